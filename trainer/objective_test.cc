#include "trainer/objective.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

torch::Tensor Rows(std::vector<float> v, int64_t rows) {
  return torch::tensor(v, torch::kFloat32).reshape({rows, static_cast<int64_t>(v.size()) / rows});
}

TEST(ObjectiveConfigTest, UnsetFieldsTakeTheControllersDefaults) {
  const ObjectiveConfig c = ObjectiveConfig::FromAlgorithm(v1::AlgorithmConfig(), 64);
  EXPECT_EQ(c.objective, v1::OBJECTIVE_DECOUPLED_PPO);
  EXPECT_EQ(c.proximal, ProximalSource::kRecompute);
  EXPECT_DOUBLE_EQ(c.loss.clip_eps_low, 0.2);
  EXPECT_DOUBLE_EQ(c.loss.clip_eps_high, 0.2);
  EXPECT_DOUBLE_EQ(c.loss.behaviour_weight_cap, 5.0);
  EXPECT_EQ(c.loss.cap_mode, WeightCapMode::kTruncate);
  EXPECT_EQ(c.loss.aggregation, LossAggregation::kTokenMean);
  EXPECT_DOUBLE_EQ(c.loss.aggregation_constant, 64);  // max_new_tokens
  EXPECT_EQ(c.dynamic_sampling, v1::DYNAMIC_SAMPLING_DROP);
  EXPECT_TRUE(c.normalize_advantage_by_std);
  EXPECT_FALSE(c.UsesReference());
  EXPECT_FALSE(c.TrainsUniformGroups());

  v1::AlgorithmConfig tb;
  tb.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
  EXPECT_EQ(ObjectiveConfig::FromAlgorithm(tb, 64).dynamic_sampling, v1::DYNAMIC_SAMPLING_KEEP);
  EXPECT_FALSE(ObjectiveConfig::FromAlgorithm(tb, 64).UsesReference());
  tb.set_tb_use_reference(true);
  EXPECT_TRUE(ObjectiveConfig::FromAlgorithm(tb, 64).UsesReference());

  v1::AlgorithmConfig tis;
  tis.set_truncated_importance_sampling(true);
  tis.set_kl_coef(0.01);
  tis.set_loss_normalizer_tokens(100);
  tis.set_loss_aggregation(v1::LOSS_AGGREGATION_CONSTANT_NORMALIZER);
  const ObjectiveConfig t = ObjectiveConfig::FromAlgorithm(tis, 64);
  EXPECT_EQ(t.proximal, ProximalSource::kCurrent);
  EXPECT_TRUE(t.UsesReference());
  EXPECT_DOUBLE_EQ(t.loss.aggregation_constant, 100);
}

// One row, two tokens: log pi_theta = -1, -1; log pi_behav = -2, -1;
// versions 2 and 6; the batch started at version 4, the weights are at 6;
// A = 1, 1.
ObjectiveBatch OneRow() {
  ObjectiveBatch batch;
  batch.logits = torch::zeros({1, 2, 3});  // uniform over 3 tokens: entropy ln 3
  batch.logp = Rows({-1, -1}, 1).requires_grad_(true);
  batch.mask = Rows({1, 1}, 1);
  batch.behaviour = Rows({-2, -1}, 1);
  batch.versions = torch::tensor({2, 6}, torch::kInt64).reshape({1, 2});
  batch.advantages = Rows({1, 1}, 1);
  batch.rewards = {1};
  batch.groups = {0};
  batch.batch_start_version = 4;
  batch.current_version = 6;
  return batch;
}

TEST(ComputeObjectiveTest, LogLinearProximalPolicyWithoutASecondForward) {
  // alpha_0 = (4 - 2) / (6 - 2) = 0.5: log pi_prox_0 = -2 + 0.5 (-1 + 2) = -1.5
  // alpha_1 = 1 (v_behav = v_theta):  log pi_prox_1 = -1
  // token 0: u = e^(−1 + 1.5) = e^0.5 > 1.2, A > 0: clipped to 1.2;
  //          w = e^(−1.5 + 2) = e^0.5 -> l = -1.2 e^0.5
  // token 1: u = 1, w = 1 -> l = -1
  // loss = (-1.2 e^0.5 - 1) / 2.
  // Telemetry on w = (e^0.5, 1): ESS = (e^0.5 + 1)^2 / (2 (e + 1)); token
  // staleness 6 - (2, 6) = (4, 0): mean 2, max 4.
  v1::AlgorithmConfig algorithm;
  algorithm.set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR);
  const ObjectiveConfig config = ObjectiveConfig::FromAlgorithm(algorithm, 16);
  v1::TrainingStepMetrics metrics;
  const torch::Tensor loss = ComputeObjective(OneRow(), config, &metrics);
  const double e_half = std::exp(0.5);
  EXPECT_NEAR(loss.item<double>(), (-1.2 * e_half - 1) / 2, 1e-5);
  EXPECT_NEAR(metrics.clip_fraction(), 0.5, 1e-9);
  EXPECT_NEAR(metrics.importance_weight_max(), e_half, 1e-5);
  EXPECT_NEAR(metrics.importance_weight_ess(),
              (e_half + 1) * (e_half + 1) / (2 * (std::exp(1.0) + 1)), 1e-5);
  EXPECT_NEAR(metrics.token_staleness_mean(), 2.0, 1e-9);
  EXPECT_EQ(metrics.token_staleness_max(), 4);
  // Uniform logits over 3 tokens: entropy ln 3 at each position.
  EXPECT_NEAR(EntropyFigure(OneRow().logits, OneRow().mask, 1.0), std::log(3.0), 1e-5);
}

