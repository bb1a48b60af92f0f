#include "common/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace sluice {
namespace {

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
}

ExitStatus FromWaitStatus(int status) {
  ExitStatus exit;
  if (WIFSIGNALED(status)) {
    exit.signaled = true;
    exit.signal = WTERMSIG(status);
  } else {
    exit.code = WEXITSTATUS(status);
  }
  return exit;
}

void CloseIfOpen(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (signaled) return absl::StrCat("killed by signal ", signal, " (", strsignal(signal), ")");
  return absl::StrCat("exited with code ", code);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const SubprocessOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("subprocess: empty argv");

  // Everything the child needs is prepared before fork: between fork and exec
  // a multi-threaded parent's child may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);

  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env_map[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [key, value] : options.env) env_map[key] = value;
  std::vector<std::string> env_strings;
  for (const auto& [key, value] : env_map) env_strings.push_back(key + "=" + value);
  std::vector<char*> envp;
  for (const std::string& entry : env_strings) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);

  int log_fd = -1;
  if (!options.log_path.empty()) {
    log_fd = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot open log file ", options.log_path, ": ", strerror(errno)));
    }
  }
  int ready[2] = {-1, -1};
  if (options.ready_pipe && pipe2(ready, O_CLOEXEC) != 0) {
    CloseIfOpen(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  // The child reports a failed exec's errno on this pipe; a successful exec
  // closes it (O_CLOEXEC), so EOF means the program is running.
  int exec_error[2];
  if (pipe2(exec_error, O_CLOEXEC) != 0) {
    CloseIfOpen(log_fd);
    CloseIfOpen(ready[0]);
    CloseIfOpen(ready[1]);
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    CloseIfOpen(log_fd);
    CloseIfOpen(ready[0]);
    CloseIfOpen(ready[1]);
    close(exec_error[0]);
    close(exec_error[1]);
    return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(err)));
  }
  if (pid == 0) {
    // Child: async-signal-safe calls only.
    if (options.terminate_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);
    }
    // Undo what the parent may have set: blocked signals (the runtime blocks
    // SIGTERM/SIGINT to sigwait on them) and ignored SIGPIPE are inherited.
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    signal(SIGPIPE, SIG_DFL);
    // Its own process group, so a terminal's Ctrl-C reaches only the
    // supervisor, which then stops the children in order.
    setpgid(0, 0);
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    if (ready[1] >= 0) {
      if (ready[1] == kReadyFd) {
        fcntl(kReadyFd, F_SETFD, 0);
      } else {
        dup2(ready[1], kReadyFd);
      }
    }
    execve(argv[0], argv.data(), envp.data());
    const int err = errno;
    ssize_t ignored = write(exec_error[1], &err, sizeof(err));
    (void)ignored;
    _exit(127);
  }

  close(exec_error[1]);
  CloseIfOpen(log_fd);
  CloseIfOpen(ready[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(exec_error[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(exec_error[0]);
  if (n == sizeof(child_errno)) {
    int status;
    waitpid(pid, &status, 0);
    CloseIfOpen(ready[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute ", options.argv[0], ": ", strerror(child_errno)));
  }

  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    const int err = errno;
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    CloseIfOpen(ready[0]);
    return absl::InternalError(absl::StrCat("pidfd_open: ", strerror(err)));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, pidfd, ready[0]));
}

Subprocess::~Subprocess() {
  if (!exit_status_.has_value()) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
  CloseIfOpen(pidfd_);
  CloseIfOpen(ready_fd_);
}

absl::StatusOr<std::string> Subprocess::WaitReady(absl::Time deadline) {
  if (ready_fd_ < 0) return absl::FailedPreconditionError("started without a ready pipe");
  while (true) {
    const size_t newline = ready_buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = ready_buffer_.substr(0, newline);
      ready_buffer_.erase(0, newline + 1);
      return line;
    }
    struct pollfd fds[2] = {{ready_fd_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    const int n = poll(fds, 2, PollTimeoutMs(deadline));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    }
    if (n == 0) return absl::DeadlineExceededError("child did not report ready in time");
    if (fds[0].revents & (POLLIN | POLLHUP)) {
      char buffer[512];
      const ssize_t got = read(ready_fd_, buffer, sizeof(buffer));
      if (got > 0) {
        ready_buffer_.append(buffer, static_cast<size_t>(got));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      return absl::FailedPreconditionError(
          "child closed its ready pipe without reporting ready");
    }
    if (fds[1].revents & POLLIN) {
      // Exited; a final line may still sit in the pipe.
      std::optional<ExitStatus> exit = TryWait();
      return absl::FailedPreconditionError(absl::StrCat(
          "child ", exit.has_value() ? exit->ToString() : "exited", " before reporting ready"));
    }
  }
}

absl::Status Subprocess::Signal(int signal) {
  if (exit_status_.has_value()) return absl::OkStatus();
  if (syscall(SYS_pidfd_send_signal, pidfd_, signal, nullptr, 0) != 0 && errno != ESRCH) {
    return absl::InternalError(absl::StrCat("pidfd_send_signal: ", strerror(errno)));
  }
  return absl::OkStatus();
}

std::optional<ExitStatus> Subprocess::TryWait() {
  if (exit_status_.has_value()) return exit_status_;
  int status;
  pid_t r;
  do {
    r = waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) exit_status_ = FromWaitStatus(status);
  return exit_status_;
}

absl::StatusOr<ExitStatus> Subprocess::Wait(absl::Time deadline) {
  while (!exit_status_.has_value()) {
    struct pollfd fd = {pidfd_, POLLIN, 0};
    const int n = poll(&fd, 1, PollTimeoutMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
    if (n == 0) return absl::DeadlineExceededError("child still running");
    TryWait();
  }
  return *exit_status_;
}

ExitStatus Subprocess::Stop(absl::Duration grace) {
  if (exit_status_.has_value()) return *exit_status_;
  Signal(SIGTERM).IgnoreError();
  absl::StatusOr<ExitStatus> exit = Wait(absl::Now() + grace);
  if (exit.ok()) return *exit;
  Signal(SIGKILL).IgnoreError();
  return *Wait(absl::InfiniteFuture());
}

absl::Status ReportReady(int fd, const std::string& line) {
  const std::string data = line + "\n";
  size_t written = 0;
  absl::Status status = absl::OkStatus();
  while (written < data.size()) {
    const ssize_t n = write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = absl::UnavailableError(absl::StrCat("cannot write ready line to fd ", fd, ": ",
                                                   strerror(errno)));
      break;
    }
    written += static_cast<size_t>(n);
  }
  close(fd);
  return status;
}

}  // namespace sluice
