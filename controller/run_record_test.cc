// The run record: state.json's round trip, and a run rebuilt from its
// directory as a controller killed -9 leaves it.
#include "controller/run_record.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "controller/run_files.h"

namespace sluice::controller {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

v1::RunSpec Spec() {
  v1::RunSpec spec;
  spec.set_name("record");
  spec.set_seed(9);
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_algorithm()->set_total_steps(100);
  spec.mutable_algorithm()->set_max_staleness(2);
  return spec;
}

v1::TrainingStepMetrics Step(int64_t step, double reward, int64_t staleness_max) {
  v1::TrainingStepMetrics metrics;
  metrics.set_step(step);
  metrics.set_policy_version(step);
  metrics.set_reward_mean(reward);
  metrics.set_groups(2);
  metrics.set_tokens_trained(100);
  metrics.set_staleness_max(staleness_max);
  metrics.set_loss(0.5 / static_cast<double>(step));
  return metrics;
}

v1::EvalResult Eval(const std::string& phase, int64_t step, double accuracy) {
  v1::EvalResult eval;
  eval.set_phase(phase);
  eval.set_step(step);
  eval.set_accuracy(accuracy);
  return eval;
}

class RunRecordTest : public ::testing::Test {
 protected:
  RunRecordTest() {
    runs_dir_ = ::testing::TempDir() + "/record-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(runs_dir_);
    files_ = std::make_unique<RunFiles>(*RunFiles::Create(runs_dir_, "run-1"));
  }

  // A TRAINING run at step 3 whose state.json was last written then.
  RunRecord TrainingRecord() {
    v1::Run run;
    run.set_run_id("run-1");
    *run.mutable_spec() = Spec();
    run.mutable_created_at()->set_seconds(1767225600);
    RunRecord record = NewRunRecord(run, "cli-42", 7, RunSizes{11, 29});
    record.run.set_state(v1::RUN_STATE_TRAINING);
    record.run.mutable_summary()->set_tokens_generated(5000);
    record.run.mutable_summary()->set_groups_generated(9);
    v1::RecoveryStats& recovery = *record.run.mutable_summary()->mutable_recovery();
    (*recovery.mutable_restarts())["trainer"] = 2;
    recovery.set_controller_readoptions(1);
    recovery.set_prompts_reissued(4);
    record.left_pending_at = absl::FromUnixSeconds(1767225610);
    record.warm_start_started_at = absl::FromUnixSeconds(1767225611);
    record.rl_started_at = absl::FromUnixSeconds(1767225620) + absl::Nanoseconds(5);
    record.last_step = 3;
    record.max_policy_version = 3;
    record.recent_step_rewards = {0.1, 0.2, 0.3};
    record.incarnations = {{"replay_buffer", 1764000000123456789ull}, {"reward_server", 7}};
    return record;
  }

  std::string runs_dir_;
  std::unique_ptr<RunFiles> files_;
};

TEST_F(RunRecordTest, StateRoundTripsEverythingButTheSpecAndEvals) {
  RunRecord record = TrainingRecord();
  *record.run.mutable_summary()->add_evals() = Eval("before", 0, 0.4);
  absl::StatusOr<RunRecord> decoded = DecodeRunState(EncodeRunState(record));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->request_id, "cli-42");
  EXPECT_EQ(decoded->sequence, 7);
  EXPECT_EQ(decoded->sizes.max_prompt_tokens, 11);
  EXPECT_EQ(decoded->sizes.max_sequence_tokens, 29);
  EXPECT_EQ(decoded->left_pending_at, record.left_pending_at);
  EXPECT_EQ(decoded->warm_start_started_at, record.warm_start_started_at);
  EXPECT_EQ(decoded->rl_started_at, record.rl_started_at);
  EXPECT_EQ(decoded->last_step, 3);
  EXPECT_EQ(decoded->max_policy_version, 3);
  EXPECT_THAT(decoded->recent_step_rewards, ::testing::ElementsAre(0.1, 0.2, 0.3));
  EXPECT_EQ(decoded->incarnations.at("replay_buffer"), 1764000000123456789ull);
  EXPECT_EQ(decoded->incarnations.at("reward_server"), 7u);
  // The spec lives in spec.json, the evaluations in evals.jsonl.
  v1::Run expected = record.run;
  expected.clear_spec();
  expected.mutable_summary()->clear_evals();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(decoded->run, expected))
      << decoded->run.DebugString();

  RunRecord fresh = NewRunRecord(record.run, "", 1, {});
  decoded = DecodeRunState(EncodeRunState(fresh));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->left_pending_at, absl::InfinitePast());
  EXPECT_EQ(decoded->run.state(), v1::RUN_STATE_QUEUED);
}

