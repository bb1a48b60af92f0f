#include "replay_buffer/samplers/prioritized_sampler.h"

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/samplers/sampler_test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::sluice::replay_buffer::testing::ExpectOrderedPairsMatch;
using ::sluice::replay_buffer::testing::ExpectSingleDrawsMatch;
using ::sluice::replay_buffer::testing::OrderedPairProbabilities;
using ::testing::UnorderedElementsAre;

constexpr int64_t kDraws = 200'000;

// The closed form: P(key) = priority^alpha / sum (alpha = 0: uniform); when
// every weight is 0, uniform.
std::map<int64_t, double> Expected(const std::map<int64_t, double>& priorities, double alpha) {
  std::map<int64_t, double> weights;
  double total = 0.0;
  for (const auto& [key, priority] : priorities) {
    weights[key] = alpha == 0.0 ? 1.0 : (priority > 0.0 ? std::pow(priority, alpha) : 0.0);
    total += weights[key];
  }
  for (auto& [key, weight] : weights) {
    weight = total > 0.0 ? weight / total : 1.0 / static_cast<double>(weights.size());
  }
  return weights;
}

PrioritizedSampler Make(const std::map<int64_t, double>& priorities, double alpha, uint64_t seed) {
  PrioritizedSampler sampler(alpha, seed);
  for (const auto& [key, priority] : priorities) sampler.Insert(key, priority);
  return sampler;
}

TEST(PrioritizedSamplerTest, SingleDrawsFollowPriorityToTheAlpha) {
  const std::map<int64_t, double> priorities = {{1, 1.0}, {2, 2.0}, {3, 3.0}, {4, 4.0}, {5, 0.5}};
  PrioritizedSampler sampler = Make(priorities, /*alpha=*/0.6, /*seed=*/1);
  ExpectSingleDrawsMatch(sampler, Expected(priorities, 0.6), kDraws);
}

TEST(PrioritizedSamplerTest, AlphaOneIsProportionalToPriority) {
  const std::map<int64_t, double> priorities = {{1, 1.0}, {2, 2.0}, {3, 3.0}, {4, 10.0}};
  PrioritizedSampler sampler = Make(priorities, /*alpha=*/1.0, /*seed=*/2);
  EXPECT_DOUBLE_EQ(sampler.Probability(4), 10.0 / 16.0);
  ExpectSingleDrawsMatch(sampler, Expected(priorities, 1.0), kDraws);
}

TEST(PrioritizedSamplerTest, AlphaZeroIsUniformOverEveryKeyEvenPriorityZero) {
  const std::map<int64_t, double> priorities = {{1, 0.0}, {2, 2.0}, {3, 300.0}, {4, 1e-9}};
  PrioritizedSampler sampler = Make(priorities, /*alpha=*/0.0, /*seed=*/3);
  EXPECT_EQ(sampler.Probability(1), 0.25);
  ExpectSingleDrawsMatch(sampler, Expected(priorities, 0.0), kDraws);
}

TEST(PrioritizedSamplerTest, UpdatesChangeTheDistribution) {
  std::map<int64_t, double> priorities = {{1, 1.0}, {2, 1.0}, {3, 1.0}, {4, 1.0}};
  PrioritizedSampler sampler = Make(priorities, /*alpha=*/1.0, /*seed=*/4);
  EXPECT_EQ(sampler.Probability(1), 0.25);
  priorities[1] = 6.0;
  priorities[3] = 0.0;
  EXPECT_TRUE(sampler.Update(1, 6.0));
  EXPECT_TRUE(sampler.Update(3, 0.0));
  EXPECT_FALSE(sampler.Update(9, 100.0));  // unknown: no change
  ExpectSingleDrawsMatch(sampler, Expected(priorities, 1.0), kDraws);
}

TEST(PrioritizedSamplerTest, ZeroPriorityKeysAreNeverDrawnWhileOthersWeighMore) {
  const std::map<int64_t, double> priorities = {{1, 0.0}, {2, 1.0}, {3, 0.0}, {4, 3.0}, {5, 0.0}};
  PrioritizedSampler sampler = Make(priorities, /*alpha=*/0.6, /*seed=*/5);
  EXPECT_EQ(sampler.Probability(1), 0.0);
  ExpectSingleDrawsMatch(sampler, Expected(priorities, 0.6), kDraws);  // 0 tolerance for 1, 3, 5
  // A batch takes every positive key before any zero-priority one; those then
  // come uniformly, so batches of all keys still work.
  for (int i = 0; i < 1000; ++i) {
    const std::vector<int64_t> batch = sampler.Select(5);
    ASSERT_EQ(batch.size(), 5u);
    EXPECT_THAT(std::vector<int64_t>(batch.begin(), batch.begin() + 2), UnorderedElementsAre(2, 4));
    EXPECT_THAT(std::vector<int64_t>(batch.begin() + 2, batch.end()),
                UnorderedElementsAre(1, 3, 5));
  }
}

