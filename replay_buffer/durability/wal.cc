#include "replay_buffer/durability/wal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "replay_buffer/durability/record_format.h"

namespace sluice::replay_buffer::durability {
namespace {

constexpr absl::string_view kSegmentPrefix = "wal-";
constexpr absl::string_view kSegmentSuffix = ".log";
constexpr size_t kLsnDigits = 20;
constexpr absl::string_view kLockFileName = "LOCK";

struct SegmentFile {
  uint64_t first_lsn;
  std::string path;
};

// Segment files of `dir` sorted by first LSN; other names are ignored.
// A missing directory has none.
absl::StatusOr<std::vector<SegmentFile>> ListSegments(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir);
  if (absl::IsNotFound(names.status())) return std::vector<SegmentFile>();
  if (!names.ok()) return names.status();
  std::vector<SegmentFile> segments;
  for (const std::string& name : *names) {
    if (std::optional<uint64_t> lsn = ParseWalSegmentFileName(name)) {
      segments.push_back({*lsn, JoinPath(dir, name)});
    }
  }
  std::sort(segments.begin(), segments.end(),
            [](const SegmentFile& a, const SegmentFile& b) { return a.first_lsn < b.first_lsn; });
  return segments;
}

// What reading one segment found.
struct SegmentScan {
  uint64_t next_lsn = 0;     // one past the last complete record
  uint64_t valid_bytes = 0;  // end of the last complete record
  uint64_t file_bytes = 0;
  uint64_t records_delivered = 0;
  // A torn tail (only possible when scanning the last segment).
  std::string torn_problem;
};

// Reads the segment at `path`, whose records must be first_lsn, first_lsn+1,
// ...; passes those >= from_lsn to `callback` (may be null). A torn tail is
// accepted (and reported) only when `is_last`.
absl::StatusOr<SegmentScan> ScanSegment(const SegmentFile& segment, bool is_last, uint64_t from_lsn,
                                        const WalRecordCallback* callback) {
  ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(segment.path, O_RDONLY));
  SegmentScan scan;
  ASSIGN_OR_RETURN(scan.file_bytes, FileSize(fd.get(), segment.path));
  scan.next_lsn = segment.first_lsn;
  RecordReader reader(fd.get(), segment.path, kWalRecordMagic, scan.file_bytes);
  while (true) {
    ASSIGN_OR_RETURN(RecordReadResult record, reader.Next());
    switch (record.kind) {
      case RecordReadResult::Kind::kRecord:
        if (record.sequence != scan.next_lsn) {
          return absl::DataLossError(absl::StrCat("WAL LSN gap in ", segment.path, " at offset ",
                                                  record.offset, ": expected LSN ", scan.next_lsn,
                                                  ", found ", record.sequence));
        }
        if (callback != nullptr && record.sequence >= from_lsn) {
          RETURN_IF_ERROR((*callback)(record.sequence, record.payload));
          ++scan.records_delivered;
        }
        ++scan.next_lsn;
        break;
      case RecordReadResult::Kind::kEnd:
        scan.valid_bytes = reader.offset();
        return scan;
      case RecordReadResult::Kind::kTornTail:
        if (!is_last) {
          return absl::DataLossError(absl::StrCat("WAL segment ", segment.path,
                                                  " (not the last) is cut short at offset ",
                                                  record.offset, ": ", record.problem));
        }
        scan.valid_bytes = reader.offset();
        scan.torn_problem = std::move(record.problem);
        return scan;
      case RecordReadResult::Kind::kCorrupt:
        return absl::DataLossError(absl::StrCat("corrupt WAL record in ", segment.path,
                                                " at offset ", record.offset, ": ",
                                                record.problem));
    }
  }
}

}  // namespace

std::string WalSegmentFileName(uint64_t first_lsn) {
  return absl::StrFormat("%s%020u%s", kSegmentPrefix, first_lsn, kSegmentSuffix);
}