TEST_F(RunRecordTest, BadStateTextIsDataLossSayingWhat) {
  EXPECT_EQ(DecodeRunState("{").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(DecodeRunState(R"({"format": 9})").status().message()),
              HasSubstr("unknown format"));
  EXPECT_THAT(std::string(DecodeRunState(R"({"format": 1, "run": {"progress": 7}})")
                              .status()
                              .message()),
              HasSubstr("\"run\" is not a Run"));
}

TEST_F(RunRecordTest, ProgressIsRebuiltFromTheAppendedFilesAheadOfTheState) {
  RunRecord record = TrainingRecord();
  ASSERT_TRUE(files_->WriteSpec(Spec()).ok());
  ASSERT_TRUE(files_->WriteState(EncodeRunState(record), true).ok());
  // Steps 4 and 5 were appended after state.json's last write, and step 6
  // was being appended when the controller was killed.
  const double rewards[] = {0.1, 0.2, 0.3, 0.4, 0.9};
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE(files_->AppendMetrics(Step(step, rewards[step - 1], step == 2 ? 2 : 1)).ok());
  }
  { std::ofstream(files_->Path(RunFiles::kMetrics), std::ios::app) << R"({"step": 6, "rew)"; }
  ASSERT_TRUE(files_->AppendEval(Eval("warm_start", 20, 0.3)).ok());
  ASSERT_TRUE(files_->AppendEval(Eval("before", 0, 0.4)).ok());
  ASSERT_TRUE(files_->AppendEval(Eval("periodic", 5, 0.55)).ok());

  absl::StatusOr<RunRecord> loaded = LoadRunRecord(files_->dir(), "run-1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const v1::Run& run = loaded->run;
  EXPECT_EQ(run.state(), v1::RUN_STATE_TRAINING);
  EXPECT_EQ(run.spec().name(), "record");
  EXPECT_EQ(loaded->last_step, 5);
  EXPECT_EQ(loaded->max_policy_version, 5);
  EXPECT_EQ(run.progress().step(), 5);
  EXPECT_EQ(run.progress().total_steps(), 100);
  EXPECT_EQ(run.progress().policy_version(), 5);
  EXPECT_DOUBLE_EQ(run.progress().reward_mean(), 0.9);
  EXPECT_DOUBLE_EQ(run.progress().loss(), 0.1);
  EXPECT_EQ(run.progress().groups_trained(), 10);
  EXPECT_EQ(run.summary().steps(), 5);
  EXPECT_EQ(run.summary().groups_trained(), 10);
  EXPECT_EQ(run.summary().tokens_trained(), 500);
  EXPECT_EQ(run.summary().max_observed_staleness(), 2);
  // Deprecated, the same figure, still written for old readers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(run.summary().max_staleness(), 2);
#pragma GCC diagnostic pop
  EXPECT_EQ(run.summary().weight_versions(), 6);
  EXPECT_DOUBLE_EQ(run.summary().final_reward_mean(), (0.1 + 0.2 + 0.3 + 0.4 + 0.9) / 5);
  EXPECT_EQ(loaded->recent_step_rewards.size(), 5u);
  // Evaluations: all of them, and the latest.
  ASSERT_EQ(run.summary().evals_size(), 3);
  EXPECT_DOUBLE_EQ(run.summary().warm_start_accuracy(), 0.3);
  EXPECT_DOUBLE_EQ(run.summary().eval_before(), 0.4);
  EXPECT_DOUBLE_EQ(run.progress().latest_eval_accuracy(), 0.55);
  EXPECT_EQ(run.progress().latest_eval_step(), 5);
  // What only state.json knows.
  EXPECT_EQ(run.summary().tokens_generated(), 5000);
  EXPECT_EQ(run.summary().recovery().restarts().at("trainer"), 2);
  EXPECT_EQ(run.summary().recovery().prompts_reissued(), 4);
  EXPECT_EQ(loaded->request_id, "cli-42");

  // The torn line is dropped, so the next step starts a line of its own.
  ASSERT_TRUE(files_->RepairAppendedFiles().ok());
  ASSERT_TRUE(files_->AppendMetrics(Step(6, 1.0, 0)).ok());
  absl::StatusOr<CompleteLines> lines = ReadCompleteLines(files_->Path(RunFiles::kMetrics));
  ASSERT_TRUE(lines.ok());
  EXPECT_EQ(lines->lines.size(), 6u);
  EXPECT_EQ(lines->torn_tail_bytes, 0);
  EXPECT_EQ(LoadRunRecord(files_->dir(), "run-1")->run.progress().step(), 6);
}

