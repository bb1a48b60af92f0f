#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace sluice::trainer {
namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

double LearningRateAt(const v1::AlgorithmConfig& algorithm, int64_t step) {
  const double peak = algorithm.learning_rate();
  const int64_t warmup = algorithm.lr_warmup_steps();
  if (warmup > 0 && step < warmup) {
    return peak * static_cast<double>(std::max<int64_t>(step, 0)) / static_cast<double>(warmup);
  }
  const int64_t decay_steps = algorithm.total_steps() - warmup;
  if (decay_steps <= 0) return peak;
  // The fraction of the decay done before this step (so the last step still
  // learns, as in Hugging Face's schedules).
  const double p = std::clamp(
      static_cast<double>(step - 1 - warmup) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double m = algorithm.min_lr_ratio();
  switch (algorithm.lr_schedule()) {
    case v1::LR_SCHEDULE_COSINE:
      return peak * (m + (1 - m) * 0.5 * (1 + std::cos(kPi * p)));
    case v1::LR_SCHEDULE_LINEAR:
      return peak * (m + (1 - m) * (1 - p));
    default:
      return peak;
  }
}

}  // namespace sluice::trainer
