#include "replay_buffer/durability/snapshot_store.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "replay_buffer/durability/record_format.h"

namespace sluice::replay_buffer::durability {
namespace {

constexpr absl::string_view kPrefix = "snapshot-";
constexpr absl::string_view kCommittedSuffix = ".snap";
constexpr absl::string_view kTempSuffix = ".tmp";
constexpr size_t kLsnDigits = 20;

constexpr uint32_t kTrailerMagic = 0x7A11E4D5;
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kTrailerBytes = 32;
constexpr size_t kTrailerCrcOffset = 28;
// Appends are buffered up to this size; larger payloads go straight out.
constexpr size_t kWriteBufferBytes = 1 << 20;

std::optional<uint64_t> ParseName(absl::string_view name, absl::string_view suffix) {
  if (name.size() != kPrefix.size() + kLsnDigits + suffix.size() ||
      !absl::StartsWith(name, kPrefix) || !absl::EndsWith(name, suffix)) {
    return std::nullopt;
  }
  const absl::string_view digits = name.substr(kPrefix.size(), kLsnDigits);
  if (!std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) return std::nullopt;
  uint64_t lsn;
  if (!absl::SimpleAtoi(digits, &lsn)) return std::nullopt;
  return lsn;
}

// LSNs of the committed snapshots in `dir`, ascending. A missing directory
// has none.
absl::StatusOr<std::vector<uint64_t>> ListCommitted(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(dir);
  if (absl::IsNotFound(names.status())) return std::vector<uint64_t>();
  if (!names.ok()) return names.status();
  std::vector<uint64_t> lsns;
  for (const std::string& name : *names) {
    if (std::optional<uint64_t> lsn = ParseName(name, kCommittedSuffix)) lsns.push_back(*lsn);
  }
  std::sort(lsns.begin(), lsns.end());
  return lsns;
}

struct SnapshotFileStats {
  uint64_t records = 0;
  uint64_t size_bytes = 0;
};

// Reads and verifies the snapshot file at `path`, passing each record to
// `callback` (may be null: verify only). Every problem is DATA_LOSS naming
// the file and offset, except the callback's own errors, which are
// returned as they are.
absl::StatusOr<SnapshotFileStats> ReadSnapshotFile(const std::string& path, uint64_t lsn,
                                                   const SnapshotRecordCallback* callback) {
  ASSIGN_OR_RETURN(ScopedFd fd, OpenFile(path, O_RDONLY));
  SnapshotFileStats stats;
  ASSIGN_OR_RETURN(stats.size_bytes, FileSize(fd.get(), path));
  if (stats.size_bytes < kTrailerBytes) {
    return absl::DataLossError(absl::StrCat("snapshot ", path, " is incomplete: ", stats.size_bytes,
                                            " bytes, too short for its ", kTrailerBytes,
                                            "-byte trailer"));
  }
  const uint64_t trailer_offset = stats.size_bytes - kTrailerBytes;
  char trailer[kTrailerBytes];
  RETURN_IF_ERROR(PreadFully(fd.get(), trailer, kTrailerBytes, trailer_offset, path));
  if (DecodeFixed32(trailer) != kTrailerMagic) {
    return absl::DataLossError(absl::StrCat("snapshot ", path, " has no trailer at offset ",
                                            trailer_offset, " (incomplete or corrupt)"));
  }
  if (MaskCrc(Crc32c(absl::string_view(trailer, kTrailerCrcOffset))) !=
      DecodeFixed32(trailer + kTrailerCrcOffset)) {
    return absl::DataLossError(
        absl::StrCat("snapshot ", path, ": trailer CRC mismatch at offset ", trailer_offset));
  }
  const uint32_t version = DecodeFixed32(trailer + 4);
  const uint64_t trailer_lsn = DecodeFixed64(trailer + 8);
  const uint64_t trailer_records = DecodeFixed64(trailer + 16);
  const uint32_t trailer_chain_crc = DecodeFixed32(trailer + 24);
  if (version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("snapshot ", path, ": unsupported format version ",
                                            version, " in the trailer at offset ", trailer_offset));
  }
  if (trailer_lsn != lsn) {
    return absl::DataLossError(absl::StrCat("snapshot ", path, ": the trailer at offset ",
                                            trailer_offset, " is for LSN ", trailer_lsn,
                                            ", not the LSN ", lsn, " in the file name"));
  }

  RecordReader reader(fd.get(), path, kSnapshotRecordMagic, trailer_offset);
  uint32_t chain_crc = 0;
  while (true) {
    ASSIGN_OR_RETURN(RecordReadResult record, reader.Next());
    if (record.kind == RecordReadResult::Kind::kEnd) break;
    if (record.kind != RecordReadResult::Kind::kRecord) {
      return absl::DataLossError(absl::StrCat("corrupt snapshot record in ", path, " at offset ",
                                              record.offset, ": ", record.problem));
    }
    if (record.sequence != stats.records) {
      return absl::DataLossError(absl::StrCat("snapshot ", path, ": record at offset ",
                                              record.offset, " has index ", record.sequence,
                                              ", expected ", stats.records));
    }
    chain_crc = Crc32c(record.header, chain_crc);
    if (callback != nullptr) RETURN_IF_ERROR((*callback)(record.payload));
    ++stats.records;
  }
  if (stats.records != trailer_records) {
    return absl::DataLossError(absl::StrCat("snapshot ", path, " holds ", stats.records,
                                            " records but its trailer at offset ", trailer_offset,
                                            " says ", trailer_records));
  }
  if (MaskCrc(chain_crc) != trailer_chain_crc) {
    return absl::DataLossError(
        absl::StrCat("snapshot ", path, ": content checksum mismatch with the trailer at offset ",
                     trailer_offset));
  }
  return stats;
}

}  // namespace