TEST_F(RunRecordTest, ADirectoryWithoutARunIsNotFound) {
  EXPECT_EQ(LoadRunRecord(files_->dir(), "run-1").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RunRecordTest, UnreadableRecordsAreDataLossNamingTheFile) {
  ASSERT_TRUE(files_->WriteState(EncodeRunState(TrainingRecord()), true).ok());
  absl::Status status = LoadRunRecord(files_->dir(), "run-1").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("spec.json is missing"));

  ASSERT_TRUE(files_->WriteSpec(Spec()).ok());
  { std::ofstream(files_->Path(RunFiles::kState)) << R"({"format": 1, "run": {)"; }
  status = LoadRunRecord(files_->dir(), "run-1").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("state.json is unreadable"));

  RunRecord other = TrainingRecord();
  other.run.set_run_id("run-2");
  ASSERT_TRUE(files_->WriteState(EncodeRunState(other), true).ok());
  EXPECT_THAT(std::string(LoadRunRecord(files_->dir(), "run-1").status().message()),
              HasSubstr("the record of run \"run-2\""));

  std::filesystem::remove(files_->Path(RunFiles::kState));
  EXPECT_THAT(std::string(LoadRunRecord(files_->dir(), "run-1").status().message()),
              HasSubstr("no state.json"));
}

// Directories of runs that ended under a controller from before state.json.
TEST_F(RunRecordTest, ATerminalRunWithoutStateLoadsFromItsSummary) {
  ASSERT_TRUE(files_->WriteSpec(Spec()).ok());
  v1::RunSummary summary;
  summary.set_run_id("run-1");
  summary.set_state("RUN_STATE_SUCCEEDED");
  summary.set_steps(2);
  summary.set_eval_after(0.8);
  ASSERT_TRUE(files_->WriteSummary(summary).ok());
  ASSERT_TRUE(files_->AppendMetrics(Step(1, 0.5, 0)).ok());
  ASSERT_TRUE(files_->AppendMetrics(Step(2, 0.7, 0)).ok());
  absl::StatusOr<RunRecord> loaded = LoadRunRecord(files_->dir(), "run-1");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->run.state(), v1::RUN_STATE_SUCCEEDED);
  EXPECT_DOUBLE_EQ(loaded->run.summary().eval_after(), 0.8);
  EXPECT_EQ(loaded->run.progress().step(), 2);
}