std::optional<uint64_t> ParseWalSegmentFileName(absl::string_view name) {
  if (name.size() != kSegmentPrefix.size() + kLsnDigits + kSegmentSuffix.size() ||
      !absl::StartsWith(name, kSegmentPrefix) || !absl::EndsWith(name, kSegmentSuffix)) {
    return std::nullopt;
  }
  const absl::string_view digits = name.substr(kSegmentPrefix.size(), kLsnDigits);
  if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) return std::nullopt;
  uint64_t lsn;
  if (!absl::SimpleAtoi(digits, &lsn)) return std::nullopt;
  return lsn;
}

absl::Status WalOptions::Validate() const {
  if (fsync_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("fsync_interval must be > 0, got ", absl::FormatDuration(fsync_interval)));
  }
  if (segment_size_bytes == 0) {
    return absl::InvalidArgumentError("segment_size_bytes must be > 0, got 0");
  }
  if (lock_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lock_wait must be >= 0, got ", absl::FormatDuration(lock_wait)));
  }
  return absl::OkStatus();
}

WalWriter::WalWriter(std::string dir, WalOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<WalWriter>> WalWriter::Open(std::string dir, WalOptions options) {
  RETURN_IF_ERROR(options.Validate());
  if (dir.empty()) return absl::InvalidArgumentError("WAL directory must not be empty");
  std::unique_ptr<WalWriter> writer(new WalWriter(std::move(dir), std::move(options)));
  RETURN_IF_ERROR(writer->Initialize());
  return writer;
}

absl::Status WalWriter::Initialize() {
  RETURN_IF_ERROR(CreateDirectories(dir_));
  if (options_.fsync_policy != FsyncPolicy::kNever) {
    // The directory itself may be new: make its entry in the parent durable
    // before any record in it is acknowledged as durable.
    RETURN_IF_ERROR(SyncDirectory(ParentDirectory(dir_)));
  }
  RETURN_IF_ERROR(LockDirectory());

  ASSIGN_OR_RETURN(std::vector<SegmentFile> files, ListSegments(dir_));
  absl::MutexLock lock(&mu_);
  if (files.empty()) {
    next_lsn_ = kFirstLsn;
    RETURN_IF_ERROR(OpenNewSegmentLocked());
  } else {
    for (size_t i = 0; i + 1 < files.size(); ++i) {
      ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(files[i].path, O_RDONLY));
      ASSIGN_OR_RETURN(const uint64_t bytes, FileSize(fd.get(), files[i].path));
      if (options_.fsync_policy != FsyncPolicy::kNever) {
        RETURN_IF_ERROR(SyncFileData(fd.get(), files[i].path));
      }
      segments_.push_back({files[i].first_lsn, bytes});
      disk_bytes_ += bytes;
    }
    const SegmentFile& last = files.back();
    ASSIGN_OR_RETURN(const SegmentScan scan,
                     ScanSegment(last, /*is_last=*/true, /*from_lsn=*/0, /*callback=*/nullptr));
    ASSIGN_OR_RETURN(fd_, OpenFile(last.path, O_WRONLY | O_APPEND));
    if (scan.valid_bytes < scan.file_bytes) {
      // Cut the torn record so that new records follow the last good one.
      if (::ftruncate(fd_.get(), static_cast<off_t>(scan.valid_bytes)) != 0) {
        return PosixError(errno, absl::StrCat("ftruncate to ", scan.valid_bytes, " bytes"),
                          last.path);
      }
      recovery_.truncated_bytes = scan.file_bytes - scan.valid_bytes;
      recovery_.truncated_segment = last.path;
      recovery_.truncated_at_offset = scan.valid_bytes;
      recovery_.truncation_reason = scan.torn_problem;
    }
    if (options_.fsync_policy != FsyncPolicy::kNever || recovery_.truncated_bytes > 0) {
      RETURN_IF_ERROR(SyncFileData(fd_.get(), last.path));
    }
    active_path_ = last.path;
    segments_.push_back({last.first_lsn, scan.valid_bytes});
    disk_bytes_ += scan.valid_bytes;
    next_lsn_ = scan.next_lsn;
  }
  // A previous writer (perhaps under kNever, perhaps killed before its
  // sync) may have left data only in the page cache. Unless kNever, every
  // segment was synced above (cheap when already clean), so that a power
  // loss cannot punch a hole below records this writer acknowledges as
  // durable, and synced_lsn_ means what it says.
  synced_lsn_ = options_.fsync_policy == FsyncPolicy::kNever ? 0 : next_lsn_ - 1;
  recovery_.next_lsn = next_lsn_;

  if (options_.fsync_policy == FsyncPolicy::kInterval) {
    interval_thread_ = std::thread([this] { IntervalSyncLoop(); });
  }
  return absl::OkStatus();
}

