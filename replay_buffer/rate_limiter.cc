#include "replay_buffer/rate_limiter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/run/run_buffer.h"

namespace sluice::replay_buffer {

RateLimiter::Options RateLimiter::OptionsFrom(const v1::BufferConfig& config,
                                              int32_t batch_size_groups) {
  Options options;
  options.samples_per_insert = config.samples_per_insert();
  options.min_size_to_sample = config.min_size_to_sample_groups();
  options.ratio_min_size = config.min_size_to_sample_groups() > 0
                               ? config.min_size_to_sample_groups()
                               : std::max<int64_t>(1, batch_size_groups);
  options.tolerance = config.samples_per_insert_tolerance() > 0
                          ? config.samples_per_insert_tolerance()
                          : 2.0 * batch_size_groups;
  return options;
}

void RateLimiter::Validate(const v1::BufferConfig& config, int32_t batch_size_groups,
                           std::vector<std::string>* problems) {
  run::ValidateBufferRateLimit(config, batch_size_groups, problems);
}

bool RateLimiter::RatioAllowsSample(int64_t n) const {
  if (options_.samples_per_insert <= 0) return true;
  const double diff = static_cast<double>(inserts_) * options_.samples_per_insert -
                      static_cast<double>(samples_);
  const double min_diff =
      options_.samples_per_insert * static_cast<double>(options_.ratio_min_size) -
      options_.tolerance;
  return diff - static_cast<double>(n) >= min_diff;
}

bool RateLimiter::CanInsert(int64_t size) const {
  if (options_.samples_per_insert <= 0) return true;
  if (size < options_.ratio_min_size) return true;
  const double next = static_cast<double>(inserts_ + 1) * options_.samples_per_insert -
                      static_cast<double>(samples_);
  const double max_diff =
      options_.samples_per_insert * static_cast<double>(options_.ratio_min_size) +
      options_.tolerance;
  return next <= max_diff;
}

}  // namespace sluice::replay_buffer
