#include "replay_buffer/samplers/sampler.h"

#include "absl/strings/str_cat.h"
#include "replay_buffer/samplers/fifo_sampler.h"

namespace sluice::replay_buffer {

absl::Status CheckSamplerAvailable(v1::SamplerKind kind, const char* field) {
  switch (kind) {
    case v1::SAMPLER_KIND_UNSPECIFIED:
    case v1::SAMPLER_KIND_FIFO:
      return absl::OkStatus();
    default:
      break;
  }
  const std::string name = v1::SamplerKind_IsValid(kind)
                               ? v1::SamplerKind_Name(kind)
                               : absl::StrCat("sampler kind ", static_cast<int>(kind));
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", name, " is not available yet; this release implements SAMPLER_KIND_FIFO"));
}

absl::StatusOr<std::unique_ptr<Sampler>> CreateSampler(v1::SamplerKind kind) {
  if (absl::Status available = CheckSamplerAvailable(kind, "sampler"); !available.ok()) {
    return available;
  }
  return std::unique_ptr<Sampler>(std::make_unique<FifoSampler>());
}

}  // namespace sluice::replay_buffer
