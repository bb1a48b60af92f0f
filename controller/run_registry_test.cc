// The run state machine end to end against fake services: what the
// controller calls, what it records, and the files it leaves.
#include "controller/run_registry.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "controller/fake_service_clients.h"
#include "controller/run_conditions.h"
#include "controller/run_spec.h"

namespace sluice::controller {
namespace {

using testing::FakeBuffer;
using testing::FakeClock;
using testing::FakeHealth;
using testing::FakeRewardServer;
using testing::FakeTrainer;
using testing::FakeWorker;
using testing::HeartbeatPacedClock;

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kWait = absl::Seconds(10);

std::vector<v1::Prompt> Pool(int n) {
  std::vector<v1::Prompt> prompts;
  for (int i = 0; i < n; ++i) {
    v1::Prompt& prompt = prompts.emplace_back();
    prompt.set_prompt_id(absl::StrCat("arith-", i));
    prompt.set_text(absl::StrCat(i, "+1="));
    prompt.set_reference_answer(absl::StrCat(i + 1));
  }
  return prompts;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

v1::RunSpec SmallSpec() {
  v1::RunSpec spec;
  spec.set_name("small");
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->mutable_arithmetic();
  spec.mutable_algorithm()->set_group_size(4);
  spec.mutable_algorithm()->set_batch_size_groups(2);
  spec.mutable_algorithm()->set_max_staleness(2);
  spec.mutable_algorithm()->set_total_steps(3);
  spec.mutable_warm_start()->set_sft_steps(10);
  return spec;
}

class RunRegistryTest : public ::testing::Test {
 protected:
  RunRegistryTest() {
    runs_dir_ = ::testing::TempDir() + "/runs-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(runs_dir_);
  }

  void MakeRegistry(bool with_services = true,
                    std::function<void(RunRegistryOptions&)> adjust = nullptr) {
    RunRegistryOptions options;
    options.runs_dir = runs_dir_;
    options.driver.health_check_interval = absl::Milliseconds(2);
    options.driver.service_free_poll = absl::Milliseconds(2);
    options.driver.clock = [this] { return clock_.Now(); };
    options.driver.prompt_source = [](const v1::RunSpec&) { return Pool(20); };
    ServiceClients clients;
    if (with_services) {
      clients.trainer = trainer_;
      clients.replay_buffer = buffer_;
      clients.workers = workers_;
      clients.reward_server_address = "reward:1";
      clients.reward_server = reward_;
      clients.health = health_;
    }
    if (adjust) adjust(options);
    registry_ = std::make_unique<RunRegistry>(options, clients);
    registry_->SetControllerAddress("controller:1");
    if (with_services) {
      worker_->Attach(workers_, worker_clock_.get());
      AwaitHeartbeats(*worker_, 1);
    }
  }

  // Waits until `worker` sent `n` more heartbeats.
  static void AwaitHeartbeats(const FakeWorker& worker, int n) {
    ASSERT_TRUE(worker.AwaitMoreHeartbeats(n, kWait));
  }

  std::string Submit(const v1::RunSpec& spec) {
    v1::SubmitRunRequest request;
    *request.mutable_spec() = spec;
    absl::StatusOr<v1::Run> run = registry_->Submit(request);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? run->run_id() : "";
  }

  // Waits until the driver has started the services (and said so).
  void AwaitServicesStarted(const std::string& run_id) {
    ASSERT_TRUE(worker_->started.WaitForNotificationWithTimeout(kWait));
    std::shared_ptr<RunDriver> driver = *registry_->Find(run_id);
    const absl::Time deadline = absl::Now() + kWait;
    RunDriver::Snapshot snapshot = driver->Get();
    // ... and the worker's joining was counted: live (from its heartbeat)
    // and joined (from its assignment event) are separate updates, which
    // may land in either order.
    while ((snapshot.run.progress().phase() != "loading model" ||
            snapshot.run.progress().workers_live() != 1 ||
            snapshot.run.summary().recovery().workers_joined() != 1) &&
           absl::Now() < deadline) {
      driver->AwaitUpdate(snapshot.generation, snapshot.run.state(), absl::InfinitePast(),
                          deadline);
      snapshot = driver->Get();
    }
    ASSERT_EQ(snapshot.run.progress().phase(), "loading model");
    ASSERT_EQ(snapshot.run.progress().workers_live(), 1);
    ASSERT_EQ(snapshot.run.summary().recovery().workers_joined(), 1);
  }

  // Waits until the trainer was started `n` times.
  void AwaitTrainerStarts(int n) {
    ASSERT_TRUE(trainer_->AwaitStarts(n, kWait));
    ASSERT_EQ(trainer_->starts(), n);
  }

  // Waits until the run's phase starts with `prefix`; returns the phase.
  std::string AwaitPhase(const std::string& run_id, const std::string& prefix) {
    std::shared_ptr<RunDriver> driver = *registry_->Find(run_id);
    const absl::Time deadline = absl::Now() + kWait;
    RunDriver::Snapshot snapshot = driver->Get();
    while (snapshot.run.progress().phase().rfind(prefix, 0) != 0 && absl::Now() < deadline) {
      driver->AwaitUpdate(snapshot.generation, snapshot.run.state(), absl::InfinitePast(),
                          deadline);
      snapshot = driver->Get();
    }
    return snapshot.run.progress().phase();
  }

  // Waits until the run is in `state`; returns the run then.
  v1::Run AwaitState(const std::string& run_id, v1::RunState state) {
    std::shared_ptr<RunDriver> driver = *registry_->Find(run_id);
    const absl::Time deadline = absl::Now() + kWait;
    RunDriver::Snapshot snapshot = driver->Get();
    while (snapshot.run.state() != state && absl::Now() < deadline) {
      driver->AwaitUpdate(snapshot.generation, snapshot.run.state(), absl::InfinitePast(),
                          deadline);
      snapshot = driver->Get();
    }
    EXPECT_EQ(v1::RunState_Name(snapshot.run.state()), v1::RunState_Name(state))
        << snapshot.run.error_message();
    return snapshot.run;
  }

  // Waits until `done(run)` holds; returns the run then (or at the deadline).
  v1::Run AwaitRun(const std::string& run_id, std::function<bool(const v1::Run&)> done) {
    std::shared_ptr<RunDriver> driver = *registry_->Find(run_id);
    const absl::Time deadline = absl::Now() + kWait;
    RunDriver::Snapshot snapshot = driver->Get();
    while (!done(snapshot.run) && absl::Now() < deadline) {
      driver->AwaitUpdate(snapshot.generation, snapshot.run.state(), absl::InfinitePast(),
                          deadline);
      snapshot = driver->Get();
    }
    EXPECT_TRUE(done(snapshot.run)) << snapshot.run.DebugString();
    return snapshot.run;
  }

  v1::ReportTrainerProgressResponse Report(
      const std::string& run_id, v1::TrainerState state,
      std::function<void(v1::ReportTrainerProgressRequest&)> fill = nullptr) {
    v1::ReportTrainerProgressRequest request;
    request.set_run_id(run_id);
    request.set_state(state);
    request.set_policy_version(-1);
    if (fill) fill(request);
    trainer_->SetRunState(run_id, state);  // A trainer says the same when asked.
    absl::StatusOr<v1::ReportTrainerProgressResponse> response =
        registry_->ReportTrainerProgress(request);
    EXPECT_TRUE(response.ok());
    return *response;
  }

  v1::LeasePromptsResponse Lease(const std::string& run_id, int max_prompts) {
    v1::LeasePromptsRequest request;
    request.set_run_id(run_id);
    request.set_worker_id("worker-a");
    request.set_worker_incarnation(1);
    request.set_max_prompts(max_prompts);
    return *registry_->LeasePrompts(request);
  }

  static v1::EvalResult Eval(const std::string& phase, int64_t step, double accuracy) {
    v1::EvalResult eval;
    eval.set_phase(phase);
    eval.set_step(step);
    eval.set_num_prompts(100);
    eval.set_num_correct(static_cast<int>(accuracy * 100));
    eval.set_accuracy(accuracy);
    return eval;
  }

  std::string runs_dir_;
  FakeClock clock_;
  std::shared_ptr<FakeTrainer> trainer_ = std::make_shared<FakeTrainer>();
  // The worker registry judges its 200 ms TTL by a clock that moves only as
  // the attached workers heartbeat (HeartbeatPacedClock, 50 ms a move): a
  // worker is lost when it is detached, never because this machine ran its
  // heartbeat thread late.
  std::shared_ptr<HeartbeatPacedClock> worker_clock_ =
      std::make_shared<HeartbeatPacedClock>(absl::Milliseconds(50));
  std::shared_ptr<WorkerRegistry> workers_ = std::make_shared<WorkerRegistry>(
      WorkerRegistryOptions{.heartbeat_interval = absl::Milliseconds(5),
                            .worker_ttl = absl::Milliseconds(200),
                            .clock = [clock = worker_clock_] { return clock->Now(); }});
  std::shared_ptr<FakeWorker> worker_ = std::make_shared<FakeWorker>();
  std::shared_ptr<FakeBuffer> buffer_ = std::make_shared<FakeBuffer>();
  std::shared_ptr<FakeHealth> health_ = std::make_shared<FakeHealth>();
  std::shared_ptr<FakeRewardServer> reward_ = std::make_shared<FakeRewardServer>();
  std::unique_ptr<RunRegistry> registry_;
};

TEST_F(RunRegistryTest, WarmStartTrainingFinishedWritesSummaryAndMetrics) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  EXPECT_THAT(run_id, ::testing::MatchesRegex("run-20260101-000000-[0-9a-f]{4}"));
  AwaitServicesStarted(run_id);

  // Step 2 of the lifecycle, with the resolved spec and everyone's address.
  const v1::ConfigureRunRequest configure = buffer_->configure_request();
  EXPECT_EQ(configure.run_id(), run_id);
  EXPECT_EQ(configure.batch_size_groups(), 2);
  EXPECT_EQ(configure.max_staleness(), 2);
  EXPECT_EQ(configure.group_size(), 4);
  EXPECT_EQ(configure.staleness_bound(), v1::STALENESS_BOUND_GROUP);  // resolved default
  EXPECT_EQ(configure.config().sampler(), v1::SAMPLER_KIND_FIFO);
  const v1::StartTrainingRequest start = trainer_->start_request();
  EXPECT_EQ(start.spec().algorithm().objective(), v1::OBJECTIVE_DECOUPLED_PPO);
  EXPECT_EQ(start.endpoints().controller_address(), "controller:1");
  EXPECT_EQ(start.endpoints().replay_buffer_address(), "buffer:1");
  EXPECT_EQ(start.endpoints().reward_server_address(), "reward:1");
  EXPECT_EQ(start.endpoints().trainer_address(), "trainer:1");
  EXPECT_EQ(worker_->start_request().run_id(), run_id);
  EXPECT_EQ(worker_->start_request().spec().algorithm().group_size(), 4);

  // Not training yet: no prompts, come back later.
  v1::LeasePromptsResponse early = Lease(run_id, 2);
  EXPECT_EQ(early.prompts_size(), 0);
  EXPECT_EQ(early.retry_after_ms(), 200);
  EXPECT_FALSE(early.run_done());

  Report(run_id, v1::TRAINER_STATE_WARM_START, [](auto& r) { r.set_warm_start_step(5); });
  EXPECT_EQ(AwaitState(run_id, v1::RUN_STATE_WARM_START).progress().phase(), "warm start 5/10");
  clock_.Advance(absl::Seconds(10));
  Report(run_id, v1::TRAINER_STATE_WARM_START, [](auto& r) {
    r.set_warm_start_step(10);
    *r.mutable_eval() = Eval("warm_start", 10, 0.5);
  });
  clock_.Advance(absl::Seconds(2));
  Report(run_id, v1::TRAINER_STATE_EVALUATING,
         [](auto& r) { *r.mutable_eval() = Eval("before", 0, 0.4); });
  EXPECT_EQ(registry_->Get(run_id)->state(), v1::RUN_STATE_WARM_START);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA, [](auto& r) { r.set_policy_version(0); });
  AwaitState(run_id, v1::RUN_STATE_TRAINING);

