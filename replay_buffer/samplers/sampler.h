#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/v1/common.pb.h"

namespace sluice::replay_buffer {

// Chooses which held groups go into a batch. The run table owns the groups
// and their bookkeeping (staleness, times sampled, eviction); a sampler only
// sees keys (a group's buffer_sequence, unique and increasing per run), as
// Reverb's ItemSelector does. FIFO, LIFO, uniform, prioritized and recency
// sampling differ only here, so adding one is adding a class and a case in
// CreateSampler.
//
// Not thread-safe: the run table calls it under its lock.
class Sampler {
 public:
  virtual ~Sampler() = default;

  virtual v1::SamplerKind kind() const = 0;

  // Adds a key that is not held yet.
  virtual void Insert(int64_t key) = 0;

  // Removes a key; unknown keys are ignored.
  virtual void Delete(int64_t key) = 0;

  // Chooses min(count, size()) distinct held keys for one batch, in the order
  // they should appear in it. Keys stay held: the table decides, from
  // times_sampled, whether to Delete them.
  virtual std::vector<int64_t> Select(int64_t count) = 0;

  virtual int64_t size() const = 0;
};

// INVALID_ARGUMENT (naming `field`) for sampler kinds this release does not
// implement; OK for UNSPECIFIED (= FIFO) and FIFO.
absl::Status CheckSamplerAvailable(v1::SamplerKind kind, const char* field);

// The sampler for `kind`; INVALID_ARGUMENT as CheckSamplerAvailable.
absl::StatusOr<std::unique_ptr<Sampler>> CreateSampler(v1::SamplerKind kind);

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_H_
