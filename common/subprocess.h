#ifndef SLUICE_COMMON_SUBPROCESS_H_
#define SLUICE_COMMON_SUBPROCESS_H_

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice {

// How a child process ended.
struct ExitStatus {
  bool signaled = false;  // true: killed by `signal`; false: exited with `code`.
  int code = 0;
  int signal = 0;
  bool success() const { return !signaled && code == 0; }
  // "exited with code 1", "killed by signal 9 (Killed)".
  std::string ToString() const;
};

struct SubprocessOptions {
  // argv[0] is the executable's path (no PATH search).
  std::vector<std::string> argv;
  // Added to (or replacing entries of) the parent's environment.
  std::vector<std::pair<std::string, std::string>> env;
  // When set, the child's stdout and stderr are appended to this file.
  std::string log_path;
  // When true, the child gets the write end of a pipe as file descriptor
  // kReadyFd; the child writes one line there once it is serving (see
  // services/runtime: --ready-fd) and the parent reads it with WaitReady().
  bool ready_pipe = false;
  // The child gets SIGTERM when the parent dies, so that a crashed supervisor
  // never leaves services behind.
  bool terminate_with_parent = true;
};

// A child process started with fork + exec, watched through a pidfd so that
// every wait is a poll() with a deadline, never a sleep loop.
//
// Thread-compatible: one thread owns a Subprocess. The destructor kills and
// reaps a child that is still running.
class Subprocess {
 public:
  static constexpr int kReadyFd = 3;

  // Starts the child. Fails (without leaving a child behind) when the
  // executable cannot be run, with the errno of the failed exec.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(const SubprocessOptions& options);

  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Readable once the child has exited; for callers polling many children.
  int pidfd() const { return pidfd_; }

  // Blocks until the child writes a newline-terminated line on its ready pipe
  // and returns it (without the newline). DEADLINE_EXCEEDED at `deadline`;
  // FAILED_PRECONDITION when the child exits or closes the pipe first.
  absl::StatusOr<std::string> WaitReady(absl::Time deadline);

  absl::Status Signal(int signal);

  // Blocks until the child exits or `deadline` passes (DEADLINE_EXCEEDED).
  absl::StatusOr<ExitStatus> Wait(absl::Time deadline);

  // Reaps the child if it has exited; never blocks.
  std::optional<ExitStatus> TryWait();

  // SIGTERM, then SIGKILL if the child is still running after `grace`; reaps it.
  ExitStatus Stop(absl::Duration grace);

  // The exit status once reaped.
  const std::optional<ExitStatus>& exit_status() const { return exit_status_; }

 private:
  Subprocess(pid_t pid, int pidfd, int ready_fd) : pid_(pid), pidfd_(pidfd), ready_fd_(ready_fd) {}

  pid_t pid_;
  int pidfd_;
  int ready_fd_;
  std::string ready_buffer_;
  std::optional<ExitStatus> exit_status_;
};

// The child's side of the ready pipe: writes `line` and a newline to the
// inherited descriptor `fd` (retrying partial writes), then closes it.
// Returns an error when the parent has gone away.
absl::Status ReportReady(int fd, const std::string& line);

}  // namespace sluice

#endif  // SLUICE_COMMON_SUBPROCESS_H_
