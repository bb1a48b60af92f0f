#include "trainer/policy_loss.h"

#include <cmath>

#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

torch::Tensor T(std::vector<float> v) {
  return torch::tensor(v, torch::kFloat32).reshape({1, static_cast<int64_t>(v.size())});
}

// The loss without a reference or an entropy term.
PolicyLoss DecoupledPpoLoss(const torch::Tensor& logp, const torch::Tensor& logp_prox,
                            const torch::Tensor& logp_behav, const torch::Tensor& advantages,
                            const torch::Tensor& mask, const PolicyLossOptions& options) {
  PolicyLossInputs inputs;
  inputs.logp = logp;
  inputs.logp_prox = logp_prox;
  inputs.logp_behav = logp_behav;
  inputs.advantages = advantages;
  inputs.mask = mask;
  return trainer::DecoupledPpoLoss(inputs, options);
}

TEST(DecoupledPpoLossTest, OnPolicyGradientIsAdvantageWeightedLogProb) {
  // logp == prox == behav: ratio 1, weight 1, loss = -mean(A), d loss / d logp = -A / n.
  torch::Tensor logp = T({-1.0f, -2.0f, -0.5f}).requires_grad_(true);
  const torch::Tensor same = logp.detach().clone();
  const torch::Tensor adv = T({1.0f, -1.0f, 2.0f});
  const torch::Tensor mask = T({1, 1, 1});
  PolicyLoss out = DecoupledPpoLoss(logp, same, same, adv, mask, {});
  EXPECT_NEAR(out.loss.item<double>(), -(1.0 - 1.0 + 2.0) / 3, 1e-6);
  out.loss.backward();
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), -1.0 / 3, 1e-6);
  EXPECT_NEAR(logp.grad()[0][1].item<double>(), 1.0 / 3, 1e-6);
  EXPECT_NEAR(logp.grad()[0][2].item<double>(), -2.0 / 3, 1e-6);
  EXPECT_DOUBLE_EQ(out.clip_fraction, 0.0);
  EXPECT_NEAR(out.kl_to_behaviour, 0.0, 1e-7);
}

TEST(DecoupledPpoLossTest, ClipsTheRatioAroundTheProximalPolicy) {
  // ratio = e^0.5 = 1.65 > 1.2 with A > 0: clipped, no gradient through it.
  torch::Tensor logp = T({0.5f, 0.5f}).requires_grad_(true);
  const torch::Tensor prox = T({0.0f, 0.0f});
  const torch::Tensor adv = T({1.0f, -1.0f});
  PolicyLoss out = DecoupledPpoLoss(logp, prox, prox, adv, T({1, 1}), {});
  // token 0: min(1.65, 1.2) * 1 = 1.2 (clipped); token 1: min(-1.65, -1.2) = -1.65.
  EXPECT_NEAR(out.loss.item<double>(), -(1.2 - std::exp(0.5)) / 2, 1e-5);
  EXPECT_DOUBLE_EQ(out.clip_fraction, 0.5);
  out.loss.backward();
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), 0.0, 1e-7);
  EXPECT_NEAR(logp.grad()[0][1].item<double>(), std::exp(0.5) / 2, 1e-5);
}

