#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_RECENCY_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_RECENCY_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "replay_buffer/samplers/sampler.h"
#include "replay_buffer/samplers/sampler_random.h"
#include "replay_buffer/samplers/sum_tree.h"

namespace sluice::replay_buffer {

// Recency-mixed sampling as in TBA (Trajectory Balance with Asynchrony): each
// draw of a batch takes, with probability p (recency_probability), the newest
// key (largest key) not yet chosen in this batch, and otherwise draws among
// the keys not yet chosen with probability proportional to
// exp(beta * priority), beta = reward_inverse_temperature (priorities are
// rewards here, any finite value; beta = 0 is uniform, beta < 0 favours low
// rewards). So Select(1) returns key i with probability
//   p * [i is the newest] + (1 - p) * exp(beta * r_i) / sum_j exp(beta * r_j),
// which is what Probability(i) reports. p = 1 never draws at random, p = 0
// never takes the newest on purpose.
//
// Numerics. beta * priority can be huge (beta = 1000 for a near-greedy
// choice): exp() of it overflows. The tree stores exp(x_i - shift) with
// x_i = beta * r_i, a softmax with a shift, which leaves the probabilities
// unchanged. The shift is kept so that:
//  - every weight is <= e^200 (x_i - shift <= 200), so sums cannot overflow;
//  - the total is >= e^-200 while any key is held (after a reshift, the
//    largest weight is exactly 1).
// When an Insert/Update breaks the first rule, or an Update/Delete (or a batch
// that already took the heaviest keys) breaks the second, Reshift() sets the
// shift to the largest x_i among the eligible keys and recomputes every
// weight: O(n), and only when the rewards held span more than ~200 / beta, so
// never for rewards in [0, 1] and beta < 200. A key more than ~745 nats below
// the heaviest one gets weight 0 (exp underflow): its true probability,
// < e^-545 of the heaviest key's, is far below a double's resolution anyway.
// x_i is clamped to [-1e300, 1e300] (beta * r may overflow) and NaN counts as
// -1e300; with beta = 0 every x_i is 0, whatever the priority.
//
// Select(k) without replacement: a chosen key is marked (a per-slot batch
// stamp) and its tree weight zeroed until the batch ends, then restored. The
// newest unchosen key is found by walking the ordered key set from the
// newest, skipping marked keys: O(k) steps over a whole batch.
//
// Costs: Insert, Update, Delete O(log n) (plus the rare O(n) reshift above);
// Select(k) O(k log n); Probability O(1).
// Seeded (SamplerRandom): same seed and calls, same keys.
class RecencySampler final : public Sampler {
 public:
  // Bounds of x_i - shift (see the class comment).
  static constexpr double kMaxLogWeight = 200.0;
  static constexpr double kMaxAbsExponent = 1e300;

  // recency_probability in [0, 1], beta finite (SamplerOptions::Validate).
  RecencySampler(double recency_probability, double beta, uint64_t seed);

  v1::SamplerKind kind() const override { return v1::SAMPLER_KIND_RECENCY; }
  void Insert(int64_t key, double priority) override;
  bool Update(int64_t key, double priority) override;
  void Delete(int64_t key) override;
  std::vector<int64_t> Select(int64_t count) override;
  double Probability(int64_t key) const override;
  int64_t size() const override { return static_cast<int64_t>(slot_keys_.size()); }

 private:
  // x = beta * priority, clamped (see the class comment).
  double ExponentOf(double priority) const;
  // Sets a held slot's exponent and tree weight, reshifting if a bound breaks.
  // Outside Select only.
  void SetSlotExponent(size_t slot, double exponent);
  // Shift := max exponent over the held keys not chosen in the current batch;
  // recomputes every weight (chosen keys: 0). O(capacity).
  void Reshift();
  bool Chosen(size_t slot) const { return chosen_in_batch_[slot] == batch_; }

  double recency_probability_;
  double beta_;
  SamplerRandom random_;
  double shift_ = 0.0;
  SumTree tree_;                                  // exp(exponent - shift_) per slot
  absl::btree_set<int64_t> keys_;                 // held keys; newest = largest
  std::vector<int64_t> slot_keys_;                // slot -> key
  std::vector<double> exponents_;                 // slot -> x = beta * priority
  std::vector<uint64_t> chosen_in_batch_;         // slot -> batch_ it was chosen in
  absl::flat_hash_map<int64_t, size_t> slot_of_;  // key -> slot
  // Stamp of the current batch. Odd outside Select, even inside it; stamps are
  // even, so no slot counts as chosen outside a Select.
  uint64_t batch_ = 1;
  std::vector<size_t> chosen_scratch_;  // Select's chosen slots, reused
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_RECENCY_SAMPLER_H_
