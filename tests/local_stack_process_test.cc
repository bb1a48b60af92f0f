// `sluice up` as a user runs it: a separate process supervising five more.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/run/run_memory.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "cli/local_stack.h"
#include "services/runtime/health_client.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

using ::testing::Contains;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

absl::Time Soon() { return absl::Now() + absl::Seconds(90); }

// Runs `sluice ARGS...` to the end, its output in `log`.
absl::StatusOr<ExitStatus> RunSluice(std::vector<std::string> args, const std::string& log) {
  args.insert(args.begin(), testing::BinDir() + "/sluice");
  absl::StatusOr<std::unique_ptr<Subprocess>> process =
      Subprocess::Start({.argv = std::move(args), .log_path = log});
  if (!process.ok()) return process.status();
  return (*process)->Wait(Soon());
}

struct Up {
  std::unique_ptr<Subprocess> process;
  nlohmann::json endpoints;
  std::string log_path;
  std::string endpoints_path;
};

// `sluice up --state-dir DIR/state EXTRA...`, once it says all are healthy.
Up StartUp(const std::string& dir, const std::vector<std::string>& extra = {},
           const std::string& log_name = "up.log") {
  Up up;
  up.log_path = dir + "/" + log_name;
  std::vector<std::string> argv = {testing::BinDir() + "/sluice", "up", "--state-dir",
                                   dir + "/state", "--ready-fd=3"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto process =
      Subprocess::Start({.argv = std::move(argv), .log_path = up.log_path, .ready_pipe = true});
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return up;
  up.process = std::move(*process);
  absl::StatusOr<std::string> ready = up.process->WaitReady(Soon());
  EXPECT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(up.log_path);
  if (!ready.ok()) return up;
  up.endpoints_path = *ready;
  up.endpoints = nlohmann::json::parse(testing::ReadFile(*ready));
  return up;
}

std::vector<pid_t> ServicePids(const nlohmann::json& endpoints) {
  std::vector<pid_t> pids;
  for (const auto& [name, service] : endpoints["services"].items()) {
    pids.push_back(service["pid"].get<pid_t>());
  }
  return pids;
}

// The command line of a running process, one argument per element.
std::vector<std::string> CommandLine(pid_t pid) {
  const std::string text = testing::ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
  std::vector<std::string> args = absl::StrSplit(text, '\0');
  if (!args.empty() && args.back().empty()) args.pop_back();
  return args;
}

// Blocks until the endpoints.json at `path` satisfies `done`, reading it again
// each time a file is renamed into or written in its directory (inotify), or
// until `deadline`. Returns the document that satisfied it.
std::optional<nlohmann::json> WaitForEndpoints(
    const std::string& path, const std::function<bool(const nlohmann::json&)>& done,
    absl::Time deadline) {
  const int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return std::nullopt;
  inotify_add_watch(fd, std::filesystem::path(path).parent_path().c_str(),
                    IN_MOVED_TO | IN_CLOSE_WRITE);
  std::optional<nlohmann::json> result;
  while (true) {
    const nlohmann::json document =
        nlohmann::json::parse(testing::ReadFile(path), nullptr, /*allow_exceptions=*/false);
    if (document.is_object() && done(document)) {
      result = document;
      break;
    }
    struct pollfd p = {fd, POLLIN, 0};
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char events[4096];
    while (read(fd, events, sizeof(events)) > 0) {
    }
  }
  close(fd);
  return result;
}

const nlohmann::json& Service(const nlohmann::json& endpoints, const std::string& name) {
  return endpoints["services"][name];
}

TEST(LocalStackProcessTest, AllFiveHealthyThenSigtermLeavesNoProcess) {
  const std::string dir = testing::MakeTempDir("up");
  Up up = StartUp(dir);
  ASSERT_NE(up.process, nullptr);
  ASSERT_TRUE(up.endpoints.contains("services"));
  EXPECT_EQ(up.endpoints["supervisor_pid"].get<pid_t>(), up.process->pid());

  const auto& services = up.endpoints["services"];
  std::vector<std::string> names;
  for (const auto& [name, service] : services.items()) names.push_back(name);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("reward_server", "replay_buffer", "trainer",
                                                     "controller", "rollout_worker-0"));
  for (const std::string& name : names) {
    const std::string grpc = services[name]["grpc"];
    EXPECT_THAT(grpc, HasSubstr("127.0.0.1:"));
    EXPECT_EQ(*runtime::CheckHealth(grpc, "", absl::Seconds(20)), "SERVING") << name;
    EXPECT_TRUE(runtime::HttpGet(services[name]["metrics"], absl::Seconds(20)).ok()) << name;
    EXPECT_GT(services[name]["pid"].get<int>(), 0);
    EXPECT_EQ(services[name]["state"], "running") << name;
    EXPECT_EQ(services[name]["restarts"], 0) << name;
  }
  // The services that hold a run's memory got their shares of the machine.
  const std::optional<int64_t> machine = run::MachineMemoryBytes();
  ASSERT_TRUE(machine.has_value());
  const cli::MemoryShares shares;
  for (const auto& [name, share] :
       {std::pair<std::string, double>{"trainer", shares.trainer},
        {"rollout_worker-0", shares.rollout_workers},
        {"replay_buffer", shares.replay_buffer}}) {
    const std::string metrics = *runtime::HttpGet(services[name]["metrics"], absl::Seconds(20));
    const size_t at = metrics.find("\nsluice_memory_budget_bytes");
    ASSERT_NE(at, std::string::npos) << name;
    const std::string line = metrics.substr(at + 1, metrics.find('\n', at + 1) - at - 1);
    const double budget = std::stod(line.substr(line.rfind(' ') + 1));
    EXPECT_NEAR(budget, static_cast<double>(*machine) * share / 100, *machine * 0.001) << name;
  }
  // The buffer is durable by default, under the state directory.
  const std::string data_dir =
      std::filesystem::path(dir + "/state/replay_buffer").lexically_normal().string();
  EXPECT_EQ(up.endpoints["buffer_data_dir"], data_dir);
  EXPECT_THAT(CommandLine(services["replay_buffer"]["pid"].get<pid_t>()),
              Contains("--data-dir=" + data_dir));
  EXPECT_TRUE(std::filesystem::is_directory(data_dir));
  // The worker is told where the controller is, and the controller is given
  // no list of workers.
  const std::vector<std::string> worker = CommandLine(services["rollout_worker-0"]["pid"]);
  EXPECT_THAT(worker, Contains("--controller-address=" +
                               services["controller"]["grpc"].get<std::string>()));
  EXPECT_THAT(worker, Contains("--worker-id=worker-0"));
  EXPECT_EQ(services["rollout_worker-0"]["worker_id"], "worker-0");
  EXPECT_THAT(CommandLine(services["controller"]["pid"]),
              Not(Contains(::testing::StartsWith("--rollout-worker-addresses"))));

  const std::vector<pid_t> pids = ServicePids(up.endpoints);
  ASSERT_EQ(pids.size(), 5u);

  ASSERT_TRUE(up.process->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> exit = up.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << testing::ReadFile(up.log_path);
  for (pid_t pid : pids) {
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now() + absl::Seconds(5))) << pid;
  }
  EXPECT_FALSE(std::filesystem::exists(up.endpoints_path));
}