  v1::LeasePromptsResponse lease = Lease(run_id, 2);
  ASSERT_EQ(lease.prompts_size(), 2);
  EXPECT_FALSE(lease.lease_id().empty());
  EXPECT_EQ(lease.lease_ttl_ms(), 120000);

  v1::ReportRolloutProgressRequest rollout;
  rollout.set_run_id(run_id);
  rollout.set_worker_id("worker-a");
  rollout.set_worker_incarnation(1);
  for (const auto& prompt : lease.prompts()) rollout.add_completed_prompt_ids(prompt.prompt_id());
  rollout.set_tokens_generated(5000);
  rollout.set_groups_inserted(2);
  EXPECT_FALSE(registry_->ReportRolloutProgress(rollout)->run_done());

  const double rewards[] = {0.25, 0.5, 0.75};
  for (int step = 1; step <= 3; ++step) {
    clock_.Advance(absl::Seconds(1));
    Report(run_id, v1::TRAINER_STATE_TRAINING, [&](auto& r) {
      r.set_policy_version(step);
      v1::TrainingStepMetrics& m = *r.mutable_step();
      m.set_step(step);
      m.set_policy_version(step);
      m.set_reward_mean(rewards[step - 1]);
      m.set_groups(2);
      m.set_tokens_trained(100);
      m.set_staleness_max(step - 1);
      m.set_staleness_mean(0.5);
      m.set_importance_weight_ess(0.9);
      m.set_token_staleness_max(step);
    });
  }
  v1::Run training = *registry_->Get(run_id);
  EXPECT_EQ(training.progress().step(), 3);
  EXPECT_EQ(training.progress().policy_version(), 3);
  EXPECT_DOUBLE_EQ(training.progress().reward_mean(), 0.75);

  Report(run_id, v1::TRAINER_STATE_EVALUATING,
         [](auto& r) { *r.mutable_eval() = Eval("after", 3, 0.9); });
  AwaitState(run_id, v1::RUN_STATE_EVALUATING);
  EXPECT_FALSE(Report(run_id, v1::TRAINER_STATE_FINISHED).stop());
  const v1::Run done = AwaitState(run_id, v1::RUN_STATE_SUCCEEDED);

