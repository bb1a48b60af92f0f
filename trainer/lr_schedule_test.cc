#include "trainer/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

v1::AlgorithmConfig Algorithm(v1::LrSchedule schedule, int64_t total, int64_t warmup,
                              double min_ratio) {
  v1::AlgorithmConfig a;
  a.set_learning_rate(1e-3);
  a.set_total_steps(total);
  a.set_lr_warmup_steps(warmup);
  a.set_lr_schedule(schedule);
  a.set_min_lr_ratio(min_ratio);
  return a;
}

TEST(LearningRateAtTest, ConstantHoldsThePeakAfterAWarmUp) {
  const auto a = Algorithm(v1::LR_SCHEDULE_CONSTANT, 100, 10, 0);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 1), 1e-4);  // 1 / 10 of the way up
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 5), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 10), 1e-3);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 100), 1e-3);
}

TEST(LearningRateAtTest, CosineFallsTowardsTheFloor) {
  const auto a = Algorithm(v1::LR_SCHEDULE_COSINE, 100, 0, 0.1);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 1), 1e-3);
  // p = 25 / 100: 0.1 + 0.9 * (1 + cos(pi / 4)) / 2 = 0.1 + 0.45 * 1.70710678
  EXPECT_NEAR(LearningRateAt(a, 26), 1e-3 * 0.868198052, 1e-12);
  EXPECT_NEAR(LearningRateAt(a, 51), 5.5e-4, 1e-15);  // 0.1 + 0.9 / 2
  // The last step: p = 0.99, just above the floor, so it still learns.
  EXPECT_NEAR(LearningRateAt(a, 100), 1e-3 * (0.1 + 0.45 * (1 + std::cos(0.99 * M_PI))), 1e-15);
  EXPECT_GT(LearningRateAt(a, 100), 1e-4);
  // Steps past total_steps (a run extended by hand) stay at the floor.
  EXPECT_NEAR(LearningRateAt(a, 101), 1e-4, 1e-15);
  EXPECT_NEAR(LearningRateAt(a, 150), 1e-4, 1e-15);
}

TEST(LearningRateAtTest, LinearDecaysFromTheEndOfTheWarmUp) {
  const auto a = Algorithm(v1::LR_SCHEDULE_LINEAR, 120, 20, 0);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 10), 5e-4);  // warming up
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 20), 1e-3);  // the peak
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 21), 1e-3);  // decay not begun
  EXPECT_NEAR(LearningRateAt(a, 71), 5e-4, 1e-15);  // half the decay done
  EXPECT_NEAR(LearningRateAt(a, 96), 2.5e-4, 1e-15);
  EXPECT_NEAR(LearningRateAt(a, 120), 1e-5, 1e-15);  // 1 / 100 of the way left
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 121), 0);
}

TEST(LearningRateAtTest, AWarmUpAsLongAsTheRunLeavesNoDecay) {
  const auto a = Algorithm(v1::LR_SCHEDULE_COSINE, 50, 50, 0);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 25), 5e-4);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 50), 1e-3);
}

TEST(LearningRateAtTest, AnUnsetScheduleIsConstant) {
  // A spec from before lr_schedule existed (not defaulted by a controller).
  const auto a = Algorithm(v1::LR_SCHEDULE_UNSPECIFIED, 100, 0, 0);
  EXPECT_DOUBLE_EQ(LearningRateAt(a, 100), 1e-3);
}

}  // namespace
}  // namespace sluice::trainer
