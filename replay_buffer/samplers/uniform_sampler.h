#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_UNIFORM_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_UNIFORM_SAMPLER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "replay_buffer/samplers/sampler.h"
#include "replay_buffer/samplers/sampler_random.h"

namespace sluice::replay_buffer {

// Uniformly at random among held keys; priorities are ignored. Select(k)
// draws k distinct keys, every ordered k-tuple equally likely.
//
// Keys live in a dense vector plus a key -> index map (Reverb's
// UniformSelector). Insert appends, Delete swaps the last key into the hole:
// both O(1). Select(k) is a partial Fisher-Yates shuffle over the vector: draw
// i swaps position i with a uniform position in [i, n) and takes position i,
// O(1) per key. The swaps are then undone in reverse order, so the vector and
// the map are exactly as before (no map writes, nothing lost), and the state
// after a Select depends only on the inserts and deletes, not on what was
// drawn. Probability is 1/n for held keys, O(1).
//
// Seeded (SamplerRandom): same seed and calls, same keys.
class UniformSampler final : public Sampler {
 public:
  explicit UniformSampler(uint64_t seed) : random_(seed) {}

  v1::SamplerKind kind() const override { return v1::SAMPLER_KIND_UNIFORM; }
  void Insert(int64_t key, double priority) override;
  bool Update(int64_t key, double priority) override;
  void Delete(int64_t key) override;
  std::vector<int64_t> Select(int64_t count) override;
  double Probability(int64_t key) const override;
  int64_t size() const override { return static_cast<int64_t>(keys_.size()); }

 private:
  std::vector<int64_t> keys_;
  absl::flat_hash_map<int64_t, size_t> index_;  // key -> position in keys_
  SamplerRandom random_;
  // Select's swap partners, kept to undo the swaps; reused across calls.
  std::vector<size_t> swap_scratch_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_UNIFORM_SAMPLER_H_
