#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_LIFO_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_LIFO_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/container/btree_set.h"
#include "replay_buffer/samplers/sampler.h"

namespace sluice::replay_buffer {

// Newest first: Select(n) returns the n largest keys, descending (keys grow
// with insertion, so the largest is the newest). Priorities are ignored.
// Deterministic: no random stream.
//
// Keys live in a B-tree set: Insert and Delete O(log n), Select O(k) for a
// batch of k, Probability O(1) (1 for the newest key, 0 for the others).
class LifoSampler final : public Sampler {
 public:
  v1::SamplerKind kind() const override { return v1::SAMPLER_KIND_LIFO; }
  void Insert(int64_t key, double priority) override;
  bool Update(int64_t key, double priority) override;
  void Delete(int64_t key) override;
  std::vector<int64_t> Select(int64_t count) override;
  double Probability(int64_t key) const override;
  int64_t size() const override { return static_cast<int64_t>(keys_.size()); }

 private:
  absl::btree_set<int64_t> keys_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_LIFO_SAMPLER_H_
