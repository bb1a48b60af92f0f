// A trainer killed at any point and started again on the same run resumes
// from its newest checkpoint losslessly: weights, optimizer state, step and
// version, RNG state and the data position (the replay buffer hands the
// steps after the checkpoint the batches they took before), so the run ends
// with the weights of a run that was never interrupted, bit for bit.
//
// The buffer is the real run table (replay_buffer/run_table.h) behind the
// client interface, fed like rollout workers would: each new step finds its
// B groups, made at the trainer's version from a counter, so that two runs
// that ask for the same steps get the same data.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/task/char_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/proto_convert.h"
#include "replay_buffer/run_table.h"
#include "trainer/checkpoint.h"
#include "trainer/trainer.h"

namespace sluice::trainer {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kRun[] = "run-resume";
constexpr int kGroupSize = 4;

// Group number `n` of the run, made at `version`: a sum of two digits, four
// completions of which some are right (rewards 1) and some wrong, the mix
// depending on n so that every batch trains differently; or, `uniform`, all
// wrong (no group-relative signal).
v1::Group MakeTrainingGroup(int n, int64_t version, bool uniform = false) {
  task::CharTokenizer tokenizer;
  v1::Group group;
  group.set_run_id(kRun);
  group.set_group_id(absl::StrCat("g", n));
  group.set_idempotency_key(absl::StrCat(kRun, "/g", n));
  const int a = n % 10;
  const int b = (n / 10) % 10;
  for (int i = 0; i < kGroupSize; ++i) {
    v1::Trajectory* t = group.add_trajectories();
    const std::vector<int32_t> prompt = *tokenizer.Encode(absl::StrCat(a, "+", b, "="));
    for (int id : prompt) t->add_prompt_token_ids(id);
    const bool right = !uniform && (i + n) % 3 == 0;
    const std::vector<int32_t> answer =
        *tokenizer.Encode(absl::StrCat(right ? a + b : a + b + 1 + i));
    for (int id : answer) t->add_completion_token_ids(id);
    t->add_completion_token_ids(tokenizer.eos_id());
    for (int k = 0; k < t->completion_token_ids_size(); ++k) {
      t->add_behaviour_logprobs(-2.0f - 0.25f * static_cast<float>(i));
      t->add_token_policy_versions(version);
    }
    t->set_reward(right ? 1.0 : 0.0);
    t->set_finish_reason(v1::FINISH_REASON_STOP);
  }
  return group;
}

// The trainer's buffer client over a real run table.
class TableBuffer : public clients::ReplayBufferClient {
 public:
  // `uniform_every` > 0: every uniform_every-th group made has all-equal
  // rewards (what dynamic sampling is about).
  explicit TableBuffer(const v1::RunSpec& spec, int uniform_every = 0)
      : uniform_every_(uniform_every) {
    Reset(spec);
  }

