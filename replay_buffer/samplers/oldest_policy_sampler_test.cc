#include "replay_buffer/samplers/oldest_policy_sampler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(OldestPolicySamplerTest, SelectsTheOldestPolicyVersionFirstThenInsertionOrder) {
  // Keys are insertion order; priorities the groups' min policy versions, as
  // when a long group leased at version 3 completes after short ones from 4
  // and 5.
  OldestPolicySampler sampler;
  sampler.Insert(1, 4);
  sampler.Insert(2, 5);
  sampler.Insert(3, 3);  // the late long group
  sampler.Insert(4, 4);
  sampler.Insert(5, 3);
  EXPECT_THAT(sampler.Select(5), ElementsAre(3, 5, 1, 4, 2));
  EXPECT_THAT(sampler.Select(2), ElementsAre(3, 5));  // Select removes nothing
  sampler.Delete(3);
  sampler.Delete(42);  // unknown: ignored
  EXPECT_THAT(sampler.Select(3), ElementsAre(5, 1, 4));
  EXPECT_EQ(sampler.size(), 4);
}

TEST(OldestPolicySamplerTest, SelectsAtMostWhatIsHeld) {
  OldestPolicySampler sampler;
  EXPECT_THAT(sampler.Select(2), IsEmpty());
  sampler.Insert(7, 0);
  EXPECT_THAT(sampler.Select(2), ElementsAre(7));
  EXPECT_THAT(sampler.Select(0), IsEmpty());
  EXPECT_THAT(sampler.Select(-3), IsEmpty());
}

TEST(OldestPolicySamplerTest, TheOrderIsFixedAtInsertAndARepeatedInsertChangesNothing) {
  OldestPolicySampler sampler;
  sampler.Insert(1, 9);
  sampler.Insert(2, 2);
  EXPECT_TRUE(sampler.Update(1, 0));   // client priorities do not reorder
  EXPECT_FALSE(sampler.Update(3, 0));  // not held
  sampler.Insert(1, 0);                // held: treated as an update
  EXPECT_EQ(sampler.size(), 2);
  EXPECT_THAT(sampler.Select(2), ElementsAre(2, 1));
  sampler.Delete(1);
  sampler.Insert(1, 0);  // deleted, then inserted anew: takes its new place
  EXPECT_THAT(sampler.Select(2), ElementsAre(1, 2));
}

TEST(OldestPolicySamplerTest, ProbabilityIsOneForTheFirstInOrderOnly) {
  OldestPolicySampler sampler;
  EXPECT_EQ(sampler.Probability(1), 0.0);
  sampler.Insert(1, 6);
  sampler.Insert(2, 5);
  EXPECT_EQ(sampler.Probability(2), 1.0);
  EXPECT_EQ(sampler.Probability(1), 0.0);
  EXPECT_EQ(sampler.Probability(3), 0.0);
  sampler.Delete(2);
  EXPECT_EQ(sampler.Probability(1), 1.0);
}

}  // namespace
}  // namespace sluice::replay_buffer
