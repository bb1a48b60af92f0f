#include "replay_buffer/durability/file_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace sluice::replay_buffer::durability {

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int ScopedFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void ScopedFd::reset(int fd) {
  // No EINTR retry: on Linux the descriptor is freed even when close(2)
  // reports EINTR, and retrying could close a descriptor another thread
  // has just been given.
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::Status PosixError(int error_number, absl::string_view what, absl::string_view path) {
  absl::StatusCode code;
  switch (error_number) {
    case ENOSPC:
    case EDQUOT:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case ENOENT:
      code = absl::StatusCode::kNotFound;
      break;
    case EACCES:
    case EPERM:
      code = absl::StatusCode::kPermissionDenied;
      break;
    default:
      code = absl::ErrnoToStatusCode(error_number);
      break;
  }
  char buffer[256];
  // The GNU strerror_r (thread-safe, unlike strerror) returns the message.
  const char* message = ::strerror_r(error_number, buffer, sizeof(buffer));
  return absl::Status(code, absl::StrCat(what, " ", path, ": ", message));
}

absl::StatusOr<ScopedFd> OpenFile(const std::string& path, int flags, int mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return PosixError(errno, "open", path);
  return ScopedFd(fd);
}

absl::Status WriteFully(int fd, absl::string_view data, absl::string_view path) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError(errno, "write", path);
    }
    if (n == 0) return PosixError(EIO, "write (no progress)", path);
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status WriteVFully(int fd, std::vector<struct iovec>& iov, absl::string_view path) {
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    const ssize_t n = ::writev(fd, &iov[first], count);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError(errno, "write", path);
    }
    if (n == 0) return PosixError(EIO, "write (no progress)", path);
    // Consume `n` bytes: whole entries, then part of one (a short write).
    size_t done = static_cast<size_t>(n);
    while (done > 0 && first < iov.size()) {
      if (done >= iov[first].iov_len) {
        done -= iov[first].iov_len;
        iov[first].iov_len = 0;
        ++first;
      } else {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + done;
        iov[first].iov_len -= done;
        done = 0;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status PreadFully(int fd, char* buffer, size_t size, uint64_t offset,
                        absl::string_view path) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, buffer + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError(errno, absl::StrCat("read at offset ", offset + done, " of"), path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("unexpected end of file ", path, " at offset ",
                                              offset + done, " (wanted ", size - done,
                                              " more bytes)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status SyncFileData(int fd, absl::string_view path) {
  int rc;
  do {
    rc = ::fdatasync(fd);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return PosixError(errno, "fdatasync", path);
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) {
  auto fd = OpenFile(dir, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) return fd.status();
  int rc;
  do {
    rc = ::fsync(fd->get());
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return PosixError(errno, "fsync directory", dir);
  return absl::OkStatus();
}

absl::Status CreateDirectories(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("empty directory path");
  // Create each prefix in turn; EEXIST is fine as long as it is a directory.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return PosixError(errno, "mkdir", prefix);
    }
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return PosixError(errno, "stat", dir);
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return PosixError(errno, "opendir", dir);
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* entry = ::readdir(d)) {
    const absl::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
    errno = 0;
  }
  const int error_number = errno;
  ::closedir(d);
  if (error_number != 0) return PosixError(error_number, "readdir", dir);
  return names;
}

absl::Status RemoveFileIfExists(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return PosixError(errno, "unlink", path);
  return absl::OkStatus();
}

absl::Status ProbeWritable(const std::string& dir, uint64_t bytes) {
  const std::string path = JoinPath(dir, ".write-probe");
  absl::Status status;
  {
    absl::StatusOr<ScopedFd> fd = OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC);
    if (!fd.ok()) return fd.status();
    const std::string chunk(std::min<uint64_t>(bytes, uint64_t{1} << 20), '\0');
    for (uint64_t left = bytes; left > 0 && status.ok();) {
      const uint64_t n = std::min<uint64_t>(left, chunk.size());
      status = WriteFully(fd->get(), absl::string_view(chunk.data(), n), path);
      left -= n;
    }
    // A file system that allocates at writeback reports a full disk here.
    if (status.ok()) status = SyncFileData(fd->get(), path);
  }
  absl::Status removed = RemoveFileIfExists(path);
  return status.ok() ? removed : status;
}

absl::StatusOr<uint64_t> FileSize(int fd, absl::string_view path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return PosixError(errno, "fstat", path);
  return static_cast<uint64_t>(st.st_size);
}

std::string ParentDirectory(absl::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (!dir.empty() && dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

}  // namespace sluice::replay_buffer::durability
