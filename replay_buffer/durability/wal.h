#ifndef SLUICE_REPLAY_BUFFER_DURABILITY_WAL_H_
#define SLUICE_REPLAY_BUFFER_DURABILITY_WAL_H_

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "replay_buffer/durability/file_io.h"

// The replay buffer's write-ahead log: payload-agnostic, append-only,
// checksummed records with consecutive log sequence numbers (LSNs).
//
//   <dir>/LOCK                             flock(2)ed by the one WalWriter,
//                                          which writes "pid <its pid>" into it
//   <dir>/wal-00000000000000000001.log     records 1 .. 4711
//   <dir>/wal-00000000000000004712.log     records 4712 .. (the active one)
//
// A segment is named after the LSN of its first record; its records follow
// one another with no gaps, and each segment starts where the previous one
// ended. Record framing is in record_format.h.
//
// Durability. Append returns only after the record's bytes were handed to
// the kernel with write(2), so:
//   - every acknowledged record (Append returned OK) survives the death of
//     the process (kill -9, abort, the OOM killer), under every policy;
//   - surviving power loss or a kernel crash depends on FsyncPolicy:
//       kAlways    every acknowledged record survives: Append returns only
//                  after fdatasync(2) of the segment covered it. Concurrent
//                  appenders share one fdatasync (group commit): while one
//                  thread syncs, the others write and then wait for the
//                  next sync, which covers all of them.
//       kInterval  a background thread syncs every `fsync_interval` when
//                  something was written; power loss can lose the records
//                  acknowledged in about the last interval (plus one sync's
//                  duration).
//       kNever     the kernel writes back when it likes (on Linux typically
//                  within ~30 s, with no bound); power loss can lose any
//                  acknowledged record not yet written back.
//     (All assume a device that honours cache flushes.) Directory entries
//     of new segments are fsynced under kAlways and kInterval too.
//   - a record whose Append returned an error was not acknowledged; it may
//     or may not be present after a restart (e.g. written, then the sync
//     failed).
//
// After a crash the last segment may end in a torn record (the unfinished
// last write). Open truncates it and ReadWal stops silently there; damage
// anywhere else is DATA_LOSS naming the file and byte offset (see
// record_format.h for what counts as a torn tail). Power loss under kNever
// or kInterval may, on some file systems, leave unsynced pages out of order
// (garbage followed by valid data); that is reported as DATA_LOSS rather
// than silently skipped, since it cannot be told apart from bit rot.
//
// Use with snapshots: after a snapshot at LSN s is committed, records
// <= s are redundant. Keep the log from the oldest *retained* snapshot on
// (RemoveSegmentsBefore(oldest_retained_snapshot_lsn + 1)), so that falling
// back to an older snapshot, when the newest is damaged, can still replay.

namespace sluice::replay_buffer::durability {

// The LSN of the first record of a new log.
inline constexpr uint64_t kFirstLsn = 1;
inline constexpr uint64_t kDefaultWalSegmentBytes = uint64_t{64} << 20;

enum class FsyncPolicy {
  kAlways,    // fdatasync before Append returns (group commit)
  kInterval,  // a background thread fdatasyncs every fsync_interval
  kNever,     // never sync (the kernel's writeback only)
};

struct WalOptions {
  FsyncPolicy fsync_policy = FsyncPolicy::kAlways;
  // kInterval only: the longest time an acknowledged record stays unsynced
  // (plus one sync's duration). > 0.
  absl::Duration fsync_interval = absl::Milliseconds(100);
  // Start a new segment when an append would take the active one past this
  // size (a single larger batch still goes into one segment). > 0.
  uint64_t segment_size_bytes = kDefaultWalSegmentBytes;
  // Called after each fdatasync of a segment with its duration (for a
  // latency histogram). It may run on any appending thread, the interval
  // thread, or with the writer's internal lock held (at rotation and Close):
  // it must be cheap and must not call into this WalWriter. Calls are never
  // concurrent with each other (one sync at a time).
  std::function<void(absl::Duration)> fsync_observer;
  // How long Open waits for another writer to release the directory lock
  // before refusing (>= 0; 0 = refuse at once). A process killed with
  // kill -9 keeps its lock until the kernel has torn it down, which can
  // take a moment after the signal: a supervisor that restarts it at once
  // must not be refused for that. A live writer is still refused once the
  // wait runs out.
  absl::Duration lock_wait = absl::ZeroDuration();
  // Called once, from Open, when the lock is held by another writer and
  // Open starts waiting for it, with what LOCK says about the holder ("pid
  // 1234", or "" when it says nothing). For a log line.
  std::function<void(const std::string& holder)> lock_wait_observer;