TEST(LocalStackProcessTest, TwoRolloutWorkersShareTheWorkersMemoryUnderTheirOwnIds) {
  const std::string dir = testing::MakeTempDir("up");
  Up up = StartUp(dir, {"--rollout-workers", "2", "--buffer-data-dir", "none"});
  ASSERT_NE(up.process, nullptr);
  const std::optional<int64_t> machine = run::MachineMemoryBytes();
  ASSERT_TRUE(machine.has_value());
  std::set<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    const std::string name = absl::StrCat("rollout_worker-", i);
    const nlohmann::json& worker = Service(up.endpoints, name);
    ASSERT_TRUE(worker.is_object()) << name << " missing from " << up.endpoints.dump(2);
    addresses.insert(worker["grpc"].get<std::string>());
    EXPECT_EQ(*runtime::CheckHealth(worker["grpc"], "", absl::Seconds(20)), "SERVING") << name;
    EXPECT_THAT(CommandLine(worker["pid"]), Contains(absl::StrCat("--worker-id=worker-", i)));
    const std::string metrics = *runtime::HttpGet(worker["metrics"], absl::Seconds(20));
    const size_t at = metrics.find("\nsluice_memory_budget_bytes");
    ASSERT_NE(at, std::string::npos) << name;
    const std::string line = metrics.substr(at + 1, metrics.find('\n', at + 1) - at - 1);
    EXPECT_NEAR(std::stod(line.substr(line.rfind(' ') + 1)),
                static_cast<double>(*machine) * cli::MemoryShares().rollout_workers / 2 / 100,
                *machine * 0.001)
        << name;
  }
  EXPECT_EQ(addresses.size(), 2u);
  EXPECT_EQ(ServicePids(up.endpoints).size(), 6u);
  // --buffer-data-dir none: in memory only.
  EXPECT_TRUE(up.endpoints["buffer_data_dir"].is_null());
  EXPECT_THAT(CommandLine(Service(up.endpoints, "replay_buffer")["pid"]),
              Not(Contains(::testing::StartsWith("--data-dir"))));
  up.process->Stop(absl::Seconds(60));
}

