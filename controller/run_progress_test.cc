#include "controller/run_progress.h"

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "controller/run_conditions.h"
#include "controller/run_driver.h"
#include "gtest/gtest.h"

namespace sluice::controller {
namespace {

const absl::Time kCreated = absl::FromUnixSeconds(1767225600);  // 2026-01-01
constexpr absl::Duration kWindow = absl::Seconds(5);

// A run just submitted: QUEUED, nothing measured.
RunRecord NewRecord() {
  v1::Run run;
  run.set_run_id("run-1");
  SetTimestamp(kCreated, run.mutable_created_at());
  return NewRunRecord(std::move(run), "", 1, RunSizes{});
}

// Folds reports into `run` as the driver does, with a run clock that the
// test moves.
class RunProgressTest : public ::testing::Test {
 protected:
  RunProgressTest() : record_(NewRecord()), progress_(record_, kWindow), run_(record_.run) {}

  v1::ReportRolloutProgressRequest Rollout(const std::string& worker, int64_t tokens,
                                           int64_t groups) {
    v1::ReportRolloutProgressRequest request;
    request.set_worker_id(worker);
    request.set_tokens_generated(tokens);
    request.set_groups_inserted(groups);
    return request;
  }

  static v1::TrainingStepMetrics Step(int64_t step, double reward, int64_t policy_version) {
    v1::TrainingStepMetrics metrics;
    metrics.set_step(step);
    metrics.set_reward_mean(reward);
    metrics.set_policy_version(policy_version);
    metrics.set_groups(4);
    metrics.set_tokens_trained(1000);
    metrics.set_staleness_max(policy_version == 0 ? 0 : 1);
    return metrics;
  }

  int64_t Restarts(const std::string& service) const {
    const auto& restarts = run_.summary().recovery().restarts();
    auto it = restarts.find(service);
    return it == restarts.end() ? 0 : it->second;
  }

