#ifndef SLUICE_REPLAY_BUFFER_DURABILITY_SNAPSHOT_STORE_H_
#define SLUICE_REPLAY_BUFFER_DURABILITY_SNAPSHOT_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "replay_buffer/durability/file_io.h"

// Snapshots of the replay buffer's state, as a stream of opaque records.
//
//   <dir>/snapshot-00000000000000004711.snap   committed, covers LSNs <= 4711
//   <dir>/snapshot-00000000000000009000.snap   the newest
//   <dir>/snapshot-00000000000000012000.tmp    being written (or a crash's leftover)
//
// A snapshot file is records framed as in the WAL (record_format.h, with
// their own magic and sequence = record index 0, 1, 2, ...) followed by a
// 32-byte trailer:
//
//   offset  size  field
//        0     4  trailer magic
//        4     4  format version (1)
//        8     8  the snapshot's LSN (must match the file name)
//       16     8  record count
//       24     4  masked CRC32C over every record header, in order (each
//                 header holds its payload's CRC and index, so this covers
//                 the whole content, its order and its count)
//       28     4  masked CRC32C of bytes [0, 28) of the trailer
//
// Compared with Reverb's checkpoints (a directory per checkpoint and a DONE
// marker written last, with nothing tying DONE to the data): completeness
// is proven by the file itself, the name appears only by an atomic
// rename(2) after the data and trailer were fsynced, every record is
// checksummed, and loading falls back to the previous snapshot when the
// newest is damaged instead of failing or loading garbage.
//
// Guarantees. A snapshot whose Commit returned OK survives power loss (file
// fsynced, then renamed, then the directory fsynced). A crash before that
// leaves at most a .tmp file, which Open removes and LoadLatest never
// reads. Damage to a committed file (bit rot, a truncation) is detected
// and that snapshot skipped with a warning.
//
// One process per directory (not enforced). Thread-safe: the store has no
// mutable state; each SnapshotWriter is used by one thread at a time.

namespace sluice::replay_buffer::durability {

inline constexpr int kDefaultSnapshotsToKeep = 2;

// "snapshot-<lsn, 20 digits>.snap" / ".tmp", and the inverse of the first.
std::string SnapshotFileName(uint64_t lsn);
std::string SnapshotTempFileName(uint64_t lsn);
std::optional<uint64_t> ParseSnapshotFileName(absl::string_view name);

// A committed snapshot.
struct SnapshotInfo {
  uint64_t lsn = 0;
  std::string path;
  uint64_t records = 0;
  uint64_t size_bytes = 0;  // the whole file, trailer included
  absl::Duration duration;  // BeginSnapshot to the end of Commit
  // Older snapshots that could not be pruned (the commit itself succeeded).
  std::vector<std::string> warnings;
};

// Streams one snapshot's records into a .tmp file. Not thread-safe.
// Destroying it without Commit() aborts (removes the .tmp file).
class SnapshotWriter {
 public:
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // Appends one record (buffered; written in ~1 MiB pieces). INVALID_ARGUMENT
  // for a payload over kMaxRecordPayloadBytes; an I/O error fails the
  // snapshot (every later call returns FAILED_PRECONDITION).
  absl::Status Append(absl::string_view payload);

  // Writes the trailer, fsyncs the file, renames it to .snap, fsyncs the
  // directory, then removes all but the `keep_last` committed snapshots
  // with the highest LSNs. Blocks for the syncs. An error before the rename
  // commits nothing and removes the .tmp file; if only the directory fsync
  // fails, the .snap exists (and may be loaded) but may not survive power
  // loss. Either way the caller must not drop WAL records on an error.
  absl::StatusOr<SnapshotInfo> Commit();

  // Removes the .tmp file. No-op after Commit, a failure or a previous Abort.
  void Abort();

  uint64_t lsn() const { return lsn_; }
  uint64_t records() const { return records_; }
  uint64_t bytes_written() const { return bytes_; }  // so far, buffered bytes included

 private:
  friend class SnapshotStore;
  enum class State { kOpen, kFailed, kCommitted, kAborted };

  SnapshotWriter(std::string dir, int keep_last, uint64_t lsn, ScopedFd fd);
  absl::Status Flush();
  absl::Status Fail(absl::Status status);
  absl::Status CheckOpen() const;

  const std::string dir_;
  const int keep_last_;
  const uint64_t lsn_;
  const std::string temp_path_;
  const absl::Time start_;
  ScopedFd fd_;
  State state_ = State::kOpen;
  std::string buffer_;
  uint64_t records_ = 0;
  uint64_t bytes_ = 0;
  uint32_t header_chain_crc_ = 0;
  absl::Status error_;
};

// Called with each record of the snapshot being loaded, in order. The
// payload is valid only during the call; a non-OK return stops the load.
using SnapshotRecordCallback = std::function<absl::Status(absl::string_view payload)>;

struct SnapshotLoadResult {
  // The loaded snapshot's LSN; nullopt when there is no usable snapshot
  // (the callback was not called).
  std::optional<uint64_t> lsn;
  std::string path;
  uint64_t records = 0;
  uint64_t size_bytes = 0;
  absl::Duration duration;  // verification and delivery together
  // One line per newer snapshot that was skipped, naming the file, the
  // byte offset and the problem: the caller should log them.
  std::vector<std::string> warnings;
};

class SnapshotStore {
 public:
  // Creates `dir` if missing and removes stray .tmp files (snapshots a
  // crash interrupted; see removed_temp_files()). keep_last >= 1.
  static absl::StatusOr<std::unique_ptr<SnapshotStore>> Open(
      std::string dir, int keep_last = kDefaultSnapshotsToKeep);

  // Starts a snapshot of the state as of `lsn` (every WAL record <= lsn
  // applied, none after). ALREADY_EXISTS if one at this LSN is being
  // written; committing over an existing .snap at this LSN replaces it.
  absl::StatusOr<std::unique_ptr<SnapshotWriter>> BeginSnapshot(uint64_t lsn) const;

  // Loads the newest valid snapshot: its whole file is verified first
  // (trailer present, names its LSN, every record CRC and the trailer
  // checksum right), and only then are its records passed to `callback`,
  // so the callback never sees a snapshot that is then rejected. A damaged
  // newer snapshot is skipped with a warning. Costs two sequential reads of
  // the chosen file (the second usually from the page cache).
  // Errors: the callback's error; DATA_LOSS if the file changes between
  // verification and delivery (records were already delivered); failure to
  // list the directory.
  absl::StatusOr<SnapshotLoadResult> LoadLatest(const SnapshotRecordCallback& callback) const;

  // LSNs of the committed .snap files, ascending (not verified). The oldest
  // tells how much WAL to keep (see wal.h).
  absl::StatusOr<std::vector<uint64_t>> ListSnapshots() const;

  const std::string& dir() const { return dir_; }
  int keep_last() const { return keep_last_; }
  // Paths of the .tmp files Open removed.
  const std::vector<std::string>& removed_temp_files() const { return removed_temp_files_; }

 private:
  SnapshotStore(std::string dir, int keep_last) : dir_(std::move(dir)), keep_last_(keep_last) {}

  const std::string dir_;
  const int keep_last_;
  std::vector<std::string> removed_temp_files_;
};

}  // namespace sluice::replay_buffer::durability

#endif  // SLUICE_REPLAY_BUFFER_DURABILITY_SNAPSHOT_STORE_H_
