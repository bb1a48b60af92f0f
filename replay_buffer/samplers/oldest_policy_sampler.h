#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_OLDEST_POLICY_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_OLDEST_POLICY_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "replay_buffer/samplers/sampler.h"

namespace sluice::replay_buffer {

// Oldest behaviour policy first: Select(n) returns the n keys whose groups
// were generated from the smallest policy version (the run table passes a
// group's min_policy_version as its priority), ties in insertion order.
//
// Why not FIFO: rollouts complete out of order. A long sequence leased at
// version v is inserted after short ones leased at v + 1 and v + 2; FIFO
// trains those first and the long group, the one closest to the staleness
// bound, waits behind them until it is evicted stale. On a long-tailed task
// that drops exactly the long completions, a bias against length. Taking the
// stalest group first trains each group at the least staleness it can still
// have and evicts only what could not have been trained in time.
//
// The order is fixed at Insert: Update (client priorities) changes nothing
// but reports whether the key is held. Deterministic: no random stream.
// Insert, Delete O(log n); Select O(k) for a batch of k; Probability O(1).
class OldestPolicySampler final : public Sampler {
 public:
  v1::SamplerKind kind() const override { return v1::SAMPLER_KIND_OLDEST_POLICY; }
  // `priority` is the group's min_policy_version (rounded to an integer).
  void Insert(int64_t key, double priority) override;
  bool Update(int64_t key, double priority) override;
  void Delete(int64_t key) override;
  std::vector<int64_t> Select(int64_t count) override;
  double Probability(int64_t key) const override;
  int64_t size() const override { return static_cast<int64_t>(order_.size()); }

 private:
  // (policy version, key), smallest first.
  absl::btree_set<std::pair<int64_t, int64_t>> order_;
  absl::flat_hash_map<int64_t, int64_t> version_of_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_OLDEST_POLICY_SAMPLER_H_