  ASSERT_TRUE(worker_->stopped.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE((*registry_->Find(run_id))->WaitUntilStopped(kWait));
  EXPECT_FALSE(trainer_->stopped.HasBeenNotified());  // It finished by itself.
  EXPECT_TRUE(done.has_finished_at());
  EXPECT_EQ(done.error_message(), "");

  // The workers are told the run is over.
  EXPECT_TRUE(Lease(run_id, 2).run_done());
  EXPECT_TRUE(registry_->ReportRolloutProgress(rollout)->run_done());
  EXPECT_TRUE(Report(run_id, v1::TRAINER_STATE_TRAINING).stop());

  const std::string dir = runs_dir_ + "/" + run_id;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["run_id"], run_id);
  EXPECT_EQ(summary["state"], "RUN_STATE_SUCCEEDED");
  EXPECT_DOUBLE_EQ(summary["eval_before"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(summary["eval_after"].get<double>(), 0.9);
  // 64-bit integers are numbers (proto JSON would write strings).
  EXPECT_EQ(summary["eta"].get<int64_t>(), 2);
  EXPECT_EQ(summary["max_staleness"].get<int64_t>(), 2);
  EXPECT_EQ(summary["steps"].get<int64_t>(), 3);
  EXPECT_EQ(summary["groups_trained"].get<int64_t>(), 6);
  EXPECT_EQ(summary["groups_evicted_stale"].get<int64_t>(), 3);
  EXPECT_EQ(summary["tokens_generated"].get<int64_t>(), 5000);
  EXPECT_EQ(summary["groups_generated"].get<int64_t>(), 2);
  EXPECT_EQ(summary["tokens_trained"].get<int64_t>(), 300);
  EXPECT_EQ(summary["weight_versions"].get<int64_t>(), 4);
  EXPECT_EQ(summary["warm_start_steps"].get<int64_t>(), 10);
  EXPECT_DOUBLE_EQ(summary["warm_start_seconds"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(summary["warm_start_accuracy"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(summary["rl_seconds"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(summary["wall_seconds"].get<double>(), 15.0);
  EXPECT_DOUBLE_EQ(summary["final_reward_mean"].get<double>(), 0.5);
  EXPECT_EQ(summary["error_message"], "");
  EXPECT_EQ(summary["evals"].size(), 3u);

  const std::vector<nlohmann::json> metrics = ReadJsonLines(dir + "/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[0]["step"].get<int64_t>(), 1);
  // 5000 tokens reported within the last 5 s.
  EXPECT_DOUBLE_EQ(metrics[0]["rollout_tokens_per_second"].get<double>(), 1000.0);
  EXPECT_TRUE(metrics[0].contains("kl_to_behaviour"));  // Defaults printed.
  // The off-policy telemetry (docs/objectives.md), zeros included.
  EXPECT_DOUBLE_EQ(metrics[0]["importance_weight_ess"].get<double>(), 0.9);
  EXPECT_EQ(metrics[1]["token_staleness_max"].get<int64_t>(), 2);
  for (const char* key : {"importance_weight_p99", "importance_weight_above_2_fraction",
                          "tokens_masked_cap_fraction", "tokens_masked_floor_fraction",
                          "tokens_masked_second_moment_fraction", "token_staleness_mean",
                          "kl_to_reference", "groups_uniform_dropped"}) {
    EXPECT_TRUE(metrics[0].contains(key)) << key;
  }
  EXPECT_DOUBLE_EQ(metrics[2]["reward_mean"].get<double>(), 0.75);

  const std::vector<nlohmann::json> evals = ReadJsonLines(dir + "/evals.jsonl");
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_EQ(evals[0]["phase"], "warm_start");
  EXPECT_EQ(evals[1]["phase"], "before");
  EXPECT_EQ(evals[2]["phase"], "after");

  const nlohmann::json spec = nlohmann::json::parse(ReadFile(dir + "/spec.json"));
  EXPECT_EQ(spec["algorithm"]["group_size"], 4);
  EXPECT_DOUBLE_EQ(spec["algorithm"]["clip_eps_low"].get<double>(), 0.2);
  EXPECT_EQ(spec["model"]["builtin"], "tiny");
}

TEST_F(RunRegistryTest, TrainerFailureFailsTheRunWithItsMessage) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  const v1::ReportTrainerProgressResponse response =
      Report(run_id, v1::TRAINER_STATE_FAILED,
             [](auto& r) { r.set_error("reward server refused ScoreBatch: UNAVAILABLE"); });
  EXPECT_TRUE(response.stop());
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_EQ(run.error_message(), "trainer: reward server refused ScoreBatch: UNAVAILABLE");
  ASSERT_TRUE(worker_->stopped.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(trainer_->stopped.WaitForNotificationWithTimeout(kWait));
  const nlohmann::json summary =
      nlohmann::json::parse(ReadFile(runs_dir_ + "/" + run_id + "/summary.json"));
  EXPECT_EQ(summary["state"], "RUN_STATE_FAILED");
  EXPECT_EQ(summary["error_message"], run.error_message());
}

TEST_F(RunRegistryTest, UnreachableServiceFailsTheRunNamingIt) {
  MakeRegistry(true, [](RunRegistryOptions& o) {
    o.driver.service_unreachable_timeout = absl::Milliseconds(100);
  });
  health_->Fail("reward:1", -1, absl::UnavailableError("connection refused"));
  const std::string run_id = Submit(SmallSpec());
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_THAT(run.error_message(),
              ::testing::StartsWith("reward_server (reward:1) is unreachable: connection refused "
                                    "(for "));
  EXPECT_TRUE(health_->AwaitCalls("reward:1", 3, absl::ZeroDuration()));
  ASSERT_TRUE(trainer_->stopped.WaitForNotificationWithTimeout(kWait));
}

// A service restarted by its supervisor is away for seconds: the run waits.
TEST_F(RunRegistryTest, OutagesShorterThanTheTimeoutAreWaitedOut) {
  MakeRegistry(true, [](RunRegistryOptions& o) {
    o.driver.service_unreachable_timeout = absl::Seconds(60);
  });
  health_->Fail("trainer:1", 50, absl::UnavailableError("connection refused"));
  const std::string run_id = Submit(SmallSpec());
  ASSERT_TRUE(health_->AwaitCalls("trainer:1", 60, kWait));
  EXPECT_EQ(registry_->Get(run_id)->state(), v1::RUN_STATE_PENDING);
}

TEST_F(RunRegistryTest, StartFailureNamesTheService) {
  trainer_->FailStart(absl::UnavailableError("connection refused"));
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_EQ(run.error_message(), "trainer (trainer:1) is unreachable: connection refused");
  EXPECT_FALSE(worker_->started.HasBeenNotified());
}

TEST_F(RunRegistryTest, CancelStopsTrainerAndWorkersAndWritesTheSummary) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  absl::StatusOr<v1::Run> cancelled = registry_->Cancel(run_id, "enough");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(cancelled->error_message(), "enough");
  ASSERT_TRUE(trainer_->stopped.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(trainer_->stop_request().run_id(), run_id);
  ASSERT_TRUE(worker_->stopped.WaitForNotificationWithTimeout(kWait));
  const nlohmann::json summary =
      nlohmann::json::parse(ReadFile(runs_dir_ + "/" + run_id + "/summary.json"));
  EXPECT_EQ(summary["state"], "RUN_STATE_CANCELLED");

  // Idempotent; a terminal run keeps its state.
  EXPECT_EQ(registry_->Cancel(run_id, "again")->error_message(), "enough");
  EXPECT_TRUE(Lease(run_id, 1).run_done());
  EXPECT_TRUE(Report(run_id, v1::TRAINER_STATE_TRAINING).stop());
  EXPECT_EQ(registry_->Cancel("run-nope", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RunRegistryTest, DefaultCancelReason) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  EXPECT_EQ(registry_->Cancel(run_id, "")->error_message(), "cancelled by user");
}

TEST_F(RunRegistryTest, AwaitUpdateBlocksUntilAChange) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  std::shared_ptr<RunDriver> driver = *registry_->Find(run_id);
  const RunDriver::Snapshot before = driver->Get();
  // Nothing happens: it times out.
  EXPECT_FALSE(driver->AwaitUpdate(before.generation, before.run.state(), absl::InfinitePast(),
                                   absl::Now() + absl::Milliseconds(50)));
  Report(run_id, v1::TRAINER_STATE_WARM_START);
  EXPECT_TRUE(driver->AwaitUpdate(before.generation, before.run.state(), absl::InfinitePast(),
                                  absl::Now() + kWait));
}

TEST_F(RunRegistryTest, ProgressIsCoalescedButStateChangesAreNot) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  std::shared_ptr<RunDriver> driver = *registry_->Find(run_id);
  Report(run_id, v1::TRAINER_STATE_WARM_START);
  const RunDriver::Snapshot seen = driver->Get();
  Report(run_id, v1::TRAINER_STATE_WARM_START, [](auto& r) { r.set_warm_start_step(1); });
  // A progress change inside the interval is held back...
  EXPECT_FALSE(driver->AwaitUpdate(seen.generation, seen.run.state(), absl::InfiniteFuture(),
                                   absl::Now() + absl::Milliseconds(50)));
  // ...a state change is not.
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  EXPECT_TRUE(driver->AwaitUpdate(seen.generation, seen.run.state(), absl::InfiniteFuture(),
                                  absl::Now() + kWait));
}

TEST_F(RunRegistryTest, SubmitWithoutServicesNamesTheMissingFlags) {
  MakeRegistry(/*with_services=*/false);
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SmallSpec();
  absl::StatusOr<v1::Run> run = registry_->Submit(request);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("--trainer-address"));
  // Validation still works without services.
  request.set_validate_only(true);
  EXPECT_TRUE(registry_->Submit(request).ok());
}

// Workers come and go: a run asking for more workers than are registered
// now is accepted and served by those that come (at most num_workers).
TEST_F(RunRegistryTest, NumWorkersCapsTheWorkersServingTheRun) {
  MakeRegistry();
  v1::RunSpec spec = SmallSpec();
  spec.mutable_rollout()->set_num_workers(2);
  const std::string run_id = Submit(spec);
  AwaitServicesStarted(run_id);
  FakeWorker second("second");
  FakeWorker third("third");
  second.Attach(workers_, worker_clock_.get());
  third.Attach(workers_, worker_clock_.get());
  AwaitHeartbeats(second, 3);
  AwaitHeartbeats(third, 3);
  EXPECT_EQ(workers_->RunWorkers(run_id).size(), 2u);
  EXPECT_NE(second.started.HasBeenNotified(), third.started.HasBeenNotified());
}

TEST_F(RunRegistryTest, RequestIdMakesSubmitIdempotent) {
  MakeRegistry();
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SmallSpec();
  request.set_request_id("once");
  const std::string first = registry_->Submit(request)->run_id();
  EXPECT_EQ(registry_->Submit(request)->run_id(), first);
  request.set_request_id("twice");
  EXPECT_NE(registry_->Submit(request)->run_id(), first);
}

TEST_F(RunRegistryTest, ListIsNewestFirstPagedAndFiltered) {
  MakeRegistry();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(Submit(SmallSpec()));
  ASSERT_TRUE(registry_->Cancel(ids[1], "").ok());

  v1::ListRunsRequest request;
  request.set_page_size(2);
  absl::StatusOr<v1::ListRunsResponse> page = registry_->List(request);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->runs_size(), 2);
  EXPECT_EQ(page->runs(0).run_id(), ids[2]);
  EXPECT_EQ(page->runs(1).run_id(), ids[1]);
  ASSERT_FALSE(page->next_page_token().empty());
  request.set_page_token(page->next_page_token());
  page = registry_->List(request);
  ASSERT_EQ(page->runs_size(), 1);
  EXPECT_EQ(page->runs(0).run_id(), ids[0]);
  EXPECT_TRUE(page->next_page_token().empty());

  v1::ListRunsRequest cancelled;
  cancelled.add_states(v1::RUN_STATE_CANCELLED);
  page = registry_->List(cancelled);
  ASSERT_EQ(page->runs_size(), 1);
  EXPECT_EQ(page->runs(0).run_id(), ids[1]);
}

// A controller stop (SIGTERM, e.g. Kubernetes rolling the pod) ends no run:
// the next controller on the runs directory re-adopts it
// (run_registry_restore_test.cc).
TEST_F(RunRegistryTest, ShutdownLeavesActiveRunsForTheNextControllerAndStopsNoService) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  registry_->Shutdown();
  const v1::Run run = *registry_->Get(run_id);
  EXPECT_EQ(run.state(), v1::RUN_STATE_PENDING);
  EXPECT_EQ(run.error_message(), "");
  EXPECT_FALSE(trainer_->stopped.HasBeenNotified());
  EXPECT_FALSE(worker_->stopped.HasBeenNotified());
  const nlohmann::json state =
      nlohmann::json::parse(ReadFile(runs_dir_ + "/" + run_id + "/state.json"));
  EXPECT_EQ(state["run"]["state"], "RUN_STATE_PENDING");
  EXPECT_FALSE(std::filesystem::exists(runs_dir_ + "/" + run_id + "/summary.json"));
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SmallSpec();
  EXPECT_EQ(registry_->Submit(request).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RunRegistryTest, RunsSubmittedWhileOneIsActiveQueueAndStartInOrder) {
  MakeRegistry();
  const std::string first = Submit(SmallSpec());
  AwaitServicesStarted(first);
  const std::string second = Submit(SmallSpec());
  const std::string third = Submit(SmallSpec());
  v1::Run run = *registry_->Get(second);
  EXPECT_EQ(run.state(), v1::RUN_STATE_QUEUED);
  EXPECT_EQ(run.queue_position(), 1);
  EXPECT_EQ(run.progress().phase(), "queued: next to start");
  run = *registry_->Get(third);
  EXPECT_EQ(run.queue_position(), 2);
  EXPECT_EQ(run.progress().phase(), "queued: 1 run(s) ahead");
  v1::ListRunsRequest queued;
  queued.add_states(v1::RUN_STATE_QUEUED);
  EXPECT_EQ(registry_->List(queued)->runs_size(), 2);
  // A queued run gets no prompts and is told to wait, not to stop.
  EXPECT_FALSE(Lease(second, 1).run_done());
  EXPECT_EQ(trainer_->starts(), 1);

  // The first one ends: the second starts, the third moves up.
  Report(first, v1::TRAINER_STATE_FINISHED);
  AwaitState(first, v1::RUN_STATE_SUCCEEDED);
  AwaitState(second, v1::RUN_STATE_PENDING);
  EXPECT_EQ(registry_->Get(second)->queue_position(), 0);
  AwaitTrainerStarts(2);
  EXPECT_EQ(trainer_->start_request().run_id(), second);
  EXPECT_EQ(registry_->Get(third)->queue_position(), 1);

  // Cancelling a queued run removes it: it never starts.
  const v1::Run cancelled = *registry_->Cancel(third, "");
  EXPECT_EQ(cancelled.state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(cancelled.queue_position(), 0);
  Report(second, v1::TRAINER_STATE_FINISHED);
  AwaitState(second, v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(trainer_->starts(), 2);
  EXPECT_EQ(registry_->Get(third)->state(), v1::RUN_STATE_CANCELLED);
}

// The run submitted right after a CancelRun starts only once the cancelled
// run's trainer and workers were stopped, so it never finds them busy.
TEST_F(RunRegistryTest, RunSubmittedRightAfterACancelStartsOnceTheServicesAreFree) {
  MakeRegistry();
  const std::string first = Submit(SmallSpec());
  AwaitServicesStarted(first);
  ASSERT_TRUE(registry_->Cancel(first, "").ok());
  const std::string second = Submit(SmallSpec());
  AwaitState(second, v1::RUN_STATE_PENDING);
  AwaitTrainerStarts(2);
  EXPECT_EQ(trainer_->stops(), 1);  // The first was stopped before the second started.
  EXPECT_EQ(trainer_->start_request().run_id(), second);
}

TEST_F(RunRegistryTest, TrainerStoppedFromOutsideFailsTheRun) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_TRAINING);
  // Another client's StopTraining: the trainer is idle, its health SERVING.
  trainer_->SetStatus(testing::IdleTrainer());
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_EQ(run.error_message(),
            "trainer (trainer:1) is no longer training this run: it reports no run in state "
            "TRAINER_STATE_IDLE (stopped by another client)");
}

TEST_F(RunRegistryTest, TrainerFailureSeenOnlyInItsStatusFailsTheRun) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  v1::TrainerStatus failed;
  failed.set_run_id(run_id);
  failed.set_state(v1::TRAINER_STATE_FAILED);
  failed.set_last_error("loss is NaN");
  trainer_->SetStatus(failed);  // Its report never arrived.
  EXPECT_EQ(AwaitState(run_id, v1::RUN_STATE_FAILED).error_message(), "trainer: loss is NaN");
}

TEST_F(RunRegistryTest, WorkerWhoseRunFailedFailsIt) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  worker_->FailRun("generation batch does not fit the memory budget");
  EXPECT_EQ(AwaitState(run_id, v1::RUN_STATE_FAILED).error_message(),
            "rollout worker fake-worker (worker:1) failed: generation batch does not fit the "
            "memory budget");
}

TEST_F(RunRegistryTest, RunWithoutProgressFailsWithWhatTheServicesReport) {
  MakeRegistry(true, [](RunRegistryOptions& o) { o.driver.stall_timeout = absl::Milliseconds(300); });
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_THAT(run.error_message(),
              ::testing::AllOf(HasSubstr("no progress for"), HasSubstr("(stall timeout 300ms)"),
                               HasSubstr("phase \"waiting for the first batch\", step 0/3"),
                               HasSubstr("the trainer reports TRAINER_STATE_WAITING_FOR_DATA")));
  ASSERT_TRUE(trainer_->stopped.WaitForNotificationWithTimeout(kWait));
}

TEST_F(RunRegistryTest, ProgressKeepsARunAlive) {
  MakeRegistry(true, [](RunRegistryOptions& o) { o.driver.stall_timeout = absl::Seconds(1); });
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  for (int step = 1; step <= 20; ++step) {
    Report(run_id, v1::TRAINER_STATE_WARM_START, [&](auto& r) { r.set_warm_start_step(step); });
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(registry_->Get(run_id)->state(), v1::RUN_STATE_WARM_START);
}

TEST_F(RunRegistryTest, TrainerBusyWithAnotherRunIsAwaitedThenNamed) {
  MakeRegistry(true, [](RunRegistryOptions& o) {
    o.driver.service_free_timeout = absl::Milliseconds(300);
  });
  v1::TrainerStatus busy;
  busy.set_run_id("run-of-someone-else");
  busy.set_state(v1::TRAINER_STATE_TRAINING);
  trainer_->SetStatus(busy);
  const std::string run_id = Submit(SmallSpec());
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_EQ(run.error_message(),
            "the trainer (trainer:1) with run run-of-someone-else (TRAINER_STATE_TRAINING) is "
            "still busy after 300ms; stop that run first (sluice runs cancel, or StopTraining)");
  EXPECT_EQ(trainer_->starts(), 0);
}

TEST_F(RunRegistryTest, RunStartsWhenTheBusyTrainerLetsGo) {
  MakeRegistry();
  v1::TrainerStatus busy;
  busy.set_run_id("run-of-someone-else");
  busy.set_state(v1::TRAINER_STATE_CHECKPOINTING);
  trainer_->SetStatus(busy);
  const std::string run_id = Submit(SmallSpec());
  EXPECT_EQ(AwaitPhase(run_id, "waiting for the trainer"),
            "waiting for the trainer (trainer:1) with run run-of-someone-else "
            "(TRAINER_STATE_CHECKPOINTING)");
  EXPECT_EQ(trainer_->starts(), 0);
  trainer_->SetStatus(testing::IdleTrainer());
  AwaitServicesStarted(run_id);
  EXPECT_EQ(trainer_->start_request().run_id(), run_id);
}

TEST_F(RunRegistryTest, UnknownVerifierIsRefusedAtSubmitWithTheServersList) {
  MakeRegistry();
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SmallSpec();
  v1::WeightedVerifier* verifier = request.mutable_spec()->mutable_reward()->add_verifiers();
  verifier->set_name("nosuch");
  absl::StatusOr<v1::Run> run = registry_->Submit(request);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run.status().message(),
            "reward.verifiers[0].name: unknown verifier \"nosuch\" (the reward server at reward:1 "
            "offers code, exact_match, format, length, math)");
  verifier->set_name("mathh");
  EXPECT_THAT(std::string(registry_->Submit(request).status().message()),
              HasSubstr("did you mean \"math\"?"));
  // A verifier only this server offers is fine.
  reward_->SetVerifiers({"math", "my_judge"});
  verifier->set_name("my_judge");
  EXPECT_TRUE(registry_->Submit(request).ok());
  reward_->Fail(absl::UnavailableError("connection refused"));
  run = registry_->Submit(request);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(run.status().message()),
              HasSubstr("cannot check reward.verifiers: the reward server at reward:1 did not "
                        "answer ListVerifiers: connection refused"));
}

TEST_F(RunRegistryTest, RunThatDoesNotFitAServicesMemoryBudgetIsRefused) {
  MakeRegistry();
  worker_->SetMemoryBudget(64 << 10);
  AwaitHeartbeats(*worker_, 2);
  buffer_->SetMemoryBudget(1 << 10);
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SmallSpec();
  absl::StatusOr<v1::Run> run = registry_->Submit(request);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(run.status().message());
  EXPECT_THAT(message, HasSubstr("rollout worker: the run needs about"));
  EXPECT_THAT(message, HasSubstr("more than the 64.0 KiB budget of the rollout worker "
                                 "fake-worker at worker:1"));
  EXPECT_THAT(message, HasSubstr("replay buffer: the run needs about"));
  EXPECT_THAT(message, Not(HasSubstr("trainer:")));
  EXPECT_EQ(trainer_->starts(), 0);
  request.set_validate_only(true);  // Validation asks the services too.
  EXPECT_EQ(registry_->Submit(request).status().code(), absl::StatusCode::kInvalidArgument);
  worker_->SetMemoryBudget(int64_t{1} << 30);
  AwaitHeartbeats(*worker_, 2);
  buffer_->SetMemoryBudget(int64_t{1} << 30);
  request.set_validate_only(false);
  EXPECT_TRUE(registry_->Submit(request).ok());
}

// The services check their own budgets with what the controller measured at
// submit, so that they agree with its estimate rather than assume prompts as
// long as the context.
TEST_F(RunRegistryTest, TheServicesAreGivenTheRunsMeasuredPromptAndSequenceLengths) {
  MakeRegistry();
  absl::StatusOr<run::RunMemoryEstimate> estimate =
      EstimateSpecMemory(ResolveDefaults(SmallSpec()));
  ASSERT_TRUE(estimate.ok()) << estimate.status();
  ASSERT_GT(estimate->max_prompt_tokens, 0);
  ASSERT_GT(estimate->sequence_tokens, estimate->max_prompt_tokens);
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  EXPECT_EQ(trainer_->start_request().max_prompt_tokens(), estimate->max_prompt_tokens);
  EXPECT_EQ(worker_->start_request().max_prompt_tokens(), estimate->max_prompt_tokens);
  EXPECT_EQ(buffer_->configure_request().max_sequence_tokens(), estimate->sequence_tokens);
}

// Issue 14: what the run survives.

TEST_F(RunRegistryTest, ALostWorkersPromptsAndSlotsGoToTheOthers) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  AwaitState(run_id, v1::RUN_STATE_TRAINING);
  v1::LeasePromptsRequest lease;
  lease.set_run_id(run_id);
  lease.set_worker_id("fake-worker");
  lease.set_worker_incarnation(1);
  lease.set_max_prompts(3);
  const v1::LeasePromptsResponse held = *registry_->LeasePrompts(lease);
  ASSERT_EQ(held.prompts_size(), 3);

  worker_->Detach();  // kill -9: no more heartbeats.
  FakeWorker other("other");
  other.Attach(workers_, worker_clock_.get());
  const v1::Run run = AwaitRun(run_id, [](const v1::Run& r) {
    return r.summary().recovery().workers_lost() == 1 && r.progress().workers_live() == 1 &&
           r.summary().recovery().workers_joined() == 2;
  });
  EXPECT_EQ(run.state(), v1::RUN_STATE_TRAINING);  // One worker is enough.
  EXPECT_EQ(run.summary().recovery().workers_joined(), 2);
  EXPECT_THAT(buffer_->released(), ::testing::ElementsAre(run_id + "/fake-worker"));
  // Its prompts go out again at once, before their lease would expire.
  lease.set_worker_id("other");
  const v1::LeasePromptsResponse reissued = *registry_->LeasePrompts(lease);
  ASSERT_EQ(reissued.prompts_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(reissued.prompts(i).prompt_id(), held.prompts(i).prompt_id());
  }
  EXPECT_EQ(AwaitRun(run_id, [](const v1::Run& r) {
              return r.summary().recovery().prompts_reissued() == 3;
            }).summary().recovery().prompts_reissued(),
            3);
}

// A worker the trainer's rollout verification quarantined (issue 19): its
// prompt leases go back to the feed at once and its LeasePrompts are
// PERMISSION_DENIED naming the quarantine; other workers are not touched.
TEST_F(RunRegistryTest, AQuarantinedWorkersPromptsAreRevokedAndItsLeasesRefused) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  AwaitState(run_id, v1::RUN_STATE_TRAINING);
  v1::LeasePromptsRequest lease;
  lease.set_run_id(run_id);
  lease.set_worker_id("rogue");
  lease.set_worker_incarnation(1);
  lease.set_max_prompts(3);
  const v1::LeasePromptsResponse held = *registry_->LeasePrompts(lease);
  ASSERT_EQ(held.prompts_size(), 3);

  Report(run_id, v1::TRAINER_STATE_TRAINING, [](v1::ReportTrainerProgressRequest& request) {
    request.add_quarantined_worker_ids("rogue");
  });
  const absl::StatusOr<v1::LeasePromptsResponse> refused = registry_->LeasePrompts(lease);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("rollout worker rogue is quarantined for run " + run_id));
  // Its prompts go to the others at once, before their lease would expire.
  lease.set_worker_id("honest");
  const v1::LeasePromptsResponse reissued = *registry_->LeasePrompts(lease);
  ASSERT_EQ(reissued.prompts_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(reissued.prompts(i).prompt_id(), held.prompts(i).prompt_id());
  }
}

TEST_F(RunRegistryTest, ARestartedWorkerIsReadmittedAndCounted) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  worker_->Restart(/*incarnation=*/2);
  const v1::Run run = AwaitRun(run_id, [](const v1::Run& r) {
    return r.summary().recovery().restarts().count("rollout_worker") > 0 &&
           r.summary().recovery().workers_joined() == 2;
  });
  EXPECT_EQ(run.summary().recovery().restarts().at("rollout_worker"), 1);
  EXPECT_EQ(run.progress().workers_live(), 1);
  EXPECT_EQ(run.state(), v1::RUN_STATE_PENDING);
}