TEST(DecoupledPpoLossTest, BehaviourWeightIsCappedOrMasked) {
  // prox - behav = log 10: w = 10, capped to 5 (truncate) or the token dropped (mask).
  torch::Tensor logp = T({0.0f, 0.0f}).requires_grad_(true);
  const torch::Tensor prox = T({0.0f, 0.0f});
  const torch::Tensor behav = T({static_cast<float>(-std::log(10.0)), 0.0f});
  const torch::Tensor adv = T({1.0f, 1.0f});
  PolicyLossOptions options;
  options.behaviour_weight_cap = 5.0;
  PolicyLoss truncated = DecoupledPpoLoss(logp, prox, behav, adv, T({1, 1}), options);
  EXPECT_NEAR(truncated.loss.item<double>(), -(5.0 + 1.0) / 2, 1e-5);
  EXPECT_DOUBLE_EQ(truncated.capped_fraction, 0.5);
  options.cap_mode = WeightCapMode::kMask;
  PolicyLoss masked = DecoupledPpoLoss(logp, prox, behav, adv, T({1, 1}), options);
  EXPECT_NEAR(masked.loss.item<double>(), -1.0, 1e-5);
  options.cap_mode = WeightCapMode::kNone;
  PolicyLoss unbounded = DecoupledPpoLoss(logp, prox, behav, adv, T({1, 1}), options);
  EXPECT_NEAR(unbounded.loss.item<double>(), -(10.0 + 1.0) / 2, 1e-4);
}

TEST(DecoupledPpoLossTest, MaskedTokensDoNotCount) {
  torch::Tensor logp = T({-1.0f, -1.0f, -1.0f}).requires_grad_(true);
  const torch::Tensor same = logp.detach().clone();
  PolicyLoss out = DecoupledPpoLoss(logp, same, same, T({1.0f, 100.0f, 1.0f}), T({1, 0, 1}), {});
  EXPECT_NEAR(out.loss.item<double>(), -1.0, 1e-6);
}

TEST(DecoupledPpoLossTest, ClipHigherLetsPositiveAdvantagesGrowFurther) {
  // DAPO's asymmetric clip, eps_low 0.2, eps_high 0.28:
  //   token 0: u = e^0.25 = 1.2840 > 1.28, A = 1: clipped to 1.28, no gradient
  //   token 1: u = e^0.2  = 1.2214 < 1.28, A = 1: kept (the symmetric 1.2
  //            would clip it)
  //   token 2: u = e^-0.3 = 0.7408 < 0.8, A = -1: min(-0.7408, -0.8) = -0.8, clipped
  // loss = -(1.28 + 1.2214028 - 0.8) / 3; d/dlogp_1 = -e^0.2 / 3; clip fraction 2/3.
  torch::Tensor logp = T({0.25f, 0.2f, -0.3f}).requires_grad_(true);
  const torch::Tensor prox = T({0, 0, 0});
  PolicyLossOptions options;
  options.clip_eps_low = 0.2;
  options.clip_eps_high = 0.28;
  PolicyLoss out = DecoupledPpoLoss(logp, prox, prox, T({1, 1, -1}), T({1, 1, 1}), options);
  EXPECT_NEAR(out.loss.item<double>(), -(1.28 + std::exp(0.2) - 0.8) / 3, 1e-6);
  EXPECT_NEAR(out.clip_fraction, 2.0 / 3, 1e-9);
  out.loss.backward();
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), 0.0, 1e-7);
  EXPECT_NEAR(logp.grad()[0][1].item<double>(), -std::exp(0.2) / 3, 1e-6);
  EXPECT_NEAR(logp.grad()[0][2].item<double>(), 0.0, 1e-7);
}

// Two rows: row 0 has three tokens with A = 1, row 1 one token with A = -2
// (on-policy: u = w = 1, so l_t = -A_t).
struct TwoRows {
  torch::Tensor logp = torch::tensor({-1.0f, -1.0f, -1.0f, -1.0f, 0.0f, 0.0f})
                           .reshape({2, 3})
                           .requires_grad_(true);
  torch::Tensor same = logp.detach().clone();
  torch::Tensor advantages = torch::tensor({1.0f, 1.0f, 1.0f, -2.0f, 0.0f, 0.0f}).reshape({2, 3});
  torch::Tensor mask = torch::tensor({1.0f, 1.0f, 1.0f, 1.0f, 0.0f, 0.0f}).reshape({2, 3});
};

