#include "replay_buffer/samplers/recency_sampler.h"

#include <algorithm>
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
using ::testing::ElementsAre;

constexpr int64_t kDraws = 200'000;

// The closed form of one draw among `among` (keys -> rewards):
// p * [key is the newest of them] + (1 - p) * softmax(beta * reward)[key],
// the softmax computed in long double around the largest exponent.
double DrawProbability(int64_t key, const std::map<int64_t, double>& among, double p, double beta) {
  long double max_exponent = -INFINITY;
  for (const auto& [other, reward] : among) {
    max_exponent = std::max(max_exponent, static_cast<long double>(beta) * reward);
  }
  long double total = 0.0L;
  for (const auto& [other, reward] : among) {
    total += std::exp(static_cast<long double>(beta) * reward - max_exponent);
  }
  const long double softmax =
      std::exp(static_cast<long double>(beta) * among.at(key) - max_exponent) / total;
  const double recent = among.rbegin()->first == key ? p : 0.0;
  return recent + (1.0 - p) * static_cast<double>(softmax);
}

std::map<int64_t, double> Expected(const std::map<int64_t, double>& rewards, double p,
                                   double beta) {
  long double max_exponent = -INFINITY;
  for (const auto& [key, reward] : rewards) {
    max_exponent = std::max(max_exponent, static_cast<long double>(beta) * reward);
  }
  long double total = 0.0L;
  for (const auto& [key, reward] : rewards) {
    total += std::exp(static_cast<long double>(beta) * reward - max_exponent);
  }
  std::map<int64_t, double> expected;
  for (const auto& [key, reward] : rewards) {
    const long double softmax =
        std::exp(static_cast<long double>(beta) * reward - max_exponent) / total;
    expected[key] =
        (rewards.rbegin()->first == key ? p : 0.0) + (1.0 - p) * static_cast<double>(softmax);
  }
  return expected;
}

RecencySampler Make(const std::map<int64_t, double>& rewards, double p, double beta,
                    uint64_t seed) {
  RecencySampler sampler(p, beta, seed);
  for (const auto& [key, reward] : rewards) sampler.Insert(key, reward);
  return sampler;
}

TEST(RecencySamplerTest, ProbabilityOneAlwaysTakesTheNewestKeys) {
  RecencySampler sampler(/*recency_probability=*/1.0, /*beta=*/5.0, /*seed=*/1);
  for (int64_t key : {3, 9, 1, 7}) sampler.Insert(key, /*priority=*/static_cast<double>(-key));
  EXPECT_EQ(sampler.Probability(9), 1.0);
  EXPECT_EQ(sampler.Probability(7), 0.0);
  for (int i = 0; i < 100; ++i) EXPECT_THAT(sampler.Select(3), ElementsAre(9, 7, 3));
  sampler.Delete(9);
  EXPECT_THAT(sampler.Select(10), ElementsAre(7, 3, 1));
  EXPECT_EQ(sampler.Probability(7), 1.0);
}

TEST(RecencySamplerTest, ProbabilityZeroAndBetaZeroIsUniform) {
  std::map<int64_t, double> rewards;
  for (int64_t key = 0; key < 8; ++key) rewards[key] = static_cast<double>(key % 3);
  RecencySampler sampler = Make(rewards, /*p=*/0.0, /*beta=*/0.0, /*seed=*/2);
  ExpectSingleDrawsMatch(sampler, Expected(rewards, 0.0, 0.0), kDraws);
  EXPECT_EQ(sampler.Probability(7), 0.125);
}

TEST(RecencySamplerTest, MixedDrawsMatchTheClosedForm) {
  const std::map<int64_t, double> rewards = {{1, 0.0}, {2, 0.5}, {3, 1.0}, {4, -1.0}, {5, 0.25}};
  RecencySampler sampler = Make(rewards, /*p=*/0.3, /*beta=*/2.0, /*seed=*/3);
  ExpectSingleDrawsMatch(sampler, Expected(rewards, 0.3, 2.0), kDraws);
}

TEST(RecencySamplerTest, UpdatesAndDeletesChangeTheDistribution) {
  std::map<int64_t, double> rewards = {{1, 0.0}, {2, 0.5}, {3, 1.0}, {4, 0.0}};
  RecencySampler sampler = Make(rewards, /*p=*/0.5, /*beta=*/1.5, /*seed=*/4);
  ASSERT_TRUE(sampler.Update(1, 2.0));
  rewards[1] = 2.0;
  sampler.Delete(4);  // the newest: key 3 becomes the recency pick
  rewards.erase(4);
  EXPECT_FALSE(sampler.Update(4, 1.0));
  sampler.Delete(4);  // unknown now: ignored
  ExpectSingleDrawsMatch(sampler, Expected(rewards, 0.5, 1.5), kDraws);
}

// Select(2) on 3 keys: the second draw is again p for the newest key left
// and (1 - p) by softmax among the two left.
TEST(RecencySamplerTest, BatchesDrawWithoutReplacement) {
  const std::map<int64_t, double> rewards = {{1, 1.0}, {2, 0.0}, {3, 0.5}};
  RecencySampler sampler = Make(rewards, /*p=*/0.4, /*beta=*/1.0, /*seed=*/5);
  const auto draw_probability = [&](int64_t key, const std::vector<int64_t>& among) {
    std::map<int64_t, double> subset;
    for (const int64_t other : among) subset[other] = rewards.at(other);
    return DrawProbability(key, subset, 0.4, 1.0);
  };
  ExpectOrderedPairsMatch(sampler, OrderedPairProbabilities({1, 2, 3}, draw_probability), kDraws);
}