TEST_F(RunRegistryTest, TooFewWorkersForTooLongFailsTheRun) {
  MakeRegistry(true, [](RunRegistryOptions& o) { o.driver.worker_grace = absl::Milliseconds(300); });
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  worker_->Detach();
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_THAT(run.error_message(),
              ::testing::AllOf(HasSubstr("no rollout worker serves the run (rollout.min_workers = "
                                         "1) for"),
                               HasSubstr("start workers with --controller-address")));
}

TEST_F(RunRegistryTest, AWorkerGivenUpBySupervisorFailsTheRunOnlyBelowMinWorkers) {
  MakeRegistry();
  FakeWorker second("second");
  second.Attach(workers_, worker_clock_.get());
  const std::string run_id = Submit(SmallSpec());
  AwaitRun(run_id, [](const v1::Run& r) { return r.progress().workers_live() == 2; });

  second.Detach();
  v1::ReportServiceFailureRequest failure;
  failure.set_service("rollout_worker");
  failure.set_worker_id("second");
  failure.set_description("killed by signal 9 (SIGKILL); gave up after 5 restarts in 2m");
  EXPECT_THAT(registry_->ReportServiceFailure(failure)->failed_run_ids(), ::testing::IsEmpty());
  EXPECT_EQ(registry_->Get(run_id)->state(), v1::RUN_STATE_PENDING);

  worker_->Detach();
  failure.set_worker_id("fake-worker");
  // Once the last worker is lost, the next reconcile fails the run, naming
  // what the supervisor said.
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_THAT(run.error_message(),
              HasSubstr("given up by their supervisor: second: killed by signal 9 (SIGKILL); "
                        "gave up after 5 restarts in 2m"));
}

