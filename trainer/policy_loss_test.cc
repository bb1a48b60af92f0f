#include "trainer/policy_loss.h"

#include <cmath>

#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

torch::Tensor T(std::vector<float> v) {
  return torch::tensor(v, torch::kFloat32).reshape({1, static_cast<int64_t>(v.size())});
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

}  // namespace
}  // namespace sluice::trainer
