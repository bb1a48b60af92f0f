#include "replay_buffer/samplers/lifo_sampler.h"

#include <algorithm>

namespace sluice::replay_buffer {

void LifoSampler::Insert(int64_t key, double /*priority*/) { keys_.insert(key); }

bool LifoSampler::Update(int64_t key, double /*priority*/) { return keys_.contains(key); }

void LifoSampler::Delete(int64_t key) { keys_.erase(key); }

std::vector<int64_t> LifoSampler::Select(int64_t count) {
  std::vector<int64_t> selected;
  const int64_t batch = std::clamp<int64_t>(count, 0, size());
  selected.reserve(static_cast<size_t>(batch));
  for (auto it = keys_.rbegin(); static_cast<int64_t>(selected.size()) < batch; ++it) {
    selected.push_back(*it);
  }
  return selected;
}

double LifoSampler::Probability(int64_t key) const {
  return !keys_.empty() && *keys_.rbegin() == key ? 1.0 : 0.0;
}

}  // namespace sluice::replay_buffer
