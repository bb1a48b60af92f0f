#ifndef SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_H_
#define SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "replay_buffer/durability/snapshot_store.h"
#include "replay_buffer/durability/wal.h"
#include "replay_buffer/run_table.h"
#include "sluice/v1/common.pb.h"

namespace sluice::replay_buffer {

// Where and how the buffer keeps its state on disk.
struct DurabilityOptions {
  // Empty: in memory only (nothing survives a restart). Otherwise
  // <data_dir>/wal holds the write-ahead log and <data_dir>/snapshots the
  // snapshots.
  std::string data_dir;
  // kAlways: an acknowledged insert survives power loss (fdatasync before
  // the ack, shared by concurrent inserts). kInterval / kNever: it survives
  // the process being killed (kill -9, a crash: the record is in the
  // kernel before the ack), and power loss loses at most fsync_interval.
  durability::FsyncPolicy fsync_policy = durability::FsyncPolicy::kInterval;
  absl::Duration fsync_interval = absl::Milliseconds(100);
  // A snapshot is taken when this much time has passed since the last one
  // and the log has grown, or the log has grown by snapshot_wal_bytes,
  // whichever comes first, and at Shutdown. Zero interval: only by size
  // and at Shutdown.
  absl::Duration snapshot_interval = absl::Minutes(5);
  uint64_t snapshot_wal_bytes = uint64_t{256} << 20;
  int keep_snapshots = 2;
  // How long Create waits for another process to release the data
  // directory (its write-ahead log's lock) before refusing: a buffer
  // restarted at once after kill -9 finds the lock still held by the dying
  // process for a moment. >= 0; a second live buffer on the same directory
  // is refused once it runs out. Create logs once that it is waiting, and
  // for whom.
  absl::Duration data_dir_lock_wait = absl::Seconds(10);
  // Observers for metrics (cheap; may run on any thread).
  std::function<void(absl::Duration)> on_fsync;
  std::function<void(const durability::SnapshotInfo&)> on_snapshot;
  // Told when the buffer finds that it cannot write its data directory (the
  // error) and again, with OK, once it can (WriteHealth). From the
  // background thread; keep it cheap.
  std::function<void(const absl::Status&)> on_write_health;
  // While the data directory cannot be written, how often the buffer tries
  // whether it can again (a small probe write, then a snapshot), doubling
  // after each failed snapshot up to 32 times this. > 0.
  absl::Duration write_retry_interval = absl::Seconds(1);
  // The first failure is logged at once (ERROR), then a reminder at most
  // this often while it lasts, and the recovery once. > 0.
  absl::Duration write_warning_interval = absl::Seconds(60);

  absl::Status Validate() const;
};

// What Create found in the data directory.
struct RestoreReport {
  bool durable = false;
  std::optional<uint64_t> snapshot_lsn;
  std::string snapshot_path;
  int64_t wal_records_replayed = 0;
  int64_t runs = 0;
  int64_t groups = 0;
  // A torn record at the end of the log (a write a crash interrupted, never
  // acknowledged) and snapshots that were skipped as damaged.
  std::string torn_tail;
  std::vector<std::string> warnings;
  absl::Duration duration;
};

// Whether the buffer can write its data directory now.
//
// A write that fails (a full or read-only disk, an I/O error) fails the
// write-ahead log: from then on every insert and every other change is
// refused RETRYABLE_ERROR / UNAVAILABLE, so that nothing is acknowledged
// that a restart would not find, while what is in memory still serves
// Sample. The buffer notices within write_retry_interval, logs it, and then
// tries by itself: once a probe write succeeds it takes a snapshot (which
// covers whatever the failure kept out of the log) and repairs the log in
// place (WalWriter::Recover), and inserts are stored again. No restart is
// needed; a restart on a still-full disk would fail.
struct WriteHealth {
  // OK while the data directory can be written (or there is none).
  absl::Status error;
  // When the current failure was first seen; InfiniteFuture while OK.
  absl::Time since = absl::InfiniteFuture();
};

// Durability figures for metrics and stats.
struct DurabilityStats {
  durability::WalStats wal;
  int64_t snapshots_taken = 0;
  uint64_t last_snapshot_lsn = 0;
  uint64_t last_snapshot_bytes = 0;
  absl::Duration last_snapshot_duration;
};

// The replay buffer's core: one RunTable per run, found by run_id. Knows
// nothing of gRPC; the service (replay_buffer_service.h) is a thin edge over
// it.
//
// Durability (with DurabilityOptions.data_dir): every table journals its
// mutations into one write-ahead log (records carry the run id); a
// background thread snapshots every table (each one's state copied under
// its lock, written outside it) and then drops the log segments the oldest
// kept snapshot no longer needs. Create restores: the newest valid snapshot,
// then the log records after it, each applied to its run's table unless the
// table's snapshot already covered it.
//
// Tables are shared_ptrs so that a call keeps its table alive without holding
// the buffer's lock, and a blocked Sample on one run never delays another run.
//
// Thread-safe.
class ReplayBuffer {
 public:
  // `options` applies to every table; INVALID_ARGUMENT from Create when it
  // does not validate. Without options.memory the groups are counted
  // against no budget. With a data directory, restores what it holds (see
  // restore_report()); DATA_LOSS naming the file and offset when the log is
  // damaged other than at its tail; FAILED_PRECONDITION when another
  // process still holds the directory after durability.data_dir_lock_wait.
  static absl::StatusOr<std::unique_ptr<ReplayBuffer>> Create(
      RunTableOptions options = {}, DurabilityOptions durability = {});

  ~ReplayBuffer();