  // A new, empty table: what a buffer restarted without its data directory
  // has for the run once it is configured again.
  void Reset(const v1::RunSpec& spec) {
    replay_buffer::RunConfig config;
    config.run_id = kRun;
    config.batch_size_groups = spec.algorithm().batch_size_groups();
    config.max_staleness = spec.algorithm().max_staleness();
    config.group_size = kGroupSize;
    config.seed = spec.seed();
    absl::StatusOr<std::unique_ptr<replay_buffer::RunTable>> table =
        replay_buffer::RunTable::Create(config);
    EXPECT_TRUE(table.ok()) << table.status();
    table_ = std::move(table).value();
  }

  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest&) override {
    return absl::UnimplementedError("not used by the trainer");
  }
  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest&) override {
    return absl::UnimplementedError("not used by the trainer");
  }
  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(const v1::InsertGroupsRequest&) override {
    return absl::UnimplementedError("not used by the trainer");
  }

  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request) override {
    {
      // The workers' part: a step not sampled before finds exactly its
      // batch's groups; a recorded one needs none.
      const replay_buffer::RunStats stats = table_->Stats();
      if (request.step() > std::max(stats.last_recorded_step, stats.committed_step)) {
        // (The version first, as Sample would: a new table starts at 0.)
        if (!table_->UpdatePolicyVersion(request.trainer_policy_version()).ok()) {
          return absl::InternalError("version");
        }
        // Groups with a signal held: all of them, or (refill) those the
        // trainer takes, the uniform ones being evicted as it samples.
        const auto usable = [&] {
          const replay_buffer::RunStats now = table_->Stats();
          return now.size_groups - (request.drop_uniform_reward_groups()
                                        ? uniform_made_ - now.evictions.uniform_reward
                                        : 0);
        };
        while (usable() < request.batch_size_groups()) {
          const int n = next_group_++;
          const bool uniform = uniform_every_ > 0 && n % uniform_every_ == uniform_every_ - 1;
          uniform_made_ += uniform ? 1 : 0;
          const replay_buffer::InsertResult inserted = table_->Insert(
              MakeTrainingGroup(n, request.trainer_policy_version(), uniform));
          if (inserted.status != replay_buffer::InsertStatus::kStored) {
            return absl::InternalError(inserted.message);
          }
        }
      }
    }
    absl::StatusOr<replay_buffer::SampleResult> result =
        table_->Sample(replay_buffer::SampleRequestFromProto(request, absl::Seconds(1)));
    v1::SampleResponse response;
    if (absl::IsDeadlineExceeded(result.status())) {
      response.set_timed_out(true);
      return response;
    }
    if (!result.ok()) return result.status();
    std::vector<std::string> ids;
    for (const replay_buffer::SampledGroup& sampled : result->groups) {
      v1::SampledGroup* out = response.add_groups();
      *out->mutable_group() = *sampled.group;
      out->set_staleness(sampled.staleness);
      out->set_times_sampled(sampled.times_sampled);
      ids.push_back(sampled.group->group_id());
    }
    response.set_policy_version(result->policy_version);
    response.set_buffer_version(result->buffer_version);
    response.set_replayed(result->replayed);
    response.set_uniform_reward_groups_dropped(result->uniform_reward_groups_dropped);
    {
      absl::MutexLock lock(&mu_);
      batches_[request.step()] = ids;
      replayed_[request.step()] = result->replayed;
    }
    if (on_sample) on_sample(request.step());
    return response;
  }

  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest& request) override {
    absl::StatusOr<replay_buffer::UpdateVersionResult> updated =
        table_->UpdatePolicyVersion(request.policy_version());
    if (!updated.ok()) return updated.status();
    v1::UpdatePolicyVersionResponse response;
    response.set_policy_version(updated->policy_version);
    return response;
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest&) override {
    v1::GetStatsResponse response;
    replay_buffer::RunStatsToProto(table_->Stats(), response.mutable_stats());
    return response;
  }
  absl::StatusOr<v1::CommitTrainedStepsResponse> CommitTrainedSteps(
      const v1::CommitTrainedStepsRequest& request) override {
    absl::StatusOr<replay_buffer::CommitResult> committed =
        table_->CommitTrainedSteps(request.step());
    if (!committed.ok()) return committed.status();
    v1::CommitTrainedStepsResponse response;
    response.set_committed_step(committed->committed_step);
    response.set_released_groups(committed->released_groups);
    return response;
  }
  void CancelSample() override {}

  replay_buffer::RunTable& table() { return *table_; }
  // Group ids handed out per step (the latest answer), and whether replayed.
  std::map<int64_t, std::vector<std::string>> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  std::map<int64_t, bool> replayed() {
    absl::MutexLock lock(&mu_);
    return replayed_;
  }
  // Called after each Sample with its step (a test's kill switch).
  std::function<void(int64_t step)> on_sample;

 private:
  std::unique_ptr<replay_buffer::RunTable> table_;
  const int uniform_every_;
  int next_group_ = 0;
  int64_t uniform_made_ = 0;
  absl::Mutex mu_;
  std::map<int64_t, std::vector<std::string>> batches_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, bool> replayed_ ABSL_GUARDED_BY(mu_);
};

class ExactReward : public clients::RewardClient {
 public:
  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration) override {
    v1::ScoreBatchResponse response;
    for (const auto& item : request.items()) {
      v1::ScoreResult* result = response.add_results();
      result->set_item_id(item.item_id());
      result->mutable_result()->set_reward(item.response() == item.reference_answer() ? 1.0 : 0.0);
      result->mutable_result()->set_error_kind(v1::VERIFIER_ERROR_NONE);
    }
    return response;
  }
};

