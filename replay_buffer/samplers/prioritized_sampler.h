#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_PRIORITIZED_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_PRIORITIZED_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "replay_buffer/samplers/sampler.h"
#include "replay_buffer/samplers/sampler_random.h"
#include "replay_buffer/samplers/sum_tree.h"

namespace sluice::replay_buffer {

// Prioritized experience replay: P(key) = w(key) / sum of w over held keys,
// with weight w = priority^alpha (Schaul et al. 2016; Reverb's
// PrioritizedSelector).
//
// Weights:
//  - alpha = 0 is exactly uniform over every held key, priority 0 included
//    (pow(0, 0) = 1, as in Reverb and PER, where alpha = 0 recovers uniform
//    replay).
//  - alpha > 0: a key of priority 0 (or negative or NaN, which the table never
//    passes) weighs 0 and is never drawn, unless every held key weighs 0: then
//    the draw is uniform over all of them rather than failing.
//  - Weights are capped at kMaxWeight (1e250) so that the sum of any number of
//    keys stays finite; priority +inf therefore counts as the cap.
//
// Select(k) draws without replacement: each draw is proportional to the
// weights of the keys not yet drawn in this batch. It zeroes each drawn key's
// weight in the tree and restores it after the batch; since the sum tree keeps
// exact sums (sum_tree.h), the restored tree is bit for bit the one before, so
// a Select leaves no trace but the random stream. When the keys of positive
// weight run out within a batch (or there are none), the rest of the batch is
// drawn uniformly from the zero-weight keys, by partial Fisher-Yates over a
// list of them that is undone afterwards, as in UniformSampler.
//
// Structure: held keys occupy slots 0..n-1 of a SumTree (key -> slot map,
// slot -> key vector; Delete moves the last slot into the hole), plus the list
// of zero-weight slots with each slot's position in it.
// Costs: Insert, Update, Delete O(log n) (O(n) when the tree doubles,
// amortized O(1)); Select(k) O(k log n); Probability O(1); memory about
// 2 * 2^ceil(log2 n) doubles for the tree (capacity never shrinks) plus
// ~40 bytes per key.
//
// Seeded (SamplerRandom): same seed and calls, same keys.
class PrioritizedSampler final : public Sampler {
 public:
  // 1e250: the sum of up to 1e58 such weights still fits in a double.
  static constexpr double kMaxWeight = 1e250;

  // alpha >= 0 and finite (SamplerOptions::Validate checks it).
  PrioritizedSampler(double alpha, uint64_t seed) : alpha_(alpha), random_(seed) {}

  v1::SamplerKind kind() const override { return v1::SAMPLER_KIND_PRIORITIZED; }
  void Insert(int64_t key, double priority) override;
  bool Update(int64_t key, double priority) override;
  void Delete(int64_t key) override;
  std::vector<int64_t> Select(int64_t count) override;
  double Probability(int64_t key) const override;
  int64_t size() const override { return static_cast<int64_t>(slot_keys_.size()); }

  // The weight a priority gets (see the class comment).
  double WeightOf(double priority) const;

 private:
  static constexpr size_t kNotZero = static_cast<size_t>(-1);

  // Sets a held slot's weight and its membership of zero_slots_.
  void SetSlotWeight(size_t slot, double weight);
  // Removes a slot from zero_slots_ if it is there. O(1).
  void Unlist(size_t slot);

  double alpha_;
  SamplerRandom random_;
  SumTree tree_;
  std::vector<int64_t> slot_keys_;                // slot -> key
  absl::flat_hash_map<int64_t, size_t> slot_of_;  // key -> slot
  std::vector<size_t> zero_slots_;                // slots of weight 0
  std::vector<size_t> zero_position_;             // slot -> index in zero_slots_, or kNotZero
  // Select's scratch, reused across calls: (slot, weight) of drawn keys to
  // restore, and the swap partners of the zero-weight draws to undo.
  std::vector<std::pair<size_t, double>> drawn_scratch_;
  std::vector<size_t> zero_swap_scratch_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_PRIORITIZED_SAMPLER_H_