  struct ConfigureResult {
    bool created = false;
    RunStats stats;
  };

  // Creates the run's table (created = true) or re-applies the configuration
  // to an existing one: the same configuration is a no-op, a different B,
  // eta or G is FAILED_PRECONDITION, a different buffer config replaces the
  // old (stored groups are kept). INVALID_ARGUMENT naming every bad field.
  // UNAVAILABLE after Shutdown.
  //
  // A new table with config.max_sequence_tokens > 0 is checked against the
  // memory budget first: when what it may hold (run::
  // EstimateReplayBufferMemory) exceeds what the other tables leave of the
  // budget, RESOURCE_EXHAUSTED naming the estimate, the budget and the
  // fields to lower, and nothing is created. A reconfigure is not checked
  // again (a run already stored groups); inserts always are.
  absl::StatusOr<ConfigureResult> ConfigureRun(const RunConfig& config) ABSL_LOCKS_EXCLUDED(mu_);

  // The run's table; NOT_FOUND naming the run when it was never configured.
  absl::StatusOr<std::shared_ptr<RunTable>> GetRun(absl::string_view run_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Run ids, sorted.
  std::vector<std::string> RunIds() const ABSL_LOCKS_EXCLUDED(mu_);

  // The memory budget (RunTableOptions.memory; 0 = none) and the bytes of
  // the groups every table holds now. Lock-free.
  int64_t memory_budget_bytes() const { return options_.memory->budget_bytes(); }
  int64_t memory_used_bytes() const { return options_.memory->used_bytes(); }

  // Inserts each group into its run's table (Group.run_id); one result per
  // group, in order. A group for an unconfigured run is UNKNOWN_RUN. Waits
  // only for the rate limiter (up to rate_limit_wait per group) and, under
  // kAlways, for the fsync covering the stored groups: every STORED result
  // is durable when this returns.
  std::vector<InsertResult> Insert(std::vector<v1::Group> groups,
                                   absl::Duration rate_limit_wait = absl::Seconds(30))
      ABSL_LOCKS_EXCLUDED(mu_);

  // Takes a snapshot now (no-op without a data directory or when nothing
  // was logged since the last one).
  absl::Status SnapshotNow() ABSL_LOCKS_EXCLUDED(mu_, snapshot_mu_);

  const RestoreReport& restore_report() const { return restore_report_; }
  // See WriteHealth. Lock-free of the tables and snapshots; O(1).
  WriteHealth write_health() const ABSL_LOCKS_EXCLUDED(health_mu_);
  DurabilityStats durability_stats() const ABSL_LOCKS_EXCLUDED(snapshot_mu_);

  // Shuts every table down (see RunTable::Shutdown), and the tables that
  // ConfigureRun would create later refuse to start; with a data directory,
  // takes a last snapshot and closes the log. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class WalJournal;

  ReplayBuffer(RunTableOptions options, DurabilityOptions durability)
      : options_(std::move(options)), durability_(std::move(durability)) {}

  absl::Status Restore() ABSL_LOCKS_EXCLUDED(mu_);
  // ConfigureRun's memory check of a new table (see there).
  absl::Status CheckNewTableMemory(const RunConfig& config) const;
  void SnapshotLoop() ABSL_LOCKS_EXCLUDED(mu_, snapshot_mu_);
  // The snapshot thread's look at the log, every write_retry_interval: a
  // failure found is logged and reported (on_write_health); a failed log is
  // probed, snapshotted and recovered once the directory takes writes.
  void CheckWritesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(snapshot_mu_)
      ABSL_LOCKS_EXCLUDED(mu_, health_mu_);
  absl::Status SnapshotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(snapshot_mu_) ABSL_LOCKS_EXCLUDED(mu_);

  RunTableOptions options_;  // journal set by Create when durable
  const DurabilityOptions durability_;
  std::unique_ptr<durability::WalWriter> wal_;
  std::unique_ptr<durability::SnapshotStore> snapshots_;
  RestoreReport restore_report_;
  // Restore() completed: only then may Shutdown take a final snapshot.
  bool restored_ = false;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<RunTable>> runs_ ABSL_GUARDED_BY(mu_);

  // Serializes snapshots; guards their bookkeeping.
  mutable absl::Mutex snapshot_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool snapshot_stop_ ABSL_GUARDED_BY(snapshot_mu_) = false;
  uint64_t last_snapshot_lsn_ ABSL_GUARDED_BY(snapshot_mu_) = 0;
  uint64_t wal_bytes_at_snapshot_ ABSL_GUARDED_BY(snapshot_mu_) = 0;
  absl::Time last_snapshot_time_ ABSL_GUARDED_BY(snapshot_mu_);
  int64_t snapshots_taken_ ABSL_GUARDED_BY(snapshot_mu_) = 0;
  durability::SnapshotInfo last_snapshot_ ABSL_GUARDED_BY(snapshot_mu_);
  // While the log has failed: when to try to recover next, the wait after
  // that, and when the failure was last logged.
  absl::Time next_write_retry_ ABSL_GUARDED_BY(snapshot_mu_) = absl::InfinitePast();
  absl::Duration write_retry_backoff_ ABSL_GUARDED_BY(snapshot_mu_);
  absl::Time last_write_warning_ ABSL_GUARDED_BY(snapshot_mu_) = absl::InfinitePast();
  std::thread snapshot_thread_;

  // write_health(), apart from snapshot_mu_ (held for whole snapshots).
  mutable absl::Mutex health_mu_ ABSL_ACQUIRED_AFTER(snapshot_mu_);
  WriteHealth write_health_ ABSL_GUARDED_BY(health_mu_);
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_H_