std::string ScratchDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// What a kill point's run trains with besides the defaults.
enum class Variant {
  kDefault,
  // A KL to the frozen reference and an entropy bonus: the reference must
  // come back from the checkpoint (it is not the checkpoint's weights).
  kKlToReference,
  // Trajectory balance against the reference.
  kTrajectoryBalance,
  // Dynamic sampling with refill over groups of which some are uniform:
  // the buffer records the informative batches and replays them.
  kRefill,
};

v1::RunSpec ResumeSpec(const std::string& dir, int minibatches,
                       Variant variant = Variant::kDefault) {
  v1::RunSpec spec;
  spec.set_seed(11);
  spec.mutable_model()->set_builtin("micro");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(40);
  arithmetic->set_num_operands(2);
  spec.mutable_task()->set_eval_split_size(8);
  auto* alg = spec.mutable_algorithm();
  alg->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  alg->set_group_size(kGroupSize);
  alg->set_batch_size_groups(2);
  alg->set_max_staleness(1);
  alg->set_clip_eps_low(0.2);
  alg->set_behaviour_weight_cap(5);
  alg->set_learning_rate(1e-2);
  alg->set_lr_warmup_steps(3);
  alg->set_grad_clip_norm(1.0);
  alg->set_advantage_eps(1e-6);
  alg->set_total_steps(7);
  alg->set_minibatches_per_batch(minibatches);
  // Made-up log-probs: verifying them would leave every group out.
  alg->mutable_rollout_verification()->set_fraction(0);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(3);
  spec.mutable_eval()->set_every_n_steps(4);
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_every_n_steps(3);
  switch (variant) {
    case Variant::kDefault:
      break;
    case Variant::kKlToReference:
      alg->set_kl_coef(0.05);
      alg->set_entropy_coef(0.01);
      break;
    case Variant::kTrajectoryBalance:
      alg->set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
      alg->set_tb_use_reference(true);
      alg->set_tb_beta(0.5);
      break;
    case Variant::kRefill:
      alg->set_objective(v1::OBJECTIVE_GRPO);
      alg->set_dynamic_sampling(v1::DYNAMIC_SAMPLING_REFILL);
      break;
  }
  return spec;
}

std::vector<std::string> VersionBytes(WeightStore& weights, int64_t version) {
  absl::StatusOr<std::shared_ptr<const PublishedVersion>> published = weights.Get(kRun, version);
  EXPECT_TRUE(published.ok()) << "version " << version << ": " << published.status();
  return published.ok() ? (*published)->bytes : std::vector<std::string>();
}

torch::Tensor GeneratorState() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

struct KillPoint {
  int minibatches;
  // The earlier incarnation dies right after training this step...
  int64_t after_step;
  // ...or, when > 0, right after sampling this step's batch (recorded by
  // the buffer, never trained).
  int64_t at_sample_step;
  // Expected of the resumed incarnation.
  int64_t resumed_from;
  int64_t steps_redone;
  Variant variant = Variant::kDefault;
};

class TrainerResumeTest : public ::testing::TestWithParam<KillPoint> {};

// The test name's suffix for a variant.
std::string VariantSuffix(Variant variant) {
  switch (variant) {
    case Variant::kKlToReference:
      return "_klToReference";
    case Variant::kTrajectoryBalance:
      return "_trajectoryBalance";
    case Variant::kRefill:
      return "_refill";
    case Variant::kDefault:
      break;
  }
  return "";
}

