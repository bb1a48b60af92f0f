// Chaos: `sluice up --rollout-workers 2` runs a few hundred RL steps while
// the test kill -9s one rollout worker, then the reward server, the trainer,
// the replay buffer and the controller, each once the run has made progress
// again after the previous kill; then the trainer twice more (each time once
// the one before has resumed and moved the run on), and the replay buffer
// four times in a row, each as soon as sluice up has it back (before anyone
// may have asked it anything). `sluice up` restarts each; the run must still
// reach SUCCEEDED with every step trained once, nothing staler than eta
// trained, its evaluation improved, and RunSummary.recovery counting exactly
// what was done: every restart of every service, every resume and every
// redone step the trainers' logs report. The seconds from each kill to the
// run's next step are printed (and written to chaos_recovery.json in the
// test's directory).
#include <signal.h>
#include <sys/types.h>

#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/health_client.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

constexpr int64_t kSteps = 600;
constexpr int kEta = 2;
constexpr int kBatchGroups = 8;

v1::RunSpec ChaosSpec(const std::string& checkpoint_dir) {
  v1::RunSpec spec;
  spec.set_name("chaos");
  spec.set_seed(3);
  spec.mutable_model()->set_builtin("tiny");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->set_num_operands(2);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(400);
  spec.mutable_task()->set_eval_split_size(50);
  spec.mutable_warm_start()->set_sft_steps(300);
  spec.mutable_warm_start()->set_learning_rate(3e-3);
  spec.mutable_warm_start()->set_batch_size(32);
  spec.mutable_warm_start()->set_target_accuracy(0.2);
  auto* alg = spec.mutable_algorithm();
  alg->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  alg->set_group_size(8);
  alg->set_batch_size_groups(kBatchGroups);
  alg->set_max_staleness(kEta);
  alg->set_learning_rate(2e-4);
  alg->set_grad_clip_norm(1.0);
  alg->set_total_steps(kSteps);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(4);
  spec.mutable_eval()->set_every_n_steps(200);
  spec.mutable_checkpoint()->set_dir(checkpoint_dir);
  spec.mutable_checkpoint()->set_every_n_steps(10);
  spec.mutable_checkpoint()->set_keep_last(2);
  return spec;
}

bool Ended(const v1::Run& run) {
  return run.state() == v1::RUN_STATE_SUCCEEDED || run.state() == v1::RUN_STATE_FAILED ||
         run.state() == v1::RUN_STATE_CANCELLED;
}

struct Service {
  std::string grpc;
  pid_t pid = 0;
  int64_t restarts = 0;
  std::string log;
};

class ChaosProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("chaos");
    SubprocessOptions up;
    up.argv = {testing::BinDir() + "/sluice",
               "up",
               "--state-dir=" + dir_ + "/stack",
               "--runs-dir=" + dir_ + "/runs",
               "--rollout-workers=2",
               // The runs' checkpoints go to <dir>/checkpoints.
               "--allowed-path-roots=" + dir_,
               absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
    up.log_path = dir_ + "/up.log";
    up.ready_pipe = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(up);
    ASSERT_TRUE(started.ok()) << started.status();
    up_ = std::move(*started);
    absl::StatusOr<std::string> ready = up_->WaitReady(absl::Now() + absl::Minutes(2));
    ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(dir_ + "/up.log");
    endpoints_path_ = *ready;
    const std::map<std::string, Service> services = Endpoints();
    ASSERT_TRUE(services.count("controller")) << testing::ReadFile(endpoints_path_);
    controller_ = v1::ControllerService::NewStub(
        grpc::CreateChannel(services.at("controller").grpc, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (up_ == nullptr) return;
    up_->Signal(SIGTERM).IgnoreError();
    const absl::StatusOr<ExitStatus> exit = up_->Wait(absl::Now() + absl::Seconds(60));
    EXPECT_TRUE(exit.ok()) << "sluice up did not stop within 60s";
  }

  // endpoints.json as sluice up keeps it: the live processes.
  std::map<std::string, Service> Endpoints() {
    std::map<std::string, Service> services;
    const nlohmann::json document =
        nlohmann::json::parse(testing::ReadFile(endpoints_path_), nullptr, false);
    if (!document.is_object() || !document.contains("services")) return services;
    for (const auto& [name, entry] : document["services"].items()) {
      // pid is null while sluice up is restarting the service.
      const pid_t pid =
          entry.contains("pid") && entry["pid"].is_number() ? entry["pid"].get<pid_t>() : 0;
      services[name] = {entry.value("grpc", ""), pid, entry.value("restarts", int64_t{0}),
                        entry.value("log", "")};
    }
    return services;
  }

  // Follows the run (testing::AwaitRun: WatchRun, reopened while the
  // controller is away) until `done` holds or `timeout` passes.
  v1::Run AwaitRun(const std::string& run_id, const std::function<bool(const v1::Run&)>& done,
                   absl::Duration timeout) {
    return testing::AwaitRun(*controller_, run_id, done, timeout);
  }

  // kill -9 of `name`, then waits until sluice up has restarted it and the
  // run has taken a step; returns the seconds from the kill to that step.
  double KillAndAwaitNextStep(const std::string& run_id, const std::string& name) {
    const std::map<std::string, Service> before = Endpoints();
    EXPECT_TRUE(before.count(name)) << name;
    if (!before.count(name)) return -1;
    const pid_t pid = before.at(name).pid;
    const v1::Run now = AwaitRun(run_id, [](const v1::Run&) { return true; }, absl::Seconds(60));
    const int64_t step = now.progress().step();
    const absl::Time killed_at = absl::Now();
    EXPECT_EQ(kill(pid, SIGKILL), 0) << name;
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now() + absl::Seconds(30))) << name;
    // sluice up restarts it after its backoff (endpoints.json is rewritten
    // then; another process's file, so it is read again rather than waited on).
    const absl::Time restart_deadline = absl::Now() + absl::Seconds(90);
    while (absl::Now() < restart_deadline) {
      const std::map<std::string, Service> now_up = Endpoints();
      if (now_up.count(name) && now_up.at(name).pid != 0 && now_up.at(name).pid != pid) break;
      absl::SleepFor(absl::Milliseconds(100));
    }
    const v1::Run next = AwaitRun(
        run_id,
        [&](const v1::Run& r) {
          return r.progress().step() > step || Ended(r);
        },
        absl::Minutes(2));
    EXPECT_NE(next.state(), v1::RUN_STATE_FAILED) << name << ": " << next.error_message();
    EXPECT_GT(next.progress().step(), step) << name << " killed at step " << step;
    const double seconds = absl::ToDoubleSeconds(absl::Now() - killed_at);
    const std::map<std::string, Service> after = Endpoints();
    EXPECT_TRUE(after.count(name) && after.at(name).pid != pid && after.at(name).pid != 0)
        << name << " was not restarted: " << testing::ReadFile(endpoints_path_);
    std::printf("chaos: %s (pid %d) killed at step %ld; next step after %.1fs\n", name.c_str(),
                pid, static_cast<long>(step), seconds);
    return seconds;
  }

  // kill -9 of `name` as soon as sluice up has it running (a pid in
  // endpoints.json other than `previous`, the one killed before; 0 = the
  // one running now); returns the pid killed, 0 when none came.
  pid_t KillWhenBack(const std::string& name, pid_t previous) {
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    pid_t pid = 0;
    while (absl::Now() < deadline) {
      const std::map<std::string, Service> now_up = Endpoints();
      // Back = running and answering its health check: a buffer killed
      // before it has counted its own start (<data-dir>/starts) was never a
      // start the run's record could count, and on a loaded machine the
      // window between a pid and a started server is long.
      if (now_up.count(name) && now_up.at(name).pid != 0 && now_up.at(name).pid != previous &&
          runtime::CheckHealth(now_up.at(name).grpc, "", absl::Seconds(2)).ok()) {
        pid = now_up.at(name).pid;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_NE(pid, 0) << name << " did not come back: " << testing::ReadFile(endpoints_path_);
    if (pid == 0) return 0;
    EXPECT_EQ(kill(pid, SIGKILL), 0) << name;
    EXPECT_TRUE(testing::WaitForPidExit(pid, absl::Now() + absl::Seconds(30))) << name;
    std::printf("chaos: %s (pid %d) killed again as soon as it was back and serving\n", name.c_str(), pid);
    return pid;
  }

  std::string dir_;
  std::string endpoints_path_;
  std::unique_ptr<Subprocess> up_;
  std::unique_ptr<v1::ControllerService::Stub> controller_;
};

TEST_F(ChaosProcessTest, EveryServiceKilledOnceAndTheRunStillSucceeds) {
  std::string run_id;
  {
    grpc::ClientContext context;
    v1::SubmitRunRequest request;
    *request.mutable_spec() = ChaosSpec(dir_ + "/checkpoints");
    v1::SubmitRunResponse response;
    const grpc::Status status = controller_->SubmitRun(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    run_id = response.run().run_id();
  }
  // Into RL, with a checkpoint written and both workers serving.
  v1::Run run = AwaitRun(
      run_id,
      [](const v1::Run& r) {
        return (r.progress().step() >= 12 && r.progress().workers_live() == 2) || Ended(r);
      },
      absl::Minutes(3));
  ASSERT_EQ(run.state(), v1::RUN_STATE_TRAINING) << run.error_message();
  ASSERT_EQ(run.progress().workers_live(), 2);

  // What is done to the stack, counted here to be compared with the record.
  std::map<std::string, int64_t> kills;
  std::map<std::string, double> recovery_seconds;
  const auto more_steps = [&](int64_t n) {
    // Progress resumed: a few more steps before the next kill.
    const int64_t step = AwaitRun(run_id, [](const v1::Run&) { return true; }, absl::Minutes(1))
                             .progress()
                             .step();
    AwaitRun(
        run_id, [&](const v1::Run& r) { return r.progress().step() >= step + n || Ended(r); },
        absl::Minutes(2));
  };
  for (const std::string name : {"rollout_worker-0", "reward_server", "trainer", "trainer",
                                 "trainer", "replay_buffer", "controller"}) {
    recovery_seconds[name] = KillAndAwaitNextStep(run_id, name);
    ++kills[name];
    if (HasFailure()) break;
    more_steps(name == "trainer" ? 12 : 20);  // Past a checkpoint (every 10 steps).
  }
  // Four more buffer kills in a row, each as soon as it is back: starts that
  // a status check every second may never see.
  if (!HasFailure()) {
    pid_t previous = 0;
    for (int i = 0; i < 4 && !HasFailure(); ++i) {
      previous = KillWhenBack("replay_buffer", previous);
      if (previous != 0) ++kills["replay_buffer"];
    }
    const v1::Run back = AwaitRun(
        run_id, [](const v1::Run&) { return true; }, absl::Minutes(1));
    AwaitRun(
        run_id,
        [&](const v1::Run& r) { return r.progress().step() > back.progress().step() || Ended(r); },
        absl::Minutes(4));
  }
  {
    nlohmann::json figures(recovery_seconds);
    std::ofstream(dir_ + "/chaos_recovery.json") << figures.dump(2) << "\n";
  }

  run = AwaitRun(
      run_id,
      Ended,
      absl::Minutes(6));
  ASSERT_EQ(v1::RunState_Name(run.state()), "RUN_STATE_SUCCEEDED") << run.error_message();

  const std::string run_dir = dir_ + "/runs/" + run_id;
  const auto summary = nlohmann::json::parse(testing::ReadFile(run_dir + "/summary.json"));
  EXPECT_EQ(summary["steps"].get<int64_t>(), kSteps);
  EXPECT_LE(summary["max_staleness"].get<int64_t>(), kEta);
  EXPECT_EQ(summary["groups_trained"].get<int64_t>(), kSteps * kBatchGroups);
  EXPECT_GT(summary["eval_after"].get<double>(), summary["eval_before"].get<double>());
  // The record counts exactly what was done to the stack.
  const auto& recovery = summary["recovery"];
  const std::map<std::string, std::string> services = {{"rollout_worker-0", "rollout_worker"},
                                                       {"reward_server", "reward_server"},
                                                       {"trainer", "trainer"},
                                                       {"replay_buffer", "replay_buffer"},
                                                       {"controller", "controller"}};
  for (const auto& [name, service] : services) {
    EXPECT_EQ(recovery["restarts"].value(service, int64_t{0}), kills[name]) << service << "\n"
                                                                            << summary;
  }
  EXPECT_EQ(recovery.value("controller_readoptions", int64_t{0}), kills["controller"]) << summary;
  // Each trainer incarnation says in its log that it resumed and how many
  // steps it had to redo; it redid them all before it was killed again (the
  // run moved past the step it was killed at).
  int64_t resumes = 0, redo = 0;
  {
    std::ifstream log(Endpoints()["trainer"].log);
    const std::regex resumed("resumed from a checkpoint.* steps_to_redo=([0-9]+)");
    std::string line;
    std::smatch match;
    while (std::getline(log, line)) {
      if (!std::regex_search(line, match, resumed)) continue;
      ++resumes;
      redo += std::stoll(match[1].str());
    }
  }
  EXPECT_EQ(resumes, kills["trainer"]);
  EXPECT_EQ(recovery.value("trainer_resumes", int64_t{0}), resumes) << summary;
  EXPECT_EQ(recovery.value("trainer_steps_redone", int64_t{0}), redo) << summary;

  // Every step once, in order, none staler than eta: steps redone after the
  // trainer's resume were not counted twice.
  std::ifstream lines(run_dir + "/metrics.jsonl");
  std::string line;
  int64_t expected = 1;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const auto m = nlohmann::json::parse(line);
    EXPECT_EQ(m["step"].get<int64_t>(), expected);
    EXPECT_LE(m["staleness_max"].get<int64_t>(), kEta);
    ++expected;
  }
  EXPECT_EQ(expected, kSteps + 1);

  // sluice up's record of the restarts agrees.
  for (const auto& [name, service] : Endpoints()) {
    EXPECT_EQ(service.restarts, kills[name]) << name;
  }
}

}  // namespace
}  // namespace sluice
