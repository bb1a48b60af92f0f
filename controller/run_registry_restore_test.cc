// A controller that stops or dies and is started again on the same runs
// directory: RunRegistry::Restore against fake services. A controller killed
// -9 is simulated by copying the runs directory while the first registry is
// still running (what a kill leaves on disk: nothing flushed), a SIGTERM by
// destroying the first registry (its Shutdown).
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "controller/fake_service_clients.h"
#include "controller/worker_registry.h"
#include "controller/run_registry.h"

namespace sluice::controller {
namespace {

using testing::FakeBuffer;
using testing::FakeClock;
using testing::FakeHealth;
using testing::FakeTrainer;
using testing::FakeWorker;

using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

std::vector<v1::Prompt> Pool(int n) {
  std::vector<v1::Prompt> prompts;
  for (int i = 0; i < n; ++i) {
    v1::Prompt& prompt = prompts.emplace_back();
    prompt.set_prompt_id(absl::StrCat("arith-", i));
    prompt.set_text(absl::StrCat(i, "+1="));
  }
  return prompts;
}

v1::RunSpec SmallSpec() {
  v1::RunSpec spec;
  spec.set_name("small");
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->mutable_arithmetic();
  spec.mutable_algorithm()->set_group_size(4);
  spec.mutable_algorithm()->set_batch_size_groups(2);
  spec.mutable_algorithm()->set_max_staleness(2);
  spec.mutable_algorithm()->set_total_steps(10);
  return spec;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Ids(const v1::LeasePromptsResponse& lease) {
  std::vector<std::string> ids;
  for (const v1::Prompt& prompt : lease.prompts()) ids.push_back(prompt.prompt_id());
  return ids;
}

class RunRegistryRestoreTest : public ::testing::Test {
 protected:
  RunRegistryRestoreTest() {
    runs_dir_ = ::testing::TempDir() + "/restore-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(runs_dir_);
    std::filesystem::remove_all(runs_dir_ + "-killed");
  }

  // A controller on `runs_dir` (default: the test's), restoring what is
  // there; the services (fakes) are the same across controllers.
  std::unique_ptr<RunRegistry> StartController(std::string runs_dir = "",
                                               RunRegistryRestore* report = nullptr,
                                               bool with_services = true) {
    RunRegistryOptions options;
    options.runs_dir = runs_dir.empty() ? runs_dir_ : runs_dir;
    options.driver.health_check_interval = absl::Milliseconds(2);
    options.driver.service_free_poll = absl::Milliseconds(2);
    options.driver.clock = [this] { return clock_.Now(); };
    options.driver.prompt_source = [](const v1::RunSpec&) { return Pool(20); };
    // state.json only at state changes, so that a kill loses the counters
    // since and the progress must come back from metrics.jsonl.
    options.driver.state_flush_interval = absl::InfiniteDuration();
    ServiceClients clients;
    if (with_services) {
      clients.trainer = trainer_;
      clients.replay_buffer = buffer_;
      // Every controller has its own (empty) worker registry: workers
      // register with a new one by heartbeating.
      clients.workers = std::make_shared<WorkerRegistry>(
          WorkerRegistryOptions{.heartbeat_interval = absl::Milliseconds(5)});
      clients.reward_server_address = "reward:1";
      clients.health = health_;
    }
    auto registry = std::make_unique<RunRegistry>(options, clients);
    registry->SetControllerAddress("controller:1");
    absl::StatusOr<RunRegistryRestore> restored = registry->Restore();
    if (with_services) worker_->Attach(clients.workers);
    EXPECT_TRUE(restored.ok()) << restored.status();
    if (report != nullptr && restored.ok()) *report = *restored;
    return registry;
  }

  std::string Submit(RunRegistry& registry, const std::string& request_id = "") {
    v1::SubmitRunRequest request;
    *request.mutable_spec() = SmallSpec();
    request.set_request_id(request_id);
    absl::StatusOr<v1::Run> run = registry.Submit(request);
    EXPECT_TRUE(run.ok()) << run.status();
    return run.ok() ? run->run_id() : "";
  }

  v1::Run AwaitState(RunRegistry& registry, const std::string& run_id, v1::RunState state) {
    std::shared_ptr<RunDriver> driver = *registry.Find(run_id);
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

  void Report(RunRegistry& registry, const std::string& run_id, v1::TrainerState state,
              std::function<void(v1::ReportTrainerProgressRequest&)> fill = nullptr) {
    v1::ReportTrainerProgressRequest request;
    request.set_run_id(run_id);
    request.set_state(state);
    request.set_policy_version(-1);
    if (fill) fill(request);
    trainer_->SetRunState(run_id, state);
    absl::StatusOr<v1::ReportTrainerProgressResponse> response =
        registry.ReportTrainerProgress(request);
    ASSERT_TRUE(response.ok());
    EXPECT_FALSE(response->stop());
  }

  void Step(RunRegistry& registry, const std::string& run_id, int64_t step, double reward) {
    Report(registry, run_id, v1::TRAINER_STATE_TRAINING, [&](auto& r) {
      r.set_policy_version(step);
      v1::TrainingStepMetrics& m = *r.mutable_step();
      m.set_step(step);
      m.set_policy_version(step);
      m.set_reward_mean(reward);
      m.set_groups(2);
      m.set_tokens_trained(100);
    });
  }

  // Submits a run and takes it to TRAINING.
  std::string TrainingRun(RunRegistry& registry) {
    const std::string run_id = Submit(registry, "req-1");
    EXPECT_TRUE(trainer_->AwaitStarts(1, kWait));
    Report(registry, run_id, v1::TRAINER_STATE_WAITING_FOR_DATA,
           [](auto& r) { r.set_policy_version(0); });
    AwaitState(registry, run_id, v1::RUN_STATE_TRAINING);
    return run_id;
  }

  v1::LeasePromptsResponse Lease(RunRegistry& registry, const std::string& run_id,
                                 const std::string& worker, int max_prompts) {
    v1::LeasePromptsRequest request;
    request.set_run_id(run_id);
    request.set_worker_id(worker);
    request.set_worker_incarnation(1);
    request.set_max_prompts(max_prompts);
    return *registry.LeasePrompts(request);
  }

  void Complete(RunRegistry& registry, const std::string& run_id, const std::string& worker,
                const std::vector<std::string>& ids, int64_t tokens = 0) {
    v1::ReportRolloutProgressRequest request;
    request.set_run_id(run_id);
    request.set_worker_id(worker);
    request.set_worker_incarnation(1);
    for (const std::string& id : ids) request.add_completed_prompt_ids(id);
    request.set_tokens_generated(tokens);
    request.set_groups_inserted(static_cast<int64_t>(ids.size()));
    ASSERT_TRUE(registry.ReportRolloutProgress(request).ok());
  }

  // What a kill -9 leaves on disk: the runs directory as it is now, copied
  // while the controller goes on.
  std::string KilledCopy() {
    const std::string copy = runs_dir_ + "-killed";
    std::filesystem::copy(runs_dir_, copy, std::filesystem::copy_options::recursive);
    return copy;
  }

  std::string runs_dir_;
  FakeClock clock_;
  std::shared_ptr<FakeTrainer> trainer_ = std::make_shared<FakeTrainer>();
  std::shared_ptr<FakeWorker> worker_ = std::make_shared<FakeWorker>();
  std::shared_ptr<FakeBuffer> buffer_ = std::make_shared<FakeBuffer>();
  std::shared_ptr<FakeHealth> health_ = std::make_shared<FakeHealth>();
};

TEST_F(RunRegistryRestoreTest, AKilledControllersActiveRunIsReadoptedAndGoesOn) {
  std::unique_ptr<RunRegistry> first = StartController();
  const std::string run_id = TrainingRun(*first);
  const v1::LeasePromptsResponse lease = Lease(*first, run_id, "worker-a", 4);
  ASSERT_EQ(lease.prompts_size(), 4);
  const std::vector<std::string> leased = Ids(lease);
  Complete(*first, run_id, "worker-a", {leased[0], leased[1]}, 1000);
  Step(*first, run_id, 1, 0.25);
  Step(*first, run_id, 2, 0.5);
  Report(*first, run_id, v1::TRAINER_STATE_EVALUATING, [](auto& r) {
    r.mutable_eval()->set_phase("periodic");
    r.mutable_eval()->set_step(2);
    r.mutable_eval()->set_accuracy(0.6);
  });
  // Killed while appending step 3's line.
  const std::string copy = KilledCopy();
  { std::ofstream(copy + "/" + run_id + "/metrics.jsonl", std::ios::app) << R"({"step": 3, "lo)"; }

  RunRegistryRestore report;
  std::unique_ptr<RunRegistry> second = StartController(copy, &report);
  EXPECT_EQ(report.adopted, 1);
  // Adopted as it was, not started again from PENDING: the buffer and the
  // trainer are told again (the trainer answers OK, or resumes).
  ASSERT_TRUE(trainer_->AwaitStarts(2, kWait));
  EXPECT_EQ(trainer_->start_request().run_id(), run_id);
  EXPECT_EQ(trainer_->start_request().endpoints().controller_address(), "controller:1");
  EXPECT_EQ(buffer_->configure_request().run_id(), run_id);
  v1::Run run = *second->Get(run_id);
  EXPECT_EQ(run.state(), v1::RUN_STATE_TRAINING);
  EXPECT_EQ(run.progress().step(), 2);
  EXPECT_EQ(run.progress().policy_version(), 2);
  EXPECT_DOUBLE_EQ(run.progress().reward_mean(), 0.5);
  EXPECT_EQ(run.summary().groups_trained(), 4);
  EXPECT_DOUBLE_EQ(run.progress().latest_eval_accuracy(), 0.6);
  EXPECT_EQ(run.summary().recovery().controller_readoptions(), 1);
  EXPECT_EQ(run.summary().recovery().restarts().at("controller"), 1);
  EXPECT_EQ(run.progress().phase(), "re-adopted after a controller restart");

  // The feed goes on: the two prompts handed out and not completed come
  // first, under their ids; then fresh ones never handed out before.
  const v1::LeasePromptsResponse after = Lease(*second, run_id, "worker-b", 6);
  ASSERT_EQ(after.prompts_size(), 6);
  EXPECT_EQ(after.prompts(0).prompt_id(), leased[2]);
  EXPECT_EQ(after.prompts(1).prompt_id(), leased[3]);
  for (int i = 2; i < 6; ++i) {
    EXPECT_THAT(leased, ::testing::Not(::testing::Contains(after.prompts(i).prompt_id())));
  }
  EXPECT_NE(after.lease_id(), lease.lease_id());
  // worker-a's late report of a prompt it completed before the restart is
  // ignored; the one it had not completed still counts.
  Complete(*second, run_id, "worker-a", {leased[0], leased[2]});
  EXPECT_EQ(second->Get(run_id)->summary().recovery().prompts_reissued(), 2);

  // The run goes on to its end; the step after the kill continues the log.
  Step(*second, run_id, 3, 0.75);
  Report(*second, run_id, v1::TRAINER_STATE_FINISHED);
  run = AwaitState(*second, run_id, v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(run.summary().steps(), 3);
  const std::string dir = copy + "/" + run_id;
  const nlohmann::json summary = nlohmann::json::parse(ReadFile(dir + "/summary.json"));
  EXPECT_EQ(summary["state"], "RUN_STATE_SUCCEEDED");
  EXPECT_EQ(summary["recovery"]["controller_readoptions"], 1);
  EXPECT_EQ(summary["recovery"]["prompts_reissued"], 2);
  int lines = 0;
  for (const char c : ReadFile(dir + "/metrics.jsonl")) lines += c == '\n';
  EXPECT_EQ(lines, 3);  // Steps 1, 2, 3: the torn line is gone.
}

TEST_F(RunRegistryRestoreTest, AStoppedControllerEndsNoRunAndStopsNoService) {
  std::unique_ptr<RunRegistry> first = StartController();
  const std::string run_id = TrainingRun(*first);
  std::shared_ptr<RunDriver> driver = *first->Find(run_id);
  const RunDriver::Snapshot seen = driver->Get();
  absl::Notification woken;
  std::thread watcher([&] {
    // A watcher blocked for long is woken by the stop.
    EXPECT_TRUE(driver->AwaitUpdate(seen.generation, seen.run.state(), absl::InfiniteFuture(),
                                    absl::Now() + absl::Hours(1)));
    woken.Notify();
  });
  EXPECT_FALSE(woken.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  first->Shutdown();
  EXPECT_TRUE(woken.WaitForNotificationWithTimeout(kWait));
  watcher.join();
  EXPECT_EQ(first->Get(run_id)->state(), v1::RUN_STATE_TRAINING);
  EXPECT_EQ(trainer_->stops(), 0);
  EXPECT_FALSE(worker_->stopped.HasBeenNotified());
  EXPECT_FALSE(std::filesystem::exists(runs_dir_ + "/" + run_id + "/summary.json"));
  first.reset();

  std::unique_ptr<RunRegistry> second = StartController();
  EXPECT_EQ(second->Get(run_id)->state(), v1::RUN_STATE_TRAINING);
  ASSERT_TRUE(trainer_->AwaitStarts(2, kWait));
  second.reset();
  // Every restart is counted, and the count survives.
  std::unique_ptr<RunRegistry> third = StartController();
  EXPECT_EQ(third->Get(run_id)->summary().recovery().controller_readoptions(), 2);
  ASSERT_TRUE(trainer_->AwaitStarts(3, kWait));
  // Only a cancel ends it.
  ASSERT_TRUE(third->Cancel(run_id, "enough").ok());
  ASSERT_TRUE(trainer_->stopped.WaitForNotificationWithTimeout(kWait));
  third.reset();
  std::unique_ptr<RunRegistry> fourth = StartController();
  EXPECT_EQ(fourth->Get(run_id)->state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(fourth->Get(run_id)->error_message(), "enough");
  EXPECT_EQ(trainer_->starts(), 3);  // Not started again once ended.
}

TEST_F(RunRegistryRestoreTest, EndedRunsAreListedAndQueuedRunsQueueAgainInOrder) {
  std::unique_ptr<RunRegistry> first = StartController();
  const std::string done = TrainingRun(*first);
  Step(*first, done, 1, 0.5);
  Report(*first, done, v1::TRAINER_STATE_FINISHED);
  const v1::Run finished = AwaitState(*first, done, v1::RUN_STATE_SUCCEEDED);
  ASSERT_TRUE((*first->Find(done))->WaitUntilStopped(kWait));
  const std::string active = Submit(*first);
  ASSERT_TRUE(trainer_->AwaitStarts(2, kWait));
  const std::string next = Submit(*first, "req-next");
  const std::string last = Submit(*first);
  const std::string cancelled = Submit(*first);
  ASSERT_TRUE(first->Cancel(cancelled, "").ok());
  first.reset();

  std::unique_ptr<RunRegistry> second = StartController();
  v1::ListRunsRequest request;
  absl::StatusOr<v1::ListRunsResponse> list = second->List(request);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->runs_size(), 5);
  EXPECT_EQ(list->runs(0).run_id(), cancelled);
  EXPECT_EQ(list->runs(1).run_id(), last);
  EXPECT_EQ(list->runs(4).run_id(), done);
  const v1::Run restored = *second->Get(done);
  EXPECT_EQ(restored.state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(restored.summary().steps(), 1);
  EXPECT_EQ(restored.finished_at().seconds(), finished.finished_at().seconds());
  EXPECT_EQ(second->Get(cancelled)->state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(second->Get(next)->queue_position(), 1);
  EXPECT_EQ(second->Get(last)->queue_position(), 2);
  // A retried submit finds its run across the restart.
  EXPECT_EQ(Submit(*second, "req-next"), next);

  // The queue moves on as before: once the adopted run ends, `next` starts.
  ASSERT_TRUE(trainer_->AwaitStarts(3, kWait));  // The re-adoption.
  Report(*second, active, v1::TRAINER_STATE_FINISHED);
  AwaitState(*second, active, v1::RUN_STATE_SUCCEEDED);
  AwaitState(*second, next, v1::RUN_STATE_PENDING);
  ASSERT_TRUE(trainer_->AwaitStarts(4, kWait));
  EXPECT_EQ(trainer_->start_request().run_id(), next);
  EXPECT_EQ(second->Get(last)->queue_position(), 1);
  // New runs do not take an old id's place in the order.
  const std::string newest = Submit(*second);
  EXPECT_EQ(second->Get(newest)->queue_position(), 2);
}

// A queued run recorded before specs had bounds (here: a 20 MB name written
// into its spec.json) cannot be sent to any service: when its turn comes it
// fails saying why, instead of holding the services and the runs behind it,
// and ListRuns shows it without its spec.
TEST_F(RunRegistryRestoreTest, ARecordedSpecOverItsBoundsFailsSayingWhyAndTheQueueMovesOn) {
  std::unique_ptr<RunRegistry> first = StartController();
  const std::string active = Submit(*first);
  ASSERT_TRUE(trainer_->AwaitStarts(1, kWait));
  const std::string oversized = Submit(*first);
  const std::string last = Submit(*first);
  first.reset();
  const std::string spec_path = runs_dir_ + "/" + oversized + "/spec.json";
  nlohmann::json spec = nlohmann::json::parse(ReadFile(spec_path));
  spec["name"] = std::string(20 << 20, 'n');
  std::ofstream(spec_path) << spec.dump();

  std::unique_ptr<RunRegistry> second = StartController();
  absl::StatusOr<v1::ListRunsResponse> list = second->List(v1::ListRunsRequest());
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->runs_size(), 3);
  EXPECT_EQ(list->runs(1).run_id(), oversized);
  EXPECT_FALSE(list->runs(1).has_spec());
  EXPECT_LT(list->ByteSizeLong(), size_t{1} << 20);
  ASSERT_TRUE(trainer_->AwaitStarts(2, kWait));  // The re-adoption.
  Report(*second, active, v1::TRAINER_STATE_FINISHED);
  AwaitState(*second, active, v1::RUN_STATE_SUCCEEDED);
  const v1::Run failed = AwaitState(*second, oversized, v1::RUN_STATE_FAILED);
  EXPECT_THAT(failed.error_message(),
              HasSubstr("the run's spec cannot be sent to its services: name: must be at most 256 "
                        "bytes, got 20971520"));
  AwaitState(*second, last, v1::RUN_STATE_PENDING);
  ASSERT_TRUE(trainer_->AwaitStarts(3, kWait));
  EXPECT_EQ(trainer_->start_request().run_id(), last);
}

TEST_F(RunRegistryRestoreTest, AnUnreadableRecordFailsThatRunOnlyAndSaysWhy) {
  std::unique_ptr<RunRegistry> first = StartController();
  const std::string good = TrainingRun(*first);
  first.reset();
  // Another run whose state.json was damaged, and a directory that holds no
  // run at all (quickstart keeps its stack/ here).
  const std::string bad_dir = runs_dir_ + "/run-20260101-000000-dead";
  std::filesystem::create_directories(bad_dir);
  std::filesystem::copy_file(runs_dir_ + "/" + good + "/spec.json", bad_dir + "/spec.json");
  { std::ofstream(bad_dir + "/state.json") << "{\"format\": 1, \"ru"; }
  std::filesystem::create_directories(runs_dir_ + "/stack/logs");

  RunRegistryRestore report;
  std::unique_ptr<RunRegistry> second = StartController("", &report);
  EXPECT_EQ(report.unreadable, 1);
  EXPECT_EQ(report.adopted, 1);
  const v1::Run bad = *second->Get("run-20260101-000000-dead");
  EXPECT_EQ(bad.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(bad.error_message(),
              HasSubstr("cannot restore the run after a controller restart: state.json is "
                        "unreadable"));
  EXPECT_TRUE(second->Cancel(bad.run_id(), "").ok());  // A no-op, not a crash.
  EXPECT_EQ(ReadFile(bad_dir + "/state.json"), "{\"format\": 1, \"ru");  // Left for inspection.
  EXPECT_EQ(second->Get(good)->state(), v1::RUN_STATE_TRAINING);
  EXPECT_EQ(second->List(v1::ListRunsRequest())->runs_size(), 2);
}

// An operator restarting the controller without its service flags must not
// cost the run: it waits, as recorded, for a controller that has them.
TEST_F(RunRegistryRestoreTest, AControllerWithoutTheServicesLeavesTheRunForOneWithThem) {
  std::unique_ptr<RunRegistry> first = StartController();
  const std::string run_id = TrainingRun(*first);
  first.reset();
  const std::string state = ReadFile(runs_dir_ + "/" + run_id + "/state.json");

  RunRegistryRestore report;
  std::unique_ptr<RunRegistry> bare = StartController("", &report, /*with_services=*/false);
  EXPECT_EQ(report.not_resumed, 1);
  EXPECT_EQ(report.adopted, 0);
  EXPECT_EQ(bare->Get(run_id)->state(), v1::RUN_STATE_TRAINING);
  bare.reset();
  EXPECT_EQ(trainer_->starts(), 1);
  EXPECT_EQ(ReadFile(runs_dir_ + "/" + run_id + "/state.json"), state);

  std::unique_ptr<RunRegistry> proper = StartController("", &report);
  EXPECT_EQ(report.adopted, 1);
  ASSERT_TRUE(trainer_->AwaitStarts(2, kWait));
  EXPECT_EQ(proper->Get(run_id)->summary().recovery().controller_readoptions(), 1);
}

TEST_F(RunRegistryRestoreTest, RestoreIsOnceAndBeforeAnySubmit) {
  std::unique_ptr<RunRegistry> registry = StartController();
  EXPECT_EQ(registry->Restore().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sluice::controller