  RunRecord record_;
  RunProgress progress_;
  v1::Run run_;
  absl::Time now_ = kCreated;
};

TEST_F(RunProgressTest, StepsFoldIntoProgressAndSummary) {
  progress_.NoteTransition(v1::RUN_STATE_PENDING, v1::RUN_STATE_TRAINING, now_);
  now_ += absl::Seconds(10);
  ASSERT_TRUE(progress_.ApplyStep(Step(1, 0.25, 0), now_, &run_).has_value());
  now_ += absl::Seconds(10);
  ASSERT_TRUE(progress_.ApplyStep(Step(2, 0.75, 1), now_, &run_).has_value());

  EXPECT_EQ(run_.progress().step(), 2);
  EXPECT_DOUBLE_EQ(run_.progress().reward_mean(), 0.75);
  EXPECT_EQ(run_.progress().groups_trained(), 8);
  EXPECT_EQ(run_.progress().policy_version(), 1);
  EXPECT_EQ(run_.summary().steps(), 2);
  EXPECT_EQ(run_.summary().tokens_trained(), 2000);
  EXPECT_EQ(run_.summary().max_observed_staleness(), 1);
  EXPECT_EQ(run_.summary().weight_versions(), 2);
  EXPECT_DOUBLE_EQ(run_.summary().final_reward_mean(), 0.5);
  EXPECT_DOUBLE_EQ(run_.summary().rl_seconds(), 20);
  EXPECT_EQ(progress_.last_step(), 2);
}

TEST_F(RunProgressTest, RepeatedOrRedoneStepKeepsTheFirst) {
  ASSERT_TRUE(progress_.ApplyStep(Step(1, 0.25, 0), now_, &run_).has_value());
  ASSERT_TRUE(progress_.ApplyStep(Step(2, 0.75, 1), now_, &run_).has_value());
  // A trainer resumed from the checkpoint of step 1 redoes step 2.
  EXPECT_FALSE(progress_.ApplyStep(Step(2, 0.0, 1), now_, &run_).has_value());
  EXPECT_FALSE(progress_.ApplyStep(Step(1, 0.0, 0), now_, &run_).has_value());
  EXPECT_DOUBLE_EQ(run_.progress().reward_mean(), 0.75);
  EXPECT_EQ(run_.summary().groups_trained(), 8);
}

TEST_F(RunProgressTest, ThroughputCountsTheTokensReportedWithinTheWindow) {
  EXPECT_DOUBLE_EQ(progress_.TokensPerSecond(now_), 0);
  progress_.ApplyRolloutReport(Rollout("w1", 1000, 1), now_, &run_);
  now_ += absl::Seconds(2);
  progress_.ApplyRolloutReport(Rollout("w2", 500, 1), now_, &run_);
  EXPECT_DOUBLE_EQ(progress_.TokensPerSecond(now_), 1500.0 / 5);
  // The step records the throughput as of its report.
  std::optional<v1::TrainingStepMetrics> step = progress_.ApplyStep(Step(1, 0.5, 0), now_, &run_);
  ASSERT_TRUE(step.has_value());
  EXPECT_DOUBLE_EQ(step->rollout_tokens_per_second(), 1500.0 / 5);
  // The first report leaves the window 5 s after it was made.
  EXPECT_DOUBLE_EQ(progress_.TokensPerSecond(kCreated + absl::Seconds(5)), 500.0 / 5);
  EXPECT_DOUBLE_EQ(progress_.TokensPerSecond(kCreated + absl::Seconds(8)), 0);
  // A snapshot shows it, and a terminal state freezes it at zero.
  progress_.FillLiveFigures(now_, &run_);
  EXPECT_DOUBLE_EQ(run_.progress().generated_tokens_per_second(), 1500.0 / 5);
  progress_.FreezeFigures(now_, &run_);
  EXPECT_DOUBLE_EQ(run_.progress().generated_tokens_per_second(), 0);
}

TEST_F(RunProgressTest, RolloutReportsAddTokensGroupsAndLateRefusals) {
  RunProgress::RolloutChange change =
      progress_.ApplyRolloutReport(Rollout("w1", 100, 2), now_, &run_);
  EXPECT_TRUE(change.generated);
  EXPECT_FALSE(change.late_groups_refused);
  v1::ReportRolloutProgressRequest late = Rollout("w1", 0, 0);
  late.set_late_groups_refused(3);
  change = progress_.ApplyRolloutReport(late, now_, &run_);
  EXPECT_FALSE(change.generated);
  EXPECT_TRUE(change.late_groups_refused);
  // Negative counts (a confused worker) add nothing.
  change = progress_.ApplyRolloutReport(Rollout("w1", -50, -1), now_, &run_);
  EXPECT_FALSE(change.generated);

  EXPECT_EQ(run_.summary().tokens_generated(), 100);
  EXPECT_EQ(run_.summary().groups_generated(), 2);
  EXPECT_EQ(run_.progress().groups_generated(), 2);
  EXPECT_EQ(run_.summary().recovery().late_groups_refused(), 3);
}

TEST_F(RunProgressTest, EvaluationIsKeptOncePerPhaseAndStep) {
  v1::EvalResult before;
  before.set_phase("before");
  before.set_step(0);
  before.set_accuracy(0.25);
  EXPECT_TRUE(RunProgress::ApplyEval(before, &run_));
  before.set_accuracy(0.5);  // Evaluated again by a resumed trainer.
  EXPECT_FALSE(RunProgress::ApplyEval(before, &run_));
  v1::EvalResult after;
  after.set_phase("after");
  after.set_step(10);
  after.set_accuracy(0.75);
  EXPECT_TRUE(RunProgress::ApplyEval(after, &run_));

  EXPECT_EQ(run_.summary().evals_size(), 2);
  EXPECT_DOUBLE_EQ(run_.summary().eval_before(), 0.25);
  EXPECT_DOUBLE_EQ(run_.summary().eval_after(), 0.75);
  EXPECT_EQ(run_.progress().latest_eval_step(), 10);
}

TEST_F(RunProgressTest, PolicyVersionAndWarmStartStepOnlyGrow) {
  EXPECT_TRUE(progress_.NotePolicyVersion(0, &run_));
  EXPECT_TRUE(progress_.NotePolicyVersion(3, &run_));
  EXPECT_FALSE(progress_.NotePolicyVersion(2, &run_));
  EXPECT_EQ(run_.progress().policy_version(), 3);
  EXPECT_EQ(run_.summary().weight_versions(), 4);

  EXPECT_TRUE(RunProgress::NoteWarmStartStep(5, &run_));
  EXPECT_FALSE(RunProgress::NoteWarmStartStep(5, &run_));
  EXPECT_EQ(run_.summary().warm_start_steps(), 5);
}

TEST_F(RunProgressTest, TrainerStateChangesAreProgress) {
  EXPECT_TRUE(progress_.NoteTrainerState(v1::TRAINER_STATE_LOADING));
  EXPECT_FALSE(progress_.NoteTrainerState(v1::TRAINER_STATE_LOADING));
  EXPECT_TRUE(progress_.NoteTrainerState(v1::TRAINER_STATE_TRAINING));
}

TEST_F(RunProgressTest, PhaseTimesFromTheTransitions) {
  progress_.NoteTransition(v1::RUN_STATE_QUEUED, v1::RUN_STATE_PENDING,
                           kCreated + absl::Seconds(1));
  progress_.NoteTransition(v1::RUN_STATE_PENDING, v1::RUN_STATE_WARM_START,
                           kCreated + absl::Seconds(3));
  progress_.NoteWarmStartSeconds(kCreated + absl::Seconds(7), &run_);
  EXPECT_DOUBLE_EQ(run_.summary().warm_start_seconds(), 4);
  progress_.NoteTransition(v1::RUN_STATE_WARM_START, v1::RUN_STATE_TRAINING,
                           kCreated + absl::Seconds(10));

  progress_.FillLiveFigures(kCreated + absl::Seconds(20), &run_);
  EXPECT_DOUBLE_EQ(run_.progress().elapsed_seconds(), 17);  // Since it left PENDING.
  EXPECT_DOUBLE_EQ(run_.summary().wall_seconds(), 20);      // Since it was submitted.
  progress_.FreezeFigures(kCreated + absl::Seconds(30), &run_);
  EXPECT_DOUBLE_EQ(run_.progress().elapsed_seconds(), 27);
  EXPECT_DOUBLE_EQ(run_.summary().wall_seconds(), 30);

  RunRecord record;
  progress_.FillRecord(&record);
  EXPECT_EQ(record.left_pending_at, kCreated + absl::Seconds(3));
  EXPECT_EQ(record.warm_start_started_at, kCreated + absl::Seconds(3));
  EXPECT_EQ(record.rl_started_at, kCreated + absl::Seconds(10));
}

TEST_F(RunProgressTest, NoWarmStartTimeBeforeTheWarmStart) {
  progress_.NoteWarmStartSeconds(now_ + absl::Seconds(5), &run_);
  EXPECT_DOUBLE_EQ(run_.summary().warm_start_seconds(), 0);
  progress_.FillLiveFigures(now_ + absl::Seconds(5), &run_);
  EXPECT_DOUBLE_EQ(run_.progress().elapsed_seconds(), 0);  // Still queued.
}

TEST_F(RunProgressTest, TrainerRestartsResumesAndRedoneStepsAreCountedOnce) {
  RunProgress::TrainerChange change = progress_.NoteTrainer(1, false, 0, &run_);
  EXPECT_FALSE(change.restarted);  // The first incarnation seen.
  EXPECT_FALSE(change.counted);
  change = progress_.NoteTrainer(2, true, 3, &run_);
  EXPECT_TRUE(change.restarted);
  EXPECT_TRUE(change.counted);
  // Its status and its reports say the same again: nothing new.
  change = progress_.NoteTrainer(2, true, 3, &run_);
  EXPECT_FALSE(change.restarted);
  EXPECT_FALSE(change.counted);
  // It redid more steps; a late answer of the old one counts nothing.
  EXPECT_TRUE(progress_.NoteTrainer(2, true, 5, &run_).counted);
  change = progress_.NoteTrainer(1, true, 9, &run_);
  EXPECT_TRUE(change.counted);  // Incarnation 1 had not resumed yet.
  EXPECT_FALSE(change.restarted);

  EXPECT_EQ(Restarts("trainer"), 1);
  EXPECT_EQ(run_.summary().recovery().trainer_resumes(), 2);
  EXPECT_EQ(run_.summary().recovery().trainer_steps_redone(), 14);
  RunRecord record;
  progress_.FillRecord(&record);
  EXPECT_EQ(record.incarnations.at("trainer"), 2u);
  EXPECT_EQ(record.incarnations.at("trainer.resumed"), 1u);
  EXPECT_EQ(record.incarnations.at("trainer.steps_redone"), 5u);
  EXPECT_EQ(progress_.NoteTrainer(0, true, 100, &run_).counted, false);  // Does not say.
}

TEST_F(RunProgressTest, RestoredRecordCountsNothingTwice) {
  ASSERT_TRUE(progress_.ApplyStep(Step(4, 0.5, 3), now_, &run_).has_value());
  progress_.NoteTrainer(7, false, 0, &run_);
  progress_.NoteTrainer(8, true, 2, &run_);
  RunRecord record = record_;
  record.run = run_;
  progress_.FillRecord(&record);

  // A controller restarted on the same runs directory.
  RunProgress restored(record, kWindow);
  v1::Run run = record.run;
  EXPECT_EQ(restored.last_step(), 4);
  EXPECT_FALSE(restored.ApplyStep(Step(4, 0.5, 3), now_, &run).has_value());
  EXPECT_FALSE(restored.NotePolicyVersion(3, &run));
  RunProgress::TrainerChange change = restored.NoteTrainer(8, true, 2, &run);
  EXPECT_FALSE(change.restarted);
  EXPECT_FALSE(change.counted);
  // One it cannot tell apart from one counted before: nothing.
  change = restored.NoteTrainer(6, true, 1, &run);
  EXPECT_FALSE(change.restarted);
  EXPECT_FALSE(change.counted);
  EXPECT_TRUE(restored.NoteTrainer(9, false, 0, &run).restarted);
  EXPECT_EQ(run.summary().recovery().restarts().at("trainer"), 2);
  EXPECT_EQ(run.summary().recovery().trainer_resumes(), 1);
}

TEST_F(RunProgressTest, ServiceIncarnationsCountNewerOnesAsRestarts) {
  RunProgress::IncarnationChange change = progress_.NoteIncarnation("reward_server", 10, &run_);
  EXPECT_TRUE(change.recorded);
  EXPECT_EQ(change.restarts, 0);                                  // The first one seen.
  change = progress_.NoteIncarnation("reward_server", 9, &run_);  // An older process.
  EXPECT_FALSE(change.recorded);
  change = progress_.NoteIncarnation("reward_server", 0, &run_);  // Does not say.
  EXPECT_FALSE(change.recorded);
  change = progress_.NoteIncarnation("reward_server", 11, &run_);
  EXPECT_TRUE(change.recorded);
  EXPECT_EQ(change.restarts, 1);
  EXPECT_EQ(Restarts("reward_server"), 1);
}

TEST_F(RunProgressTest, BufferRestartsFromItsStartCount) {
  // The count as the run begins is where its own count begins.
  RunProgress::IncarnationChange change = progress_.NoteBufferStarts(100, 4, &run_);
  EXPECT_TRUE(change.recorded);
  EXPECT_EQ(change.restarts, 0);
  EXPECT_FALSE(progress_.NoteBufferStarts(100, 4, &run_).recorded);
  // Two starts, one of them between two checks.
  change = progress_.NoteBufferStarts(102, 6, &run_);
  EXPECT_EQ(change.restarts, 2);
  // A replaced volume: a new beginning, no restart.
  change = progress_.NoteBufferStarts(103, 1, &run_);
  EXPECT_TRUE(change.recorded);
  EXPECT_EQ(change.restarts, 0);
  EXPECT_EQ(Restarts("replay_buffer"), 2);
  RunRecord record;
  progress_.FillRecord(&record);
  EXPECT_EQ(record.incarnations.at("replay_buffer"), 103u);
  EXPECT_EQ(record.incarnations.at("replay_buffer.starts"), 1u);
}

TEST_F(RunProgressTest, BufferWithoutDataDirectoryRestartsByIncarnation) {
  EXPECT_EQ(progress_.NoteBufferStarts(100, 0, &run_).restarts, 0);
  EXPECT_EQ(progress_.NoteBufferStarts(101, 0, &run_).restarts, 1);
  EXPECT_EQ(Restarts("replay_buffer"), 1);
}

TEST_F(RunProgressTest, RecoveryCountsOfWorkersFeedAndController) {
  RunProgress::NoteWorkerJoined(&run_);
  RunProgress::NoteWorkerJoined(&run_);
  RunProgress::NoteWorkerLost(&run_);
  RunProgress::AddRestarts("rollout_worker", 1, &run_);
  RunProgress::NoteReadoption(&run_);
  EXPECT_TRUE(RunProgress::NoteWorkersLive(2, &run_));
  EXPECT_FALSE(RunProgress::NoteWorkersLive(2, &run_));
  PromptFeedStats feed;
  feed.reissued = 3;
  feed.leases_expired = 2;
  EXPECT_TRUE(RunProgress::NoteReissuedPrompts(feed, &run_));
  EXPECT_FALSE(RunProgress::NoteReissuedPrompts(feed, &run_));
  RunProgress::FillFeedFigures(feed, &run_);

  const v1::RecoveryStats& recovery = run_.summary().recovery();
  EXPECT_EQ(recovery.workers_joined(), 2);
  EXPECT_EQ(recovery.workers_lost(), 1);
  EXPECT_EQ(Restarts("rollout_worker"), 1);
  EXPECT_EQ(recovery.controller_readoptions(), 1);
  EXPECT_EQ(Restarts("controller"), 1);
  EXPECT_EQ(run_.progress().workers_live(), 2);
  EXPECT_EQ(recovery.prompts_reissued(), 3);
  EXPECT_EQ(recovery.prompt_leases_expired(), 2);
}

TEST_F(RunProgressTest, EvictionsFromTheBufferStatistics) {
  v1::BufferStats stats;
  const auto add = [&stats](v1::EvictionReason reason, int64_t groups) {
    v1::EvictionCount* count = stats.add_evictions();
    count->set_reason(reason);
    count->set_groups(groups);
  };
  add(v1::EVICTION_REASON_STALE, 3);
  add(v1::EVICTION_REASON_CAPACITY, 2);
  add(v1::EVICTION_REASON_MAX_TIMES_SAMPLED, 6);  // Used up, not evicted.
  EXPECT_EQ(RunProgress::GroupsEvicted(stats), 5);
  EXPECT_TRUE(RunProgress::NoteGroupsEvicted(stats, &run_));
  EXPECT_FALSE(RunProgress::NoteGroupsEvicted(stats, &run_));
  EXPECT_EQ(run_.progress().groups_evicted(), 5);
  RunProgress::ApplyFinalBufferStats(stats, &run_);
  EXPECT_EQ(run_.summary().groups_evicted_stale(), 3);
  EXPECT_EQ(run_.progress().groups_evicted(), 5);
}

TEST_F(RunProgressTest, QuarantinedWhenReportedOrMarkedInTheSummary) {
  EXPECT_TRUE(progress_.Quarantine("rogue"));
  EXPECT_FALSE(progress_.Quarantine("rogue"));
  EXPECT_TRUE(progress_.IsQuarantined("rogue", run_));
  EXPECT_FALSE(progress_.IsQuarantined("honest", run_));
  v1::WorkerVerification* marked = run_.mutable_summary()->mutable_verification()->add_workers();
  marked->set_worker_id("restored-rogue");
  marked->set_quarantined(true);
  EXPECT_TRUE(progress_.IsQuarantined("restored-rogue", run_));
}

TEST_F(RunProgressTest, InsertRefusalsShowUntilInsertingAgainOrExpired) {
  v1::ReportRolloutProgressRequest refused = Rollout("w1", 0, 0);
  refused.set_insert_error("disk full");
  EXPECT_TRUE(progress_.NoteInsertOutcome(refused, "buffer:1", now_, now_, &run_));
  refused.set_worker_id("w2");
  EXPECT_TRUE(
      progress_.NoteInsertOutcome(refused, "buffer:1", now_ + absl::Seconds(30), now_, &run_));
  const v1::RunCondition* condition = RunConditions::Find(run_, "inserts_refused", "replay_buffer");
  ASSERT_NE(condition, nullptr);
  EXPECT_EQ(condition->message(),
            "rollout worker w1: the replay buffer (buffer:1) refuses its inserts: disk full "
            "(and 1 other worker(s))");

  // w1 inserts again; w2 goes quiet and expires.
  EXPECT_TRUE(progress_.NoteInsertOutcome(Rollout("w1", 10, 1), "buffer:1", now_, now_, &run_));
  EXPECT_FALSE(progress_.ExpireInsertRefusals(now_ + absl::Seconds(30), "buffer:1", now_, &run_));
  ASSERT_NE(RunConditions::Find(run_, "inserts_refused", "replay_buffer"), nullptr);
  EXPECT_TRUE(progress_.ExpireInsertRefusals(now_ + absl::Seconds(31), "buffer:1", now_, &run_));
  EXPECT_EQ(RunConditions::Find(run_, "inserts_refused", "replay_buffer"), nullptr);
}

}  // namespace
}  // namespace sluice::controller