absl::Status WalWriter::LockDirectory() {
  const std::string lock_path = JoinPath(dir_, kLockFileName);
  ASSIGN_OR_RETURN(lock_fd_, OpenFile(lock_path, O_RDWR | O_CREAT));
  // What the holder wrote into LOCK: "pid 1234" (empty when unknown).
  const auto holder = [&]() -> std::string {
    char buffer[64];
    const ssize_t n = ::pread(lock_fd_.get(), buffer, sizeof(buffer) - 1, 0);
    if (n <= 0) return "";
    return std::string(absl::StripAsciiWhitespace(absl::string_view(buffer, n)));
  };
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + options_.lock_wait;
  bool waiting = false;
  // flock(2) has no timed form, so the wait polls; the interval is short
  // next to a process's teardown and the wait is bounded.
  constexpr absl::Duration kPollInterval = absl::Milliseconds(20);
  while (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return PosixError(errno, "flock", lock_path);
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      const std::string who = holder();
      return absl::FailedPreconditionError(absl::StrCat(
          "another WalWriter has the log open (", lock_path, " is locked",
          who.empty() ? "" : absl::StrCat(" by ", who),
          waiting ? absl::StrCat(", still after waiting ", absl::FormatDuration(now - start))
                  : "",
          ")"));
    }
    if (!waiting) {
      waiting = true;
      if (options_.lock_wait_observer) options_.lock_wait_observer(holder());
    }
    absl::SleepFor(std::min(kPollInterval, deadline - now));
  }
  // Ours now: say who holds it, for the message of the next one to wait.
  const std::string mine = absl::StrCat("pid ", ::getpid(), "\n");
  if (::ftruncate(lock_fd_.get(), 0) != 0 ||
      ::pwrite(lock_fd_.get(), mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
    return PosixError(errno, "writing the holder's pid into", lock_path);
  }
  return absl::OkStatus();
}

WalWriter::~WalWriter() { Close().IgnoreError(); }

absl::Status WalWriter::OpenNewSegmentLocked() {
  const std::string path = JoinPath(dir_, WalSegmentFileName(next_lsn_));
  absl::StatusOr<ScopedFd> fd = OpenFile(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND);
  if (!fd.ok()) return fd.status();
  if (options_.fsync_policy != FsyncPolicy::kNever) {
    // The new file's name must be durable before records in it are
    // acknowledged as durable. If it cannot be, the file goes (a retry,
    // Recover, creates it again).
    if (absl::Status synced = SyncDirectory(dir_); !synced.ok()) {
      RemoveFileIfExists(path).IgnoreError();
      return synced;
    }
  }
  fd_ = *std::move(fd);
  active_path_ = path;
  segments_.push_back({next_lsn_, 0});
  return absl::OkStatus();
}

absl::Status WalWriter::CheckWritableLocked() const {
  if (closed_) return absl::FailedPreconditionError(absl::StrCat("WAL ", dir_, " is closed"));
  if (!error_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "WAL ", dir_, " refuses appends after an earlier write error, until it is recovered: ",
        error_.ToString()));
  }
  return absl::OkStatus();
}

