#ifndef SLUICE_REPLAY_BUFFER_DURABILITY_FILE_IO_H_
#define SLUICE_REPLAY_BUFFER_DURABILITY_FILE_IO_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// Thin POSIX file helpers for the write-ahead log and the snapshot store.
//
// Every function retries EINTR and loops over short reads and writes, and
// every error names the file (and the byte offset where one applies), so a
// caller can return it unchanged. None of them crash on a bad file.

namespace sluice::replay_buffer::durability {

// Owns a file descriptor; closes it on destruction (errors there are ignored:
// a caller that cares about close(2) errors syncs first).
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// An absl::Status for errno `error_number`: "<what> <path>: <strerror>".
// ENOSPC and EDQUOT map to RESOURCE_EXHAUSTED, ENOENT to NOT_FOUND, EACCES
// and EPERM to PERMISSION_DENIED, the rest as absl::ErrnoToStatusCode does.
absl::Status PosixError(int error_number, absl::string_view what, absl::string_view path);

// open(2) with O_CLOEXEC added.
absl::StatusOr<ScopedFd> OpenFile(const std::string& path, int flags, int mode = 0644);

// Writes all of `data` at the file offset (or end, with O_APPEND).
absl::Status WriteFully(int fd, absl::string_view data, absl::string_view path);

// Writes every byte described by `iov` (modified: consumed as written),
// in as few writev(2) calls as IOV_MAX allows.
absl::Status WriteVFully(int fd, std::vector<struct iovec>& iov, absl::string_view path);

// Reads exactly `size` bytes at `offset`; a file shorter than that is
// DATA_LOSS naming the path and offset.
absl::Status PreadFully(int fd, char* buffer, size_t size, uint64_t offset, absl::string_view path);

// fdatasync(2): the file's data and the metadata needed to read it (its
// size) reach stable storage. `path` is for the message only.
absl::Status SyncFileData(int fd, absl::string_view path);

// fsync(2) of the directory itself, so that entries created, renamed or
// removed in it survive power loss.
absl::Status SyncDirectory(const std::string& dir);

// mkdir -p. OK when the directory exists.
absl::Status CreateDirectories(const std::string& dir);

// Names in `dir` (no "." or ".."), unsorted.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir);

// unlink(2); a file that is already gone is OK.
absl::Status RemoveFileIfExists(const std::string& path);

// Whether `dir` can take a write of `bytes` bytes now: writes them to a
// scratch file there (".write-probe"), syncs and removes it. The write's
// error when it cannot (RESOURCE_EXHAUSTED for a full disk), naming the
// file. For telling when a full directory has room again.
absl::Status ProbeWritable(const std::string& dir, uint64_t bytes);

// Size of the open file, via fstat(2).
absl::StatusOr<uint64_t> FileSize(int fd, absl::string_view path);

// The directory holding `path`: "a/b/c" -> "a/b", "c" -> ".", "/c" -> "/".
std::string ParentDirectory(absl::string_view path);

// dir + "/" + name.
std::string JoinPath(absl::string_view dir, absl::string_view name);

}  // namespace sluice::replay_buffer::durability

#endif  // SLUICE_REPLAY_BUFFER_DURABILITY_FILE_IO_H_
