#include "common/run/run_buffer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace sluice::run {

absl::Status BufferSamplerOptions::Validate(const char* field_prefix) const {
  std::vector<std::string> problems;
  if (!v1::SamplerKind_IsValid(kind)) {
    problems.push_back(
        absl::StrCat(field_prefix, "sampler: unknown sampler kind ", static_cast<int>(kind)));
  }
  if (!(std::isfinite(priority_alpha) && priority_alpha >= 0)) {
    problems.push_back(absl::StrCat(field_prefix, "priority_alpha: must be finite and >= 0, got ",
                                    priority_alpha));
  }
  if (!(recency_probability >= 0 && recency_probability <= 1)) {
    problems.push_back(absl::StrCat(field_prefix, "recency_probability: must be in [0, 1], got ",
                                    recency_probability));
  }
  if (!std::isfinite(reward_inverse_temperature)) {
    problems.push_back(absl::StrCat(field_prefix,
                                    "reward_inverse_temperature: must be finite, got ",
                                    reward_inverse_temperature));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

absl::StatusOr<BufferSamplerOptions> BufferSamplerOptions::FromConfig(
    const v1::BufferConfig& config, uint64_t seed, const char* field_prefix) {
  BufferSamplerOptions options;
  options.kind =
      config.sampler() == v1::SAMPLER_KIND_UNSPECIFIED ? v1::SAMPLER_KIND_FIFO : config.sampler();
  options.priority_alpha =
      config.has_priority_alpha() ? config.priority_alpha() : kDefaultPriorityAlpha;
  options.recency_probability =
      config.recency_probability() == 0 ? kDefaultRecencyProbability : config.recency_probability();
  options.reward_inverse_temperature = config.reward_inverse_temperature();
  options.seed = seed;
  if (absl::Status status = options.Validate(field_prefix); !status.ok()) return status;
  return options;
}

void ValidateBufferRateLimit(const v1::BufferConfig& config, int32_t batch_size_groups,
                             std::vector<std::string>* problems) {
  const double spi = config.samples_per_insert();
  if (!std::isfinite(spi) || spi < 0) {
    problems->push_back(
        absl::StrCat("buffer.samples_per_insert: must be >= 0 (0 = off), got ", spi));
    return;
  }
  const double tolerance = config.samples_per_insert_tolerance();
  if (!std::isfinite(tolerance) || tolerance < 0) {
    problems->push_back(absl::StrCat(
        "buffer.samples_per_insert_tolerance: must be >= 0 (0 = 2 * batch_size_groups), got ",
        tolerance));
    return;
  }
  if (spi > 0 && tolerance > 0 && batch_size_groups > 0) {
    const double needed = (batch_size_groups + spi) / 2.0;
    if (tolerance < needed) {
      problems->push_back(absl::StrCat(
          "buffer.samples_per_insert_tolerance: must be >= (batch_size_groups + "
          "samples_per_insert) / 2 = ",
          needed, ", got ", tolerance,
          "; with less, inserts could block before a whole batch may be sampled and both "
          "sides would wait for ever"));
    }
  }
}

void ValidateBufferConfig(const v1::BufferConfig& buffer, int32_t batch_size_groups,
                          std::vector<std::string>* problems) {
  if (absl::StatusOr<BufferSamplerOptions> sampler = BufferSamplerOptions::FromConfig(buffer, 0);
      !sampler.ok()) {
    for (absl::string_view line : absl::StrSplit(sampler.status().message(), '\n')) {
      problems->emplace_back(line);
    }
  }
  if (!v1::PrioritySource_IsValid(buffer.priority_source())) {
    problems->push_back(absl::StrCat("buffer.priority_source: unknown value ",
                                     static_cast<int>(buffer.priority_source())));
  }
  if (!std::isfinite(buffer.priority_epsilon()) || buffer.priority_epsilon() < 0) {
    problems->push_back(absl::StrCat("buffer.priority_epsilon: must be >= 0 (0 = 0.01), got ",
                                     buffer.priority_epsilon()));
  }
  if (buffer.max_times_sampled() < 0) {
    problems->push_back(absl::StrCat("buffer.max_times_sampled: must be >= 0 (0 = 1), got ",
                                     buffer.max_times_sampled()));
  }
  if (buffer.min_size_to_sample_groups() < 0) {
    problems->push_back(absl::StrCat("buffer.min_size_to_sample_groups: must be >= 0, got ",
                                     buffer.min_size_to_sample_groups()));
  }
  const int64_t batch_minimum =
      std::max<int64_t>(batch_size_groups, buffer.min_size_to_sample_groups());
  if (buffer.capacity_groups() < 0) {
    problems->push_back(absl::StrCat("buffer.capacity_groups: must be >= 0 (0 = unbounded), got ",
                                     buffer.capacity_groups()));
  } else if (buffer.capacity_groups() > 0 && buffer.capacity_groups() < batch_minimum) {
    problems->push_back(
        absl::StrCat("buffer.capacity_groups: must be 0 (unbounded) or >= max(batch_size_groups, "
                     "min_size_to_sample_groups) = ",
                     batch_minimum, ", got ", buffer.capacity_groups(),
                     "; a smaller table could never fill a batch"));
  }
  ValidateBufferRateLimit(buffer, batch_size_groups, problems);
}

}  // namespace sluice::run
