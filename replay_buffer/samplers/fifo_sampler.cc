#include "replay_buffer/samplers/fifo_sampler.h"

#include <algorithm>

namespace sluice::replay_buffer {

void FifoSampler::Insert(int64_t key) { keys_.insert(key); }

void FifoSampler::Delete(int64_t key) { keys_.erase(key); }

std::vector<int64_t> FifoSampler::Select(int64_t count) {
  std::vector<int64_t> selected;
  selected.reserve(static_cast<size_t>(std::max<int64_t>(0, std::min(count, size()))));
  for (auto it = keys_.begin(); it != keys_.end() && static_cast<int64_t>(selected.size()) < count;
       ++it) {
    selected.push_back(*it);
  }
  return selected;
}

}  // namespace sluice::replay_buffer