std::string SnapshotFileName(uint64_t lsn) {
  return absl::StrFormat("%s%020u%s", kPrefix, lsn, kCommittedSuffix);
}

std::string SnapshotTempFileName(uint64_t lsn) {
  return absl::StrFormat("%s%020u%s", kPrefix, lsn, kTempSuffix);
}

std::optional<uint64_t> ParseSnapshotFileName(absl::string_view name) {
  return ParseName(name, kCommittedSuffix);
}

// ---------------------------------------------------------------------------
// SnapshotWriter

SnapshotWriter::SnapshotWriter(std::string dir, int keep_last, uint64_t lsn, ScopedFd fd)
    : dir_(std::move(dir)),
      keep_last_(keep_last),
      lsn_(lsn),
      temp_path_(JoinPath(dir_, SnapshotTempFileName(lsn))),
      start_(absl::Now()),
      fd_(std::move(fd)) {}

SnapshotWriter::~SnapshotWriter() { Abort(); }

absl::Status SnapshotWriter::CheckOpen() const {
  switch (state_) {
    case State::kOpen:
      return absl::OkStatus();
    case State::kFailed:
      return absl::FailedPreconditionError(
          absl::StrCat("snapshot ", temp_path_, " failed earlier: ", error_.ToString()));
    case State::kCommitted:
      return absl::FailedPreconditionError(
          absl::StrCat("snapshot at LSN ", lsn_, " is already committed"));
    case State::kAborted:
      return absl::FailedPreconditionError(absl::StrCat("snapshot at LSN ", lsn_, " was aborted"));
  }
  return absl::InternalError("unreachable");
}

absl::Status SnapshotWriter::Fail(absl::Status status) {
  state_ = State::kFailed;
  error_ = status;
  fd_.reset();
  RemoveFileIfExists(temp_path_).IgnoreError();
  return status;
}

absl::Status SnapshotWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  const absl::Status written = WriteFully(fd_.get(), buffer_, temp_path_);
  buffer_.clear();
  return written;
}

absl::Status SnapshotWriter::Append(absl::string_view payload) {
  RETURN_IF_ERROR(CheckOpen());
  if (payload.size() > kMaxRecordPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("snapshot record of ", payload.size(),
                                                   " bytes exceeds the maximum of ",
                                                   kMaxRecordPayloadBytes));
  }
  char header[kRecordHeaderBytes];
  EncodeRecordHeader(kSnapshotRecordMagic, records_, static_cast<uint32_t>(payload.size()),
                     Crc32c(payload), header);
  header_chain_crc_ = Crc32c(absl::string_view(header, kRecordHeaderBytes), header_chain_crc_);
  buffer_.append(header, kRecordHeaderBytes);
  absl::Status written;
  if (payload.size() >= kWriteBufferBytes) {
    written = Flush();
    if (written.ok()) written = WriteFully(fd_.get(), payload, temp_path_);
  } else {
    buffer_.append(payload.data(), payload.size());
    if (buffer_.size() >= kWriteBufferBytes) written = Flush();
  }
  if (!written.ok()) return Fail(written);
  ++records_;
  bytes_ += kRecordHeaderBytes + payload.size();
  return absl::OkStatus();
}

absl::StatusOr<SnapshotInfo> SnapshotWriter::Commit() {
  RETURN_IF_ERROR(CheckOpen());
  char trailer[kTrailerBytes];
  EncodeFixed32(trailer, kTrailerMagic);
  EncodeFixed32(trailer + 4, kFormatVersion);
  EncodeFixed64(trailer + 8, lsn_);
  EncodeFixed64(trailer + 16, records_);
  EncodeFixed32(trailer + 24, MaskCrc(header_chain_crc_));
  EncodeFixed32(trailer + kTrailerCrcOffset,
                MaskCrc(Crc32c(absl::string_view(trailer, kTrailerCrcOffset))));
  buffer_.append(trailer, kTrailerBytes);
  bytes_ += kTrailerBytes;

  // Data and trailer must be on disk before the name says "committed".
  absl::Status status = Flush();
  if (status.ok()) status = SyncFileData(fd_.get(), temp_path_);
  if (!status.ok()) return Fail(status);
  fd_.reset();
  const std::string path = JoinPath(dir_, SnapshotFileName(lsn_));
  if (::rename(temp_path_.c_str(), path.c_str()) != 0) {
    return Fail(PosixError(errno, absl::StrCat("rename ", temp_path_, " to"), path));
  }
  // From here the .tmp name is gone (and may be reused by a new
  // BeginSnapshot): never unlink it again.
  state_ = State::kCommitted;
  RETURN_IF_ERROR(SyncDirectory(dir_));

  SnapshotInfo info;
  info.lsn = lsn_;
  info.path = path;
  info.records = records_;
  info.size_bytes = bytes_;

  absl::StatusOr<std::vector<uint64_t>> lsns = ListCommitted(dir_);
  if (!lsns.ok()) {
    info.warnings.push_back(absl::StrCat("not pruning old snapshots: ", lsns.status().ToString()));
  } else if (lsns->size() > static_cast<size_t>(keep_last_)) {
    const size_t excess = lsns->size() - static_cast<size_t>(keep_last_);
    for (size_t i = 0; i < excess; ++i) {
      const absl::Status removed = RemoveFileIfExists(JoinPath(dir_, SnapshotFileName((*lsns)[i])));
      if (!removed.ok()) info.warnings.push_back(removed.ToString());
    }
  }
  info.duration = absl::Now() - start_;
  return info;
}

