#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <thread>
#include <unistd.h>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/model/hf_checkpoint.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "common/task/char_tokenizer.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/trainer.h"

namespace sluice::trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Serves batches of synthetic groups: prompt "1+2=" style tokens, G
// completions alternating right and wrong so every group has a signal.
class FakeBuffer : public clients::ReplayBufferClient {
 public:
  explicit FakeBuffer(bool block_samples = false) : block_samples_(block_samples) {}

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
    if (block_samples_) {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&cancelled_));
      return absl::CancelledError("cancelled");
    }
    task::CharTokenizer tokenizer;
    v1::SampleResponse response;
    for (int g = 0; g < request.batch_size_groups(); ++g) {
      v1::SampledGroup* sampled = response.add_groups();
      sampled->set_staleness(g % 2);
      v1::Group* group = sampled->mutable_group();
      group->set_group_id("g" + std::to_string(next_group_++));
      group->set_min_policy_version(request.trainer_policy_version() - g % 2);
      for (int i = 0; i < 4; ++i) {
        v1::Trajectory* t = group->add_trajectories();
        const std::vector<int32_t> prompt = *tokenizer.Encode("12+30=");
        for (int id : prompt) t->add_prompt_token_ids(id);
        const std::vector<int32_t> answer = *tokenizer.Encode(i % 2 == 0 ? "42" : "41");
        for (int id : answer) t->add_completion_token_ids(id);
        t->add_completion_token_ids(tokenizer.eos_id());
        for (int k = 0; k < t->completion_token_ids_size(); ++k) {
          t->add_behaviour_logprobs(-2.5f);
          t->add_token_policy_versions(group->min_policy_version());
        }
        t->set_reward(i % 2 == 0 ? 1.0 : 0.0);
        t->set_finish_reason(v1::FINISH_REASON_STOP);
      }
      if (poison) poison(g, *group);
    }
    return response;
  }
  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest& request) override {
    absl::MutexLock lock(&mu_);
    versions_.push_back(request.policy_version());
    return v1::UpdatePolicyVersionResponse();
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest&) override {
    return v1::GetStatsResponse();
  }
  void CancelSample() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  std::vector<int64_t> versions() {
    absl::MutexLock lock(&mu_);
    return versions_;
  }
  // Applied to each group served, with its index in the batch: what got
  // past the buffer's validation (as from a buffer of an older release).
  std::function<void(int index, v1::Group& group)> poison;

 private:
  const bool block_samples_;
  int next_group_ = 0;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int64_t> versions_ ABSL_GUARDED_BY(mu_);
};

// Exact-match scoring, as the math verifier does for integers.
class FakeReward : public clients::RewardClient {
 public:
  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration) override {
    v1::ScoreBatchResponse response;
    for (const auto& item : request.items()) {
      items.push_back(item);
      v1::ScoreResult* r = response.add_results();
      r->set_item_id(item.item_id());
      r->mutable_result()->set_reward(item.response() == item.reference_answer() ? 1.0 : 0.0);
      r->mutable_result()->set_error_kind(v1::VERIFIER_ERROR_NONE);
    }
    ++batches;
    return response;
  }
  int batches = 0;
  std::vector<v1::ScoreItem> items;
};

class FakeController : public clients::ControllerClient {
 public:
  absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(const v1::LeasePromptsRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest& request) override {
    absl::MutexLock lock(&mu);
    reports.push_back(request);
    return v1::ReportTrainerProgressResponse();
  }
  absl::Mutex mu;
  std::vector<v1::ReportTrainerProgressRequest> reports;
};

v1::RunSpec SmallSpec() {
  v1::RunSpec spec;
  spec.set_seed(7);
  spec.mutable_model()->set_builtin("micro");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(60);
  arithmetic->set_num_operands(2);
  spec.mutable_task()->set_eval_split_size(20);
  auto* alg = spec.mutable_algorithm();
  alg->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  alg->set_group_size(4);
  alg->set_batch_size_groups(2);
  alg->set_max_staleness(1);
  alg->set_clip_eps_low(0.2);
  alg->set_behaviour_weight_cap(5);
  alg->set_learning_rate(1e-3);
  alg->set_grad_clip_norm(1.0);
  alg->set_advantage_eps(1e-6);
  alg->set_total_steps(3);
  alg->set_minibatches_per_batch(1);
  // The fake buffer's log-probs are made up (-2.5): verifying them would
  // leave every group out (trainer_verification_test.cc verifies).
  alg->mutable_rollout_verification()->set_fraction(0);
  spec.mutable_warm_start()->set_sft_steps(30);
  spec.mutable_warm_start()->set_learning_rate(3e-3);
  spec.mutable_warm_start()->set_batch_size(16);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(4);
  spec.mutable_eval()->set_every_n_steps(2);
  return spec;
}