// The steps' rollout verification summed per worker into summary.json's
// verification section; a quarantined worker stays marked.
TEST(ApplyStepFiguresTest, VerificationIsSummedPerWorker) {
  v1::Run run;
  std::deque<double> rewards;
  v1::TrainingStepMetrics first;
  first.set_step(1);
  first.set_groups_verified(3);
  first.set_groups_verification_failed(1);
  first.set_verification_max_abs_diff(2e-6);
  first.set_verification_seconds(0.25);
  v1::WorkerVerification* honest = first.add_verification_by_worker();
  honest->set_worker_id("honest");
  honest->set_groups_verified(3);
  v1::WorkerVerification* rogue = first.add_verification_by_worker();
  rogue->set_worker_id("rogue");
  rogue->set_groups_failed(1);
  ApplyStepFigures(first, &run, &rewards);
  v1::TrainingStepMetrics second;
  second.set_step(2);
  second.set_groups_verified(2);
  second.set_groups_verification_failed(2);
  second.set_groups_unverifiable(1);
  second.set_verification_max_abs_diff(1e-6);
  second.set_verification_seconds(0.5);
  *second.add_verification_by_worker() = *honest;
  second.mutable_verification_by_worker(0)->set_groups_verified(2);
  *second.add_verification_by_worker() = *rogue;
  second.mutable_verification_by_worker(1)->set_groups_failed(2);
  second.add_workers_quarantined("rogue");
  ApplyStepFigures(second, &run, &rewards);

  const v1::RolloutVerificationSummary& v = run.summary().verification();
  EXPECT_EQ(v.groups_verified(), 5);
  EXPECT_EQ(v.groups_failed(), 3);
  EXPECT_EQ(v.groups_unverifiable(), 1);
  EXPECT_DOUBLE_EQ(v.max_abs_diff_verified(), 2e-6);
  EXPECT_DOUBLE_EQ(v.seconds(), 0.75);
  ASSERT_EQ(v.workers_size(), 2);
  EXPECT_EQ(v.workers(0).worker_id(), "honest");
  EXPECT_EQ(v.workers(0).groups_verified(), 5);
  EXPECT_FALSE(v.workers(0).quarantined());
  EXPECT_EQ(v.workers(1).worker_id(), "rogue");
  EXPECT_EQ(v.workers(1).groups_failed(), 3);
  EXPECT_TRUE(v.workers(1).quarantined());
}

// The versions the steps published, summed into summary.json's
// weight_sync section under the run's resolved weight_sync.
TEST(ApplyStepFiguresTest, WeightSyncSumsFullAndDeltaBytes) {
  v1::Run run;
  run.mutable_spec()->mutable_weight_sync()->set_dtype(v1::DTYPE_BFLOAT16);
  std::deque<double> rewards;
  v1::TrainingStepMetrics step;
  step.set_step(1);
  step.set_weight_version_bytes(1000);  // the first version: no delta
  ApplyStepFigures(step, &run, &rewards);
  step.set_step(2);
  step.set_weight_delta_bytes(40);
  step.set_weight_delta_encode_seconds(0.25);
  ApplyStepFigures(step, &run, &rewards);
  step.set_step(3);
  step.set_weight_delta_bytes(60);
  ApplyStepFigures(step, &run, &rewards);
  const v1::WeightSyncSummary& w = run.summary().weight_sync();
  EXPECT_EQ(w.transport(), "grpc");
  EXPECT_EQ(w.dtype(), "bfloat16");
  EXPECT_TRUE(w.delta());
  EXPECT_EQ(w.versions(), 3);
  EXPECT_EQ(w.version_bytes(), 3000);
  EXPECT_EQ(w.delta_versions(), 2);
  EXPECT_EQ(w.delta_bytes(), 100);
  EXPECT_EQ(w.delta_versions_full_bytes(), 2000);
  EXPECT_DOUBLE_EQ(w.delta_encode_seconds(), 0.5);

  // A trainer that reports no version bytes leaves the section alone.
  v1::Run old;
  v1::TrainingStepMetrics bare;
  bare.set_step(1);
  ApplyStepFigures(bare, &old, &rewards);
  EXPECT_FALSE(old.summary().has_weight_sync());
}

TEST(RunFilesTest, AtomicWriteReplacesTheWholeFile) {
  const std::string dir = ::testing::TempDir() + "/atomic";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/f.json";
  ASSERT_TRUE(WriteFileAtomically(path, "a much longer first version", true).ok());
  ASSERT_TRUE(WriteFileAtomically(path, "short", false).ok());
  EXPECT_EQ(ReadFile(path), "short\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(RunFilesTest, DropTornTailKeepsWholeLines) {
  const std::string path = ::testing::TempDir() + "/torn.jsonl";
  { std::ofstream(path) << "{\"a\":1}\n{\"b\":2}\n{\"c\""; }
  EXPECT_EQ(*DropTornTail(path), 4);
  EXPECT_EQ(ReadFile(path), "{\"a\":1}\n{\"b\":2}\n");
  EXPECT_EQ(*DropTornTail(path), 0);
  { std::ofstream(path) << "{\"only\""; }
  EXPECT_EQ(*DropTornTail(path), 7);
  EXPECT_EQ(ReadFile(path), "");
  EXPECT_EQ(*DropTornTail(::testing::TempDir() + "/missing.jsonl"), 0);
}

}  // namespace
}  // namespace sluice::controller