void SnapshotWriter::Abort() {
  // A failed writer already removed its file (Fail), and a committed one's
  // .tmp name may belong to a newer writer by now.
  if (state_ != State::kOpen) return;
  fd_.reset();
  RemoveFileIfExists(temp_path_).IgnoreError();
  state_ = State::kAborted;
}

// ---------------------------------------------------------------------------
// SnapshotStore

absl::StatusOr<std::unique_ptr<SnapshotStore>> SnapshotStore::Open(std::string dir, int keep_last) {
  if (dir.empty()) return absl::InvalidArgumentError("snapshot directory must not be empty");
  if (keep_last < 1) {
    return absl::InvalidArgumentError(absl::StrCat("keep_last must be >= 1, got ", keep_last));
  }
  RETURN_IF_ERROR(CreateDirectories(dir));
  // The directory may be new; commits fsync only the directory itself.
  RETURN_IF_ERROR(SyncDirectory(ParentDirectory(dir)));
  std::unique_ptr<SnapshotStore> store(new SnapshotStore(std::move(dir), keep_last));
  ASSIGN_OR_RETURN(const std::vector<std::string> names, ListDirectory(store->dir_));
  for (const std::string& name : names) {
    if (!ParseName(name, kTempSuffix).has_value()) continue;
    const std::string path = JoinPath(store->dir_, name);
    RETURN_IF_ERROR(RemoveFileIfExists(path));
    store->removed_temp_files_.push_back(path);
  }
  return store;
}

absl::StatusOr<std::unique_ptr<SnapshotWriter>> SnapshotStore::BeginSnapshot(uint64_t lsn) const {
  const std::string temp_path = JoinPath(dir_, SnapshotTempFileName(lsn));
  absl::StatusOr<ScopedFd> fd = OpenFile(temp_path, O_WRONLY | O_CREAT | O_EXCL);
  if (!fd.ok()) {
    if (absl::IsAlreadyExists(fd.status())) {
      return absl::AlreadyExistsError(
          absl::StrCat("a snapshot at LSN ", lsn, " is already being written (", temp_path, ")"));
    }
    return fd.status();
  }
  return std::unique_ptr<SnapshotWriter>(new SnapshotWriter(dir_, keep_last_, lsn, *std::move(fd)));
}

absl::StatusOr<SnapshotLoadResult> SnapshotStore::LoadLatest(
    const SnapshotRecordCallback& callback) const {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const std::vector<uint64_t> lsns, ListCommitted(dir_));
  SnapshotLoadResult result;
  for (auto it = lsns.rbegin(); it != lsns.rend(); ++it) {
    const std::string path = JoinPath(dir_, SnapshotFileName(*it));
    const absl::StatusOr<SnapshotFileStats> verified = ReadSnapshotFile(path, *it, nullptr);
    if (!verified.ok()) {
      result.warnings.push_back(
          absl::StrCat("skipped snapshot ", path, ": ", verified.status().message()));
      continue;
    }
    // Tell the callback's own errors from the file's.
    absl::Status callback_error;
    const SnapshotRecordCallback deliver = [&](absl::string_view payload) {
      callback_error = callback(payload);
      return callback_error;
    };
    const absl::StatusOr<SnapshotFileStats> delivered = ReadSnapshotFile(path, *it, &deliver);
    if (!callback_error.ok()) return callback_error;
    if (!delivered.ok()) {
      return absl::Status(delivered.status().code(),
                          absl::StrCat("snapshot ", path,
                                       " changed after it was verified, records were already "
                                       "delivered: ",
                                       delivered.status().message()));
    }
    result.lsn = *it;
    result.path = path;
    result.records = delivered->records;
    result.size_bytes = delivered->size_bytes;
    break;
  }
  result.duration = absl::Now() - start;
  return result;
}

absl::StatusOr<std::vector<uint64_t>> SnapshotStore::ListSnapshots() const {
  return ListCommitted(dir_);
}

}  // namespace sluice::replay_buffer::durability
