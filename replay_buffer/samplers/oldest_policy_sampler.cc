#include "replay_buffer/samplers/oldest_policy_sampler.h"

#include <algorithm>
#include <cmath>

namespace sluice::replay_buffer {

void OldestPolicySampler::Insert(int64_t key, double priority) {
  if (version_of_.contains(key)) return;  // a repeated insert is an Update
  const int64_t version = std::isfinite(priority) ? std::llround(priority) : 0;
  version_of_.emplace(key, version);
  order_.emplace(version, key);
}

bool OldestPolicySampler::Update(int64_t key, double /*priority*/) {
  return version_of_.contains(key);
}

void OldestPolicySampler::Delete(int64_t key) {
  auto it = version_of_.find(key);
  if (it == version_of_.end()) return;
  order_.erase({it->second, key});
  version_of_.erase(it);
}

std::vector<int64_t> OldestPolicySampler::Select(int64_t count) {
  std::vector<int64_t> selected;
  const int64_t batch = std::clamp<int64_t>(count, 0, size());
  selected.reserve(static_cast<size_t>(batch));
  for (auto it = order_.begin(); static_cast<int64_t>(selected.size()) < batch; ++it) {
    selected.push_back(it->second);
  }
  return selected;
}

double OldestPolicySampler::Probability(int64_t key) const {
  return !order_.empty() && order_.begin()->second == key ? 1.0 : 0.0;
}

}  // namespace sluice::replay_buffer
