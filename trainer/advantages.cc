#include "trainer/advantages.h"

#include <cmath>

namespace sluice::trainer {

std::vector<double> GroupAdvantages(const std::vector<double>& rewards, bool normalize_by_std,
                                    double eps) {
  std::vector<double> advantages(rewards.size(), 0.0);
  if (rewards.empty() || IsUniform(rewards)) return advantages;
  double mean = 0;
  for (double r : rewards) mean += r;
  mean /= static_cast<double>(rewards.size());
  double variance = 0;
  for (double r : rewards) variance += (r - mean) * (r - mean);
  variance /= static_cast<double>(rewards.size());
  const double scale = normalize_by_std ? 1.0 / (std::sqrt(variance) + eps) : 1.0;
  for (size_t i = 0; i < rewards.size(); ++i) advantages[i] = (rewards[i] - mean) * scale;
  return advantages;
}

bool IsUniform(const std::vector<double>& rewards) {
  for (double r : rewards) {
    if (r != rewards.front()) return false;
  }
  return true;
}

}  // namespace sluice::trainer