absl::Status WalWriter::FailLocked(absl::Status status, bool may_lose) {
  if (error_.ok()) error_ = status;
  error_may_lose_ = error_may_lose_ || may_lose;
  return status;
}

absl::Status WalWriter::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Status WalWriter::Recover() {
  absl::MutexLock lock(&mu_);
  if (error_.ok() || closed_) return absl::OkStatus();
  mu_.Await(absl::Condition(this, &WalWriter::SyncIdle));
  Segment& active = segments_.back();
  // What the file holds of complete records: a failed write leaves a torn
  // one after them, a failed sync may have lost some.
  absl::StatusOr<SegmentScan> scan =
      ScanSegment({active.first_lsn, active_path_}, /*is_last=*/true, /*from_lsn=*/0,
                  /*callback=*/nullptr);
  // (A failed rotation left no active file open. A failed sync can have
  // lost only records of the active segment: a rotation syncs the old one
  // first.)
  const bool in_place = fd_.valid() && scan.ok() && scan->next_lsn == next_lsn_ &&
                        (!error_may_lose_ || active.first_lsn == next_lsn_);
  if (in_place) {
    if (::ftruncate(fd_.get(), static_cast<off_t>(scan->valid_bytes)) != 0) {
      return PosixError(errno, absl::StrCat("ftruncate to ", scan->valid_bytes, " bytes"),
                        active_path_);
    }
    if (options_.fsync_policy != FsyncPolicy::kNever) {
      const absl::Time start = absl::Now();
      const absl::Status synced = SyncFileData(fd_.get(), active_path_);
      ObserveSync(absl::Now() - start);
      RETURN_IF_ERROR(synced);
    }
    disk_bytes_ = disk_bytes_ - active.bytes + scan->valid_bytes;
    active.bytes = scan->valid_bytes;
  } else {
    // Step over whatever the old segment holds: records from next_lsn_ on
    // go to a new one (the caller's snapshot covers those before).
    if (fd_.valid() && scan.ok() && scan->valid_bytes < scan->file_bytes &&
        ::ftruncate(fd_.get(), static_cast<off_t>(scan->valid_bytes)) == 0) {
      disk_bytes_ = disk_bytes_ - active.bytes + scan->valid_bytes;
      active.bytes = scan->valid_bytes;
    }
    ScopedFd old_fd = std::move(fd_);
    if (absl::Status opened = OpenNewSegmentLocked(); !opened.ok()) {
      fd_ = std::move(old_fd);
      return opened;
    }
  }
  // In place, the sync above covers every record; in a new segment, the
  // caller's snapshot does.
  if (options_.fsync_policy != FsyncPolicy::kNever) synced_lsn_ = next_lsn_ - 1;
  error_ = absl::OkStatus();
  error_may_lose_ = false;
  return absl::OkStatus();
}

bool WalWriter::NeedsRotationLocked(uint64_t batch_bytes) const {
  const uint64_t active_bytes = segments_.back().bytes;
  return active_bytes > 0 && active_bytes + batch_bytes > options_.segment_size_bytes;
}

absl::Status WalWriter::SyncActiveSegmentLocked() {
  if (options_.fsync_policy != FsyncPolicy::kNever && synced_lsn_ + 1 < next_lsn_) {
    const absl::Time start = absl::Now();
    const absl::Status synced = SyncFileData(fd_.get(), active_path_);
    ObserveSync(absl::Now() - start);
    if (!synced.ok()) return FailLocked(synced, /*may_lose=*/true);
    synced_lsn_ = next_lsn_ - 1;
  }
  return absl::OkStatus();
}

