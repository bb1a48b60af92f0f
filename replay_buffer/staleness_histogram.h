#ifndef SLUICE_REPLAY_BUFFER_STALENESS_HISTOGRAM_H_
#define SLUICE_REPLAY_BUFFER_STALENESS_HISTOGRAM_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::replay_buffer {

// Counts of staleness values (in policy versions), in the shape of
// sluice.v1.StalenessHistogram: inclusive upper bounds, non-cumulative counts
// and one overflow bucket past the last bound. Values <= 0 land in the first
// bucket (a group newer than the trainer's version is "fresh").
//
// Not thread-safe; the run table keeps it under its lock.
class StalenessHistogram {
 public:
  // Bounds 0, 1, 2, 3, 4, 6, 8, 16, 32: exact around the usual eta (0..4),
  // coarse beyond.
  StalenessHistogram();
  explicit StalenessHistogram(std::vector<int64_t> bucket_upper_bounds);

  // Records `count` observations of `staleness`. O(log buckets).
  void Add(int64_t staleness, int64_t count = 1);
  // Takes back observations recorded by Add (a batch that was never delivered).
  void Remove(int64_t staleness, int64_t count = 1);

  const std::vector<int64_t>& bucket_upper_bounds() const { return bounds_; }
  // bucket_upper_bounds().size() + 1 entries.
  const std::vector<int64_t>& counts() const { return counts_; }
  int64_t sum() const { return sum_; }
  int64_t total_count() const;

  // Replaces the counts (restoring a snapshot); false, and no change, when
  // `bounds` differ from this histogram's or counts has the wrong length.
  bool Restore(const std::vector<int64_t>& bounds, const std::vector<int64_t>& counts,
               int64_t sum);

 private:
  size_t BucketOf(int64_t staleness) const;

  std::vector<int64_t> bounds_;
  std::vector<int64_t> counts_;
  int64_t sum_ = 0;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_STALENESS_HISTOGRAM_H_
