#include "replay_buffer/samplers/sum_tree.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "replay_buffer/samplers/sampler_random.h"

namespace sluice::replay_buffer {
namespace {

TEST(SumTreeTest, StartsEmptyAndSumsWhatIsSet) {
  SumTree tree;
  EXPECT_EQ(tree.Total(), 0.0);
  tree.Set(0, 1.5);
  tree.Set(3, 2.5);
  EXPECT_EQ(tree.Total(), 4.0);
  EXPECT_EQ(tree.Get(3), 2.5);
  EXPECT_EQ(tree.Get(2), 0.0);
  EXPECT_EQ(tree.Get(1 << 20), 0.0);  // beyond capacity
  tree.Set(0, 0.0);
  EXPECT_EQ(tree.Total(), 2.5);
}

TEST(SumTreeTest, FindWalksTheCumulativeWeights) {
  SumTree tree;
  const std::vector<double> weights = {1.0, 0.0, 2.0, 3.0};
  for (size_t slot = 0; slot < weights.size(); ++slot) tree.Set(slot, weights[slot]);
  EXPECT_EQ(tree.Find(0.0), 0u);
  EXPECT_EQ(tree.Find(0.999), 0u);
  EXPECT_EQ(tree.Find(1.0), 2u);  // slot 1 weighs 0
  EXPECT_EQ(tree.Find(2.999), 2u);
  EXPECT_EQ(tree.Find(3.0), 3u);
  EXPECT_EQ(tree.Find(5.999), 3u);
}

TEST(SumTreeTest, FindNeverReturnsAZeroWeightSlotEvenPastTheTotal) {
  SumTree tree;
  tree.Set(0, 1.0);
  tree.Set(1, 2.0);  // slots 2.. weigh 0
  EXPECT_EQ(tree.Find(3.0), 1u);
  EXPECT_EQ(tree.Find(1e9), 1u);
  // Random weights with many zeros, targets pushed onto and past each
  // boundary: rounding must never land on an empty slot.
  SumTree sparse;
  SamplerRandom random(7);
  std::vector<double> weights(1000);
  for (size_t slot = 0; slot < weights.size(); ++slot) {
    weights[slot] = random.Uniform() < 0.7 ? 0.0 : std::exp(40.0 * (random.Uniform() - 0.5));
    sparse.Set(slot, weights[slot]);
  }
  double cumulative = 0.0;
  for (size_t slot = 0; slot < weights.size(); ++slot) {
    cumulative += weights[slot];
    for (const double target :
         {std::nextafter(cumulative, 0.0), cumulative, std::nextafter(cumulative, 1e300)}) {
      EXPECT_GT(sparse.Get(sparse.Find(target)), 0.0) << "target " << target;
    }
  }
  for (int i = 0; i < 100000; ++i) {
    EXPECT_GT(sparse.Get(sparse.Find(random.Uniform() * sparse.Total())), 0.0);
  }
}

TEST(SumTreeTest, GrowsByDoublingAndKeepsTheWeights) {
  SumTree tree;
  const size_t initial = tree.capacity();
  tree.Set(1, 4.0);
  tree.Set(initial, 1.0);  // one past the capacity
  EXPECT_EQ(tree.capacity(), 2 * initial);
  tree.Set(1000, 2.0);
  EXPECT_EQ(tree.capacity(), 1024u);
  EXPECT_EQ(tree.Get(1), 4.0);
  EXPECT_EQ(tree.Get(initial), 1.0);
  EXPECT_EQ(tree.Total(), 7.0);
  EXPECT_EQ(tree.Find(4.5), initial);
}

TEST(SumTreeTest, AssignSetsEveryWeightAtOnce) {
  SumTree tree;
  tree.Set(40, 9.0);
  tree.Assign(3, [](size_t slot) { return static_cast<double>(slot + 1); });
  EXPECT_EQ(tree.Total(), 6.0);
  EXPECT_EQ(tree.Get(40), 0.0);
  EXPECT_EQ(tree.Find(1.5), 1u);
}

// Millions of updates with weights over 16 orders of magnitude. A tree that
// adds deltas up the path (as Reverb does before its periodic rebuild) drifts
// here by many ulps of the total; this one recomputes each node from its
// children, so the root must stay within the pairwise-summation bound of the
// exact sum: ceil(log2 1024) * 2^-53 ~ 1.1e-15 relative (weights are >= 0, so
// the bound is relative to the sum itself). We allow 4e-15. It must also be
// bit for bit the root of a tree built afresh from the same leaves, and
// exactly 0 once every leaf is 0 (a drifting tree keeps a residue there and
// would draw weight-0 slots).
TEST(SumTreeTest, MillionsOfUpdatesLeaveNoRoundingDrift) {
  constexpr size_t kSlots = 1000;
  constexpr int kUpdates = 3'000'000;
  SumTree tree;
  std::vector<double> weights(kSlots, 0.0);
  SamplerRandom random(2024);
  for (int i = 0; i < kUpdates; ++i) {
    const size_t slot = static_cast<size_t>(random.UniformInt(kSlots));
    weights[slot] = random.Uniform() < 0.05 ? 0.0 : std::pow(10.0, 16.0 * random.Uniform() - 8.0);
    tree.Set(slot, weights[slot]);
  }
  long double exact = 0.0L;  // 64-bit mantissa: ~2^-64 relative per add
  for (const double weight : weights) exact += weight;
  EXPECT_NEAR(tree.Total(), static_cast<double>(exact), 4e-15 * static_cast<double>(exact));

  SumTree fresh;
  fresh.Assign(kSlots, [&](size_t slot) { return weights[slot]; });
  EXPECT_EQ(tree.Total(), fresh.Total());

  for (size_t slot = 0; slot < kSlots; ++slot) tree.Set(slot, 0.0);
  EXPECT_EQ(tree.Total(), 0.0);
}

}  // namespace
}  // namespace sluice::replay_buffer
