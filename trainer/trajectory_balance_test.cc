#include "trainer/trajectory_balance.h"

#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

// Two groups of two samples, interleaved (group ids 7 and 3), beta = 0.5:
//
//   sample  group  r  r/beta  log pi  log pi_ref
//   a0      7      1  2       -3      -4
//   b0      3      0  0       -2      -3
//   a1      7      0  0       -4      -4
//   b1      3      0  0       -6      -5
TrajectoryBalanceInputs Inputs(bool reference) {
  TrajectoryBalanceInputs inputs;
  inputs.sequence_logp = torch::tensor({-3.0f, -2.0f, -4.0f, -6.0f}).requires_grad_(true);
  if (reference) inputs.sequence_logp_reference = torch::tensor({-4.0f, -3.0f, -4.0f, -5.0f});
  inputs.rewards = {1, 0, 0, 0};
  inputs.groups = {7, 3, 7, 3};
  return inputs;
}

TEST(TrajectoryBalanceTest, VarGradLogZPerGroupWithAReference) {
  // log Z(7) = mean(2 + 3 - 4, 0 + 4 - 4) = mean(1, 0) = 0.5
  // log Z(3) = mean(0 + 2 - 3, 0 + 6 - 5) = mean(-1, 1) = 0
  // residuals log Z + log pi - log pi_ref - r/beta:
  //   a0: 0.5 - 3 + 4 - 2 = -0.5    a1: 0.5 - 4 + 4 - 0 = 0.5
  //   b0: 0   - 2 + 3 - 0 =  1      b1: 0   - 6 + 5 - 0 = -1
  // loss = (0.25 + 1 + 0.25 + 1) / 4 = 0.625; log Z mean (0.5 + 0) / 2.
  // d loss / d log pi_i = 2 residual_i / 4 (log Z is a constant).
  TrajectoryBalanceInputs inputs = Inputs(/*reference=*/true);
  TrajectoryBalanceLoss out = TrajectoryBalance(inputs, /*beta=*/0.5);
  EXPECT_NEAR(out.loss.item<double>(), 0.625, 1e-6);
  EXPECT_NEAR(out.log_z_mean, 0.25, 1e-9);
  out.loss.backward();
  const torch::Tensor grad = inputs.sequence_logp.grad();
  EXPECT_NEAR(grad[0].item<double>(), -0.25, 1e-6);
  EXPECT_NEAR(grad[1].item<double>(), 0.5, 1e-6);
  EXPECT_NEAR(grad[2].item<double>(), 0.25, 1e-6);
  EXPECT_NEAR(grad[3].item<double>(), -0.5, 1e-6);
}

TEST(TrajectoryBalanceTest, WithoutAReferenceLogPiRefIsZero) {
  // log Z(7) = mean(2 + 3, 0 + 4) = 4.5; log Z(3) = mean(0 + 2, 0 + 6) = 4
  // residuals: a0 4.5 - 3 - 2 = -0.5, a1 4.5 - 4 = 0.5, b0 4 - 2 = 2,
  // b1 4 - 6 = -2; loss = (0.25 + 4 + 0.25 + 4) / 4 = 2.125.
  TrajectoryBalanceInputs inputs = Inputs(/*reference=*/false);
  TrajectoryBalanceLoss out = TrajectoryBalance(inputs, /*beta=*/0.5);
  EXPECT_NEAR(out.loss.item<double>(), 2.125, 1e-6);
  EXPECT_NEAR(out.log_z_mean, 4.25, 1e-9);
  out.loss.backward();
  EXPECT_NEAR(inputs.sequence_logp.grad()[1].item<double>(), 1.0, 1e-6);
}

TEST(TrajectoryBalanceTest, AGroupAtItsOptimumHasNoLoss) {
  // pi = pi_ref exp(r / beta) / Z up to the group's constant: with beta 1,
  // log pi - log pi_ref = r + c for both samples -> every residual is 0.
  TrajectoryBalanceInputs inputs;
  inputs.sequence_logp = torch::tensor({-1.0f, -2.0f}).requires_grad_(true);
  inputs.sequence_logp_reference = torch::tensor({-5.0f, -5.0f});
  inputs.rewards = {4, 3};
  inputs.groups = {0, 0};
  EXPECT_NEAR(TrajectoryBalance(inputs, 1.0).loss.item<double>(), 0.0, 1e-9);
}

}  // namespace
}  // namespace sluice::trainer