TEST_P(TrainerResumeTest, AKilledTrainerResumesToTheWeightsOfAnUninterruptedRun) {
  const KillPoint kill = GetParam();
  const std::string name = absl::StrCat("resume_m", kill.minibatches, "_", kill.after_step, "_",
                                        static_cast<int>(kill.variant));
  const int uniform_every = kill.variant == Variant::kRefill ? 3 : 0;
  ExactReward reward;

  // The run as it goes when nothing happens to it.
  const v1::RunSpec straight_spec =
      ResumeSpec(ScratchDir(name + "_straight"), kill.minibatches, kill.variant);
  TableBuffer straight_buffer(straight_spec, uniform_every);
  WeightStore straight_weights(/*retain=*/16);
  {
    TrainerRun run(kRun, straight_spec, {&straight_buffer, &reward, nullptr, &straight_weights});
    const absl::Status status = run.Run();
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(run.Status().resumed_from_step(), -1);
  }

  // The same run, killed: Stop() without a checkpoint leaves what a kill -9
  // leaves (checkpoints written so far, the buffer's records), nothing more.
  const std::string dir = ScratchDir(name);
  const v1::RunSpec spec = ResumeSpec(dir, kill.minibatches, kill.variant);
  TableBuffer buffer(spec, uniform_every);
  torch::manual_seed(1);
  const torch::Tensor generator_at_start = GeneratorState();
  WeightStore dead_weights(/*retain=*/16);
  {
    TrainerRunDeps deps{&buffer, &reward, nullptr, &dead_weights};
    TrainerRun* dying = nullptr;
    deps.on_step = [&](const v1::TrainingStepMetrics& step) {
      if (kill.at_sample_step == 0 && step.step() == kill.after_step) dying->Stop();
    };
    buffer.on_sample = [&](int64_t step) {
      if (kill.at_sample_step > 0 && step == kill.at_sample_step) dying->Stop();
    };
    TrainerRun run(kRun, spec, deps);
    dying = &run;
    EXPECT_EQ(run.Run().code(), absl::StatusCode::kCancelled);
    buffer.on_sample = nullptr;
  }
  const std::map<int64_t, std::vector<std::string>> dead_batches = buffer.batches();
  const replay_buffer::RunStats at_death = buffer.table().Stats();
  EXPECT_EQ(at_death.gate.policy_version, kill.resumed_from + kill.steps_redone);
  ASSERT_TRUE(fs::exists(dir + "/step-00000003/optimizer.pt"));
  ASSERT_TRUE(fs::exists(dir + "/step-00000003/rng.pt"));
  const bool keeps_reference =
      kill.variant == Variant::kKlToReference || kill.variant == Variant::kTrajectoryBalance;
  EXPECT_EQ(fs::exists(dir + "/step-00000003/reference.pt"), keeps_reference);
  if (kill.variant == Variant::kRefill) {
    // Uniform groups were made and left out; every batch had B groups.
    EXPECT_GT(buffer.table().Stats().evictions.uniform_reward, 0);
    for (const auto& [step, ids] : buffer.batches()) EXPECT_EQ(ids.size(), 2u) << step;
  }

  // A newer checkpoint that does not load is skipped for the older one.
  const std::string broken = absl::StrFormat("%s/step-%08d", dir, kill.resumed_from + 1);
  fs::copy(dir + "/step-00000003", broken);
  {
    std::ifstream in(broken + "/trainer_state.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<TrainerCheckpointState> state = TrainerCheckpointState::FromJson(text);
    ASSERT_TRUE(state.ok()) << state.status();
    state->step = kill.resumed_from + 1;
    std::ofstream(broken + "/trainer_state.json") << state->ToJson();
    std::ofstream(broken + "/optimizer.pt", std::ios::trunc) << "not an archive";
  }

  // A new incarnation, the same run and buffer.
  torch::manual_seed(99);  // whatever the process did meanwhile
  WeightStore weights(/*retain=*/16);
  TrainerRun resumed(kRun, spec, {&buffer, &reward, nullptr, &weights});
  const absl::Status status = resumed.Run();
  ASSERT_TRUE(status.ok()) << status;
  const v1::TrainerStatus trainer = resumed.Status();
  EXPECT_EQ(trainer.resumed_from_step(), kill.resumed_from);
  EXPECT_EQ(trainer.steps_redone(), kill.steps_redone);
  EXPECT_EQ(trainer.step(), 7);

  // The steps after the checkpoint that the dead incarnation had sampled
  // were answered with the same groups, replayed.
  const std::map<int64_t, std::vector<std::string>> batches = buffer.batches();
  const std::map<int64_t, bool> replayed = buffer.replayed();
  const int64_t first_redone_batch = kill.resumed_from / kill.minibatches + 1;
  for (const auto& [step, ids] : dead_batches) {
    if (step < first_redone_batch) continue;
    SCOPED_TRACE(absl::StrCat("batch step ", step));
    EXPECT_EQ(batches.at(step), ids);
    EXPECT_TRUE(replayed.at(step));
  }
  EXPECT_FALSE(replayed.rbegin()->second);  // the last steps were new

  // Every version it published is the uninterrupted run's, bit for bit: the
  // checkpoint's, the redone ones (also the dead incarnation's), the rest.
  for (int64_t version = kill.resumed_from; version <= 7; ++version) {
    SCOPED_TRACE(absl::StrCat("version ", version));
    EXPECT_EQ(VersionBytes(weights, version), VersionBytes(straight_weights, version));
    if (version <= kill.resumed_from + kill.steps_redone) {
      EXPECT_EQ(VersionBytes(weights, version), VersionBytes(dead_weights, version));
    }
  }
  // The RNG state came back from the checkpoint.
  EXPECT_TRUE(torch::equal(GeneratorState(), generator_at_start));
  // Every batch is let go of once the run is done.
  const replay_buffer::RunStats done = buffer.table().Stats();
  EXPECT_EQ(done.retained_groups, 0);
  EXPECT_EQ(done.committed_step, (7 + kill.minibatches - 1) / kill.minibatches);
  EXPECT_EQ(done.replayed_batches, static_cast<int64_t>(dead_batches.size()) -
                                       kill.resumed_from / kill.minibatches);
}

INSTANTIATE_TEST_SUITE_P(
    KillPoints, TrainerResumeTest,
    ::testing::Values(
        // Killed between steps 5 and 6: steps 4, 5 redone.
        KillPoint{.minibatches = 1, .after_step = 5, .at_sample_step = 0, .resumed_from = 3,
                  .steps_redone = 2},
        // Killed after the buffer recorded step 6's batch, before training it.
        KillPoint{.minibatches = 1, .after_step = 0, .at_sample_step = 6, .resumed_from = 3,
                  .steps_redone = 2},
        // Two minibatches per batch: the checkpoint at step 3 is inside batch
        // 2 (its proximal weights are in it); killed after step 5.
        KillPoint{.minibatches = 2, .after_step = 5, .at_sample_step = 0, .resumed_from = 3,
                  .steps_redone = 2},
        // The reference policy survives the restart (reference.pt).
        KillPoint{.minibatches = 1, .after_step = 5, .at_sample_step = 0, .resumed_from = 3,
                  .steps_redone = 2, .variant = Variant::kKlToReference},
        KillPoint{.minibatches = 1, .after_step = 5, .at_sample_step = 0, .resumed_from = 3,
                  .steps_redone = 2, .variant = Variant::kTrajectoryBalance},
        // Refilled batches are recorded as trained and replayed as such.
        KillPoint{.minibatches = 1, .after_step = 5, .at_sample_step = 0, .resumed_from = 3,
                  .steps_redone = 2, .variant = Variant::kRefill}),
    [](const auto& info) {
      return absl::StrCat("minibatches", info.param.minibatches, "_",
                          info.param.at_sample_step > 0 ? "atSample" : "afterStep",
                          info.param.at_sample_step > 0 ? info.param.at_sample_step
                                                        : info.param.after_step,
                          VariantSuffix(info.param.variant));
    });

// A buffer that lost the run's steps (restarted without its data directory,
// the table configured afresh) refuses the trainer's next step as ahead of
// its position; the trainer moves the position to its own and goes on.
TEST(TrainerResumeRefusalTest, ATrainerReanchorsABufferThatForgotItsSteps) {
  ExactReward reward;
  v1::RunSpec spec = ResumeSpec(ScratchDir("reanchor"), 1);
  spec.clear_checkpoint();
  TableBuffer buffer(spec);
  WeightStore weights(/*retain=*/16);
  TrainerRunDeps deps{&buffer, &reward, nullptr, &weights};
  deps.on_step = [&](const v1::TrainingStepMetrics& step) {
    if (step.step() == 4) buffer.Reset(spec);
  };
  TrainerRun run(kRun, spec, deps);
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(run.Status().step(), 7);
  const replay_buffer::RunStats stats = buffer.table().Stats();
  EXPECT_EQ(stats.committed_step, 7);
  EXPECT_EQ(stats.sampled_groups, 3 * 2);  // steps 5, 6 and 7 on the new table
}

// No checkpoint of the run, and the buffer says it trained past version 0:
// starting over from the model would publish versions the workers and the
// buffer already hold differently. The run is refused, saying why.
TEST(TrainerResumeRefusalTest, NoCheckpointOfARunTheBufferSaysWasTrainedIsRefused) {
  ExactReward reward;
  const std::string dir = ScratchDir("resume_refused");
  v1::RunSpec spec = ResumeSpec(dir, 1);
  TableBuffer buffer(spec);
  ASSERT_TRUE(buffer.table().UpdatePolicyVersion(4).ok());
  WeightStore weights;
  TrainerRun run(kRun, spec, {&buffer, &reward, nullptr, &weights});
  absl::Status status = run.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("cannot resume losslessly: no checkpoint of run run-resume in " + dir),
                    HasSubstr("the replay buffer is at version 4")));
  EXPECT_EQ(run.Status().state(), v1::TRAINER_STATE_FAILED);
  EXPECT_EQ(run.Status().policy_version(), -1);  // nothing published

  // Without a checkpoint.dir at all, and with resume turned off: the same.
  spec.clear_checkpoint();
  TrainerRun no_dir(kRun, spec, {&buffer, &reward, nullptr, &weights});
  status = no_dir.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("(checkpoint.dir is not set)"));
  spec.mutable_checkpoint()->set_dir(dir);
  spec.mutable_checkpoint()->set_resume(false);
  TrainerRun no_resume(kRun, spec, {&buffer, &reward, nullptr, &weights});
  status = no_resume.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("checkpoint.resume is false"));
}