TEST(DecoupledPpoLossTest, TokenMeanWeighsEveryTokenAlike) {
  // (-1 - 1 - 1 + 2) / 4 = -0.25; d/dlogp = -A / 4.
  TwoRows rows;
  PolicyLoss out =
      DecoupledPpoLoss(rows.logp, rows.same, rows.same, rows.advantages, rows.mask, {});
  EXPECT_NEAR(out.loss.item<double>(), -0.25, 1e-6);
  out.loss.backward();
  EXPECT_NEAR(rows.logp.grad()[0][0].item<double>(), -0.25, 1e-6);
  EXPECT_NEAR(rows.logp.grad()[1][0].item<double>(), 0.5, 1e-6);
}

TEST(DecoupledPpoLossTest, SequenceMeanWeighsEverySequenceAlike) {
  // mean(row 0: -3/3 = -1, row 1: 2/1 = 2) = 0.5;
  // d/dlogp = -A / (tokens of the row * 2 rows): row 0 -1/6, row 1 2/2 = 1.
  TwoRows rows;
  PolicyLossOptions options;
  options.aggregation = LossAggregation::kSequenceMean;
  PolicyLoss out =
      DecoupledPpoLoss(rows.logp, rows.same, rows.same, rows.advantages, rows.mask, options);
  EXPECT_NEAR(out.loss.item<double>(), 0.5, 1e-6);
  out.loss.backward();
  EXPECT_NEAR(rows.logp.grad()[0][0].item<double>(), -1.0 / 6, 1e-6);
  EXPECT_NEAR(rows.logp.grad()[1][0].item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(rows.logp.grad()[1][1].item<double>(), 0.0, 1e-7);  // padding
}

TEST(DecoupledPpoLossTest, ConstantNormalizerDividesSequenceSumsByAConstant) {
  // Dr. GRPO with L = 4: (row sums -3 and 2) / (2 rows * 4) = -1/8;
  // d/dlogp = -A / 8: row 0 -1/8, row 1 2/8.
  TwoRows rows;
  PolicyLossOptions options;
  options.aggregation = LossAggregation::kConstantNormalizer;
  options.aggregation_constant = 4;
  PolicyLoss out =
      DecoupledPpoLoss(rows.logp, rows.same, rows.same, rows.advantages, rows.mask, options);
  EXPECT_NEAR(out.loss.item<double>(), -0.125, 1e-6);
  out.loss.backward();
  EXPECT_NEAR(rows.logp.grad()[0][2].item<double>(), -0.125, 1e-6);
  EXPECT_NEAR(rows.logp.grad()[1][0].item<double>(), 0.25, 1e-6);
}

TEST(DecoupledPpoLossTest, KlToTheReferenceIsK3) {
  // A = 0, so only the KL term: kl_coef 0.1, d = ref - logp:
  //   token 0: d = -1.5 - -1 = -0.5: k3 = e^-0.5 + 0.5 - 1 = 0.1065307
  //   token 1: d = -1 - -2 = 1:      k3 = e - 1 - 1       = 0.7182818
  // loss = 0.1 * (0.1065307 + 0.7182818) / 2 = 0.0412406;
  // d k3 / d logp = 1 - e^d: token 0 1 - 0.6065307, token 1 1 - e; times 0.1 / 2.
  torch::Tensor logp = T({-1.0f, -2.0f}).requires_grad_(true);
  const torch::Tensor same = logp.detach().clone();
  PolicyLossInputs inputs;
  inputs.logp = logp;
  inputs.logp_prox = same;
  inputs.logp_behav = same;
  inputs.advantages = T({0, 0});
  inputs.mask = T({1, 1});
  inputs.logp_reference = T({-1.5f, -1.0f});
  PolicyLossOptions options;
  options.kl_coef = 0.1;
  PolicyLoss out = DecoupledPpoLoss(inputs, options);
  const double k3_0 = std::exp(-0.5) + 0.5 - 1;
  const double k3_1 = std::exp(1.0) - 2;
  EXPECT_NEAR(out.loss.item<double>(), 0.1 * (k3_0 + k3_1) / 2, 1e-6);
  EXPECT_NEAR(out.kl_to_reference, (k3_0 + k3_1) / 2, 1e-6);
  out.loss.backward();
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), 0.1 * (1 - std::exp(-0.5)) / 2, 1e-6);
  EXPECT_NEAR(logp.grad()[0][1].item<double>(), 0.1 * (1 - std::exp(1.0)) / 2, 1e-6);
}