TEST_F(RunRegistryTest, ASingletonGivenUpBySupervisorFailsTheRunSayingHowItDied) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  v1::ReportServiceFailureRequest failure;
  failure.set_service("trainer");
  failure.set_description("(pid 42) was killed by signal 9 (SIGKILL); gave up after 5 restarts");
  EXPECT_THAT(registry_->ReportServiceFailure(failure)->failed_run_ids(),
              ::testing::ElementsAre(run_id));
  const v1::Run run = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_EQ(run.error_message(),
            "trainer (pid 42) was killed by signal 9 (SIGKILL); gave up after 5 restarts");
  const nlohmann::json summary =
      nlohmann::json::parse(ReadFile(runs_dir_ + "/" + run_id + "/summary.json"));
  EXPECT_EQ(summary["error_message"], run.error_message());
  failure.set_service("nope");
  EXPECT_EQ(registry_->ReportServiceFailure(failure).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RunRegistryTest, ARestartedTrainerIsAskedToResumeAndItsRedoneStepsCounted) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_TRAINING, [](auto& r) {
    r.mutable_step()->set_step(1);
    r.mutable_step()->set_policy_version(1);
    r.mutable_step()->set_groups(2);
  });
  trainer_->Restart(/*incarnation=*/2, /*resume_step=*/0, /*steps_redone=*/1);
  AwaitTrainerStarts(2);
  EXPECT_EQ(trainer_->start_request().run_id(), run_id);
  const v1::Run run = AwaitRun(run_id, [](const v1::Run& r) {
    return r.summary().recovery().trainer_resumes() == 1;
  });
  EXPECT_EQ(run.summary().recovery().restarts().at("trainer"), 1);
  EXPECT_EQ(run.summary().recovery().trainer_steps_redone(), 1);
  // Its reports of the redone step are not counted twice.
  Report(run_id, v1::TRAINER_STATE_TRAINING, [](auto& r) {
    r.mutable_step()->set_step(1);
    r.mutable_step()->set_policy_version(1);
    r.mutable_step()->set_groups(2);
  });
  EXPECT_EQ(registry_->Get(run_id)->summary().groups_trained(), 2);
  EXPECT_EQ(registry_->Get(run_id)->state(), v1::RUN_STATE_TRAINING);
}