TEST(LocalStackProcessTest, NeverRestartReportsADeadSingletonByNameAndStopsTheRest) {
  const std::string dir = testing::MakeTempDir("up");
  Up up = StartUp(dir, {"--restart", "never"});
  ASSERT_NE(up.process, nullptr);
  const pid_t victim = up.endpoints["services"]["replay_buffer"]["pid"].get<pid_t>();
  const std::vector<pid_t> pids = ServicePids(up.endpoints);
  ASSERT_EQ(kill(victim, SIGKILL), 0);

  absl::StatusOr<ExitStatus> exit = up.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_FALSE(exit->success());
  const std::string log = testing::ReadFile(up.log_path);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("replay_buffer (pid ", victim,
                                          ") was killed by signal 9 (SIGKILL); giving up on it "
                                          "(--restart never)")));
  EXPECT_THAT(log, HasSubstr("the stack cannot go on without replay_buffer"));
  for (pid_t pid : pids) {
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now() + absl::Seconds(5))) << pid;
  }
}

// kill -9 of a singleton: the same address again (the others hold channels
// to it), a new pid in endpoints.json, the restart counted and said, the log
// kept across both processes. kill -9 of a worker: a fresh port, the same id.
TEST(LocalStackProcessTest, KilledSingletonReturnsOnItsAddressAndKilledWorkerOnAFreshPort) {
  const std::string dir = testing::MakeTempDir("restart");
  Up up = StartUp(dir);
  ASSERT_NE(up.process, nullptr);
  const nlohmann::json before = up.endpoints;
  const pid_t reward_pid = Service(before, "reward_server")["pid"];
  const std::string reward_address = Service(before, "reward_server")["grpc"];
  ASSERT_EQ(kill(reward_pid, SIGKILL), 0);
  const std::optional<nlohmann::json> after = WaitForEndpoints(
      up.endpoints_path,
      [&](const nlohmann::json& endpoints) {
        const nlohmann::json& reward = Service(endpoints, "reward_server");
        return reward["state"] == "running" && reward["pid"] != reward_pid;
      },
      Soon());
  ASSERT_TRUE(after.has_value()) << testing::ReadFile(up.log_path);
  const nlohmann::json& reward = Service(*after, "reward_server");
  const pid_t new_reward_pid = reward["pid"];
  EXPECT_EQ(reward["grpc"], reward_address);
  EXPECT_EQ(reward["restarts"], 1);
  EXPECT_EQ(reward["last_exit"],
            absl::StrCat("reward_server (pid ", reward_pid, ") was killed by signal 9 (SIGKILL)"));
  EXPECT_EQ(*runtime::CheckHealth(reward_address, "", absl::Seconds(20)), "SERVING");
  EXPECT_THAT(CommandLine(new_reward_pid),
              Contains("--listen-address=127.0.0.1:" +
                       reward_address.substr(reward_address.rfind(':') + 1)));
  for (const std::string name : {"replay_buffer", "trainer", "controller", "rollout_worker-0"}) {
    EXPECT_EQ(Service(*after, name)["pid"], Service(before, name)["pid"]) << name;
    EXPECT_EQ(Service(*after, name)["restarts"], 0) << name;
  }
  std::string console = testing::ReadFile(up.log_path);
  EXPECT_THAT(console, HasSubstr(absl::StrCat(
                           "sluice up: reward_server (pid ", reward_pid,
                           ") was killed by signal 9 (SIGKILL); restarting in 1s (restart 1 of 5 "
                           "allowed in 2m)")));
  EXPECT_THAT(console, HasSubstr(absl::StrCat("sluice up: reward_server restarted: pid ",
                                              new_reward_pid, " at ", reward_address)));
  // Appended to, not truncated: both processes' start-up lines, a marker between.
  const std::string log = testing::ReadFile(reward["log"]);
  const size_t marker = log.find("=== sluice up: starting reward_server again");
  ASSERT_NE(marker, std::string::npos) << log;
  EXPECT_NE(log.find(absl::StrCat("pid=", reward_pid)), std::string::npos) << log;
  EXPECT_NE(log.find(absl::StrCat("pid=", new_reward_pid), marker), std::string::npos) << log;

  const pid_t worker_pid = Service(before, "rollout_worker-0")["pid"];
  ASSERT_EQ(kill(worker_pid, SIGKILL), 0);
  const std::optional<nlohmann::json> worker_back = WaitForEndpoints(
      up.endpoints_path,
      [&](const nlohmann::json& endpoints) {
        const nlohmann::json& worker = Service(endpoints, "rollout_worker-0");
        return worker["state"] == "running" && worker["pid"] != worker_pid;
      },
      Soon());
  ASSERT_TRUE(worker_back.has_value()) << testing::ReadFile(up.log_path);
  const nlohmann::json& worker = Service(*worker_back, "rollout_worker-0");
  EXPECT_EQ(worker["restarts"], 1);
  EXPECT_EQ(worker["worker_id"], "worker-0");
  EXPECT_EQ(*runtime::CheckHealth(worker["grpc"], "", absl::Seconds(20)), "SERVING");
  const std::vector<std::string> argv = CommandLine(worker["pid"]);
  EXPECT_THAT(argv, Contains("--listen-address=127.0.0.1:0"));
  EXPECT_THAT(argv, Contains("--worker-id=worker-0"));
  EXPECT_EQ(Service(*worker_back, "reward_server")["restarts"], 1);

  ASSERT_TRUE(up.process->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> exit = up.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->success()) << testing::ReadFile(up.log_path);
}