TEST(TrainerRunTest, WarmStartThenRlPublishesEveryVersionAndReportsEachStep) {
  FakeBuffer buffer;
  FakeReward reward;
  FakeController controller;
  WeightStore weights(/*retain=*/8);
  weights.Reset("run-1");
  TrainerRunDeps deps{&buffer, &reward, &controller, &weights, nullptr, nullptr};
  TrainerRun run("run-1", SmallSpec(), deps);
  ASSERT_TRUE(run.Run().ok());

  EXPECT_EQ(buffer.versions(), (std::vector<int64_t>{0, 1, 2, 3}));
  for (int v = 0; v <= 3; ++v) {
    auto published = weights.Get("run-1", v);
    ASSERT_TRUE(published.ok()) << v;
    EXPECT_EQ((*published)->info.tensor_count(), (*published)->tensors.size());
    EXPECT_TRUE(absl::StartsWith((*published)->info.checksum(), "crc32c:"));
  }
  // Training changed the weights between versions.
  EXPECT_NE((*weights.Get("run-1", 0))->info.checksum(), (*weights.Get("run-1", 3))->info.checksum());

  std::vector<std::string> eval_phases;
  std::vector<int64_t> steps;
  for (const auto& r : controller.reports) {
    if (r.has_eval()) eval_phases.push_back(r.eval().phase());
    if (r.has_step()) {
      steps.push_back(r.step().step());
      EXPECT_EQ(r.step().groups(), 2);
      EXPECT_EQ(r.step().groups_zero_advantage(), 0);
      EXPECT_DOUBLE_EQ(r.step().reward_mean(), 0.5);
      EXPECT_EQ(r.step().staleness_max(), 1);
      EXPECT_EQ(r.step().staleness_histogram_size(), 2);
      EXPECT_GT(r.step().tokens_trained(), 0);
      EXPECT_TRUE(std::isfinite(r.step().loss()));
    }
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  // 30 SFT steps: dev checks at 10, 20 and 30; then before, periodic at 2, after.
  EXPECT_EQ(eval_phases, (std::vector<std::string>{"warm_start", "warm_start", "warm_start",
                                                   "before", "periodic", "after"}));
  EXPECT_EQ(controller.reports.back().state(), v1::TRAINER_STATE_FINISHED);
  EXPECT_EQ(run.Status().state(), v1::TRAINER_STATE_FINISHED);
  EXPECT_EQ(run.Status().step(), 3);
}

// Each step's report carries the rate it trained at: the schedule's, by
// the step's number.
TEST(TrainerRunTest, StepsTrainAtTheScheduledLearningRate) {
  FakeBuffer buffer;
  FakeReward reward;
  FakeController controller;
  WeightStore weights(/*retain=*/8);
  weights.Reset("run-lr");
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  spec.mutable_algorithm()->set_lr_schedule(v1::LR_SCHEDULE_LINEAR);
  spec.mutable_algorithm()->set_min_lr_ratio(0.25);
  TrainerRunDeps deps{&buffer, &reward, &controller, &weights, nullptr, nullptr};
  TrainerRun run("run-lr", spec, deps);
  ASSERT_TRUE(run.Run().ok());
  std::vector<double> rates;
  for (const auto& r : controller.reports) {
    if (r.has_step()) rates.push_back(r.step().learning_rate());
  }
  // 1e-3 * (0.25 + 0.75 * (1 - p)), p = 0, 1/3, 2/3.
  ASSERT_EQ(rates.size(), 3u);
  EXPECT_NEAR(rates[0], 1e-3, 1e-12);
  EXPECT_NEAR(rates[1], 0.75e-3, 1e-12);
  EXPECT_NEAR(rates[2], 0.5e-3, 1e-12);
}

TEST(TrainerRunTest, MinibatchesPublishOneVersionEachAndClipAgainstTheBatchStart) {
  FakeBuffer buffer;
  FakeReward reward;
  FakeController controller;
  WeightStore weights(/*retain=*/8);
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  spec.mutable_algorithm()->set_minibatches_per_batch(2);
  spec.mutable_algorithm()->set_total_steps(4);
  spec.mutable_algorithm()->set_learning_rate(5e-2);  // big steps: the second minibatch moves off-proximal
  TrainerRun run("run-4", spec, {&buffer, &reward, &controller, &weights, nullptr, nullptr});
  ASSERT_TRUE(run.Run().ok());
  EXPECT_EQ(buffer.versions(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  double second_minibatch_kl = 0;
  for (const auto& r : controller.reports) {
    if (!r.has_step()) continue;
    EXPECT_EQ(r.step().groups(), 1);  // B = 2 split in two
    if (r.step().step() % 2 == 0) second_minibatch_kl += r.step().kl_to_behaviour();
  }
  // Behaviour log-probs are fixed at -2.5 in the fake, so the KL estimate is
  // positive whatever the weights; the point is that the run completes with
  // the proximal copy in use and reports every version.
  EXPECT_GT(second_minibatch_kl, 0.0);
}

// Every objective and correction a spec can choose trains end to end: a
// short run (two steps, the second on weights the first moved, so the
// ratios, weights and masks are not all trivially 1) finishes, every step
// has a finite loss and makes its update, and the figures that describe the
// step's importance weights are in range.
struct ObjectiveCase {
  std::string name;
  std::function<void(v1::AlgorithmConfig&)> set;
};

class TrainerObjectiveTest : public ::testing::TestWithParam<ObjectiveCase> {};

TEST_P(TrainerObjectiveTest, TrainsWithoutError) {
  FakeBuffer buffer;
  // Of each batch's 4 groups (staleness 0, 1, 0, 1), the third has
  // all-equal rewards (dynamic sampling); with two minibatches each has one
  // group of each staleness.
  buffer.poison = [](int index, v1::Group& group) {
    if (index != 2) return;
    for (v1::Trajectory& t : *group.mutable_trajectories()) t.set_reward(0);
  };
  FakeReward reward;
  FakeController controller;
  WeightStore weights(/*retain=*/8);
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  spec.mutable_eval()->set_every_n_steps(0);
  spec.mutable_eval()->set_num_prompts(2);
  v1::AlgorithmConfig& alg = *spec.mutable_algorithm();
  alg.set_batch_size_groups(4);
  alg.set_total_steps(2);
  alg.set_learning_rate(2e-2);
  GetParam().set(alg);
  const std::string run_id = "run-" + GetParam().name;
  TrainerRun run(run_id, spec, {&buffer, &reward, &controller, &weights, nullptr, nullptr});
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  int steps = 0;
  int64_t zero_advantage = 0;
  for (const auto& r : controller.reports) {
    if (!r.has_step()) continue;
    ++steps;
    zero_advantage += r.step().groups_zero_advantage();
    const v1::TrainingStepMetrics& m = r.step();
    SCOPED_TRACE(absl::StrCat("step ", m.step()));
    EXPECT_TRUE(std::isfinite(m.loss()));
    EXPECT_FALSE(m.update_skipped());
    EXPECT_GT(m.tokens_trained(), 0);
    EXPECT_GT(m.importance_weight_ess(), 0.0);
    EXPECT_LE(m.importance_weight_ess(), 1.0 + 1e-9);
    EXPECT_LE(m.importance_weight_min(), m.importance_weight_p01() + 1e-9);
    EXPECT_LE(m.importance_weight_p99(), m.importance_weight_max() + 1e-9);
    // The fake's groups alternate staleness 0 and 1 (all their tokens), as
    // of the batch's start; a later minibatch trains them one version on.
    EXPECT_EQ(m.token_staleness_max(), 1 + (m.step() - 1) % alg.minibatches_per_batch());
    EXPECT_GE(m.kl_to_reference(), 0.0);
  }
  EXPECT_EQ(steps, alg.total_steps());
  // One uniform group per batch, left out unless kept (trajectory balance
  // keeps them by default).
  const bool keeps_uniform = alg.dynamic_sampling() == v1::DYNAMIC_SAMPLING_KEEP ||
                             (alg.objective() == v1::OBJECTIVE_TRAJECTORY_BALANCE &&
                              alg.dynamic_sampling() == v1::DYNAMIC_SAMPLING_UNSPECIFIED);
  EXPECT_EQ(zero_advantage, keeps_uniform ? 0 : alg.total_steps() / alg.minibatches_per_batch());
  EXPECT_NE((*weights.Get(run_id, 0))->info.checksum(), (*weights.Get(run_id, 2))->info.checksum());
}

INSTANTIATE_TEST_SUITE_P(
    Objectives, TrainerObjectiveTest,
    ::testing::Values(
        ObjectiveCase{"grpo", [](v1::AlgorithmConfig& a) { a.set_objective(v1::OBJECTIVE_GRPO); }},
        ObjectiveCase{"decoupled_ppo", [](v1::AlgorithmConfig&) {}},
        ObjectiveCase{"loglinear_minibatches",
                      [](v1::AlgorithmConfig& a) {
                        a.set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR);
                        a.set_minibatches_per_batch(2);
                        a.set_total_steps(4);
                      }},
        ObjectiveCase{"recompute_minibatches",
                      [](v1::AlgorithmConfig& a) {
                        a.set_minibatches_per_batch(2);
                        a.set_total_steps(4);
                      }},
        ObjectiveCase{"truncated_importance_sampling",
                      [](v1::AlgorithmConfig& a) {
                        a.set_truncated_importance_sampling(true);
                        a.set_minibatches_per_batch(2);
                        a.set_total_steps(4);
                      }},
        ObjectiveCase{"icepop",
                      [](v1::AlgorithmConfig& a) {
                        a.set_behaviour_weight_mode(v1::BEHAVIOUR_WEIGHT_MODE_MASK);
                        a.set_behaviour_weight_cap(2);
                        a.set_behaviour_weight_floor(0.5);
                      }},
        // The fake's behaviour log-probs (-2.5) are far from the untrained
        // model's: (log w)^2 is about 1 on most tokens, so M2PO's 0.04 would
        // mask them all (and rightly make no update); a looser tau keeps some.
        ObjectiveCase{"m2po", [](v1::AlgorithmConfig& a) { a.set_second_moment_threshold(1.0); }},
        ObjectiveCase{"dr_grpo",
                      [](v1::AlgorithmConfig& a) {
                        a.set_objective(v1::OBJECTIVE_GRPO);
                        a.set_normalize_advantage_by_std(false);
                        a.set_loss_aggregation(v1::LOSS_AGGREGATION_CONSTANT_NORMALIZER);
                      }},
        ObjectiveCase{"clip_higher_sequence_mean",
                      [](v1::AlgorithmConfig& a) {
                        a.set_clip_eps_high(0.28);
                        a.set_loss_aggregation(v1::LOSS_AGGREGATION_SEQUENCE_MEAN);
                      }},
        ObjectiveCase{"keep_uniform_groups",
                      [](v1::AlgorithmConfig& a) {
                        a.set_dynamic_sampling(v1::DYNAMIC_SAMPLING_KEEP);
                      }},
        ObjectiveCase{"kl_and_entropy",
                      [](v1::AlgorithmConfig& a) {
                        a.set_kl_coef(0.1);
                        a.set_entropy_coef(0.01);
                      }},
        ObjectiveCase{"trajectory_balance",
                      [](v1::AlgorithmConfig& a) {
                        a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
                      }},
        ObjectiveCase{"trajectory_balance_reference",
                      [](v1::AlgorithmConfig& a) {
                        a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
                        a.set_tb_use_reference(true);
                        a.set_tb_beta(0.5);
                      }}),
    [](const auto& info) { return info.param.name; });

// A run that keeps a reference policy: its KL figure is 0 on the first step
// (the reference is the weights RL starts from) and grows once they move.
TEST(TrainerRunTest, TheReferenceIsThePolicyRlStartedFrom) {
  FakeBuffer buffer;
  FakeReward reward;
  FakeController controller;
  WeightStore weights(/*retain=*/8);
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(10);
  spec.mutable_eval()->set_every_n_steps(0);
  spec.mutable_eval()->set_num_prompts(2);
  spec.mutable_algorithm()->set_kl_coef(0.1);
  spec.mutable_algorithm()->set_learning_rate(2e-2);
  TrainerRun run("run-kl", spec, {&buffer, &reward, &controller, &weights, nullptr, nullptr});
  ASSERT_TRUE(run.Run().ok());
  std::vector<double> kl;
  for (const auto& r : controller.reports) {
    if (r.has_step()) kl.push_back(r.step().kl_to_reference());
  }
  ASSERT_EQ(kl.size(), 3u);
  EXPECT_NEAR(kl[0], 0.0, 1e-6);  // after the warm start, before any RL update
  EXPECT_GT(kl[1], 1e-6);
  EXPECT_GT(kl[2], 1e-6);
}

// True when every weight of the published version is finite.
bool AllFinite(const PublishedVersion& published) {
  for (const std::string& bytes : published.bytes) {
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
    for (float value : values) {
      if (!std::isfinite(value)) return false;
    }
  }
  return true;
}

// Groups that got past the buffer (NaN log-prob, a token id far outside the
// vocabulary, NaN reward) are left out of the batch and counted; the run
// trains on the rest and every version it publishes is finite. (Before:
// the NaN made the loss and then every weight NaN, and the id failed the
// run with LibTorch's "index out of range in self".)
TEST(TrainerRunTest, UntrainableGroupsAreLeftOutAndEveryPublishedVersionIsFinite) {
  FakeBuffer buffer;
  buffer.poison = [](int index, v1::Group& group) {
    v1::Trajectory& t = *group.mutable_trajectories(1);
    switch (index) {
      case 0:
        t.set_behaviour_logprobs(0, std::nanf(""));
        break;
      case 1:
        t.set_completion_token_ids(0, 1000000000);
        break;
      case 2:
        t.set_reward(std::nan(""));
        break;
      default:
        break;  // the fourth group is fine
    }
  };
  FakeReward reward;
  FakeController controller;
  WeightStore weights(/*retain=*/8);
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  spec.mutable_algorithm()->set_batch_size_groups(4);
  spec.mutable_eval()->set_every_n_steps(0);
  TrainerRun run("run-poison", spec, {&buffer, &reward, &controller, &weights, nullptr, nullptr});
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  int steps = 0;
  int64_t zero_advantage = 0;
  for (const auto& r : controller.reports) {
    if (!r.has_step()) continue;
    ++steps;
    zero_advantage += r.step().groups_zero_advantage();
    EXPECT_EQ(r.step().groups_invalid(), 3);
    EXPECT_FALSE(r.step().update_skipped());
    EXPECT_GT(r.step().tokens_trained(), 0);  // the fourth group was trained on
    EXPECT_TRUE(std::isfinite(r.step().loss()));
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(run.Status().groups_invalid(), 9);
  EXPECT_EQ(run.Status().updates_skipped(), 0);
  for (int v = 0; v <= 3; ++v) {
    auto published = weights.Get("run-poison", v);
    ASSERT_TRUE(published.ok()) << v;
    EXPECT_TRUE(AllFinite(**published)) << "version " << v;
  }
  EXPECT_NE((*weights.Get("run-poison", 0))->info.checksum(),
            (*weights.Get("run-poison", 3))->info.checksum());
}

// Finite log-probs can still make the loss infinite: -1e30 passes every
// check (finite, <= 0), but GRPO's ratio exp(logp - behaviour) overflows.
// The step makes no update, is counted and logged, and its version is
// published with the previous weights, so the run goes on.
TEST(TrainerRunTest, ANonFiniteLossSkipsTheUpdateAndRepublishesThePreviousWeights) {
  FakeBuffer buffer;
  buffer.poison = [](int, v1::Group& group) {
    for (v1::Trajectory& t : *group.mutable_trajectories()) {
      for (int k = 0; k < t.behaviour_logprobs_size(); ++k) t.set_behaviour_logprobs(k, -1e30f);
    }
  };
  FakeReward reward;
  FakeController controller;
  WeightStore weights(/*retain=*/8);
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  spec.mutable_algorithm()->set_objective(v1::OBJECTIVE_GRPO);
  spec.mutable_eval()->set_every_n_steps(0);
  TrainerRun run("run-inf", spec, {&buffer, &reward, &controller, &weights, nullptr, nullptr});
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(buffer.versions(), (std::vector<int64_t>{0, 1, 2, 3}));
  int skipped = 0;
  for (const auto& r : controller.reports) {
    if (r.has_step() && r.step().update_skipped()) ++skipped;
  }
  EXPECT_EQ(skipped, 3);
  EXPECT_EQ(run.Status().updates_skipped(), 3);
  const std::string before = (*weights.Get("run-inf", 0))->info.checksum();
  for (int v = 1; v <= 3; ++v) {
    auto published = weights.Get("run-inf", v);
    ASSERT_TRUE(published.ok()) << v;
    EXPECT_TRUE(AllFinite(**published)) << "version " << v;
    EXPECT_EQ((*published)->info.checksum(), before) << "version " << v;
  }
}

// Runs `run` on a thread, checks that it is still running (blocked) after
// 300 ms, stops it and returns what Run() returned.
absl::Status RunUntilStopped(TrainerRun& run, bool checkpoint) {
  absl::Notification done;
  absl::Status result;
  std::thread thread([&] {
    result = run.Run();
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  run.Stop(checkpoint);
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  thread.join();
  return result;
}

TEST(TrainerRunTest, StopEndsARunBlockedOnSampling) {
  FakeBuffer buffer(/*block_samples=*/true);
  FakeReward reward;
  WeightStore weights;
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  TrainerRun run("run-2", spec, {&buffer, &reward, nullptr, &weights, nullptr, nullptr});
  EXPECT_EQ(RunUntilStopped(run, /*checkpoint=*/false).code(), absl::StatusCode::kCancelled);
}

TEST(TrainerRunTest, AnUnreachableRewardServerFailsTheRunWithItsError) {
  class DownReward : public clients::RewardClient {
   public:
    absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest&,
                                                      absl::Duration) override {
      return absl::UnavailableError("reward_server ScoreBatch on 127.0.0.1:1: connection refused");
    }
  } reward;
  FakeBuffer buffer;
  FakeController controller;
  WeightStore weights;
  TrainerRun run("run-3", SmallSpec(), {&buffer, &reward, &controller, &weights, nullptr, nullptr});
  const absl::Status status = run.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("connection refused"), absl::string_view::npos);
  ASSERT_FALSE(controller.reports.empty());
  EXPECT_EQ(controller.reports.back().state(), v1::TRAINER_STATE_FAILED);
  EXPECT_NE(controller.reports.back().error().find("reward_server"), std::string::npos);
}

// A client other than the controller can start a run the trainer's budget
// does not hold, or a buffer can hand out longer sequences than the run's
// estimate: the batch is checked before it is padded and run forward, and
// the run fails saying why instead of allocating past the budget.
TEST(TrainerRunTest, ATrainingBatchOverTheMemoryBudgetFailsTheRunNamingIt) {
  FakeBuffer buffer;
  FakeReward reward;
  FakeController controller;
  WeightStore weights;
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  absl::StatusOr<model::ModelConfig> config = run::LoadRunModelConfig(spec.model());
  ASSERT_TRUE(config.ok()) << config.status();
  const run::ServiceMemoryEstimate estimate = run::EstimateRunMemory(spec, *config, -1).trainer;
  // Room for what the run holds and a batch of one short sequence: the
  // first step's 8 sequences do not fit.
  TrainerRunDeps deps{&buffer, &reward, &controller, &weights, nullptr, nullptr};
  deps.memory_budget_bytes =
      estimate.bytes - estimate.batch_bytes + run::TrainingBatchBytes(*config, 1, 4);
  TrainerRun run("run-oom", spec, deps);
  const absl::Status status = run.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("trainer: step 1: a batch of 8 sequences"),
                    HasSubstr("algorithm.minibatches_per_batch (raise it)"),
                    HasSubstr("--memory-budget")));
  EXPECT_EQ(run.Status().state(), v1::TRAINER_STATE_FAILED);
  EXPECT_EQ(run.Status().step(), 0);
  ASSERT_FALSE(controller.reports.empty());
  EXPECT_EQ(controller.reports.back().state(), v1::TRAINER_STATE_FAILED);

  // With the budget of the whole estimate the same run trains.
  FakeController fine_controller;
  deps.controller = &fine_controller;
  deps.memory_budget_bytes = estimate.bytes;
  TrainerRun fits("run-fits", spec, deps);
  EXPECT_TRUE(fits.Run().ok());
}

namespace fs = std::filesystem;

// A fresh directory under the test's temporary directory.
std::string ScratchDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / (name + "." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A model with the weights of a published version.
std::unique_ptr<model::Transformer> ModelOf(const PublishedVersion& published,
                                            const model::ModelConfig& config) {
  std::vector<model::NamedTensor> tensors;
  for (size_t i = 0; i < published.tensors.size(); ++i) {
    const auto& spec = published.tensors[i];
    tensors.push_back({spec.name(), *model::Float32TensorFromBytes(
                                        {spec.shape().begin(), spec.shape().end()},
                                        published.bytes[i])});
  }
  auto model = model::Transformer::CreateUninitialized(config);
  EXPECT_TRUE(model.ok());
  EXPECT_TRUE((*model)->LoadWeights(tensors).ok());
  return std::move(*model);
}

// SmallSpec without warm start, `steps` RL steps, checkpoints in `dir`.
v1::RunSpec CheckpointingSpec(const std::string& dir, int64_t steps) {
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(0);
  spec.mutable_algorithm()->set_total_steps(steps);
  spec.mutable_checkpoint()->set_dir(dir);
  return spec;
}

TEST(TrainerRunTest, CheckpointsAreHfDirectoriesThatLoadBackWithIdenticalLogits) {
  FakeBuffer buffer;
  FakeReward reward;
  WeightStore weights(/*retain=*/8);
  const std::string dir = ScratchDir("checkpoints");
  v1::RunSpec spec = CheckpointingSpec(dir, 4);
  spec.mutable_checkpoint()->set_every_n_steps(2);
  spec.mutable_checkpoint()->set_keep_last(1);
  TrainerRun run("run-ckpt", spec, {&buffer, &reward, nullptr, &weights, nullptr, nullptr});
  ASSERT_TRUE(run.Run().ok());
  EXPECT_EQ(run.Status().last_checkpoint_step(), 4);

  // step 2 (periodic) was pruned by keep_last 1; step 4 (final) remains.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  ASSERT_EQ(names, (std::vector<std::string>{"step-00000004"}));
  const fs::path checkpoint = fs::path(dir) / "step-00000004";
  for (const char* file : {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(checkpoint / file)) << file;
  }
  EXPECT_NE(ReadAll(checkpoint / "trainer_state.json").find("\"step\": 4"), std::string::npos);
  EXPECT_EQ(ReadAll(checkpoint / "tokenizer.json"), task::CharTokenizer().ToHfTokenizerJson());
  EXPECT_TRUE(tokenizer::BpeTokenizer::FromFile((checkpoint / "tokenizer.json").string()).ok());

  // What it holds is exactly the final published policy.
  absl::StatusOr<model::HfModel> loaded = model::LoadHfModel(checkpoint.string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto published = weights.Get("run-ckpt", 4);
  ASSERT_TRUE(published.ok());
  std::unique_ptr<model::Transformer> trained = ModelOf(**published, loaded->config);
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::tensor({{1, 4, 13, 5, 16, 7, 2}}, torch::kInt64);
  EXPECT_TRUE(torch::equal(loaded->model->Forward(ids), trained->Forward(ids)));
  // Training moved it away from the initial policy.
  std::unique_ptr<model::Transformer> initial =
      ModelOf(**weights.Get("run-ckpt", 0), loaded->config);
  EXPECT_FALSE(torch::equal(loaded->model->Forward(ids), initial->Forward(ids)));
}

TEST(TrainerRunTest, Bf16CheckpointsHalveTheWeightsAndKeepTheArgmax) {
  FakeBuffer buffer;
  FakeReward reward;
  WeightStore weights(/*retain=*/8);
  const std::string dir = ScratchDir("bf16_checkpoint");
  v1::RunSpec spec = CheckpointingSpec(dir, 1);
  spec.mutable_model()->set_dtype(v1::DTYPE_BFLOAT16);
  TrainerRun run("run-bf16", spec, {&buffer, &reward, nullptr, &weights, nullptr, nullptr});
  ASSERT_TRUE(run.Run().ok());
  const std::string checkpoint = dir + "/step-00000001";
  EXPECT_NE(ReadAll(checkpoint + "/config.json").find("\"torch_dtype\": \"bfloat16\""),
            std::string::npos);
  absl::StatusOr<model::HfModel> loaded = model::LoadHfModel(checkpoint);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::unique_ptr<model::Transformer> trained =
      ModelOf(**weights.Get("run-bf16", 1), loaded->config);
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::tensor({{1, 4, 13, 5, 16, 7, 2}}, torch::kInt64);
  const torch::Tensor bf16 = loaded->model->Forward(ids);
  const torch::Tensor f32 = trained->Forward(ids);
  EXPECT_FALSE(torch::equal(bf16, f32));  // It really went through bf16...
  EXPECT_LT((bf16 - f32).abs().max().item<float>(), 0.05);  // ...and stayed close.
  EXPECT_TRUE(torch::equal(bf16.argmax(-1), f32.argmax(-1)));
}

TEST(TrainerRunTest, ARunStartsFromAHfDirectoryWithItsWeights) {
  // A builtin model's checkpoint is an HF directory a later run can start from.
  FakeBuffer buffer;
  FakeReward reward;
  WeightStore weights(/*retain=*/8);
  const std::string dir = ScratchDir("from_hf");
  const v1::RunSpec first = CheckpointingSpec(dir, 1);
  TrainerRun run1("run-a", first, {&buffer, &reward, nullptr, &weights, nullptr, nullptr});
  ASSERT_TRUE(run1.Run().ok());
  const std::string checkpoint = dir + "/step-00000001";
  ASSERT_TRUE(fs::exists(checkpoint + "/model.safetensors"));

  v1::RunSpec second = first;
  second.mutable_model()->set_hf_model_dir(checkpoint);
  second.clear_checkpoint();
  WeightStore weights2(/*retain=*/8);
  weights2.Reset("run-b");
  TrainerRun run2("run-b", second, {&buffer, &reward, nullptr, &weights2, nullptr, nullptr});
  ASSERT_TRUE(run2.Run().ok());
  // Version 0 of the second run is version 1 of the first, byte for byte.
  auto end_of_first = weights.Get("run-a", 1);
  auto start_of_second = weights2.Get("run-b", 0);
  ASSERT_TRUE(end_of_first.ok() && start_of_second.ok());
  EXPECT_EQ((*end_of_first)->info.checksum(), (*start_of_second)->info.checksum());
  EXPECT_EQ((*end_of_first)->bytes, (*start_of_second)->bytes);
}

TEST(TrainerRunTest, StopWithCheckpointWritesTheWeightsItHas) {
  FakeBuffer buffer(/*block_samples=*/true);
  FakeReward reward;
  WeightStore weights;
  v1::RunSpec spec = SmallSpec();
  spec.mutable_warm_start()->set_sft_steps(2);  // Trained, but no RL step yet.
  const std::string dir = ScratchDir("stop_checkpoint");
  spec.mutable_checkpoint()->set_dir(dir);
  TrainerRun run("run-stop", spec, {&buffer, &reward, nullptr, &weights, nullptr, nullptr});
  EXPECT_EQ(RunUntilStopped(run, /*checkpoint=*/true).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(model::LoadHfModel(dir + "/step-00000000").ok());
  EXPECT_FALSE(fs::exists(dir + "/.step-00000000.tmp"));

  // A run stopped before it trained anything leaves no checkpoint.
  FakeBuffer blocked(/*block_samples=*/true);
  spec.mutable_warm_start()->set_sft_steps(0);
  const std::string empty_dir = ScratchDir("stop_untrained");
  spec.mutable_checkpoint()->set_dir(empty_dir);
  TrainerRun untrained("run-stop-2", spec, {&blocked, &reward, nullptr, &weights, nullptr, nullptr});
  EXPECT_EQ(RunUntilStopped(untrained, /*checkpoint=*/true).code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(fs::is_empty(empty_dir));
}

TEST(TrainerRunTest, QwenTokenizerAndChatMlDatasetRun) {
  // A random Qwen2-shaped model with Qwen2's real tokenizer, trained on a
  // JSONL dataset through the ChatML template.
  const std::string model_dir = ScratchDir("qwen_random");
  model::ModelConfig config;
  config.architecture = "Qwen2ForCausalLM";
  config.vocab_size = 151936;
  config.hidden_size = 16;
  config.intermediate_size = 32;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.max_position_embeddings = 256;
  config.tie_word_embeddings = true;
  config.attention_bias = true;
  config.eos_token_id = 151643;
  auto random = model::Transformer::Create(config, 3);
  ASSERT_TRUE(random.ok());
  model::SaveHfOptions save;
  save.extra_files = {std::string(SLUICE_TESTDATA_DIR) + "/tokenizers/qwen2/tokenizer.json"};
  ASSERT_TRUE(model::SaveHfModel(model_dir, **random, save).ok());
  const std::string data = ScratchDir("qwen_data") + "/sums.jsonl";
  {
    std::ofstream out(data);
    for (int i = 0; i < 20; ++i) {
      out << "{\"q\": \"What is " << i << " plus " << i << "?\", \"a\": \"" << 2 * i
          << "\"}\n";
    }
  }
  FakeBuffer buffer;
  FakeReward reward;
  WeightStore weights(/*retain=*/8);
  v1::RunSpec spec = SmallSpec();
  spec.mutable_model()->set_hf_model_dir(model_dir);
  auto* dataset = spec.mutable_task()->mutable_dataset();
  dataset->set_path(data);
  dataset->set_format(v1::DATASET_FORMAT_JSONL);
  dataset->set_prompt_field("q");
  dataset->set_answer_field("a");
  spec.mutable_task()->set_eval_split_size(2);
  spec.mutable_task()->set_prompt_template("{question}");
  spec.mutable_task()->set_chat_template("chatml");
  spec.mutable_task()->set_system_prompt("Be brief.");
  spec.mutable_warm_start()->set_sft_steps(2);
  spec.mutable_warm_start()->set_batch_size(4);
  spec.mutable_algorithm()->set_total_steps(1);
  spec.mutable_eval()->set_every_n_steps(0);
  TrainerRun run("run-qwen", spec, {&buffer, &reward, nullptr, &weights, nullptr, nullptr});
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  // Eval prompts went to the reward server as the model saw them: ChatML.
  ASSERT_FALSE(reward.items.empty());
  bool saw_eval_prompt = false;
  for (const v1::ScoreItem& item : reward.items) {
    EXPECT_EQ(item.prompt().rfind("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n", 0),
              0u)
        << item.prompt();
    EXPECT_TRUE(absl::EndsWith(item.prompt(), "?<|im_end|>\n<|im_start|>assistant\n"));
    // Completions are decoded without special tokens.
    EXPECT_EQ(item.response().find("<|im_end|>"), std::string::npos);
    EXPECT_EQ(item.response().find("<|endoftext|>"), std::string::npos);
    saw_eval_prompt = true;
  }
  EXPECT_TRUE(saw_eval_prompt);
}
}  // namespace
}  // namespace sluice::trainer
