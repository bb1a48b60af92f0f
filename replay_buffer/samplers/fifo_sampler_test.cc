#include "replay_buffer/samplers/fifo_sampler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(FifoSamplerTest, SelectsOldestKeysFirstWithoutRemovingThem) {
  FifoSampler sampler;
  for (int64_t key : {5, 1, 3, 4, 2}) sampler.Insert(key, /*priority=*/10.0 - key);
  EXPECT_THAT(sampler.Select(3), ElementsAre(1, 2, 3));
  EXPECT_THAT(sampler.Select(3), ElementsAre(1, 2, 3));
  sampler.Delete(2);
  sampler.Delete(42);  // unknown: ignored
  EXPECT_THAT(sampler.Select(3), ElementsAre(1, 3, 4));
  EXPECT_EQ(sampler.size(), 4);
}

TEST(FifoSamplerTest, SelectsAtMostWhatIsHeld) {
  FifoSampler sampler;
  EXPECT_THAT(sampler.Select(2), IsEmpty());
  sampler.Insert(7, 0.0);
  EXPECT_THAT(sampler.Select(2), ElementsAre(7));
  EXPECT_THAT(sampler.Select(0), IsEmpty());
  EXPECT_THAT(sampler.Select(-3), IsEmpty());
}

TEST(FifoSamplerTest, IgnoresPrioritiesAndReportsWhetherAKeyIsHeld) {
  FifoSampler sampler;
  sampler.Insert(1, 0.0);
  sampler.Insert(2, 100.0);
  EXPECT_TRUE(sampler.Update(1, 1e9));
  EXPECT_FALSE(sampler.Update(3, 1.0));
  EXPECT_EQ(sampler.size(), 2);
  EXPECT_THAT(sampler.Select(2), ElementsAre(1, 2));
}

TEST(FifoSamplerTest, ProbabilityIsOneForTheOldestKeyOnly) {
  FifoSampler sampler;
  EXPECT_EQ(sampler.Probability(1), 0.0);
  sampler.Insert(2, 0.0);
  sampler.Insert(1, 0.0);
  EXPECT_EQ(sampler.Probability(1), 1.0);
  EXPECT_EQ(sampler.Probability(2), 0.0);
  EXPECT_EQ(sampler.Probability(3), 0.0);
  sampler.Delete(1);
  EXPECT_EQ(sampler.Probability(2), 1.0);
}

}  // namespace
}  // namespace sluice::replay_buffer