  // INVALID_ARGUMENT naming the field, e.g. "segment_size_bytes must be > 0".
  absl::Status Validate() const;
};

// What Open found and repaired.
struct WalRecovery {
  // The LSN the next Append gets.
  uint64_t next_lsn = kFirstLsn;
  // Bytes cut from the end of the last segment (a torn record), and where
  // and why; 0 / empty when the log ended cleanly.
  uint64_t truncated_bytes = 0;
  std::string truncated_segment;
  uint64_t truncated_at_offset = 0;
  std::string truncation_reason;
};

// Counters for metrics; a consistent snapshot taken under the writer's lock.
struct WalStats {
  uint64_t bytes_appended = 0;    // since Open, record headers included
  uint64_t records_appended = 0;  // since Open
  uint64_t fsyncs = 0;            // fdatasyncs of segment files since Open
  uint64_t segment_count = 0;     // segment files in the directory now
  uint64_t disk_bytes = 0;        // their total size
  uint64_t next_lsn = 0;          // the LSN the next Append gets
  // Every record with an LSN <= this is known to be on stable storage
  // (Open syncs what it finds unless kNever; always 0 under kNever).
  uint64_t synced_lsn = 0;
};

// Appends records to the log in one directory. One WalWriter per directory
// (enforced with flock(2) on <dir>/LOCK, also within one process).
//
// Thread-safe: any number of threads may Append concurrently; LSNs are
// assigned in the order the appends reach the file.
class WalWriter {
 public:
  // Opens the log in `dir`, creating the directory if missing. Scans the
  // last segment to find the last LSN, truncating a torn tail (reported in
  // recovery()). Only the last segment is read, so Open costs O(segment
  // size); unless kNever it also fdatasyncs every segment (cheap when
  // clean) so that a previous writer's unsynced data is durable too. When another writer holds
  // the directory, blocks up to options.lock_wait for it to let go (polling the lock; flock(2)
  // has no timeout). Errors: INVALID_ARGUMENT for bad options, FAILED_PRECONDITION naming the
  // holder's pid when another writer still holds the directory after the wait, DATA_LOSS when
  // the last segment is damaged other than at its tail, or an I/O error.
  static absl::StatusOr<std::unique_ptr<WalWriter>> Open(std::string dir, WalOptions options = {});

  // Close()s, ignoring its error.
  ~WalWriter();

  WalWriter(const WalWriter&) = delete;
  WalWriter& operator=(const WalWriter&) = delete;

  // Appends one record and returns its LSN. Blocks for write(2), and under
  // kAlways until an fdatasync covers the record (a few ms on a disk).
  // INVALID_ARGUMENT for a payload over kMaxRecordPayloadBytes (nothing is
  // written and the writer stays usable). Any I/O error (ENOSPC, EIO, a
  // failed sync) is returned once and makes the writer refuse every later
  // Append with FAILED_PRECONDITION: the file may end in a torn record,
  // which only Recover (or reopening) repairs.
  absl::StatusOr<uint64_t> Append(absl::string_view payload) ABSL_LOCKS_EXCLUDED(mu_);

  // Appends a batch with one writev(2) (up to IOV_MAX / 2 records per call)
  // and at most one sync; returns the LSN of the first record, the others
  // following consecutively. Never split across segments. Empty batches
  // are INVALID_ARGUMENT. Errors as for one record; on error none of the
  // batch is acknowledged (some of it may be present after a restart).
  absl::StatusOr<uint64_t> Append(absl::Span<const absl::string_view> payloads)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> Append(absl::Span<const std::string> payloads) ABSL_LOCKS_EXCLUDED(mu_);