// A singleton that cannot come back (its port taken meanwhile) is in a crash
// loop: given up on, said with how it died each time, the controller told,
// the stack stopped, exit 1.
TEST(LocalStackProcessTest, SingletonCrashLoopGivesUpSaysWhyAndStopsTheStack) {
  const std::string dir = testing::MakeTempDir("loop");
  Up up = StartUp(dir, {"--max-restarts", "1"});
  ASSERT_NE(up.process, nullptr);
  const pid_t reward_pid = Service(up.endpoints, "reward_server")["pid"];
  const std::string address = Service(up.endpoints, "reward_server")["grpc"];
  const std::vector<pid_t> pids = ServicePids(up.endpoints);
  ASSERT_EQ(kill(reward_pid, SIGKILL), 0);
  ASSERT_TRUE(testing::WaitForPidExit(reward_pid, Soon()));
  // Taken before the restart, 1 s later: without SO_REUSEPORT, the restarted
  // server cannot share it.
  const int blocker = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(blocker, 0);
  const int one = 1;
  setsockopt(blocker, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in bound = {};
  bound.sin_family = AF_INET;
  bound.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bound.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  ASSERT_EQ(bind(blocker, reinterpret_cast<sockaddr*>(&bound), sizeof(bound)), 0) << strerror(errno);
  ASSERT_EQ(listen(blocker, 1), 0);

  absl::StatusOr<ExitStatus> exit = up.process->Wait(Soon());
  close(blocker);
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(exit->code, 1);
  const std::string console = testing::ReadFile(up.log_path);
  EXPECT_THAT(console, HasSubstr(absl::StrCat("reward_server (pid ", reward_pid,
                                              ") was killed by signal 9 (SIGKILL); restarting in "
                                              "1s (restart 1 of 1 allowed in 2m)")));
  EXPECT_THAT(console, HasSubstr("reward_server failed to start: "));
  EXPECT_THAT(console, HasSubstr("giving up on it (it failed 2 times within 2m, more than the 1 "
                                 "restart allowed)"));
  EXPECT_THAT(console, HasSubstr("GIVING UP on reward_server"));
  EXPECT_THAT(console, ContainsRegex("(told|could not tell) the controller"));
  EXPECT_THAT(console, HasSubstr("the stack cannot go on without reward_server"));
  EXPECT_THAT(console, HasSubstr("--- last lines of "));
  for (pid_t pid : pids) {
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now() + absl::Seconds(5))) << pid;
  }
}

