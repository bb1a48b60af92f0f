#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_TEST_UTIL_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_TEST_UTIL_H_

// Helpers of the sampler tests: empirical frequencies against probabilities.

#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "replay_buffer/samplers/sampler.h"

namespace sluice::replay_buffer::testing {

// Tolerance of an empirical frequency: 5 standard deviations of the fraction
// of `draws` independent draws that hit an event of probability p,
// 5 * sqrt(p (1 - p) / draws). Each key's count is binomial (a marginal of the
// multinomial), so a correct sampler lands outside this band with probability
// < 6e-7 per key (normal approximation; draws * p >= ~100 here): a few hundred
// comparisons over the suite stay below 1e-3 for any seed, and with the fixed
// seeds the tests are deterministic anyway. What it catches: at 200k draws,
// a bias of 0.0034 on p = 0.1 or 0.0011 on p = 0.01. p = 0 and p = 1 get a
// tolerance of 0: such keys must never (always) come out.
inline double FiveSigma(double p, int64_t draws) {
  return 5.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(draws));
}

// Checks Probability() against `expected` (closed form, to 1e-12) and then
// the frequencies of `draws` Select(1) calls against it (FiveSigma). Keys not
// in `expected` must never be drawn.
inline void ExpectSingleDrawsMatch(Sampler& sampler, const std::map<int64_t, double>& expected,
                                   int64_t draws) {
  for (const auto& [key, p] : expected) {
    EXPECT_NEAR(sampler.Probability(key), p, 1e-12) << "key " << key;
  }
  std::map<int64_t, int64_t> counts;
  for (int64_t i = 0; i < draws; ++i) {
    const std::vector<int64_t> drawn = sampler.Select(1);
    ASSERT_EQ(drawn.size(), 1u);
    ++counts[drawn[0]];
  }
  for (const auto& [key, count] : counts) {
    EXPECT_TRUE(expected.count(key)) << "drew key " << key << " " << count << " times";
  }
  for (const auto& [key, p] : expected) {
    const double frequency = static_cast<double>(counts[key]) / static_cast<double>(draws);
    EXPECT_NEAR(frequency, p, FiveSigma(p, draws)) << "key " << key;
  }
}

// Draws `batches` Select(2) and checks the frequency of each ordered pair
// (first, second) against `expected` (FiveSigma); pairs not in `expected`
// must never come out.
inline void ExpectOrderedPairsMatch(Sampler& sampler,
                                    const std::map<std::pair<int64_t, int64_t>, double>& expected,
                                    int64_t batches) {
  std::map<std::pair<int64_t, int64_t>, int64_t> counts;
  for (int64_t i = 0; i < batches; ++i) {
    const std::vector<int64_t> drawn = sampler.Select(2);
    ASSERT_EQ(drawn.size(), 2u);
    ++counts[{drawn[0], drawn[1]}];
  }
  for (const auto& [pair, count] : counts) {
    EXPECT_TRUE(expected.count(pair))
        << "drew (" << pair.first << ", " << pair.second << ") " << count << " times";
  }
  for (const auto& [pair, p] : expected) {
    const double frequency = static_cast<double>(counts[pair]) / static_cast<double>(batches);
    EXPECT_NEAR(frequency, p, FiveSigma(p, batches))
        << "pair (" << pair.first << ", " << pair.second << ")";
  }
}

// The ordered-pair probabilities of drawing 2 without replacement from
// `keys`, given the single-draw probability of each key among a remaining set:
// P(i, j) = P(i | keys) * P(j | keys - {i}).
template <typename DrawProbability>
std::map<std::pair<int64_t, int64_t>, double> OrderedPairProbabilities(
    const std::vector<int64_t>& keys, DrawProbability draw_probability) {
  std::map<std::pair<int64_t, int64_t>, double> pairs;
  for (const int64_t first : keys) {
    std::vector<int64_t> rest;
    for (const int64_t key : keys) {
      if (key != first) rest.push_back(key);
    }
    for (const int64_t second : rest) {
      pairs[{first, second}] = draw_probability(first, keys) * draw_probability(second, rest);
    }
  }
  return pairs;
}

}  // namespace sluice::replay_buffer::testing

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_TEST_UTIL_H_
