// `sluice up` as a user runs it: a separate process supervising five more.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/run/run_memory.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/cli/local_stack.h"
#include "services/runtime/health_client.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

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

Up StartUp(const std::string& dir) {
  Up up;
  up.log_path = dir + "/up.log";
  auto process = Subprocess::Start({.argv = {testing::BinDir() + "/sluice", "up", "--state-dir",
                                             dir + "/state", "--ready-fd=3"},
                                    .log_path = up.log_path,
                                    .ready_pipe = true});
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

TEST(LocalStackProcessTest, AllFiveHealthyThenSigtermLeavesNoProcess) {
  const std::string dir = testing::MakeTempDir("up");
  Up up = StartUp(dir);
  ASSERT_NE(up.process, nullptr);
  ASSERT_TRUE(up.endpoints.contains("services"));

  const auto& services = up.endpoints["services"];
  for (const std::string& name : cli::LocalStack::ServiceNames()) {
    ASSERT_TRUE(services.contains(name)) << name;
    const std::string grpc = services[name]["grpc"];
    EXPECT_THAT(grpc, HasSubstr("127.0.0.1:"));
    EXPECT_EQ(*runtime::CheckHealth(grpc, "", absl::Seconds(20)), "SERVING") << name;
    EXPECT_TRUE(runtime::HttpGet(services[name]["metrics"], absl::Seconds(20)).ok()) << name;
    EXPECT_GT(services[name]["pid"].get<int>(), 0);
  }
  // The services that hold a run's memory got their shares of the machine.
  const std::optional<int64_t> machine = run::MachineMemoryBytes();
  ASSERT_TRUE(machine.has_value());
  const cli::MemoryShares shares;
  for (const auto& [name, share] :
       {std::pair<std::string, double>{"trainer", shares.trainer},
        {"rollout_worker", shares.rollout_workers},
        {"replay_buffer", shares.replay_buffer}}) {
    const std::string metrics = *runtime::HttpGet(services[name]["metrics"], absl::Seconds(20));
    const size_t at = metrics.find("\nsluice_memory_budget_bytes");
    ASSERT_NE(at, std::string::npos) << name;
    const std::string line = metrics.substr(at + 1, metrics.find('\n', at + 1) - at - 1);
    const double budget = std::stod(line.substr(line.rfind(' ') + 1));
    EXPECT_NEAR(budget, static_cast<double>(*machine) * share / 100, *machine * 0.001) << name;
  }

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

TEST(LocalStackProcessTest, DeadChildIsReportedByNameAndTheRestAreStopped) {
  const std::string dir = testing::MakeTempDir("up");
  Up up = StartUp(dir);
  ASSERT_NE(up.process, nullptr);
  const pid_t victim = up.endpoints["services"]["replay_buffer"]["pid"].get<pid_t>();
  const std::vector<pid_t> pids = ServicePids(up.endpoints);
  ASSERT_EQ(kill(victim, SIGKILL), 0);

  absl::StatusOr<ExitStatus> exit = up.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_FALSE(exit->success());
  const std::string log = testing::ReadFile(up.log_path);
  EXPECT_THAT(log, HasSubstr("replay_buffer"));
  EXPECT_THAT(log, HasSubstr("killed by signal 9"));
  for (pid_t pid : pids) {
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now() + absl::Seconds(5))) << pid;
  }
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
      RunSluice({"quickstart", "--runs-dir", dir + "/runs", "--spec", spec}, log);
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
