#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/run/run_buffer.h"
#include "sluice/v1/common.pb.h"

namespace sluice::replay_buffer {

// A sampler's settings, resolved from a run's BufferConfig (defaults applied):
// the buffer section's rules live with the run spec's (common/run/run_buffer.h),
// which the controller applies at submit.
using SamplerOptions = run::BufferSamplerOptions;

// Chooses which held groups go into a batch. The run table owns the groups
// and their bookkeeping (staleness, times sampled, eviction); a sampler only
// sees keys (a group's buffer_sequence, unique and increasing per run, so a
// larger key is a newer group) and a priority per key, as Reverb's
// ItemSelector does. FIFO, LIFO, uniform, prioritized and recency sampling
// differ only here, so adding one is adding a class and a case in
// CreateSampler.
//
// Priorities are finite and >= 0 for PRIORITIZED (the table guarantees it);
// RECENCY reads them as rewards (any finite value); FIFO, LIFO and UNIFORM
// ignore them.
//
// Not thread-safe: the run table calls it under its lock.
class Sampler {
 public:
  virtual ~Sampler() = default;

  virtual v1::SamplerKind kind() const = 0;

  // Adds a key that is not held yet. (Inserting a held key is treated as
  // Update, so a repeated insert cannot corrupt the sampler.)
  virtual void Insert(int64_t key, double priority) = 0;

  // Changes a held key's priority; false (and no change) for unknown keys.
  virtual bool Update(int64_t key, double priority) = 0;

  // Removes a key; unknown keys are ignored.
  virtual void Delete(int64_t key) = 0;

  // Chooses min(count, size()) distinct held keys for one batch (drawn
  // without replacement), in the order they should appear in it. Keys stay
  // held: the table decides, from times_sampled, whether to Delete them.
  // count <= 0 gives an empty batch. A Select changes nothing but the random
  // stream: Probability() and later draws are as before it.
  virtual std::vector<int64_t> Select(int64_t count) = 0;

  // Probability that Select(1) returns `key` now (0 for unknown keys). Used by
  // tests and diagnostics; O(1) or O(log n) except where noted.
  virtual double Probability(int64_t key) const = 0;

  virtual int64_t size() const = 0;
};

// The sampler for options.kind (UNSPECIFIED = FIFO); INVALID_ARGUMENT (from
// options.Validate()) for an unknown kind or out-of-range options.
absl::StatusOr<std::unique_ptr<Sampler>> CreateSampler(const SamplerOptions& options);

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_H_
