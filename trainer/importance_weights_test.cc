#include "trainer/importance_weights.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

torch::Tensor Row(std::vector<double> v) {
  return torch::tensor(v, torch::kFloat32).reshape({1, static_cast<int64_t>(v.size())});
}

std::vector<float> Values(const torch::Tensor& t) {
  const torch::Tensor flat = t.to(torch::kFloat32).contiguous().reshape({-1});
  return std::vector<float>(flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
}

TEST(LogLinearProximalLogProbsTest, InterpolatesInVersionTime) {
  // v_prox = 4 (the batch's start), v_theta = 6 (two minibatches later).
  //   token 0: v_behav 2, alpha = (4-2)/(6-2) = 1/2: -2   + 1/2 (-1 - -2)   = -1.5
  //   token 1: v_behav 3, alpha = (4-3)/(6-3) = 1/3: -2.5 + 1/3 (-1 - -2.5) = -2.0
  //   token 2: v_behav 4, alpha = (4-4)/(6-4) = 0:   -3   + 0               = -3.0
  const torch::Tensor current = Row({-1, -1, -1});
  const torch::Tensor behaviour = Row({-2, -2.5, -3});
  const torch::Tensor versions = torch::tensor({2, 3, 4}, torch::kInt64).reshape({1, 3});
  const std::vector<float> prox =
      Values(LogLinearProximalLogProbs(current, behaviour, versions, 4, 6));
  EXPECT_NEAR(prox[0], -1.5, 1e-6);
  EXPECT_NEAR(prox[1], -2.0, 1e-6);
  EXPECT_NEAR(prox[2], -3.0, 1e-6);
}

TEST(LogLinearProximalLogProbsTest, IsTheCurrentPolicyWhenTheWeightsHaveNotMoved) {
  // v_prox = v_theta = 5: alpha = (5-3)/(5-3) = 1 for the stale token, and
  // 1 by definition for the token of version 5 (0/0).
  const torch::Tensor current = Row({-0.7, -1.2});
  const torch::Tensor behaviour = Row({-2, -0.1});
  const torch::Tensor versions = torch::tensor({3, 5}, torch::kInt64).reshape({1, 2});
  const std::vector<float> prox =
      Values(LogLinearProximalLogProbs(current, behaviour, versions, 5, 5));
  EXPECT_NEAR(prox[0], -0.7, 1e-6);
  EXPECT_NEAR(prox[1], -1.2, 1e-6);
}

TEST(CorrectBehaviourWeightsTest, TruncatesAtTheCap) {
  // w = 10, 4, 1, 0.25 with cap 5: 10 -> 5, one token of four above the cap.
  const torch::Tensor log_w = Row({std::log(10.0), std::log(4.0), 0.0, std::log(0.25)});
  WeightCorrectionOptions options;
  options.cap = 5;
  const CorrectedWeights out = CorrectBehaviourWeights(log_w, Row({1, 1, 1, 1}), options);
  const std::vector<float> w = Values(out.weight);
  EXPECT_NEAR(w[0], 5.0, 1e-5);
  EXPECT_NEAR(w[1], 4.0, 1e-5);
  EXPECT_NEAR(w[2], 1.0, 1e-6);
  EXPECT_NEAR(w[3], 0.25, 1e-6);
  EXPECT_EQ(Values(out.keep), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(out.above_cap_fraction, 0.25);
  EXPECT_DOUBLE_EQ(out.masked_above_cap_fraction, 0.0);
}

TEST(CorrectBehaviourWeightsTest, IcePopMasksOutsideFloorAndCap) {
  // Mask mode with [0.5, 5]: w = 10 (above) and 0.25 (below) drop, 4 and 1
  // stay with their weights; each bound dropped 1 of 4 tokens.
  const torch::Tensor log_w = Row({std::log(10.0), std::log(4.0), 0.0, std::log(0.25)});
  WeightCorrectionOptions options;
  options.mode = WeightCapMode::kMask;
  options.cap = 5;
  options.floor = 0.5;
  const CorrectedWeights out = CorrectBehaviourWeights(log_w, Row({1, 1, 1, 1}), options);
  EXPECT_EQ(Values(out.keep), (std::vector<float>{0, 1, 1, 0}));
  EXPECT_NEAR(Values(out.weight)[1], 4.0, 1e-5);
  EXPECT_DOUBLE_EQ(out.masked_above_cap_fraction, 0.25);
  EXPECT_DOUBLE_EQ(out.masked_below_floor_fraction, 0.25);
}

TEST(CorrectBehaviourWeightsTest, TheFloorAlsoMasksUnderTruncation) {
  // Truncate mode, floor 0.5: 0.25 drops; 10 is truncated to 5 and stays.
  const torch::Tensor log_w = Row({std::log(10.0), std::log(0.25)});
  WeightCorrectionOptions options;
  options.cap = 5;
  options.floor = 0.5;
  const CorrectedWeights out = CorrectBehaviourWeights(log_w, Row({1, 1}), options);
  EXPECT_EQ(Values(out.keep), (std::vector<float>{1, 0}));
  EXPECT_NEAR(Values(out.weight)[0], 5.0, 1e-5);
  EXPECT_DOUBLE_EQ(out.masked_below_floor_fraction, 0.5);
}

TEST(SecondMomentKeepMaskTest, DropsTheLargestSecondMomentsUntilTheMeanIsWithinTau) {
  // log w = 0.1, -0.2, 0.5, 0, 0.3 (and a 6th token outside the mask, 3.0):
  // (log w)^2 = 0.01, 0.04, 0.25, 0, 0.09, mean 0.39 / 5 = 0.078 > 0.04.
  // Sorted: 0, 0.01, 0.04, 0.09, 0.25; prefix means 0, 0.005, 0.0167,
  // 0.035, 0.078. tau = 0.04: keep the 4 smallest (0.035 <= 0.04), drop
  // 0.5. tau = 0.02: keep 3 (0.0167 <= 0.02 < 0.035), drop 0.5 and 0.3.
  const torch::Tensor log_w = Row({0.1, -0.2, 0.5, 0.0, 0.3, 3.0});
  const torch::Tensor mask = Row({1, 1, 1, 1, 1, 0});
  EXPECT_EQ(Values(SecondMomentKeepMask(log_w, mask, 0.04)),
            (std::vector<float>{1, 1, 0, 1, 1, 0}));
  EXPECT_EQ(Values(SecondMomentKeepMask(log_w, mask, 0.02)),
            (std::vector<float>{1, 1, 0, 1, 0, 0}));
  // tau 0.1 >= 0.078: everything stays; tau 0 = off.
  EXPECT_EQ(Values(SecondMomentKeepMask(log_w, mask, 0.1)), Values(mask));
  EXPECT_EQ(Values(SecondMomentKeepMask(log_w, mask, 0.0)), Values(mask));

  WeightCorrectionOptions options;
  options.mode = WeightCapMode::kNone;
  options.second_moment_threshold = 0.04;
  const CorrectedWeights out = CorrectBehaviourWeights(log_w, mask, options);
  EXPECT_DOUBLE_EQ(out.masked_second_moment_fraction, 0.2);  // 1 of the 5 masked tokens
}

TEST(SummarizeImportanceWeightsTest, EssAndTails) {
  // w = 0.4, 1, 1, 2.5, 5 (and 100 outside the mask).
  //   sum w = 9.9, sum w^2 = 0.16 + 1 + 1 + 6.25 + 25 = 33.41
  //   ESS = 9.9^2 / (5 * 33.41) = 98.01 / 167.05 = 0.58671...
  //   p99: position 0.99 * 4 = 3.96: 2.5 + 0.96 (5 - 2.5) = 4.9
  //   p01: position 0.01 * 4 = 0.04: 0.4 + 0.04 (1 - 0.4) = 0.424
  //   above 2: {2.5, 5} = 2/5; below 0.5: {0.4} = 1/5.
  const ImportanceWeightStats stats =
      SummarizeImportanceWeights(Row({0.4, 1, 1, 2.5, 5, 100}), Row({1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(stats.tokens, 5);
  EXPECT_NEAR(stats.effective_sample_size, 98.01 / 167.05, 1e-6);
  EXPECT_NEAR(stats.max, 5.0, 1e-6);
  EXPECT_NEAR(stats.min, 0.4, 1e-6);
  EXPECT_NEAR(stats.p99, 4.9, 1e-5);
  EXPECT_NEAR(stats.p01, 0.424, 1e-6);
  EXPECT_DOUBLE_EQ(stats.fraction_above_2, 0.4);
  EXPECT_DOUBLE_EQ(stats.fraction_below_half, 0.2);
}

TEST(SummarizeImportanceWeightsTest, OnPolicyWeightsHaveFullEffectiveSampleSize) {
  const ImportanceWeightStats stats = SummarizeImportanceWeights(Row({1, 1, 1}), Row({1, 1, 1}));
  EXPECT_NEAR(stats.effective_sample_size, 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(stats.fraction_above_2, 0.0);
  const ImportanceWeightStats empty = SummarizeImportanceWeights(Row({3}), Row({0}));
  EXPECT_EQ(empty.tokens, 0);
  EXPECT_DOUBLE_EQ(empty.effective_sample_size, 1.0);
}

}  // namespace
}  // namespace sluice::trainer