// A rollout worker in a crash loop is given up on; the stack goes on.
TEST(LocalStackProcessTest, WorkerCrashLoopGivesUpOnItAndTheStackGoesOn) {
  const std::string dir = testing::MakeTempDir("wloop");
  Up up = StartUp(dir, {"--rollout-workers", "2", "--max-restarts", "1"});
  ASSERT_NE(up.process, nullptr);
  const pid_t first = Service(up.endpoints, "rollout_worker-1")["pid"];
  ASSERT_EQ(kill(first, SIGKILL), 0);
  std::optional<nlohmann::json> endpoints = WaitForEndpoints(
      up.endpoints_path,
      [&](const nlohmann::json& endpoints) {
        const nlohmann::json& worker = Service(endpoints, "rollout_worker-1");
        return worker["state"] == "running" && worker["pid"] != first;
      },
      Soon());
  ASSERT_TRUE(endpoints.has_value()) << testing::ReadFile(up.log_path);
  const pid_t second = Service(*endpoints, "rollout_worker-1")["pid"];
  ASSERT_EQ(kill(second, SIGKILL), 0);
  endpoints = WaitForEndpoints(
      up.endpoints_path,
      [&](const nlohmann::json& endpoints) {
        return Service(endpoints, "rollout_worker-1")["state"] == "gave_up";
      },
      Soon());
  ASSERT_TRUE(endpoints.has_value()) << testing::ReadFile(up.log_path);
  EXPECT_TRUE(Service(*endpoints, "rollout_worker-1")["pid"].is_null());

  const std::string console = testing::ReadFile(up.log_path);
  EXPECT_THAT(console, HasSubstr("GIVING UP on rollout_worker-1: it failed 2 times within 2m, "
                                 "more than the 1 restart allowed"));
  for (pid_t pid : {first, second}) {
    EXPECT_THAT(console, HasSubstr(absl::StrCat("rollout_worker-1 (pid ", pid,
                                                ") was killed by signal 9 (SIGKILL)")));
  }
  EXPECT_THAT(console, ContainsRegex("(told|could not tell) the controller"));
  EXPECT_THAT(console, HasSubstr("going on without rollout_worker-1: 1 of 2 rollout workers left"));
  EXPECT_FALSE(up.process->TryWait().has_value()) << console;
  for (const std::string name : {"controller", "rollout_worker-0"}) {
    EXPECT_EQ(*runtime::CheckHealth(Service(*endpoints, name)["grpc"], "", absl::Seconds(20)),
              "SERVING");
  }
  ASSERT_TRUE(up.process->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> exit = up.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->success()) << testing::ReadFile(up.log_path);
}