  // Like Append, but never waits for a sync, whatever the policy: on return
  // the record is in the kernel (it survives kill -9). Under kAlways call
  // SyncUpTo(lsn) before acknowledging it. This lets a caller append under
  // its own lock (to order records like the mutations they describe) and
  // wait for the shared sync after releasing it.
  absl::StatusOr<uint64_t> AppendWithoutSync(absl::string_view payload) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<uint64_t> AppendWithoutSync(absl::Span<const absl::string_view> payloads)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until record `lsn` is as durable as the policy promises: under
  // kAlways until an fdatasync covers it (one sync shared by all concurrent
  // callers and appenders: group commit); under kInterval and kNever it
  // returns at once. INVALID_ARGUMENT for an LSN not yet appended; under
  // kAlways a failed sync is returned and sticky, as for Append.
  absl::Status SyncUpTo(uint64_t lsn) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes the next LSN at least `lsn`, starting a new segment named after
  // it; no-op if it already is. For a log found *behind* the newest
  // snapshot (its tail lost to power loss under kInterval or kNever while
  // the snapshot, always synced, survived): without the jump, new records
  // would reuse LSNs the snapshot covers and be skipped by the next
  // restore (ReadWal from snapshot LSN + 1). Reads that span the gap are
  // DATA_LOSS, as they should be.
  absl::Status AdvanceNextLsn(uint64_t lsn) ABSL_LOCKS_EXCLUDED(mu_);

  // Deletes the segments whose every record has an LSN < `lsn`; the active
  // segment is always kept, so the log's continuity survives a reopen. The
  // removals are made durable with a directory fsync (unless kNever).
  // Blocks appenders only to read the segment list; O(segments removed).
  absl::Status RemoveSegmentsBefore(uint64_t lsn) ABSL_LOCKS_EXCLUDED(mu_, remove_mu_);

  // The sticky error of an earlier failed write or sync (OK while there is
  // none): while it is set, every Append is refused FAILED_PRECONDITION.
  absl::Status error() const ABSL_LOCKS_EXCLUDED(mu_);