absl::Status WalWriter::RotateLocked() {
  RETURN_IF_ERROR(SyncActiveSegmentLocked());
  fd_.reset();
  const absl::Status opened = OpenNewSegmentLocked();
  if (!opened.ok()) return FailLocked(opened);
  return absl::OkStatus();
}

void WalWriter::ObserveSync(absl::Duration latency) {
  fsyncs_.fetch_add(1, std::memory_order_relaxed);
  if (options_.fsync_observer) options_.fsync_observer(latency);
}

absl::StatusOr<uint64_t> WalWriter::Append(absl::string_view payload) {
  return AppendImpl(absl::MakeConstSpan(&payload, 1), /*wait_for_sync=*/true);
}

absl::StatusOr<uint64_t> WalWriter::Append(absl::Span<const absl::string_view> payloads) {
  return AppendImpl(payloads, /*wait_for_sync=*/true);
}

absl::StatusOr<uint64_t> WalWriter::Append(absl::Span<const std::string> payloads) {
  absl::InlinedVector<absl::string_view, 16> views(payloads.begin(), payloads.end());
  return AppendImpl(absl::MakeConstSpan(views), /*wait_for_sync=*/true);
}

absl::StatusOr<uint64_t> WalWriter::AppendWithoutSync(absl::string_view payload) {
  return AppendImpl(absl::MakeConstSpan(&payload, 1), /*wait_for_sync=*/false);
}

absl::StatusOr<uint64_t> WalWriter::AppendWithoutSync(
    absl::Span<const absl::string_view> payloads) {
  return AppendImpl(payloads, /*wait_for_sync=*/false);
}

absl::Status WalWriter::SyncUpTo(uint64_t lsn) {
  absl::MutexLock lock(&mu_);
  if (lsn >= next_lsn_) {
    return absl::InvalidArgumentError(absl::StrCat("SyncUpTo(", lsn, "): WAL ", dir_,
                                                   " has appended only up to LSN ", next_lsn_ - 1));
  }
  // Under kInterval and kNever the promise (in the kernel) already holds.
  if (options_.fsync_policy != FsyncPolicy::kAlways) return absl::OkStatus();
  return SyncUpToLocked(lsn);
}

absl::Status WalWriter::AdvanceNextLsn(uint64_t lsn) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckWritableLocked());
  if (lsn <= next_lsn_) return absl::OkStatus();
  mu_.Await(absl::Condition(this, &WalWriter::SyncIdle));
  RETURN_IF_ERROR(CheckWritableLocked());
  if (lsn <= next_lsn_) return absl::OkStatus();
  // Records after the jump go to a segment named after it; the gap before
  // it is visible to ReadWal (DATA_LOSS for reads that span it).
  RETURN_IF_ERROR(SyncActiveSegmentLocked());
  next_lsn_ = lsn;
  if (options_.fsync_policy != FsyncPolicy::kNever) synced_lsn_ = next_lsn_ - 1;
  fd_.reset();
  const absl::Status opened = OpenNewSegmentLocked();
  if (!opened.ok()) return FailLocked(opened);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> WalWriter::AppendImpl(absl::Span<const absl::string_view> payloads,
                                               bool wait_for_sync) {
  if (payloads.empty()) return absl::InvalidArgumentError("WAL Append of an empty batch");
  // Checksum outside the lock: for large payloads it is most of the CPU.
  absl::InlinedVector<uint32_t, 16> crcs(payloads.size());
  uint64_t batch_bytes = 0;
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (payloads[i].size() > kMaxRecordPayloadBytes) {
      return absl::InvalidArgumentError(absl::StrCat("WAL record of ", payloads[i].size(),
                                                     " bytes exceeds the maximum of ",
                                                     kMaxRecordPayloadBytes));
    }
    crcs[i] = Crc32c(payloads[i]);
    batch_bytes += kRecordHeaderBytes + payloads[i].size();
  }

  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckWritableLocked());
  if (NeedsRotationLocked(batch_bytes)) {
    // A sync leader may be using fd_ without the lock.
    mu_.Await(absl::Condition(this, &WalWriter::SyncIdle));
    RETURN_IF_ERROR(CheckWritableLocked());
    if (NeedsRotationLocked(batch_bytes)) RETURN_IF_ERROR(RotateLocked());
  }

  const uint64_t first_lsn = next_lsn_;
  header_scratch_.resize(payloads.size() * kRecordHeaderBytes);
  iov_scratch_.clear();
  for (size_t i = 0; i < payloads.size(); ++i) {
    char* header = &header_scratch_[i * kRecordHeaderBytes];
    EncodeRecordHeader(kWalRecordMagic, first_lsn + i, static_cast<uint32_t>(payloads[i].size()),
                       crcs[i], header);
    iov_scratch_.push_back({header, kRecordHeaderBytes});
    iov_scratch_.push_back({const_cast<char*>(payloads[i].data()), payloads[i].size()});
  }
  Segment& active = segments_.back();
  const absl::Status written = WriteVFully(fd_.get(), iov_scratch_, active_path_);
  if (!written.ok()) {
    // Part of the batch may be in the file: nothing more may follow it.
    return FailLocked(
        absl::Status(written.code(), absl::StrCat("WAL append of LSN ", first_lsn, " at offset ",
                                                  active.bytes, ": ", written.message())));
  }
  next_lsn_ += payloads.size();
  active.bytes += batch_bytes;
  disk_bytes_ += batch_bytes;
  bytes_appended_ += batch_bytes;
  records_appended_ += payloads.size();

  if (wait_for_sync && options_.fsync_policy == FsyncPolicy::kAlways) {
    RETURN_IF_ERROR(SyncUpToLocked(next_lsn_ - 1));
  }
  return first_lsn;
}

