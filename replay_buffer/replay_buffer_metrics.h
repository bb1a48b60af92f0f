#ifndef SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_METRICS_H_
#define SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_METRICS_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "replay_buffer/replay_buffer.h"
#include "replay_buffer/run_table.h"

namespace sluice::replay_buffer {

// The replay buffer's Prometheus metrics:
//
//   sluice_buffer_groups{run_id}                        groups held
//   sluice_buffer_inserts_total{run_id,status}          stored, duplicate, rejected_stale,
//                                                       invalid, retryable_error
//   sluice_buffer_sampled_groups_total{run_id}
//   sluice_buffer_evictions_total{run_id,reason}        stale, max_times_sampled, capacity,
//                                                       uniform_reward
//   sluice_buffer_policy_version{run_id}
//   sluice_buffer_admission_running{run_id}
//   sluice_buffer_admission_accepted{run_id}
//   sluice_buffer_admission_limit{run_id}
//   sluice_buffer_max_staleness{run_id}                 the run's bound eta
//   sluice_buffer_sampled_staleness{run_id}             histogram, versions, delivered groups
//   sluice_buffer_admission_wait_seconds                histogram, every acquire asking for slots
//   sluice_buffer_size_bytes{run_id}                    serialized bytes held
//   sluice_buffer_rate_limiter_blocked_seconds_total{run_id,side}   insert, sample
//   sluice_buffer_wal_bytes_total                       bytes appended to the write-ahead log
//   sluice_buffer_wal_records_total
//   sluice_buffer_wal_disk_bytes                        log segments on disk now
//   sluice_buffer_retained_groups{run_id}               kept for uncommitted trainer steps
//   sluice_buffer_committed_step{run_id}                the trainer's last committed step
//   sluice_buffer_replayed_batches_total{run_id}        step batches handed out again
//   (DurabilityMetrics) sluice_buffer_wal_fsync_seconds, sluice_buffer_snapshot_seconds,
//   sluice_buffer_snapshot_bytes
//
// The run table is the one source of truth: Sync copies its counters and
// gauges (counters move by the difference since the last Sync and never
// back, so a batch put back by ReturnUndelivered is not counted twice), so
// the numbers on /metrics are those of GetStats as of the run's latest RPC.
// Lease expiries between RPCs show at the next one.
//
// Per-run series are created at a run's first Sync and kept for the life of
// the process: runs are never deleted in this release (a DeleteRun would
// Remove them from their families here). The families belong to the registry,
// which must outlive this object.
//
// Thread-safe.
class ReplayBufferMetrics {
 public:
  explicit ReplayBufferMetrics(prometheus::Registry& registry);
  ~ReplayBufferMetrics();

  // Mirrors `table`'s statistics; takes its snapshot under this object's
  // lock so that concurrent Syncs apply in snapshot order.
  void Sync(RunTable& table) ABSL_LOCKS_EXCLUDED(mu_);

  // Records the staleness of a batch the trainer received.
  void ObserveDelivered(const std::string& run_id, const SampleResult& batch)
      ABSL_LOCKS_EXCLUDED(mu_);

  void ObserveAdmissionWait(absl::Duration waited);

  // Mirrors the write-ahead log's counters (no-op without a data directory).
  void SyncDurability(const DurabilityStats& stats) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct RunSeries;
  RunSeries& SeriesLocked(const std::string& run_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  prometheus::Family<prometheus::Gauge>& groups_;
  prometheus::Family<prometheus::Counter>& inserts_;
  prometheus::Family<prometheus::Counter>& sampled_groups_;
  prometheus::Family<prometheus::Counter>& evictions_;
  prometheus::Family<prometheus::Gauge>& policy_version_;
  prometheus::Family<prometheus::Gauge>& admission_running_;
  prometheus::Family<prometheus::Gauge>& admission_accepted_;
  prometheus::Family<prometheus::Gauge>& admission_limit_;
  prometheus::Family<prometheus::Gauge>& max_staleness_;
  prometheus::Family<prometheus::Histogram>& sampled_staleness_;
  prometheus::Histogram& admission_wait_seconds_;
  prometheus::Family<prometheus::Gauge>& size_bytes_;
  prometheus::Family<prometheus::Counter>& rate_limiter_blocked_;
  prometheus::Counter& wal_bytes_;
  prometheus::Counter& wal_records_;
  prometheus::Gauge& wal_disk_bytes_;
  prometheus::Family<prometheus::Gauge>& retained_groups_;
  prometheus::Family<prometheus::Gauge>& committed_step_;
  prometheus::Family<prometheus::Counter>& replayed_batches_;
  uint64_t wal_bytes_exported_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t wal_records_exported_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RunSeries>> runs_ ABSL_GUARDED_BY(mu_);
};

// Latency of the log's fsyncs and of snapshots, fed by DurabilityOptions'
// observers (created before the buffer, which reports into it).
class DurabilityMetrics {
 public:
  explicit DurabilityMetrics(prometheus::Registry& registry);
  void ObserveFsync(absl::Duration latency);
  void ObserveSnapshot(const durability::SnapshotInfo& info);

 private:
  prometheus::Histogram& fsync_seconds_;
  prometheus::Histogram& snapshot_seconds_;
  prometheus::Gauge& snapshot_bytes_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_METRICS_H_