  // Makes a writer that failed (error()) accept appends again, without a
  // reopen: cuts the active segment back to its last complete record (what
  // a failed write left behind), syncs it (unless kNever), and clears the
  // error; the next Append gets next_lsn(). When the failure may have lost
  // records already appended (a failed sync: the kernel may drop their
  // pages), or the segment cannot be cut back, appends go on in a new
  // segment named after next_lsn(), leaving a gap that reads across report
  // as DATA_LOSS. So call it only after a snapshot covering every record
  // appended so far (LSN next_lsn() - 1) was committed: the restore starts
  // from it and never reads across the gap. It does not tell whether the
  // directory can take more (the caller probes first, ProbeWritable): an
  // Append that fails again fails the writer again. The I/O error when the
  // repair itself fails (the writer stays failed); OK and nothing done when
  // there is no error. Must not race with Close. O(active segment) to find
  // its last complete record.
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the interval thread, syncs the active segment (unless kNever or
  // after an error), closes it and releases the directory lock. Appends
  // after Close are FAILED_PRECONDITION. Must not race with Append.
  // Idempotent; returns the sync's error, if any.
  absl::Status Close() ABSL_LOCKS_EXCLUDED(mu_);

  WalStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t next_lsn() const ABSL_LOCKS_EXCLUDED(mu_);
  const WalRecovery& recovery() const { return recovery_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Segment {
    uint64_t first_lsn;
    uint64_t bytes;
  };

  WalWriter(std::string dir, WalOptions options);

  absl::Status Initialize() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the flock on <dir>/LOCK (waiting up to options_.lock_wait) and
  // records this process's pid in it.
  absl::Status LockDirectory();
  absl::StatusOr<uint64_t> AppendImpl(absl::Span<const absl::string_view> payloads,
                                      bool wait_for_sync) ABSL_LOCKS_EXCLUDED(mu_);
  // fdatasync of the active segment if it holds unsynced records (unless
  // kNever). Requires no sync in progress.
  absl::Status SyncActiveSegmentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckWritableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NeedsRotationLocked(uint64_t batch_bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Syncs the active segment (unless kNever) and starts a new one at
  // next_lsn_. Requires no sync in progress.
  absl::Status RotateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OpenNewSegmentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Group commit: returns once synced_lsn_ >= lsn. Either leads a sync
  // (releasing mu_ during fdatasync) or waits for the one in progress.
  absl::Status SyncUpToLocked(uint64_t lsn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first error sets error_ (sticky); returns `status`. `may_lose`: the
  // failure may have lost records already counted as appended (a failed
  // sync), which Recover must step over.
  absl::Status FailLocked(absl::Status status, bool may_lose = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SyncIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !sync_in_progress_; }
  void IntervalSyncLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void ObserveSync(absl::Duration latency);

  const std::string dir_;
  const WalOptions options_;
  WalRecovery recovery_;
  ScopedFd lock_fd_;
  std::thread interval_thread_;

  // Serialises RemoveSegmentsBefore calls, which unlink without mu_ held.
  absl::Mutex remove_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  ScopedFd fd_ ABSL_GUARDED_BY(mu_);  // the active segment, O_APPEND
  std::string active_path_ ABSL_GUARDED_BY(mu_);
  std::vector<Segment> segments_ ABSL_GUARDED_BY(mu_);  // by first_lsn; back() is active
  uint64_t next_lsn_ ABSL_GUARDED_BY(mu_) = kFirstLsn;
  uint64_t synced_lsn_ ABSL_GUARDED_BY(mu_) = 0;
  // True while a thread runs fdatasync on fd_ without mu_; fd_ must not be
  // closed or replaced meanwhile.
  bool sync_in_progress_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // sticky until Recover
  // error_ came from a failed sync: records below next_lsn_ may be gone.
  bool error_may_lose_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t bytes_appended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t records_appended_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t disk_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Scratch space for Append, reused to avoid allocating per call.
  std::string header_scratch_ ABSL_GUARDED_BY(mu_);
  std::vector<struct iovec> iov_scratch_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> fsyncs_{0};
};

// "wal-<first lsn, 20 digits>.log", and its inverse (nullopt for any other
// name).
std::string WalSegmentFileName(uint64_t first_lsn);
std::optional<uint64_t> ParseWalSegmentFileName(absl::string_view name);

// Called with each record's LSN and payload (valid only during the call).
// A non-OK return stops the read and is returned by ReadWal.
using WalRecordCallback = std::function<absl::Status(uint64_t lsn, absl::string_view payload)>;

struct WalReadResult {
  uint64_t records = 0;  // passed to the callback
  // The LSN a writer would assign next: one past the last complete record
  // in the log (kFirstLsn for an empty log). If it is below the caller's
  // from_lsn, the log is behind (e.g. lost its tail to power loss under
  // kNever while a snapshot was synced).
  uint64_t next_lsn = kFirstLsn;
  // The torn record ending the last segment, ignored: bytes and
  // "<file> at offset N: <why>" (0 / empty when none).
  uint64_t torn_tail_bytes = 0;
  std::string torn_tail;
};

// Reads the log in `dir` and calls `callback` for every record with
// LSN >= from_lsn, in LSN order. A missing or empty directory is an empty
// log. Reads only from the segment holding from_lsn on.
//
// A torn tail of the last segment ends the log silently (reported in the
// result): that was a write in progress at a crash, never acknowledged.
// DATA_LOSS, naming the file and byte offset, for any other damage: a bad
// record followed by more data, a torn record at the end of a non-last
// segment, an LSN that does not follow its predecessor, a gap between
// segments, or from_lsn older than the oldest record still kept (removed
// after a snapshot). Safe to run while a WalWriter appends (it sees a
// prefix of the log), but not during that writer's Open.
absl::StatusOr<WalReadResult> ReadWal(const std::string& dir, uint64_t from_lsn,
                                      const WalRecordCallback& callback);

}  // namespace sluice::replay_buffer::durability

#endif  // SLUICE_REPLAY_BUFFER_DURABILITY_WAL_H_