TEST(DecoupledPpoLossTest, EntropyBonusRewardsEntropy) {
  // A = 0: loss = -0.01 * mean(0.5, 1.5) = -0.01; d/dH = -0.01 / 2 each.
  torch::Tensor logp = T({-1.0f, -1.0f}).requires_grad_(true);
  const torch::Tensor same = logp.detach().clone();
  torch::Tensor entropy = T({0.5f, 1.5f}).requires_grad_(true);
  PolicyLossInputs inputs;
  inputs.logp = logp;
  inputs.logp_prox = same;
  inputs.logp_behav = same;
  inputs.advantages = T({0, 0});
  inputs.mask = T({1, 1});
  inputs.entropy = entropy;
  PolicyLossOptions options;
  options.entropy_coef = 0.01;
  PolicyLoss out = DecoupledPpoLoss(inputs, options);
  EXPECT_NEAR(out.loss.item<double>(), -0.01, 1e-7);
  out.loss.backward();
  EXPECT_NEAR(entropy.grad()[0][0].item<double>(), -0.005, 1e-8);
  EXPECT_NEAR(entropy.grad()[0][1].item<double>(), -0.005, 1e-8);
}

TEST(DecoupledPpoLossTest, TokensBelowTheFloorLeaveTheMean) {
  // w = prox / behav = 1, 0.25, 1; floor 0.5 drops token 1 (A = 100):
  // loss = -(1 + 3) / 2 = -2, the dropped token neither in the sum nor the count.
  torch::Tensor logp = T({0, 0, 0}).requires_grad_(true);
  const torch::Tensor prox = T({0, 0, 0});
  const torch::Tensor behav = T({0.0f, static_cast<float>(std::log(4.0)), 0.0f});
  PolicyLossOptions options;
  options.behaviour_weight_floor = 0.5;
  PolicyLoss out = DecoupledPpoLoss(logp, prox, behav, T({1, 100, 3}), T({1, 1, 1}), options);
  EXPECT_NEAR(out.loss.item<double>(), -2.0, 1e-6);
  EXPECT_NEAR(out.masked_below_floor_fraction, 1.0 / 3, 1e-9);
}

TEST(DecoupledPpoLossTest, TruncatedImportanceSamplingIsTheCurrentPolicyAsProximal) {
  // prox = logp.detach(): u = 1, w = pi / pi_behav = 2 and 10 -> 5 (cap):
  // loss = -(2 * 1 + 5 * 1) / 2 = -3.5; d/dlogp = -w A / 2 = -1, -2.5 (the
  // truncated weight still passes a gradient, unlike a clipped ratio).
  torch::Tensor logp = T({0, 0}).requires_grad_(true);
  const torch::Tensor behav =
      T({static_cast<float>(-std::log(2.0)), static_cast<float>(-std::log(10.0))});
  PolicyLoss out = DecoupledPpoLoss(logp, logp.detach(), behav, T({1, 1}), T({1, 1}), {});
  EXPECT_NEAR(out.loss.item<double>(), -3.5, 1e-5);
  EXPECT_DOUBLE_EQ(out.capped_fraction, 0.5);
  out.loss.backward();
  EXPECT_NEAR(logp.grad()[0][0].item<double>(), -1.0, 1e-5);
  EXPECT_NEAR(logp.grad()[0][1].item<double>(), -2.5, 1e-5);
}

}  // namespace
}  // namespace sluice::trainer
