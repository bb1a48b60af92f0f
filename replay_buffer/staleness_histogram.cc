#include "replay_buffer/staleness_histogram.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace sluice::replay_buffer {

StalenessHistogram::StalenessHistogram()
    : StalenessHistogram(std::vector<int64_t>{0, 1, 2, 3, 4, 6, 8, 16, 32}) {}

StalenessHistogram::StalenessHistogram(std::vector<int64_t> bucket_upper_bounds)
    : bounds_(std::move(bucket_upper_bounds)), counts_(bounds_.size() + 1, 0) {}

size_t StalenessHistogram::BucketOf(int64_t staleness) const {
  return static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), staleness) -
                             bounds_.begin());
}

void StalenessHistogram::Add(int64_t staleness, int64_t count) {
  counts_[BucketOf(staleness)] += count;
  sum_ += staleness * count;
}

void StalenessHistogram::Remove(int64_t staleness, int64_t count) { Add(staleness, -count); }

int64_t StalenessHistogram::total_count() const {
  return std::accumulate(counts_.begin(), counts_.end(), int64_t{0});
}

bool StalenessHistogram::Restore(const std::vector<int64_t>& bounds,
                                 const std::vector<int64_t>& counts, int64_t sum) {
  if (bounds != bounds_ || counts.size() != counts_.size()) return false;
  counts_ = counts;
  sum_ = sum;
  return true;
}

}  // namespace sluice::replay_buffer