absl::Status WalWriter::SyncUpToLocked(uint64_t lsn) {
  while (synced_lsn_ < lsn) {
    if (!error_.ok() || closed_) return CheckWritableLocked();
    if (sync_in_progress_) {
      // Its sync may not cover `lsn` (written after it started); wait and
      // look again, leading the next sync if nobody else does.
      mu_.Await(absl::Condition(this, &WalWriter::SyncIdle));
      continue;
    }
    // Lead: one fdatasync covers every record written so far, by any thread.
    sync_in_progress_ = true;
    const uint64_t covered = next_lsn_ - 1;
    const int fd = fd_.get();
    const std::string path = active_path_;
    mu_.Unlock();
    const absl::Time start = absl::Now();
    const absl::Status synced = SyncFileData(fd, path);
    ObserveSync(absl::Now() - start);
    mu_.Lock();
    sync_in_progress_ = false;
    // After a failed fsync the kernel may have dropped the dirty pages
    // (and cleared the error), so a retry could falsely succeed: sticky.
    if (!synced.ok()) return FailLocked(synced, /*may_lose=*/true);
    synced_lsn_ = std::max(synced_lsn_, covered);
  }
  return absl::OkStatus();
}

void WalWriter::IntervalSyncLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.fsync_interval);
    if (stopping_) return;
    if (error_.ok() && synced_lsn_ + 1 < next_lsn_) {
      // An error is sticky and reported to the next Append.
      SyncUpToLocked(next_lsn_ - 1).IgnoreError();
    }
  }
}

