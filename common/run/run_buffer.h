#ifndef SLUICE_COMMON_RUN_RUN_BUFFER_H_
#define SLUICE_COMMON_RUN_RUN_BUFFER_H_

// A run spec's buffer section (v1::BufferConfig): its defaults and its rules,
// in one place for the controller (which checks a spec at submit and prints
// the resolved one) and the replay buffer (which checks it again at
// ConfigureRun and builds its sampler and rate limiter from it), so that a
// spec the controller accepts is never refused by the buffer and both apply
// the same defaults. Light: protos and Abseil only.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/v1/common.pb.h"

namespace sluice::run {

// BufferConfig.priority_alpha when unset.
inline constexpr double kDefaultPriorityAlpha = 0.6;
// BufferConfig.recency_probability when 0.
inline constexpr double kDefaultRecencyProbability = 0.5;

// A sampler's settings, resolved from a run's BufferConfig (defaults applied).
struct BufferSamplerOptions {
  // Never UNSPECIFIED once resolved.
  v1::SamplerKind kind = v1::SAMPLER_KIND_FIFO;
  // PRIORITIZED: P(i) ~ priority_i^alpha; 0 = uniform.
  double priority_alpha = kDefaultPriorityAlpha;
  // RECENCY: probability that a draw takes the newest key not yet chosen.
  double recency_probability = kDefaultRecencyProbability;
  // RECENCY: the other draws have P(i) ~ exp(beta * priority_i); 0 = uniform.
  double reward_inverse_temperature = 0.0;
  // Seed of the sampler's generator (random kinds). Same seed, same calls:
  // same keys.
  uint64_t seed = 0;

  // BufferConfig fields with their defaults; INVALID_ARGUMENT naming the
  // field (prefixed by `field_prefix`, e.g. "buffer.") for values out of range:
  // unknown kind, alpha < 0 or not finite, recency_probability outside [0, 1],
  // beta not finite. Every problem is reported, one per line, e.g.
  // "buffer.recency_probability: must be in [0, 1], got 1.5". Fields a kind
  // does not use are validated too (a bad value is a mistake either way).
  static absl::StatusOr<BufferSamplerOptions> FromConfig(const v1::BufferConfig& config,
                                                         uint64_t seed,
                                                         const char* field_prefix = "buffer.");

  // The same checks on resolved options (field names as in BufferConfig,
  // prefixed by `field_prefix`); UNSPECIFIED is accepted here as FIFO.
  absl::Status Validate(const char* field_prefix = "") const;
};

// Every problem with the rate-limit fields (samples_per_insert and its
// tolerance) for a run of `batch_size_groups` groups per step, naming the
// field; appended to `problems`.
void ValidateBufferRateLimit(const v1::BufferConfig& buffer, int32_t batch_size_groups,
                             std::vector<std::string>* problems);

// Every problem with the buffer section for a run of `batch_size_groups`
// groups per step (the sampler's fields, priorities, the sampling and
// capacity bounds, the rate limit), one "buffer.<field>: ..." line each,
// appended to `problems`. Bounds of the controller's own (how large a
// number a spec may ask for) are the controller's; these are the rules
// without which the buffer cannot work.
void ValidateBufferConfig(const v1::BufferConfig& buffer, int32_t batch_size_groups,
                          std::vector<std::string>* problems);

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_BUFFER_H_