TEST_F(RunRegistryTest, ATrainerThatCannotResumeFailsTheRunSayingWhy) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  trainer_->FailStart(absl::FailedPreconditionError("no checkpoint of the run"));
  trainer_->Restart(2, -1, 0);
  EXPECT_THAT(AwaitState(run_id, v1::RUN_STATE_FAILED).error_message(),
              HasSubstr("no checkpoint of the run"));
}

TEST_F(RunRegistryTest, BufferAndRewardServerRestartsAreCounted) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  AwaitState(run_id, v1::RUN_STATE_TRAINING);
  ASSERT_TRUE(trainer_->AwaitStatusCalls(trainer_->starts() + 5, kWait));
  buffer_->SetIncarnation(7);
  reward_->SetIncarnation(9);
  const v1::Run run = AwaitRun(run_id, [](const v1::Run& r) {
    return r.summary().recovery().restarts().count("replay_buffer") > 0 &&
           r.summary().recovery().restarts().count("reward_server") > 0;
  });
  EXPECT_EQ(run.summary().recovery().restarts().at("replay_buffer"), 1);
  EXPECT_EQ(run.summary().recovery().restarts().at("reward_server"), 1);
  EXPECT_EQ(run.state(), v1::RUN_STATE_TRAINING);
}

TEST_F(RunRegistryTest, ABufferThatLostTheRunFailsIt) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  buffer_->FailStats(absl::NotFoundError("no run " + run_id));
  EXPECT_THAT(AwaitState(run_id, v1::RUN_STATE_FAILED).error_message(),
              HasSubstr("replay_buffer (buffer:1) no longer knows the run"));
}