absl::Status WalWriter::RemoveSegmentsBefore(uint64_t lsn) {
  absl::MutexLock remove_lock(&remove_mu_);
  std::vector<std::string> doomed;
  {
    absl::MutexLock lock(&mu_);
    // Segment i holds LSNs [first_lsn(i), first_lsn(i + 1)); never the last.
    for (size_t i = 0; i + 1 < segments_.size() && segments_[i + 1].first_lsn <= lsn; ++i) {
      doomed.push_back(JoinPath(dir_, WalSegmentFileName(segments_[i].first_lsn)));
    }
  }
  if (doomed.empty()) return absl::OkStatus();
  // Oldest first, so that an interrupted removal leaves a contiguous log.
  size_t removed = 0;
  absl::Status status;
  for (const std::string& path : doomed) {
    status = RemoveFileIfExists(path);
    if (!status.ok()) break;
    ++removed;
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < removed; ++i) disk_bytes_ -= segments_[i].bytes;
    segments_.erase(segments_.begin(), segments_.begin() + removed);
  }
  RETURN_IF_ERROR(status);
  if (options_.fsync_policy != FsyncPolicy::kNever) RETURN_IF_ERROR(SyncDirectory(dir_));
  return absl::OkStatus();
}

absl::Status WalWriter::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return absl::OkStatus();
    stopping_ = true;
  }
  if (interval_thread_.joinable()) interval_thread_.join();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &WalWriter::SyncIdle));
  closed_ = true;
  absl::Status status;
  if (options_.fsync_policy != FsyncPolicy::kNever && error_.ok() && fd_.valid() &&
      synced_lsn_ + 1 < next_lsn_) {
    const absl::Time start = absl::Now();
    status = SyncFileData(fd_.get(), active_path_);
    ObserveSync(absl::Now() - start);
    if (status.ok()) synced_lsn_ = next_lsn_ - 1;
  }
  fd_.reset();
  lock_fd_.reset();
  return status;
}

WalStats WalWriter::stats() const {
  absl::MutexLock lock(&mu_);
  WalStats stats;
  stats.bytes_appended = bytes_appended_;
  stats.records_appended = records_appended_;
  stats.fsyncs = fsyncs_.load(std::memory_order_relaxed);
  stats.segment_count = segments_.size();
  stats.disk_bytes = disk_bytes_;
  stats.next_lsn = next_lsn_;
  stats.synced_lsn = synced_lsn_;
  return stats;
}

uint64_t WalWriter::next_lsn() const {
  absl::MutexLock lock(&mu_);
  return next_lsn_;
}

absl::StatusOr<WalReadResult> ReadWal(const std::string& dir, uint64_t from_lsn,
                                      const WalRecordCallback& callback) {
  ASSIGN_OR_RETURN(const std::vector<SegmentFile> segments, ListSegments(dir));
  WalReadResult result;
  if (segments.empty()) return result;
  const uint64_t from = std::max(from_lsn, kFirstLsn);
  if (from < segments.front().first_lsn) {
    return absl::DataLossError(absl::StrCat(
        "WAL records from LSN ", from, " were requested but ", dir, " starts at LSN ",
        segments.front().first_lsn, " (", segments.front().path, "); older segments were removed"));
  }
  // The last segment starting at or before `from`: older ones hold only
  // records the caller does not want.
  size_t start = 0;
  while (start + 1 < segments.size() && segments[start + 1].first_lsn <= from) ++start;

  uint64_t expected = segments[start].first_lsn;
  for (size_t i = start; i < segments.size(); ++i) {
    if (segments[i].first_lsn != expected) {
      return absl::DataLossError(absl::StrCat(
          "WAL gap: ", segments[i - 1].path, " ends before LSN ", expected,
          " but the next segment ", segments[i].path, " starts at LSN ", segments[i].first_lsn));
    }
    const bool is_last = i + 1 == segments.size();
    ASSIGN_OR_RETURN(const SegmentScan scan, ScanSegment(segments[i], is_last, from, &callback));
    result.records += scan.records_delivered;
    expected = scan.next_lsn;
    if (!scan.torn_problem.empty()) {
      result.torn_tail_bytes = scan.file_bytes - scan.valid_bytes;
      result.torn_tail =
          absl::StrCat(segments[i].path, " at offset ", scan.valid_bytes, ": ", scan.torn_problem);
    }
  }
  result.next_lsn = expected;
  return result;
}

}  // namespace sluice::replay_buffer::durability
