#include "cli/state_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// argv[0] of a running process; empty when it is gone or unreadable.
std::string Argv0(pid_t pid) {
  const std::string cmdline = ReadAll(absl::StrCat("/proc/", pid, "/cmdline"));
  return cmdline.substr(0, cmdline.find('\0'));
}

// A leftover service of a dead stack: still running, as the binary it was.
struct Leftover {
  std::string name;
  pid_t pid;
  int pidfd;
};

// Waits until every pidfd in `leftovers` is readable (its process exited)
// or `deadline`; returns those still running.
std::vector<Leftover> WaitForExits(std::vector<Leftover> leftovers, absl::Time deadline) {
  while (!leftovers.empty()) {
    std::vector<struct pollfd> fds;
    for (const Leftover& leftover : leftovers) fds.push_back({leftover.pidfd, POLLIN, 0});
    const int64_t left_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int n = poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left_ms, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    std::vector<Leftover> running;
    for (size_t i = 0; i < leftovers.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        close(leftovers[i].pidfd);
      } else {
        running.push_back(leftovers[i]);
      }
    }
    leftovers = std::move(running);
  }
  return leftovers;
}

}  // namespace

std::string BinaryFor(const std::string& kind) {
  std::string binary = "sluice-" + kind;
  for (char& c : binary) {
    if (c == '_') c = '-';
  }
  return binary;
}

std::string KindOf(const std::string& service_name) {
  return service_name.substr(0, service_name.find('-'));
}

absl::StatusOr<std::unique_ptr<StateDirLock>> StateDirLock::Acquire(const std::string& state_dir) {
  const std::string path = (fs::path(state_dir) / "sluice-up.lock").string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    close(fd);
    if (error != EWOULDBLOCK) {
      return absl::InternalError(absl::StrCat("cannot lock ", path, ": ", strerror(error)));
    }
    std::string holder(absl::StripAsciiWhitespace(ReadAll(path)));
    if (holder.empty()) holder = "unknown";
    return absl::FailedPreconditionError(absl::StrCat(
        "another `sluice up` (pid ", holder, ") is running with the state directory ", state_dir,
        " (it holds ", path, "); stop it first (kill ", holder,
        ") or give this one another --state-dir"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(error)));
  }
  return std::unique_ptr<StateDirLock>(new StateDirLock(path, fd));
}

StateDirLock::~StateDirLock() { close(fd_); }

absl::StatusOr<std::string> ReplaceStaleEndpoints(const std::string& path,
                                                  absl::Duration stop_grace) {
  std::error_code error;
  if (!fs::exists(path, error)) return std::string();
  const nlohmann::json document =
      nlohmann::json::parse(ReadAll(path), nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> lines;
  const int64_t writer =
      document.is_object() && document.contains("supervisor_pid") &&
              document["supervisor_pid"].is_number_integer()
          ? document["supervisor_pid"].get<int64_t>()
          : 0;
  lines.push_back(absl::StrCat("found a stale ", path, " (left by a `sluice up`",
                               writer > 0 ? absl::StrCat(" with pid ", writer) : "",
                               " that is no longer running); replacing it"));

  std::vector<Leftover> leftovers;
  std::vector<std::string> gone;
  if (document.is_object() && document.contains("services") && document["services"].is_object()) {
    for (const auto& [name, service] : document["services"].items()) {
      if (!service.is_object() || !service.contains("pid") || !service["pid"].is_number_integer()) {
        continue;
      }
      const pid_t pid = service["pid"].get<pid_t>();
      if (pid <= 0) continue;
      const std::string argv0 = Argv0(pid);
      if (argv0.empty() || fs::path(argv0).filename() != BinaryFor(KindOf(name))) {
        gone.push_back(absl::StrCat(name, " (pid ", pid, ")"));
        continue;
      }
      const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      if (pidfd < 0) {
        gone.push_back(absl::StrCat(name, " (pid ", pid, ")"));
        continue;
      }
      leftovers.push_back({name, pid, pidfd});
    }
  }
  if (!gone.empty()) {
    lines.push_back(absl::StrCat("  gone already: ", absl::StrJoin(gone, ", ")));
  }
  if (!leftovers.empty()) {
    std::vector<std::string> names;
    for (const Leftover& leftover : leftovers) {
      names.push_back(absl::StrCat(leftover.name, " (pid ", leftover.pid, ")"));
      // Orphans already got SIGTERM from their dead parent; a second one
      // makes a service exit at once rather than drain.
      kill(leftover.pid, SIGTERM);
    }
    lines.push_back(absl::StrCat("  still running, stopped now: ", absl::StrJoin(names, ", ")));
    std::vector<Leftover> stubborn = WaitForExits(std::move(leftovers), absl::Now() + stop_grace);
    if (!stubborn.empty()) {
      names.clear();
      for (const Leftover& leftover : stubborn) {
        names.push_back(absl::StrCat(leftover.name, " (pid ", leftover.pid, ")"));
        kill(leftover.pid, SIGKILL);
      }
      lines.push_back(absl::StrCat("  killed after ", absl::FormatDuration(stop_grace), ": ",
                                   absl::StrJoin(names, ", ")));
      for (const Leftover& leftover : WaitForExits(std::move(stubborn), absl::Now() + absl::Seconds(10))) {
        close(leftover.pidfd);
      }
    }
  }
  fs::remove(path, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot remove the stale ", path, ": ", error.message()));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace sluice::cli
