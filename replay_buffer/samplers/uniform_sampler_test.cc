#include "replay_buffer/samplers/uniform_sampler.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/samplers/sampler_test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::sluice::replay_buffer::testing::ExpectOrderedPairsMatch;
using ::sluice::replay_buffer::testing::ExpectSingleDrawsMatch;
using ::sluice::replay_buffer::testing::FiveSigma;
using ::testing::UnorderedElementsAre;

TEST(UniformSamplerTest, SingleDrawsAreUniformWhateverThePriorities) {
  UniformSampler sampler(/*seed=*/1);
  std::map<int64_t, double> expected;
  for (int64_t key = 10; key < 20; ++key) {
    sampler.Insert(key, /*priority=*/static_cast<double>(key * key));
    expected[key] = 0.1;
  }
  ExpectSingleDrawsMatch(sampler, expected, 200'000);
}

TEST(UniformSamplerTest, DeleteSwapsTheLastKeyIntoTheHole) {
  UniformSampler sampler(/*seed=*/2);
  for (int64_t key = 1; key <= 5; ++key) sampler.Insert(key, 0.0);
  sampler.Delete(2);  // middle
  sampler.Delete(5);  // now last
  sampler.Delete(9);  // unknown: ignored
  EXPECT_EQ(sampler.size(), 3);
  EXPECT_EQ(sampler.Probability(2), 0.0);
  EXPECT_EQ(sampler.Probability(4), 1.0 / 3.0);
  EXPECT_FALSE(sampler.Update(2, 1.0));
  EXPECT_TRUE(sampler.Update(4, 1.0));
  EXPECT_THAT(sampler.Select(10), UnorderedElementsAre(1, 3, 4));
  sampler.Insert(2, 0.0);
  EXPECT_THAT(sampler.Select(10), UnorderedElementsAre(1, 2, 3, 4));
}

TEST(UniformSamplerTest, PairsWithoutReplacementAreEquallyLikely) {
  UniformSampler sampler(/*seed=*/3);
  for (int64_t key : {1, 2, 3}) sampler.Insert(key, 0.0);
  std::map<std::pair<int64_t, int64_t>, double> expected;
  for (int64_t a : {1, 2, 3}) {
    for (int64_t b : {1, 2, 3}) {
      if (a != b) expected[{a, b}] = 1.0 / 6.0;
    }
  }
  ExpectOrderedPairsMatch(sampler, expected, 200'000);
}

// Select(k) on k + 1 keys: every batch holds k distinct keys, each key is the
// one left out with probability 1 / (k + 1), and the undone shuffle leaves the
// sampler as it was.
TEST(UniformSamplerTest, BatchesOfAllButOneLeaveEachKeyOutEqually) {
  constexpr int64_t kBatch = 7;
  constexpr int64_t kBatches = 50'000;
  UniformSampler sampler(/*seed=*/4);
  for (int64_t key = 0; key <= kBatch; ++key) sampler.Insert(key, 0.0);
  std::map<int64_t, int64_t> left_out;
  for (int64_t i = 0; i < kBatches; ++i) {
    const std::vector<int64_t> batch = sampler.Select(kBatch);
    ASSERT_EQ(batch.size(), static_cast<size_t>(kBatch));
    const std::set<int64_t> distinct(batch.begin(), batch.end());
    ASSERT_EQ(distinct.size(), batch.size());
    int64_t missing = 0;
    while (distinct.count(missing)) ++missing;
    ++left_out[missing];
  }
  const double p = 1.0 / (kBatch + 1);
  for (int64_t key = 0; key <= kBatch; ++key) {
    EXPECT_NEAR(static_cast<double>(left_out[key]) / kBatches, p, FiveSigma(p, kBatches));
    EXPECT_EQ(sampler.Probability(key), p);
  }
  EXPECT_EQ(sampler.size(), kBatch + 1);
}

}  // namespace
}  // namespace sluice::replay_buffer
