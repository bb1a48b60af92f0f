#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_FIFO_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_FIFO_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/container/btree_set.h"
#include "replay_buffer/samplers/sampler.h"

namespace sluice::replay_buffer {

// Oldest inserted first: Select(n) returns the n smallest keys, ascending.
// Insert and Delete O(log n), Select O(n log n) for a batch of n.
class FifoSampler final : public Sampler {
 public:
  v1::SamplerKind kind() const override { return v1::SAMPLER_KIND_FIFO; }
  void Insert(int64_t key) override;
  void Delete(int64_t key) override;
  std::vector<int64_t> Select(int64_t count) override;
  int64_t size() const override { return static_cast<int64_t>(keys_.size()); }

 private:
  absl::btree_set<int64_t> keys_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_FIFO_SAMPLER_H_