// beta * reward far beyond exp()'s range: the shifted weights keep every
// probability finite and right, including after the heaviest key leaves.
TEST(RecencySamplerTest, LargeInverseTemperatureIsNumericallySafe) {
  std::map<int64_t, double> rewards = {{1, 0.0}, {2, 1.0}, {3, 0.999}, {4, 0.5}};
  RecencySampler sampler = Make(rewards, /*p=*/0.5, /*beta=*/1000.0, /*seed=*/6);
  // exp(1000 * -0.001): key 3 is e^-1 as likely as key 2 in the random draws.
  ExpectSingleDrawsMatch(sampler, Expected(rewards, 0.5, 1000.0), kDraws);
  sampler.Delete(2);
  rewards.erase(2);
  sampler.Delete(3);  // left: rewards 0 and 0.5, 500 nats apart
  rewards.erase(3);
  ExpectSingleDrawsMatch(sampler, Expected(rewards, 0.5, 1000.0), kDraws);
  ASSERT_TRUE(sampler.Update(4, -1.0));  // both light now; 1000 nats apart
  rewards[4] = -1.0;
  ExpectSingleDrawsMatch(sampler, Expected(rewards, 0.5, 1000.0), 10'000);

  // Exponents that overflow a double are clamped, not propagated as inf/NaN.
  RecencySampler extreme(/*recency_probability=*/0.5, /*beta=*/1e10, /*seed=*/7);
  extreme.Insert(1, 1e300);
  extreme.Insert(2, -1e300);
  extreme.Insert(3, std::nan(""));
  EXPECT_EQ(extreme.Probability(1), 0.5);
  EXPECT_EQ(extreme.Probability(3), 0.5);  // the newest; NaN weighs as little as possible
  EXPECT_EQ(extreme.Probability(2), 0.0);
}

// A batch that takes the only heavy key must still draw the rest by their
// own (tiny) weights: the sampler rescales them mid-batch.
TEST(RecencySamplerTest, BatchesPastTheHeaviestKeyStillFollowTheSoftmax) {
  const std::map<int64_t, double> rewards = {{1, 0.0}, {2, 0.001}, {3, 1.0}};
  RecencySampler sampler = Make(rewards, /*p=*/0.0, /*beta=*/1000.0, /*seed=*/8);
  const auto draw_probability = [&](int64_t key, const std::vector<int64_t>& among) {
    std::map<int64_t, double> subset;
    for (const int64_t other : among) subset[other] = rewards.at(other);
    return DrawProbability(key, subset, 0.0, 1000.0);
  };
  // First draw: key 3 (weight 1 against e^-999); second: key 2 over key 1 as
  // e^1 to 1.
  ExpectOrderedPairsMatch(sampler, OrderedPairProbabilities({1, 2, 3}, draw_probability), kDraws);
  for (const auto& [key, p] : Expected(rewards, 0.0, 1000.0)) {
    EXPECT_NEAR(sampler.Probability(key), p, 1e-12);
  }
}

// Random inserts, updates and deletes against a plain map, at a moderate and
// at a huge inverse temperature (which reshifts often): Probability() must
// match the closed form after every step, and sum to 1.
TEST(RecencySamplerTest, RandomOperationsKeepProbabilitiesRight) {
  for (const double beta : {1.0, 400.0}) {
    SCOPED_TRACE(beta);
    RecencySampler sampler(/*recency_probability=*/0.25, beta, /*seed=*/9);
    std::map<int64_t, double> rewards;
    std::mt19937_64 driver(9);
    int64_t next_key = 0;
    for (int step = 0; step < 2000; ++step) {
      const uint64_t op = driver() % 10;
      const double reward = static_cast<double>(driver() % 401) / 100.0 - 2.0;  // [-2, 2]
      if (op < 4 || rewards.empty()) {
        sampler.Insert(next_key, reward);
        rewards[next_key++] = reward;
      } else {
        auto it = rewards.begin();
        std::advance(it, static_cast<int64_t>(driver() % rewards.size()));
        if (op < 7) {
          ASSERT_TRUE(sampler.Update(it->first, reward));
          it->second = reward;
        } else {
          sampler.Delete(it->first);
          rewards.erase(it);
        }
      }
      ASSERT_EQ(sampler.size(), static_cast<int64_t>(rewards.size()));
      if (step % 10 != 0 || rewards.empty()) continue;
      double sum = 0.0;
      for (const auto& [key, p] : Expected(rewards, 0.25, beta)) {
        ASSERT_NEAR(sampler.Probability(key), p, 1e-12) << "step " << step << " key " << key;
        sum += sampler.Probability(key);
      }
      EXPECT_NEAR(sum, 1.0, 1e-12);
      const std::vector<int64_t> batch = sampler.Select(static_cast<int64_t>(rewards.size()));
      ASSERT_EQ(std::set<int64_t>(batch.begin(), batch.end()).size(), rewards.size());
    }
  }
}

}  // namespace
}  // namespace sluice::replay_buffer
