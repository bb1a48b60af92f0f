#include "replay_buffer/samplers/sampler.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "replay_buffer/samplers/fifo_sampler.h"
#include "replay_buffer/samplers/lifo_sampler.h"
#include "replay_buffer/samplers/oldest_policy_sampler.h"
#include "replay_buffer/samplers/prioritized_sampler.h"
#include "replay_buffer/samplers/recency_sampler.h"
#include "replay_buffer/samplers/uniform_sampler.h"

namespace sluice::replay_buffer {

absl::StatusOr<std::unique_ptr<Sampler>> CreateSampler(const SamplerOptions& options) {
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  switch (options.kind) {
    case v1::SAMPLER_KIND_UNSPECIFIED:
    case v1::SAMPLER_KIND_FIFO:
      return std::unique_ptr<Sampler>(std::make_unique<FifoSampler>());
    case v1::SAMPLER_KIND_LIFO:
      return std::unique_ptr<Sampler>(std::make_unique<LifoSampler>());
    case v1::SAMPLER_KIND_UNIFORM:
      return std::unique_ptr<Sampler>(std::make_unique<UniformSampler>(options.seed));
    case v1::SAMPLER_KIND_PRIORITIZED:
      return std::unique_ptr<Sampler>(
          std::make_unique<PrioritizedSampler>(options.priority_alpha, options.seed));
    case v1::SAMPLER_KIND_RECENCY:
      return std::unique_ptr<Sampler>(std::make_unique<RecencySampler>(
          options.recency_probability, options.reward_inverse_temperature, options.seed));
    case v1::SAMPLER_KIND_OLDEST_POLICY:
      return std::unique_ptr<Sampler>(std::make_unique<OldestPolicySampler>());
    default:
      break;
  }
  // Validate() accepts only declared kinds; this is a kind declared in the
  // proto and not handled above.
  return absl::InvalidArgumentError(
      absl::StrCat("sampler: no sampler implements ", v1::SamplerKind_Name(options.kind)));
}

}  // namespace sluice::replay_buffer