TEST_F(RunRegistryTest, LateGroupsRefusedAreCounted) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  v1::ReportRolloutProgressRequest report;
  report.set_run_id(run_id);
  report.set_worker_id("fake-worker");
  report.set_worker_incarnation(1);
  report.set_late_groups_refused(2);
  ASSERT_TRUE(registry_->ReportRolloutProgress(report).ok());
  ASSERT_TRUE(registry_->ReportRolloutProgress(report).ok());
  EXPECT_EQ(registry_->Get(run_id)->summary().recovery().late_groups_refused(), 4);
}

// A run that no worker serves says so in GetRun (Run.conditions: what, since
// when, and what happens next), and stops saying it once one serves it.
TEST_F(RunRegistryTest, ARunWithoutWorkersShowsItWhileItLasts) {
  MakeRegistry(true, [](RunRegistryOptions& o) { o.driver.worker_grace = absl::Minutes(10); });
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  worker_->Detach();
  const v1::Run waiting = AwaitRun(run_id, [](const v1::Run& r) {
    return RunConditions::Find(r, "no_worker", "rollout_worker") != nullptr;
  });
  const v1::RunCondition* condition = RunConditions::Find(waiting, "no_worker", "rollout_worker");
  ASSERT_NE(condition, nullptr);
  EXPECT_THAT(condition->message(),
              ::testing::AllOf(HasSubstr("no rollout worker serves the run (rollout.min_workers "
                                         "= 1) since "),
                               HasSubstr("the run fails if none comes within 10m "
                                         "(--worker-grace-ms)")));
  EXPECT_GT(condition->since().seconds(), 0);
  EXPECT_FALSE(IsTerminal(waiting.state()));
  worker_->Attach(workers_);
  AwaitRun(run_id, [](const v1::Run& r) { return r.conditions_size() == 0; });
}

// A service that stops answering its health check (SIGSTOP, a hang) shows in
// the run's status, which one and since when, until it answers again; one
// that refuses connections shows as unreachable.
TEST_F(RunRegistryTest, AServiceTheRunWaitsForIsShownUntilItAnswers) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  health_->Fail("trainer:1", -1, absl::DeadlineExceededError("Deadline Exceeded"));
  health_->Fail("reward:1", -1, absl::UnavailableError("connection refused"));
  const v1::Run waiting = AwaitRun(run_id, [](const v1::Run& r) {
    return RunConditions::Find(r, "service_unresponsive", "trainer") != nullptr &&
           RunConditions::Find(r, "service_unreachable", "reward_server") != nullptr;
  });
  const v1::RunCondition* trainer = RunConditions::Find(waiting, "service_unresponsive", "trainer");
  ASSERT_NE(trainer, nullptr);
  EXPECT_THAT(trainer->message(),
              ::testing::AllOf(HasSubstr("trainer (trainer:1) has not answered its health check "
                                         "since "),
                               HasSubstr("Deadline Exceeded"),
                               HasSubstr("--service-unreachable-timeout-ms")));
  EXPECT_GT(trainer->since().seconds(), 0);
  EXPECT_THAT(RunConditions::Find(waiting, "service_unreachable", "reward_server")->message(),
              HasSubstr("reward_server (reward:1) cannot be reached since "));
  EXPECT_EQ(RunConditions::Find(waiting, "service_unresponsive", "replay_buffer"), nullptr);
  health_->Fail("trainer:1", 0, absl::OkStatus());
  health_->Fail("reward:1", 0, absl::OkStatus());
  const v1::Run answered =
      AwaitRun(run_id, [](const v1::Run& r) { return r.conditions_size() == 0; });
  EXPECT_FALSE(IsTerminal(answered.state()));
}

// One run holds the services; the queue behind it is bounded, with an error
// that says so, and has room again once a queued run is cancelled.
TEST_F(RunRegistryTest, TheQueueIsBoundedWithAnErrorThatSaysSo) {
  MakeRegistry(true, [](RunRegistryOptions& o) { o.max_queued_runs = 2; });
  const std::string active = Submit(SmallSpec());
  const std::string first = Submit(SmallSpec());
  Submit(SmallSpec());
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SmallSpec();
  const absl::StatusOr<v1::Run> refused = registry_->Submit(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::AllOf(HasSubstr("the queue is full: 2 runs wait behind run " + active),
                               HasSubstr("--max-queued-runs 2")));
  ASSERT_TRUE(registry_->Cancel(first, "").ok());
  EXPECT_TRUE(registry_->Submit(request).ok());
}

// The trainer's resumes and redone steps come from its own reports, each
// incarnation's counted once, whether or not the controller's status checks
// ever saw it (a trainer killed again within a second was missed, and
// summary.json said 2 resumes after 3).
TEST_F(RunRegistryTest, TrainerResumesAndRedoneStepsAreCountedFromItsReports) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  const auto report = [&](uint64_t incarnation, std::optional<int64_t> resumed, int64_t redone) {
    Report(run_id, v1::TRAINER_STATE_TRAINING, [&](v1::ReportTrainerProgressRequest& r) {
      r.set_trainer_incarnation(incarnation);
      if (resumed.has_value()) r.set_resumed_from_step(*resumed);
      r.set_steps_redone(redone);
    });
  };
  // The first incarnation (the one the status checks see too) and three
  // that only ever report, one of them twice and one late.
  report(1, std::nullopt, 0);
  report(100, 10, 1);
  report(100, 10, 3);
  report(200, 20, 2);
  report(300, 20, 1);
  report(300, 20, 1);  // A repeated report counts nothing more.
  report(200, 20, 2);  // Nor a late one of an older incarnation.
  const v1::RecoveryStats recovery = registry_->Get(run_id)->summary().recovery();
  EXPECT_EQ(recovery.trainer_resumes(), 3);
  EXPECT_EQ(recovery.trainer_steps_redone(), 3 + 2 + 1);
  EXPECT_EQ(recovery.restarts().at("trainer"), 3);
}

// A buffer that starts on its data directory counts its starts there: every
// restart is counted, including those no status check saw (five kills in a
// row were counted three).
TEST_F(RunRegistryTest, BufferRestartsAreCountedFromItsStartCount) {
  buffer_->SetStarts(3);
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  AwaitState(run_id, v1::RUN_STATE_TRAINING);
  buffer_->SetIncarnation(50);
  buffer_->SetStarts(8);  // Five starts since, one incarnation seen.
  const v1::Run run = AwaitRun(run_id, [](const v1::Run& r) {
    return r.summary().recovery().restarts().count("replay_buffer") > 0;
  });
  EXPECT_EQ(run.summary().recovery().restarts().at("replay_buffer"), 5);
}

// Specs as big as their bounds allow (~150 KB each): ListRuns stops a page
// before 2 MiB, so that it reaches a client that takes 4 MiB a message (a
// page of 50 such runs was 7 MB), and the pages together hold every run.
TEST_F(RunRegistryTest, ListRunsPagesStayUnderTwoMebibytesAndHoldEveryRun) {
  MakeRegistry();
  v1::RunSpec big = SmallSpec();
  for (int i = 0; i < 64; ++i) {
    (*big.mutable_labels())[absl::StrCat("label-", i)] = std::string(256, 'v');
  }
  for (int i = 0; i < 32; ++i) {
    v1::WeightedVerifier* verifier = big.mutable_reward()->add_verifiers();
    verifier->set_name("format");
    (*verifier->mutable_params())["format_regex"] = std::string(4000, 'a');
  }
  ASSERT_TRUE(ValidateRunSpecSizes(big).ok());
  constexpr int kRuns = 20;
  std::set<std::string> submitted;
  for (int i = 0; i < kRuns; ++i) submitted.insert(Submit(big));
  std::set<std::string> listed;
  v1::ListRunsRequest request;
  request.set_page_size(1000);
  int pages = 0;
  do {
    absl::StatusOr<v1::ListRunsResponse> page = registry_->List(request);
    ASSERT_TRUE(page.ok()) << page.status();
    ++pages;
    EXPECT_LE(page->ByteSizeLong(), size_t{2} << 20);
    ASSERT_GT(page->runs_size(), 0);
    for (const v1::Run& run : page->runs()) listed.insert(run.run_id());
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty() && pages < kRuns);
  EXPECT_GT(pages, 1);
  EXPECT_EQ(listed, submitted);
}