TEST(PrioritizedSamplerTest, DrawsUniformlyWhenEveryKeyWeighsZero) {
  const std::map<int64_t, double> priorities = {{1, 0.0}, {2, 0.0}, {3, 0.0}, {4, 0.0}};
  PrioritizedSampler sampler = Make(priorities, /*alpha=*/0.6, /*seed=*/6);
  ExpectSingleDrawsMatch(sampler, Expected(priorities, 0.6), kDraws);
  std::map<std::pair<int64_t, int64_t>, double> pairs;
  for (int64_t a = 1; a <= 4; ++a) {
    for (int64_t b = 1; b <= 4; ++b) {
      if (a != b) pairs[{a, b}] = 1.0 / 12.0;
    }
  }
  ExpectOrderedPairsMatch(sampler, pairs, kDraws);
  // One key gains weight: it alone is drawn.
  ASSERT_TRUE(sampler.Update(3, 0.5));
  ExpectSingleDrawsMatch(sampler, {{1, 0.0}, {2, 0.0}, {3, 1.0}, {4, 0.0}}, 1000);
}

// Select(2) on 3 keys draws the second among the two left, by weight:
// P(i, j) = w_i / W * w_j / (W - w_i).
TEST(PrioritizedSamplerTest, BatchesDrawWithoutReplacementByWeight) {
  const std::map<int64_t, double> priorities = {{1, 1.0}, {2, 2.0}, {3, 5.0}};
  PrioritizedSampler sampler = Make(priorities, /*alpha=*/1.0, /*seed=*/7);
  const auto draw_probability = [&](int64_t key, const std::vector<int64_t>& among) {
    double total = 0.0;
    for (const int64_t other : among) total += priorities.at(other);
    return priorities.at(key) / total;
  };
  ExpectOrderedPairsMatch(sampler, OrderedPairProbabilities({1, 2, 3}, draw_probability), kDraws);
}

TEST(PrioritizedSamplerTest, SelectRestoresTheWeightsExactly) {
  PrioritizedSampler sampler(/*alpha=*/0.7, /*seed=*/8);
  std::mt19937_64 driver(8);
  for (int64_t key = 0; key < 100; ++key) {
    sampler.Insert(key, key % 7 == 0 ? 0.0 : static_cast<double>(driver() % 1000) / 10.0);
  }
  std::vector<double> before;
  for (int64_t key = 0; key < 100; ++key) before.push_back(sampler.Probability(key));
  for (int i = 0; i < 200; ++i) {
    const std::vector<int64_t> batch = sampler.Select(1 + i % 100);
    ASSERT_EQ(std::set<int64_t>(batch.begin(), batch.end()).size(), batch.size());
  }
  for (int64_t key = 0; key < 100; ++key) EXPECT_EQ(sampler.Probability(key), before[key]);
}

TEST(PrioritizedSamplerTest, WeightsAreCappedAndInvalidPrioritiesWeighZero) {
  PrioritizedSampler sampler(/*alpha=*/1.0, /*seed=*/9);
  EXPECT_EQ(sampler.WeightOf(-1.0), 0.0);
  EXPECT_EQ(sampler.WeightOf(std::nan("")), 0.0);
  EXPECT_EQ(sampler.WeightOf(INFINITY), PrioritizedSampler::kMaxWeight);
  sampler.Insert(1, INFINITY);
  sampler.Insert(2, 1e300);
  sampler.Insert(3, 1.0);
  EXPECT_EQ(sampler.Probability(1), 0.5);
  EXPECT_EQ(sampler.Probability(2), 0.5);
  EXPECT_TRUE(std::isfinite(sampler.Probability(3)));
}

// Random inserts, updates (many to and from priority 0) and deletes against a
// plain map: after every step Probability() must match the closed form for
// every held key. Exercises the slot moves of Delete and the bookkeeping of
// the zero-weight list.
TEST(PrioritizedSamplerTest, RandomOperationsKeepProbabilitiesExact) {
  PrioritizedSampler sampler(/*alpha=*/0.5, /*seed=*/10);
  std::map<int64_t, double> priorities;
  std::mt19937_64 driver(10);
  int64_t next_key = 0;
  for (int step = 0; step < 3000; ++step) {
    const uint64_t op = driver() % 10;
    const double priority = driver() % 3 == 0 ? 0.0 : static_cast<double>(driver() % 100) / 7.0;
    if (op < 4 || priorities.empty()) {
      sampler.Insert(next_key, priority);
      priorities[next_key++] = priority;
    } else {
      auto it = priorities.begin();
      std::advance(it, static_cast<int64_t>(driver() % priorities.size()));
      if (op < 7) {
        ASSERT_TRUE(sampler.Update(it->first, priority));
        it->second = priority;
      } else {
        sampler.Delete(it->first);
        EXPECT_EQ(sampler.Probability(it->first), 0.0);
        priorities.erase(it);
      }
    }
    ASSERT_EQ(sampler.size(), static_cast<int64_t>(priorities.size()));
    if (step % 10 != 0) continue;
    for (const auto& [key, p] : Expected(priorities, 0.5)) {
      ASSERT_NEAR(sampler.Probability(key), p, 1e-12) << "step " << step << " key " << key;
    }
    const std::vector<int64_t> batch = sampler.Select(static_cast<int64_t>(priorities.size()));
    ASSERT_EQ(std::set<int64_t>(batch.begin(), batch.end()).size(), priorities.size());
  }
}

}  // namespace
}  // namespace sluice::replay_buffer
