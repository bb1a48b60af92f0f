#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_FIFO_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_FIFO_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/container/btree_set.h"
#include "replay_buffer/samplers/sampler.h"

namespace sluice::replay_buffer {

// Oldest first: Select(n) returns the n smallest keys, ascending (keys grow
// with insertion, so the smallest is the oldest; a group the table re-inserts
// with its old key regains its old place). Priorities are ignored.
// Deterministic: no random stream.
//
// Keys live in a B-tree set: Insert and Delete O(log n), Select O(k) for a
// batch of k, Probability O(1) (1 for the oldest key, 0 for the others).
class FifoSampler final : public Sampler {
 public:
  v1::SamplerKind kind() const override { return v1::SAMPLER_KIND_FIFO; }
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

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_FIFO_SAMPLER_H_
