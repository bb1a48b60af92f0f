#ifndef SLUICE_REPLAY_BUFFER_RATE_LIMITER_H_
#define SLUICE_REPLAY_BUFFER_RATE_LIMITER_H_

#include <algorithm>
#include <cstdint>
#include <vector>
#include <string>

#include "absl/status/status.h"
#include "sluice/v1/common.pb.h"

namespace sluice::replay_buffer {

// Reverb's rate limiter, in groups, plus the consumption side of Sluice's
// staleness bound. Pure arithmetic on three numbers: the table owns the
// waiting (blocked callers wait on the table's mutex with a deadline and are
// woken by the state change that may admit them; nothing polls).
//
// With spi = samples_per_insert, min = min_size_to_sample and tolerance t:
//
//   diff = inserts * spi - samples
//   a sample of n groups may proceed iff
//       size >= max(n, min)                 (enough groups held), and, when spi > 0,
//       diff - n >= spi * min - t           (the learner is not ahead of the ratio)
//   an insert may proceed iff spi == 0, or the table is still filling
//       (size < min), or (inserts + 1) * spi - samples <= spi * min + t
//
// Groups that leave untrained (stale or capacity evictions) are taken back
// out of `inserts`: otherwise they would count as sampling credit that no
// group backs, and with inserts blocked the table could deadlock.
//
// Config validation guarantees 2t >= B + spi, so that once inserts block a
// whole batch can always be sampled (the two sides cannot both block).
class RateLimiter {
 public:
  struct Options {
    // 0 = no ratio (only the minimum size).
    double samples_per_insert = 0;
    // Groups held before any sample (0: a batch's worth, whatever its size).
    int64_t min_size_to_sample = 0;
    // The size the ratio is centred on (min in the formulas above):
    // min_size_to_sample, or B when that is 0.
    int64_t ratio_min_size = 1;
    double tolerance = 0;
  };

  // `config` as validated by RunConfig::Validate; B is the run's batch size.
  static Options OptionsFrom(const v1::BufferConfig& config, int32_t batch_size_groups);

  // Every problem with the config's rate-limit fields, naming the field;
  // appended to `problems`.
  static void Validate(const v1::BufferConfig& config, int32_t batch_size_groups,
                       std::vector<std::string>* problems);

  explicit RateLimiter(Options options) : options_(options) {}

  const Options& options() const { return options_; }
  void set_options(Options options) { options_ = options; }

  // Whether the size condition alone admits a batch of n.
  bool HasEnough(int64_t size, int64_t n) const {
    return size >= std::max<int64_t>(n, options_.min_size_to_sample);
  }
  // What a batch of n needs held.
  int64_t NeededFor(int64_t n) const { return std::max<int64_t>(n, options_.min_size_to_sample); }
  // Whether the ratio admits a batch of n (always true with spi = 0).
  bool RatioAllowsSample(int64_t n) const;
  bool CanInsert(int64_t size) const;

  void OnInsert() { ++inserts_; }
  void OnSample(int64_t n) { samples_ += n; }
  // A group left the table untrained (stale, capacity).
  void OnDroppedUntrained() { --inserts_; }
  // An undelivered batch came back.
  void OnReturned(int64_t n) { samples_ -= n; }

  int64_t inserts() const { return inserts_; }
  int64_t samples() const { return samples_; }
  // Restores the counters (snapshots and the WAL).
  void Restore(int64_t inserts, int64_t samples) {
    inserts_ = inserts;
    samples_ = samples;
  }

 private:
  Options options_;
  int64_t inserts_ = 0;
  int64_t samples_ = 0;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_RATE_LIMITER_H_