// One `sluice up` per state directory: a second one is refused naming the
// first; once the first is killed hard, its endpoints.json is stale, and the
// next one says so, stops what is left of the old stack and replaces it.
TEST(LocalStackProcessTest, SecondUpIsRefusedAndAStaleEndpointsJsonIsReplaced) {
  const std::string dir = testing::MakeTempDir("stale");
  Up first = StartUp(dir);
  ASSERT_NE(first.process, nullptr);
  const pid_t first_pid = first.process->pid();

  absl::StatusOr<ExitStatus> second =
      RunSluice({"up", "--state-dir", dir + "/state"}, dir + "/second.log");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->code, 1);
  EXPECT_THAT(testing::ReadFile(dir + "/second.log"),
              HasSubstr(absl::StrCat("another `sluice up` (pid ", first_pid,
                                     ") is running with the state directory")));
  // The first is undisturbed.
  EXPECT_EQ(nlohmann::json::parse(testing::ReadFile(first.endpoints_path))["supervisor_pid"],
            first_pid);

  const std::vector<pid_t> old_pids = ServicePids(first.endpoints);
  ASSERT_TRUE(first.process->Signal(SIGKILL).ok());
  ASSERT_TRUE(first.process->Wait(Soon()).ok());
  ASSERT_TRUE(std::filesystem::exists(first.endpoints_path));

  Up third = StartUp(dir, {}, "third.log");
  ASSERT_NE(third.process, nullptr);
  const std::string console = testing::ReadFile(third.log_path);
  EXPECT_THAT(console, HasSubstr(absl::StrCat("found a stale ", first.endpoints_path,
                                              " (left by a `sluice up` with pid ", first_pid,
                                              " that is no longer running); replacing it")));
  EXPECT_EQ(third.endpoints["supervisor_pid"], third.process->pid());
  // Stale replacement waited for the old services to be gone.
  for (pid_t pid : old_pids) {
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now())) << pid;
  }
  for (pid_t pid : ServicePids(third.endpoints)) {
    EXPECT_EQ(std::count(old_pids.begin(), old_pids.end(), pid), 0);
  }
  third.process->Stop(absl::Seconds(60));
}

TEST(LocalStackProcessTest, SupervisorKilledHardTakesItsServicesWithIt) {
  const std::string dir = testing::MakeTempDir("up");
  Up up = StartUp(dir);
  ASSERT_NE(up.process, nullptr);
  const std::vector<pid_t> pids = ServicePids(up.endpoints);
  ASSERT_TRUE(up.process->Signal(SIGKILL).ok());
  ASSERT_TRUE(up.process->Wait(Soon()).ok());
  for (pid_t pid : pids) {
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now() + absl::Seconds(30))) << pid;
  }
}

TEST(LocalStackProcessTest, MissingBinaryFailsBeforeStartingAnything) {
  const std::string dir = testing::MakeTempDir("up");
  cli::LocalStack stack({.bin_dir = dir, .state_dir = dir + "/state"});
  const absl::Status status = stack.Start();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("sluice-reward-server"));
}

