#include "replay_buffer/samplers/uniform_sampler.h"

#include <algorithm>
#include <utility>

namespace sluice::replay_buffer {

void UniformSampler::Insert(int64_t key, double /*priority*/) {
  if (index_.try_emplace(key, keys_.size()).second) keys_.push_back(key);
}

bool UniformSampler::Update(int64_t key, double /*priority*/) { return index_.contains(key); }

void UniformSampler::Delete(int64_t key) {
  const auto it = index_.find(key);
  if (it == index_.end()) return;
  const size_t hole = it->second;
  index_.erase(it);
  if (hole + 1 != keys_.size()) {
    keys_[hole] = keys_.back();
    index_[keys_[hole]] = hole;
  }
  keys_.pop_back();
}

std::vector<int64_t> UniformSampler::Select(int64_t count) {
  const size_t batch = static_cast<size_t>(std::clamp<int64_t>(count, 0, size()));
  std::vector<int64_t> selected;
  selected.reserve(batch);
  swap_scratch_.clear();
  const size_t n = keys_.size();
  for (size_t i = 0; i < batch; ++i) {
    const size_t j = i + static_cast<size_t>(random_.UniformInt(n - i));
    std::swap(keys_[i], keys_[j]);
    swap_scratch_.push_back(j);
    selected.push_back(keys_[i]);
  }
  for (size_t i = batch; i-- > 0;) std::swap(keys_[i], keys_[swap_scratch_[i]]);
  return selected;
}

double UniformSampler::Probability(int64_t key) const {
  return index_.contains(key) ? 1.0 / static_cast<double>(keys_.size()) : 0.0;
}

}  // namespace sluice::replay_buffer
