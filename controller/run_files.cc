#include "controller/run_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "controller/proto_json.h"

namespace sluice::controller {

namespace fs = std::filesystem;

namespace {

absl::Status PosixError(absl::string_view what, const std::string& path) {
  return PosixFileError(errno, what, path);
}

// Closes on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t written = ::write(fd, data.data(), data.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return PosixError("write", path);
    }
    data.remove_prefix(static_cast<size_t>(written));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PosixFileError(int error_number, absl::string_view what, const std::string& path) {
  const std::string message =
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(error_number));
  switch (error_number) {
    case ENOENT:
      return absl::NotFoundError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EROFS:
    case EIO:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) return PosixError("open", path);
  std::string text;
  char buffer[64 * 1024];
  while (true) {
    const ssize_t got = ::read(fd.get(), buffer, sizeof(buffer));
    if (got < 0) {
      if (errno == EINTR) continue;
      return PosixError("read", path);
    }
    if (got == 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  return text;
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  return ProtoToJson(message, pretty);
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view text, bool durable) {
  const std::string temporary = path + ".tmp";
  absl::Status written;
  {
    Fd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.ok()) return PosixError("create", temporary);
    written = WriteAll(fd.get(), text, temporary);
    if (written.ok() && !text.empty() && text.back() != '\n') {
      written = WriteAll(fd.get(), "\n", temporary);
    }
    // Without this a machine crash after the rename could leave an empty
    // file under the new name (the data not yet on disk).
    if (written.ok() && ::fdatasync(fd.get()) != 0) written = PosixError("fsync", temporary);
  }
  if (written.ok() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    written = PosixError("rename to", path);
  }
  if (!written.ok()) {
    // A partial temporary file on a full disk only takes what is left.
    ::unlink(temporary.c_str());
    return written;
  }
  if (durable) {
    const std::string dir = fs::path(path).parent_path().string();
    Fd dir_fd(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd.ok()) return PosixError("open directory", dir);
    if (::fsync(dir_fd.get()) != 0) return PosixError("fsync directory", dir);
  }
  return absl::OkStatus();
}

absl::Status AppendLineToFile(const std::string& path, absl::string_view line) {
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!fd.ok()) return PosixError("open", path);
  struct stat before;
  if (::fstat(fd.get(), &before) != 0) return PosixError("stat", path);
  std::string text(line);
  text.push_back('\n');
  absl::Status written = WriteAll(fd.get(), text, path);
  // A write cut short (a full disk) must not leave part of a line for the
  // next append to run on from: the file goes back to where it was.
  if (!written.ok()) (void)::ftruncate(fd.get(), before.st_size);
  return written;
}

absl::StatusOr<CompleteLines> ReadCompleteLines(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  CompleteLines result;
  size_t start = 0;
  while (start < text->size()) {
    const size_t end = text->find('\n', start);
    if (end == std::string::npos) {
      result.torn_tail_bytes = static_cast<int64_t>(text->size() - start);
      break;
    }
    result.lines.emplace_back(text->substr(start, end - start));
    start = end + 1;
  }
  return result;
}

absl::StatusOr<int64_t> DropTornTail(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return 0;
    return text.status();
  }
  if (text->empty() || text->back() == '\n') return 0;
  const size_t last_newline = text->rfind('\n');
  const size_t keep = last_newline == std::string::npos ? 0 : last_newline + 1;
  if (::truncate(path.c_str(), static_cast<off_t>(keep)) != 0) return PosixError("truncate", path);
  return static_cast<int64_t>(text->size() - keep);
}

absl::StatusOr<RunFiles> RunFiles::Create(const std::string& runs_dir, const std::string& run_id) {
  const fs::path dir = fs::path(runs_dir) / run_id;
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) return PosixFileError(error.value(), "create run directory", dir.string());
  return RunFiles(dir.string());
}

std::string RunFiles::Path(absl::string_view name) const {
  return (fs::path(dir_) / std::string(name)).string();
}

absl::Status RunFiles::WriteSpec(const google::protobuf::Message& spec) const {
  return WriteFileAtomically(Path(kSpec), ToJson(spec, /*pretty=*/true), /*durable=*/true);
}

absl::Status RunFiles::WriteState(absl::string_view text, bool durable) const {
  return WriteFileAtomically(Path(kState), text, durable);
}

absl::Status RunFiles::AppendMetrics(const google::protobuf::Message& step) const {
  return AppendLineToFile(Path(kMetrics), ToJson(step, /*pretty=*/false));
}

absl::Status RunFiles::AppendEval(const google::protobuf::Message& eval) const {
  return AppendLineToFile(Path(kEvals), ToJson(eval, /*pretty=*/false));
}

absl::Status RunFiles::WriteSummary(const google::protobuf::Message& summary) const {
  return WriteFileAtomically(Path(kSummary), ToJson(summary, /*pretty=*/true), /*durable=*/true);
}

absl::Status RunFiles::RepairAppendedFiles() const {
  for (const char* name : {kMetrics, kEvals}) {
    absl::StatusOr<int64_t> dropped = DropTornTail(Path(name));
    if (!dropped.ok()) return dropped.status();
    if (*dropped > 0) {
      log::Warning("dropped a partial last line (the controller was killed while appending it)",
                   {{"file", Path(name)}, {"bytes", *dropped}});
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::controller