// `sluice quickstart` as ./quickstart.sh runs it, with a spec shortened to
// seconds (the built-in one takes minutes): stack up, run submitted and
// watched to SUCCEEDED, run files written, stack down, exit 0.
TEST(LocalStackProcessTest, QuickstartRunsASpecToTheEndAndStopsTheStack) {
  const std::string dir = testing::MakeTempDir("qs");
  const std::string spec = dir + "/short.yaml";
  std::ofstream(spec) << R"(name: quickstart-test
seed: 3
model: {builtin: micro}
task:
  arithmetic: {max_operand: 9, operators: ["+"], num_prompts: 60}
  eval_split_size: 20
warm_start: {sft_steps: 20, learning_rate: 3.0e-3, batch_size: 32}
algorithm: {objective: grpo, group_size: 4, batch_size_groups: 4, max_staleness: 1,
            learning_rate: 1.0e-3, total_steps: 5}
rollout: {sampling: {max_new_tokens: 3}}
)";
  const std::string log = dir + "/qs.log";
  absl::StatusOr<ExitStatus> exit =
      RunSluice({"quickstart", "--runs-dir", dir + "/runs", "--spec", spec}, log);
  ASSERT_TRUE(exit.ok()) << exit.status();
  const std::string output = testing::ReadFile(log);
  EXPECT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("RUN_STATE_SUCCEEDED"));
  EXPECT_THAT(output, HasSubstr("stack stopped"));
  int runs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/runs")) {
    if (entry.path().filename() == "stack") continue;
    ++runs;
    const auto summary = nlohmann::json::parse(testing::ReadFile(entry.path() / "summary.json"));
    EXPECT_EQ(summary["state"], "RUN_STATE_SUCCEEDED");
    EXPECT_EQ(summary["steps"], 5);
    EXPECT_TRUE(std::filesystem::exists(entry.path() / "metrics.jsonl"));
  }
  EXPECT_EQ(runs, 1);
}

// A run from a Hugging Face directory to a Hugging Face checkpoint, through
// the real processes: `sluice init-model` writes the builtin micro model as
// an HF directory, the run names it as hf_model_dir, the trainer writes
// checkpoint.dir/step-00000004 at the end, and `sluice logits` runs it.
TEST(LocalStackProcessTest, RunFromAnHfDirectoryWritesAnHfCheckpoint) {
  const std::string dir = testing::MakeTempDir("hfrun");
  const std::string init_log = dir + "/init.log";
  absl::StatusOr<ExitStatus> init_exit = RunSluice(
      {"init-model", "--builtin", "micro", "--seed", "3", "--out", dir + "/micro"}, init_log);
  ASSERT_TRUE(init_exit.ok() && init_exit->success()) << testing::ReadFile(init_log);

  const std::string spec = dir + "/hf.yaml";
  std::ofstream(spec) << absl::StrCat(R"(name: hf-dir-test
seed: 3
model: {hf_model_dir: )", dir, R"(/micro}
task:
  arithmetic: {max_operand: 9, operators: ["+"], num_prompts: 60}
  eval_split_size: 20
algorithm: {objective: grpo, group_size: 4, batch_size_groups: 4, max_staleness: 1,
            learning_rate: 1.0e-3, total_steps: 4}
rollout: {sampling: {max_new_tokens: 3}}
checkpoint: {dir: )", dir, R"(/checkpoints, every_n_steps: 2, keep_last: 1}
)");
  const std::string log = dir + "/run.log";
  absl::StatusOr<ExitStatus> exit =
      RunSluice({"quickstart", "--runs-dir", dir + "/runs", "--spec", spec,
                 "--allowed-path-roots", dir},
                log);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->success()) << testing::ReadFile(log);
  EXPECT_THAT(testing::ReadFile(log), HasSubstr("RUN_STATE_SUCCEEDED"));

  std::vector<std::string> checkpoints;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/checkpoints")) {
    checkpoints.push_back(entry.path().filename());
  }
  EXPECT_EQ(checkpoints, std::vector<std::string>{"step-00000004"});
  const std::string checkpoint = dir + "/checkpoints/step-00000004";
  const auto state = nlohmann::json::parse(testing::ReadFile(checkpoint + "/trainer_state.json"));
  EXPECT_EQ(state["step"], 4);
  EXPECT_EQ(state["source_model"], dir + "/micro");

  const std::string logits_log = dir + "/logits.log";
  absl::StatusOr<ExitStatus> logits_exit =
      RunSluice({"logits", "--model", checkpoint, "--prompt", "3+4="}, logits_log);
  ASSERT_TRUE(logits_exit.ok() && logits_exit->success()) << testing::ReadFile(logits_log);
  const auto output = nlohmann::json::parse(testing::ReadFile(logits_log));
  EXPECT_EQ(output["logits"].size(), 4u);  // One row per prompt token.
}