// A checkpoint older than what the buffer let go of cannot be continued
// from (its later batches are gone): refused too, naming both.
TEST(TrainerResumeRefusalTest, ACheckpointOlderThanTheCommittedStepsIsRefused) {
  const std::string dir = ScratchDir("resume_behind");
  v1::RunSpec spec = ResumeSpec(dir, 1);
  TrainerCheckpointState state;
  state.run_id = kRun;
  state.step = 3;
  state.policy_version = 3;
  state.warm_start_done = true;
  state.rng_file = "rng.pt";
  state.optimizer_file = "optimizer.pt";
  std::vector<FoundCheckpoint> found = {{dir + "/step-00000003", state}};
  v1::BufferStats buffer;
  buffer.set_policy_version(7);
  buffer.set_committed_step(6);
  absl::StatusOr<ResumePlan> plan = PlanResume(kRun, spec, found, buffer, {});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plan.status().message()),
              AllOf(HasSubstr("the newest checkpoint of run run-resume in " + dir + " is step 3"),
                    HasSubstr("let go of the batches up to step 6")));
  buffer.set_committed_step(3);
  plan = PlanResume(kRun, spec, found, buffer, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->candidates.size(), 1u);
  EXPECT_EQ(plan->buffer_policy_version, 7);
  // A buffer that knows nothing of the run: a fresh start loses nothing.
  plan = PlanResume(kRun, spec, {}, v1::BufferStats(), {});
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->candidates.empty());
}