TEST(ComputeObjectiveTest, RecomputeWithoutACopyTakesTheCurrentWeights) {
  // No proximal tensor (one minibatch): pi_prox = pi_theta, u = 1,
  // w = (e^(−1 + 2), 1) = (e, 1): loss = -(e + 1) / 2.
  const ObjectiveConfig config = ObjectiveConfig::FromAlgorithm(v1::AlgorithmConfig(), 16);
  v1::TrainingStepMetrics metrics;
  const torch::Tensor loss = ComputeObjective(OneRow(), config, &metrics);
  EXPECT_NEAR(loss.item<double>(), -(std::exp(1.0) + 1) / 2, 1e-5);
  EXPECT_NEAR(metrics.importance_weight_max(), std::exp(1.0), 1e-5);
}

TEST(ComputeObjectiveTest, GrpoTelemetryIsTheCurrentPolicyAgainstTheBehaviour) {
  // GRPO: pi_prox = pi_behav, w = 1 in the loss; u = (e^1, 1): token 0
  // clipped at 1.2, loss = -(1.2 + 1) / 2. Its importance weights for the
  // figures are pi_theta / pi_behav = (e, 1).
  v1::AlgorithmConfig algorithm;
  algorithm.set_objective(v1::OBJECTIVE_GRPO);
  v1::TrainingStepMetrics metrics;
  const torch::Tensor loss =
      ComputeObjective(OneRow(), ObjectiveConfig::FromAlgorithm(algorithm, 16), &metrics);
  EXPECT_NEAR(loss.item<double>(), -(1.2 + 1) / 2, 1e-5);
  EXPECT_NEAR(metrics.importance_weight_max(), std::exp(1.0), 1e-5);
  EXPECT_NEAR(metrics.importance_weight_above_2_fraction(), 0.5, 1e-9);
}

TEST(ComputeObjectiveTest, TokenStalenessBoundDropsTokensOlderThanEta) {
  // OneRow's tokens are 4 and 0 versions old. With a per-token bound of
  // eta = 3 token 0 leaves the loss: what is left is token 1 alone (u = 1,
  // w = 1): loss -1, half the tokens masked, and the figures are over the
  // trained token (staleness 0, w = 1).
  v1::AlgorithmConfig algorithm;
  algorithm.set_staleness_bound(v1::STALENESS_BOUND_TOKEN);
  algorithm.set_max_staleness(3);
  const ObjectiveConfig config = ObjectiveConfig::FromAlgorithm(algorithm, 16);
  EXPECT_EQ(config.max_token_staleness, 3);
  v1::TrainingStepMetrics metrics;
  const torch::Tensor loss = ComputeObjective(OneRow(), config, &metrics);
  EXPECT_NEAR(loss.item<double>(), -1.0, 1e-5);
  EXPECT_NEAR(metrics.tokens_masked_stale_fraction(), 0.5, 1e-9);
  EXPECT_NEAR(metrics.token_staleness_mean(), 0.0, 1e-9);
  EXPECT_EQ(metrics.token_staleness_max(), 0);
  EXPECT_NEAR(metrics.importance_weight_max(), 1.0, 1e-5);

  // eta = 4 keeps both (exactly eta old is fresh enough): the unmasked loss.
  algorithm.set_max_staleness(4);
  metrics.Clear();
  EXPECT_NEAR(ComputeObjective(OneRow(), ObjectiveConfig::FromAlgorithm(algorithm, 16), &metrics)
                  .item<double>(),
              -(std::exp(1.0) + 1) / 2, 1e-5);
  EXPECT_EQ(metrics.tokens_masked_stale_fraction(), 0.0);
  // The group bound (the default) masks nothing in the trainer.
  EXPECT_EQ(ObjectiveConfig::FromAlgorithm(v1::AlgorithmConfig(), 16).max_token_staleness, -1);
}

TEST(ComputeObjectiveTest, TrajectoryBalanceSumsCompletionTokens) {
  // Two samples of one group, beta 1, no reference. Row 1's second
  // position is padding (its -5 is not counted):
  //   log pi(y_0) = -1 - 2 = -3, r = 1;  log pi(y_1) = -3, r = 0
  //   log Z = mean(1 + 3, 0 + 3) = 3.5; residuals 3.5 - 3 - 1 = -0.5 and
  //   3.5 - 3 = 0.5; loss = 0.25; d/dlogp = 2 residual / 2 on each token.
  ObjectiveBatch batch;
  batch.logits = torch::zeros({2, 2, 3});
  batch.logp = Rows({-1, -2, -3, -5}, 2).requires_grad_(true);
  batch.mask = Rows({1, 1, 1, 0}, 2);
  batch.behaviour = batch.logp.detach().clone();
  batch.versions = torch::zeros({2, 2}, torch::kInt64);
  batch.advantages = torch::zeros({2, 2});
  batch.rewards = {1, 0};
  batch.groups = {3, 3};
  v1::AlgorithmConfig algorithm;
  algorithm.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
  v1::TrainingStepMetrics metrics;
  torch::Tensor logp = batch.logp;
  const torch::Tensor loss =
      ComputeObjective(batch, ObjectiveConfig::FromAlgorithm(algorithm, 16), &metrics);
  EXPECT_NEAR(loss.item<double>(), 0.25, 1e-6);
  EXPECT_NEAR(metrics.tb_log_z_mean(), 3.5, 1e-9);
  loss.backward();
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), -0.5, 1e-6);
  EXPECT_NEAR(logp.grad()[0][1].item<double>(), -0.5, 1e-6);
  EXPECT_NEAR(logp.grad()[1][0].item<double>(), 0.5, 1e-6);
  EXPECT_NEAR(logp.grad()[1][1].item<double>(), 0.0, 1e-9);
}

}  // namespace
}  // namespace sluice::trainer
