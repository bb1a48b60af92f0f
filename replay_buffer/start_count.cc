#include "replay_buffer/start_count.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice::replay_buffer {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

// Writes `text` to `path` whole: temporary file, fsync, rename, directory
// fsync.
absl::Status WriteWhole(const std::string& dir, const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", temporary);
  const bool written =
      write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && fsync(fd) == 0;
  const int saved = errno;
  close(fd);
  errno = saved;
  if (!written) return Errno("write", temporary);
  if (rename(temporary.c_str(), path.c_str()) != 0) return Errno("rename", temporary);
  if (const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> CountStart(const std::string& data_dir) {
  const std::string path = data_dir + "/starts";
  int64_t starts = 0;
  if (std::ifstream in(path); in) {
    std::stringstream text;
    text << in.rdbuf();
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text.str()), &starts) || starts < 0) {
      starts = 0;
    }
  }
  ++starts;
  if (absl::Status written = WriteWhole(data_dir, path, absl::StrCat(starts, "\n"));
      !written.ok()) {
    return written;
  }
  return starts;
}

}  // namespace sluice::replay_buffer