// trainer_state.json round-trips, and one written before resuming existed
// (no format_version) reads as format 1, which FindRunCheckpoints skips.
TEST(TrainerCheckpointStateTest, RoundTripsAndOlderFormatsAreNotResumable) {
  TrainerCheckpointState state;
  state.run_id = kRun;
  state.step = 12;
  state.policy_version = 12;
  state.warm_start_done = true;
  state.before_eval_done = true;
  state.last_periodic_eval_step = 10;
  state.minibatches_per_batch = 2;
  state.optimizer_file = "optimizer.pt";
  state.rng_file = "rng.pt";
  absl::StatusOr<TrainerCheckpointState> back = TrainerCheckpointState::FromJson(state.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), state.ToJson());
  EXPECT_EQ(back->batch_steps(), 6);

  const std::string dir = ScratchDir("old_format");
  fs::create_directories(dir + "/step-00000004");
  std::ofstream(dir + "/step-00000004/trainer_state.json")
      << R"({"run_id": "run-resume", "step": 4, "policy_version": 4})";
  fs::create_directories(dir + "/step-00000005");
  std::ofstream(dir + "/step-00000005/trainer_state.json") << "{not json";
  fs::create_directories(dir + "/step-00000006");
  std::ofstream(dir + "/step-00000006/trainer_state.json") << R"({"run_id": "other", "step": 6})";
  std::vector<std::string> warnings;
  EXPECT_TRUE(FindRunCheckpoints(dir, kRun, &warnings).empty());
  ASSERT_EQ(warnings.size(), 2u);  // the other run's is none of this run's business
  EXPECT_THAT(warnings, ::testing::UnorderedElementsAre(HasSubstr("written by an older Sluice"),
                                                        HasSubstr("not a JSON object")));
  EXPECT_EQ(TrainerCheckpointState::FromJson(R"({"run_id": 3})").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sluice::trainer