TEST(LocalStackProcessTest, QuickstartRefusesAnInvalidSpecNamingTheField) {
  const std::string dir = testing::MakeTempDir("qsbad");
  const std::string spec = dir + "/bad.yaml";
  std::ofstream(spec) << "algorithm: {grup_size: 4}\n";
  const std::string log = dir + "/qs.log";
  absl::StatusOr<ExitStatus> exit =
      RunSluice({"quickstart", "--runs-dir", dir + "/runs", "--spec", spec}, log);
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->code, 2);
  EXPECT_THAT(testing::ReadFile(log), HasSubstr("grup_size"));
}

// `sluice submit --validate-only` needs no controller: nothing is running
// here, and no endpoints.json is found from the test's directory.
TEST(LocalStackProcessTest, ValidateOnlyWorksOfflineAndNamesEveryProblem) {
  const std::string dir = testing::MakeTempDir("validate");
  const std::string good = dir + "/good.yaml";
  std::ofstream(good) << "model: {builtin: tiny}\ntask: {arithmetic: {}}\n";
  const std::string log = dir + "/good.log";
  absl::StatusOr<ExitStatus> exit = RunSluice({"submit", good, "--validate-only"}, log);
  ASSERT_TRUE(exit.ok()) << exit.status();
  std::string output = testing::ReadFile(log);
  EXPECT_TRUE(exit->success()) << output;
  EXPECT_THAT(output, HasSubstr("\"group_size\": 8"));
  EXPECT_THAT(output, HasSubstr("\"device\": \"cpu\""));
  // What the fields still printed as 0 mean.
  EXPECT_THAT(output, HasSubstr("eval.num_prompts: 0 = the whole eval split"));
  EXPECT_THAT(output, HasSubstr("buffer.capacity_groups: 0 = unlimited"));
  EXPECT_THAT(output, HasSubstr("is valid"));
  EXPECT_THAT(output, HasSubstr("estimated memory: rollout worker"));

  const std::string bad = dir + "/bad.yaml";
  std::ofstream(bad) << "task: {arithmetic: {}}\nalgorithm: {group_size: 1000000000}\n"
                        "reward: {verifiers: [{name: nosuch}]}\n";
  exit = RunSluice({"submit", bad, "--validate-only"}, dir + "/bad.log");
  ASSERT_TRUE(exit.ok()) << exit.status();
  output = testing::ReadFile(dir + "/bad.log");
  EXPECT_EQ(exit->code, 2) << output;
  EXPECT_THAT(output, HasSubstr("model: exactly one of builtin or hf_model_dir must be set"));
  EXPECT_THAT(output, HasSubstr("algorithm.group_size: must be <= 1024, got 1000000000"));
  EXPECT_THAT(output, HasSubstr("reward.verifiers[0].name: unknown verifier \"nosuch\""));
  EXPECT_THAT(output, Not(HasSubstr("connect")));
}

TEST(LocalStackProcessTest, HealthCommandExitCodes) {
  const std::string dir = testing::MakeTempDir("h");
  Up up = StartUp(dir);
  ASSERT_NE(up.process, nullptr);
  const std::string grpc = up.endpoints["services"]["trainer"]["grpc"];
  auto ok = Subprocess::Start(
      {.argv = {testing::BinDir() + "/sluice", "health", "--target", grpc}, .log_path = dir + "/h1"});
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE((*ok)->Wait(Soon())->success());
  auto down = Subprocess::Start({.argv = {testing::BinDir() + "/sluice", "health", "--target",
                                          "127.0.0.1:1", "--timeout-ms", "2000"},
                                 .log_path = dir + "/h2"});
  ASSERT_TRUE(down.ok());
  EXPECT_EQ((*down)->Wait(Soon())->code, 1);
  up.process->Stop(absl::Seconds(60));
}

}  // namespace
}  // namespace sluice