TEST_F(RunRegistryTest, ListWorkersShowsRegisteredWorkers) {
  MakeRegistry();
  const v1::ListWorkersResponse workers = registry_->ListWorkers();
  ASSERT_EQ(workers.workers_size(), 1);
  EXPECT_EQ(workers.workers(0).worker_id(), "fake-worker");
  EXPECT_TRUE(workers.workers(0).live());
}

const v1::RunCondition* FindCondition(const v1::Run& run, const std::string& kind) {
  for (const v1::RunCondition& condition : run.conditions()) {
    if (condition.kind() == kind) return &condition;
  }
  return nullptr;
}

// The runs directory full (its metrics.jsonl /dev/full) while the run
// trains: the run is paused, says why, and goes on once there is room, with
// the step it could not write then written.
TEST_F(RunRegistryTest, ARunWhoseRecordCannotBeWrittenIsPausedSayingWhyAndResumesOnceItCan) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA, [](auto& r) { r.set_policy_version(0); });
  AwaitState(run_id, v1::RUN_STATE_TRAINING);
  const std::string metrics = runs_dir_ + "/" + run_id + "/metrics.jsonl";
  ASSERT_EQ(::symlink("/dev/full", metrics.c_str()), 0);
  Report(run_id, v1::TRAINER_STATE_TRAINING, [](auto& r) {
    r.set_policy_version(1);
    r.mutable_step()->set_step(1);
    r.mutable_step()->set_policy_version(1);
  });
  const v1::Run paused =
      AwaitRun(run_id, [](const v1::Run& run) { return FindCondition(run, "record_not_durable"); });
  const v1::RunCondition* condition = FindCondition(paused, "record_not_durable");
  ASSERT_NE(condition, nullptr);
  EXPECT_EQ(condition->service(), "controller");
  EXPECT_THAT(condition->message(), HasSubstr(metrics));
  EXPECT_THAT(condition->message(), HasSubstr("No space left on device"));
  EXPECT_THAT(condition->message(), HasSubstr("the run is paused (no new prompts)"));
  EXPECT_EQ(paused.state(), v1::RUN_STATE_TRAINING);
  const v1::LeasePromptsResponse refused = Lease(run_id, 2);
  EXPECT_EQ(refused.prompts_size(), 0);
  EXPECT_GT(refused.retry_after_ms(), 0);

  ASSERT_TRUE(std::filesystem::remove(metrics));  // Space freed.
  AwaitRun(run_id,
           [](const v1::Run& run) { return FindCondition(run, "record_not_durable") == nullptr; });
  EXPECT_EQ(Lease(run_id, 2).prompts_size(), 2);
  const std::vector<nlohmann::json> lines = ReadJsonLines(metrics);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["step"], 1);
}

TEST_F(RunRegistryTest, ARunWhoseRecordStaysUnwritableFailsSayingWhy) {
  MakeRegistry(true, [](RunRegistryOptions& options) {
    options.driver.record_unwritable_timeout = absl::Milliseconds(50);
  });
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA, [](auto& r) { r.set_policy_version(0); });
  AwaitState(run_id, v1::RUN_STATE_TRAINING);
  const std::string dir = runs_dir_ + "/" + run_id;
  ASSERT_EQ(::symlink("/dev/full", (dir + "/evals.jsonl").c_str()), 0);
  Report(run_id, v1::TRAINER_STATE_EVALUATING,
         [](auto& r) { *r.mutable_eval() = Eval("during", 0, 0.5); });
  const v1::Run failed = AwaitState(run_id, v1::RUN_STATE_FAILED);
  EXPECT_THAT(failed.error_message(), HasSubstr("the run's record in " + dir));
  EXPECT_THAT(failed.error_message(), HasSubstr("could not be written for"));
}

// Cancelled while summary.json cannot be written (a directory in the way of
// its temporary file): the driver keeps it and writes it once it can, and
// only then lets the next run start.
TEST_F(RunRegistryTest, ACancelledRunGetsItsSummaryOnceItCanBeWritten) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  const std::string dir = runs_dir_ + "/" + run_id;
  ASSERT_TRUE(std::filesystem::create_directory(dir + "/summary.json.tmp"));
  ASSERT_EQ(registry_->Cancel(run_id, "enough")->state(), v1::RUN_STATE_CANCELLED);
  std::shared_ptr<RunDriver> driver = *registry_->Find(run_id);
  EXPECT_FALSE(driver->WaitUntilStopped(absl::Milliseconds(200)));
  EXPECT_FALSE(std::filesystem::exists(dir + "/summary.json"));

  ASSERT_TRUE(std::filesystem::remove(dir + "/summary.json.tmp"));
  EXPECT_TRUE(driver->WaitUntilStopped(kWait));
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["state"], "RUN_STATE_CANCELLED");
  EXPECT_EQ(summary["error_message"], "enough");
}

TEST_F(RunRegistryTest, ARunsDirectoryThatCannotRecordARunRefusesItNamingTheDirectory) {
  std::ofstream(runs_dir_) << "not a directory";
  MakeRegistry();
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SmallSpec();
  const absl::StatusOr<v1::Run> run = registry_->Submit(request);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable) << run.status();
  EXPECT_THAT(run.status().message(),
              HasSubstr("the runs directory " + runs_dir_ + " (--runs-dir) cannot record"));
  std::filesystem::remove(runs_dir_);
}

TEST_F(RunRegistryTest, InsertsAWorkerReportsRefusedShowUntilItInsertsAgain) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  v1::ReportRolloutProgressRequest report;
  report.set_run_id(run_id);
  report.set_worker_id("fake-worker");
  report.set_worker_incarnation(1);
  report.set_insert_error(
      "RESOURCE_EXHAUSTED: InsertGroups: the connection of ipv4:127.0.0.1:5 already has 256 "
      "streams open on this service");
  ASSERT_TRUE(registry_->ReportRolloutProgress(report).ok());
  const v1::Run refused = *registry_->Get(run_id);
  const v1::RunCondition* condition = FindCondition(refused, "inserts_refused");
  ASSERT_NE(condition, nullptr);
  EXPECT_EQ(condition->service(), "replay_buffer");
  EXPECT_THAT(condition->message(), HasSubstr("rollout worker fake-worker"));
  EXPECT_THAT(condition->message(), HasSubstr("(buffer:1)"));
  EXPECT_THAT(condition->message(), HasSubstr("256 streams open"));

  report.clear_insert_error();
  report.set_groups_inserted(1);
  ASSERT_TRUE(registry_->ReportRolloutProgress(report).ok());
  EXPECT_EQ(FindCondition(*registry_->Get(run_id), "inserts_refused"), nullptr);
}

TEST_F(RunRegistryTest, ABufferThatCannotWriteShowsInTheRunUntilItCan) {
  MakeRegistry();
  const std::string run_id = Submit(SmallSpec());
  AwaitServicesStarted(run_id);
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA, [](auto& r) { r.set_policy_version(0); });
  AwaitState(run_id, v1::RUN_STATE_TRAINING);
  buffer_->SetWriteError("WAL append of LSN 9 at offset 4096: No space left on device");
  const v1::Run waiting = AwaitRun(
      run_id, [](const v1::Run& run) { return FindCondition(run, "buffer_cannot_write"); });
  const v1::RunCondition* condition = FindCondition(waiting, "buffer_cannot_write");
  ASSERT_NE(condition, nullptr);
  EXPECT_EQ(condition->service(), "replay_buffer");
  EXPECT_THAT(condition->message(), HasSubstr("replay_buffer (buffer:1) cannot write"));
  EXPECT_THAT(condition->message(), HasSubstr("No space left on device"));
  buffer_->SetWriteError("");
  AwaitRun(run_id,
           [](const v1::Run& run) { return FindCondition(run, "buffer_cannot_write") == nullptr; });
}

}  // namespace
}  // namespace sluice::controller
