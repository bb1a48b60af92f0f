#include "replay_buffer/samplers/lifo_sampler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(LifoSamplerTest, SelectsNewestKeysFirstWithoutRemovingThem) {
  LifoSampler sampler;
  for (int64_t key : {5, 1, 3, 4, 2}) sampler.Insert(key, /*priority=*/key);
  EXPECT_THAT(sampler.Select(3), ElementsAre(5, 4, 3));
  EXPECT_THAT(sampler.Select(3), ElementsAre(5, 4, 3));
  sampler.Delete(4);
  sampler.Delete(42);  // unknown: ignored
  EXPECT_THAT(sampler.Select(3), ElementsAre(5, 3, 2));
  EXPECT_EQ(sampler.size(), 4);
}

TEST(LifoSamplerTest, SelectsAtMostWhatIsHeld) {
  LifoSampler sampler;
  EXPECT_THAT(sampler.Select(2), IsEmpty());
  sampler.Insert(7, 0.0);
  sampler.Insert(8, 0.0);
  EXPECT_THAT(sampler.Select(5), ElementsAre(8, 7));
  EXPECT_THAT(sampler.Select(0), IsEmpty());
  EXPECT_THAT(sampler.Select(-1), IsEmpty());
}

TEST(LifoSamplerTest, IgnoresPrioritiesAndReportsWhetherAKeyIsHeld) {
  LifoSampler sampler;
  sampler.Insert(1, 100.0);
  sampler.Insert(2, 0.0);
  EXPECT_TRUE(sampler.Update(2, -5.0));
  EXPECT_FALSE(sampler.Update(3, 1.0));
  EXPECT_THAT(sampler.Select(2), ElementsAre(2, 1));
}

TEST(LifoSamplerTest, ProbabilityIsOneForTheNewestKeyOnly) {
  LifoSampler sampler;
  EXPECT_EQ(sampler.Probability(1), 0.0);
  sampler.Insert(1, 0.0);
  sampler.Insert(2, 0.0);
  EXPECT_EQ(sampler.Probability(2), 1.0);
  EXPECT_EQ(sampler.Probability(1), 0.0);
  sampler.Delete(2);
  EXPECT_EQ(sampler.Probability(1), 1.0);
}

}  // namespace
}  // namespace sluice::replay_buffer
