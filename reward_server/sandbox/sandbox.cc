#include "reward_server/sandbox/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "reward_server/sandbox/bwrap_launch.h"
#include "reward_server/sandbox/sandbox_internal.h"
#include "reward_server/sandbox/seccomp_filter.h"

namespace sluice::reward_server::sandbox {
namespace internal {

absl::Status ErrnoError(absl::string_view what, int error) {
  return absl::InternalError(absl::StrCat(what, ": ", strerror(error)));
}

absl::StatusOr<Pipe> MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write");
    }
    data.remove_prefix(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> MakeMemfd(const char* name, absl::string_view contents) {
  UniqueFd fd(memfd_create(name, MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoError("memfd_create");
  if (absl::Status status = WriteAll(fd.get(), contents); !status.ok()) return status;
  if (lseek(fd.get(), 0, SEEK_SET) != 0) return ErrnoError("lseek");
  return fd;
}

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return ErrnoError("fcntl");
  return absl::OkStatus();
}

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }
int PidfdSendSignal(int pidfd, int sig) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

size_t Stream::ReadSome(char* buffer) {
  const ssize_t n = read(fd, buffer, kReadChunk);
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return 0;
    open = false;
    return 0;
  }
  if (n == 0) {
    open = false;
    return 0;
  }
  total += n;
  if (keep_tail) {
    kept.append(buffer, n);
    // Trim in amortised O(1): only when twice the limit.
    if (kept.size() > 2 * kept_limit) kept.erase(0, kept.size() - kept_limit);
  } else if (kept.size() < kept_limit) {
    kept.append(buffer, std::min<size_t>(n, kept_limit - kept.size()));
  }
  return static_cast<size_t>(n);
}

void Stream::Finish() {
  if (keep_tail && kept.size() > kept_limit) kept.erase(0, kept.size() - kept_limit);
}

std::optional<pid_t> ParseChildPid(const std::string& status) {
  constexpr char kKey[] = "\"child-pid\":";
  const size_t at = status.find(kKey);
  if (at == std::string::npos) return std::nullopt;
  size_t begin = at + sizeof(kKey) - 1;
  while (begin < status.size() && status[begin] == ' ') ++begin;
  size_t end = begin;
  while (end < status.size() && status[end] >= '0' && status[end] <= '9') ++end;
  if (end == begin || end == status.size()) return std::nullopt;  // Maybe partial.
  int pid = 0;
  if (!absl::SimpleAtoi(absl::string_view(status).substr(begin, end - begin), &pid) || pid <= 0) {
    return std::nullopt;
  }
  return pid;
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

bool WaitPidfd(int pidfd, absl::Time deadline) {
  while (true) {
    struct pollfd p = {pidfd, POLLIN, 0};
    const int rc = poll(&p, 1, PollTimeoutMs(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

// A pidfd for `child`, a child of `parent` (which we have not reaped, so its
// pid is still its own); invalid when `child` is gone or is not `parent`'s.
// Checking the parent after opening makes a recycled pid harmless: if the
// pid now names another process, the pidfd names the dead one.
UniqueFd OpenChildPidfd(pid_t child, pid_t parent) {
  UniqueFd pidfd(PidfdOpen(child));
  if (!pidfd.valid()) return pidfd;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(child));
  UniqueFd stat_fd(open(path, O_RDONLY | O_CLOEXEC));
  if (!stat_fd.valid()) return UniqueFd();
  char text[512];
  const ssize_t n = read(stat_fd.get(), text, sizeof(text) - 1);
  if (n <= 0) return UniqueFd();
  text[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
  const char* close_paren = strrchr(text, ')');
  int ppid = 0;
  char state;
  if (close_paren == nullptr || sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2 ||
      ppid != parent) {
    return UniqueFd();
  }
  return pidfd;
}

absl::Status ValidPath(absl::string_view field, absl::string_view path) {
  if (path.empty() || path[0] != '/' || absl::StrContains(path, "/../") ||
      absl::EndsWith(path, "/..")) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be an absolute path without '..', got \"", path, "\""));
  }
  return absl::OkStatus();
}

SandboxResult CollectOutput(Stream (&streams)[3], int secret_read_fd, bool has_secret,
                            absl::Time start) {
  SandboxResult run;
  int unread_secret = 0;
  run.started = has_secret && ioctl(secret_read_fd, FIONREAD, &unread_secret) == 0 &&
                unread_secret == 0;
  for (Stream& stream : streams) stream.Finish();
  run.stdout_text = std::move(streams[0].kept);
  run.stderr_text = std::move(streams[1].kept);
  run.result = std::move(streams[2].kept);
  run.stdout_bytes = streams[0].total;
  run.stderr_bytes = streams[1].total;
  run.wall_time = absl::Now() - start;
  return run;
}

}  // namespace internal

using namespace internal;  // NOLINT(build/namespaces): this file's own helpers.

std::string SandboxSetupHint(const std::string& bwrap_stderr) {
  const bool namespaces_refused =
      absl::StrContains(bwrap_stderr, "uid map") ||
      absl::StrContains(bwrap_stderr, "No permissions to creat") ||
      absl::StrContains(bwrap_stderr, "Creating new namespace failed") ||
      absl::StrContains(bwrap_stderr, "setting up uid map") ||
      absl::StrContains(bwrap_stderr, "Operation not permitted") ||
      absl::StrContains(bwrap_stderr, "Permission denied");
  if (absl::StrContains(bwrap_stderr, "ModuleNotFoundError")) {
    return "the interpreter lacks part of its standard library, which the pool's warm "
           "interpreter needs (Debian: install python3, not only python3-minimal); or run a "
           "fresh sandbox per program (--sandbox-slots 0)";
  }
  if (absl::StrContains(bwrap_stderr, "execvp")) {
    return "the program to run is missing from the sandbox: check the interpreter path and "
           "read_only_paths";
  }
  if (absl::StrContains(bwrap_stderr, "Can't mount proc")) {
    // The namespaces were made; the container runtime's masked /proc (paths
    // overmounted or read-only) makes the kernel refuse a new procfs in them.
    return "the user namespace was created but a fresh /proc cannot be mounted in it: the "
           "container runtime masks /proc paths. Docker: --security-opt systempaths=unconfined "
           "(with seccomp=unconfined); Kubernetes: securityContext.procMount: Unmasked with "
           "hostUsers: false (docs/deployment.md, \"The code sandbox in a container\")";
  }
  if (!namespaces_refused) return "";
  return "unprivileged user namespaces seem to be disabled or blocked: the sandbox needs an "
         "unprivileged uid to create user, pid, mount and network namespaces. Set "
         "`sysctl -w kernel.unprivileged_userns_clone=1` (Debian) and "
         "`sysctl -w user.max_user_namespaces=15000`; under AppArmor (Ubuntu >= 23.10) "
         "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`; in a container, allow "
         "unshare/clone(CLONE_NEWUSER) (Docker: --security-opt seccomp=unconfined "
         "--security-opt systempaths=unconfined, and apparmor=unconfined under AppArmor, or "
         "a profile permitting them; Kubernetes: docs/deployment.md). Check with "
         "`setpriv --reuid 990000 --regid 990000 --clear-groups unshare -Ur true`";
}

absl::Status SandboxOptions::Validate() const {
  if (absl::Status s = ValidPath("bwrap_path", bwrap_path); !s.ok()) return s;
  if (absl::Status s = ValidPath("prlimit_path", prlimit_path); !s.ok()) return s;
  if (absl::Status s = ValidPath("uid_lock_dir", uid_lock_dir); !s.ok()) return s;
  for (size_t i = 0; i < read_only_paths.size(); ++i) {
    if (absl::Status s = ValidPath(absl::StrCat("read_only_paths[", i, "]"), read_only_paths[i]);
        !s.ok()) {
      return s;
    }
  }
  auto positive = [](absl::string_view field, auto value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, " must be > 0, got ", value));
  };
  if (absl::Status s = positive("address_space_bytes", address_space_bytes); !s.ok()) return s;
  if (cpu_time < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_time must be >= 1s, got ", absl::FormatDuration(cpu_time)));
  }
  // bwrap and its pid-1 reaper take two tasks of the budget.
  if (max_processes < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_processes must be >= 3 (bwrap takes 2), got ", max_processes));
  }
  if (absl::Status s = positive("max_file_bytes", max_file_bytes); !s.ok()) return s;
  if (max_open_files < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_open_files must be >= 16, got ", max_open_files));
  }
  if (tmpfs_bytes < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("tmpfs_bytes must be >= 4096, got ", tmpfs_bytes));
  }
  if (absl::Status s = positive("output_bytes_kept", output_bytes_kept); !s.ok()) return s;
  if (uid_base == 0) return absl::InvalidArgumentError("uid_base must be > 0 (never root)");
  if (uid_count < 1 || uid_count > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("uid_count must be in [1, 1048576], got ", uid_count));
  }
  if (uint64_t{uid_base} + static_cast<uint64_t>(uid_count) > uint64_t{0xFFFFFFFE}) {
    return absl::InvalidArgumentError(
        absl::StrCat("uid_base + uid_count must be < 4294967294, got ", uid_base, " + ",
                     uid_count));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Sandbox>> Sandbox::Create(SandboxOptions options) {
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  absl::StatusOr<std::string> bpf = BuildSeccompFilterBpf();
  if (!bpf.ok()) return bpf.status();
  return std::unique_ptr<Sandbox>(new Sandbox(std::move(options), *std::move(bpf)));
}

absl::StatusOr<SandboxResult> Sandbox::Run(const SandboxRequest& request) const {
  const absl::Time start = absl::Now();
  if (request.argv.empty()) return absl::InvalidArgumentError("argv must not be empty");
  if (request.deadline == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("deadline must be set");
  }
  if (absl::Status s = ValidPath("argv[0]", request.argv[0]); !s.ok()) return s;
  if (request.files.size() > kMaxFiles) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxFiles, " files"));
  }
  for (const SandboxFile& file : request.files) {
    if (absl::Status s = ValidPath("files[].path", file.path); !s.ok()) return s;
    // bwrap copies the file under the sandbox's RLIMIT_FSIZE.
    if (file.contents.size() > options_.max_file_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file ", file.path, " exceeds max_file_bytes (", options_.max_file_bytes, ")"));
    }
  }
  const bool as_root = geteuid() == 0;

  // --- Descriptors. All O_CLOEXEC here; the child places its own copies.
  UniqueFd dev_null(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null.valid()) return ErrnoError("open /dev/null");
  absl::StatusOr<Pipe> out = MakePipe();
  absl::StatusOr<Pipe> err = MakePipe();
  absl::StatusOr<Pipe> secret = MakePipe();
  absl::StatusOr<Pipe> result = MakePipe();
  absl::StatusOr<Pipe> status = MakePipe();
  for (const auto* pipe : {&out, &err, &secret, &result, &status}) {
    if (!pipe->ok()) return pipe->status();
  }
  // The secret fits the pipe's buffer (64 KiB), so writing never blocks.
  if (request.secret.size() > 4096) return absl::InvalidArgumentError("secret exceeds 4096 bytes");
  if (absl::Status s = WriteAll(secret->write.get(), request.secret); !s.ok()) return s;
  secret->write.Reset();
  absl::StatusOr<UniqueFd> seccomp = MakeMemfd("sluice-seccomp", seccomp_bpf_);
  if (!seccomp.ok()) return seccomp.status();
  std::vector<UniqueFd> file_fds;
  for (const SandboxFile& file : request.files) {
    absl::StatusOr<UniqueFd> fd = MakeMemfd("sluice-file", file.contents);
    if (!fd.ok()) return fd.status();
    file_fds.push_back(*std::move(fd));
  }

  FreshSandboxFds fds;
  fds.stdin_fd = dev_null.get();
  fds.stdout_fd = out->write.get();
  fds.stderr_fd = err->write.get();
  fds.secret_fd = secret->read.get();
  fds.result_fd = result->write.get();
  fds.seccomp_fd = seccomp->get();
  fds.status_fd = status->write.get();
  for (const UniqueFd& fd : file_fds) fds.file_fds.push_back(fd.get());
  BwrapLaunch launch = FreshSandboxLaunch(options_, request, fds, as_root, start);

  std::unique_ptr<UidLease> root_lease;  // Held until the namespace is empty.
  if (as_root) {
    absl::StatusOr<std::unique_ptr<UidLease>> lease = UidLease::Acquire(options_);
    if (!lease.ok()) return lease.status();
    root_lease = *std::move(lease);
    launch.uid = root_lease->uid();
  }
  absl::StatusOr<pid_t> launched = LaunchBwrap(options_, launch);
  if (!launched.ok()) return launched.status();
  const pid_t pid = *launched;

  // --- Parent.
  out->write.Reset();
  err->write.Reset();
  result->write.Reset();
  status->write.Reset();
  seccomp->Reset();
  file_fds.clear();
  dev_null.Reset();

  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid()) {
    const int error = errno;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    int wait_status;
    while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    return ErrnoError("pidfd_open (Linux >= 5.3 needed)", error);
  }

  Stream streams[3];
  streams[0] = {out->read.get(), true, false, options_.output_bytes_kept};
  streams[1] = {err->read.get(), true, true, options_.output_bytes_kept};
  streams[2] = {result->read.get(), true, false, kResultBytesKept};
  Stream status_stream = {status->read.get(), true, false, kStatusBytesKept};
  for (int fd : {out->read.get(), err->read.get(), result->read.get(), status->read.get()}) {
    if (absl::Status s = SetNonBlocking(fd); !s.ok()) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      int wait_status;
      while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      return s;
    }
  }

  UniqueFd init_pidfd;  // The pid namespace's init (bwrap's reaper), once known.
  std::optional<Termination> killed_for;
  bool reaped = false;
  int wait_status = 0;
  absl::Time drain_deadline = absl::InfiniteFuture();
  auto kill_run = [&](Termination reason) {
    if (killed_for.has_value()) return;
    killed_for = reason;
    if (init_pidfd.valid()) PidfdSendSignal(init_pidfd.get(), SIGKILL);
    if (!reaped) kill(-pid, SIGKILL);
  };
  std::vector<char> buffer(kReadChunk);
  while (true) {
    const bool pipes_open = streams[0].open || streams[1].open || streams[2].open;
    if (reaped && (!pipes_open || absl::Now() >= drain_deadline)) break;
    struct pollfd fds[5];
    Stream* polled[5];
    int n = 0;
    for (Stream* stream : {&streams[0], &streams[1], &streams[2], &status_stream}) {
      if (!stream->open) continue;
      fds[n] = {stream->fd, POLLIN, 0};
      polled[n++] = stream;
    }
    const int pidfd_index = n;
    if (!reaped) fds[n++] = {pidfd.get(), POLLIN, 0};
    absl::Time wake = reaped ? drain_deadline
                             : (killed_for.has_value() ? absl::InfiniteFuture() : request.deadline);
    const int rc = poll(fds, n, PollTimeoutMs(wake));
    if (rc < 0 && errno != EINTR) {
      kill_run(Termination::kDeadline);
      continue;  // The pidfd still reports the exit.
    }
    if (!reaped && !killed_for.has_value() && absl::Now() >= request.deadline) {
      kill_run(Termination::kDeadline);
      continue;
    }
    for (int i = 0; i < pidfd_index; ++i) {
      if (fds[i].revents == 0) continue;
      polled[i]->ReadSome(buffer.data());
      if (polled[i] == &status_stream && !init_pidfd.valid() && !reaped) {
        if (std::optional<pid_t> init = ParseChildPid(status_stream.kept); init.has_value()) {
          init_pidfd = OpenChildPidfd(*init, pid);
          // A kill before this point reaches the init through
          // --die-with-parent; this one makes sure.
          if (killed_for.has_value() && init_pidfd.valid()) {
            PidfdSendSignal(init_pidfd.get(), SIGKILL);
          }
        }
      }
    }
    const uint64_t output = streams[0].total + streams[1].total + streams[2].total;
    if (options_.max_output_bytes > 0 && output > options_.max_output_bytes) {
      kill_run(Termination::kOutputLimit);
    }
    if (!reaped && pidfd_index < n && fds[pidfd_index].revents != 0) {
      while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
      reaped = true;
      drain_deadline = absl::Now() + kDrainGrace;
    }
  }
  // bwrap exits after its init, and the init after the kernel emptied the
  // namespace; but a killed bwrap does not wait for its init: do it here.
  if (init_pidfd.valid()) {
    if (killed_for.has_value()) PidfdSendSignal(init_pidfd.get(), SIGKILL);
    WaitPidfd(init_pidfd.get(), absl::Now() + kNamespaceExitGrace);
  }

  SandboxResult run =
      CollectOutput(streams, secret->read.get(), !request.secret.empty(), start);
  if (killed_for.has_value()) {
    run.termination = *killed_for;
    return run;
  }
  if (WIFSIGNALED(wait_status)) {
    // bwrap itself was killed (not by us): the sandbox went with it.
    run.termination = Termination::kSignaled;
    run.signal = WTERMSIG(wait_status);
    return run;
  }
  const int code = WEXITSTATUS(wait_status);
  // bwrap reports set-up failures as "bwrap: ..." and status 1, before the
  // program could read its secret.
  if (code == 1 && !run.started && absl::StartsWith(run.stderr_text, "bwrap: ")) {
    std::string message = run.stderr_text;
    while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
      message.pop_back();
    }
    const std::string hint = SandboxSetupHint(message);
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox set-up failed: ", message, hint.empty() ? "" : " -- ", hint));
  }
  // bwrap's init reports a program killed by signal N as status 128 + N.
  // (A program calling _exit(128 + N) itself reads the same.)
  if (code > 128 && code < 128 + NSIG) {
    run.termination = Termination::kSignaled;
    run.signal = code - 128;
    return run;
  }
  run.termination = Termination::kExited;
  run.exit_code = code;
  return run;
}

absl::Status SandboxRunner::CheckAvailable(std::vector<std::string> argv) const {
  SandboxRequest request;
  request.argv = std::move(argv);
  request.deadline = absl::Now() + absl::Seconds(30);
  absl::StatusOr<SandboxResult> run = Run(request);
  if (!run.ok()) return run.status();
  if (run->termination == Termination::kExited && run->exit_code == 0) return absl::OkStatus();
  std::string what = run->termination == Termination::kExited
                         ? absl::StrCat("exited with status ", run->exit_code)
                     : run->termination == Termination::kSignaled
                         ? absl::StrCat("was killed by signal ", run->signal)
                         : std::string("did not finish within 30s");
  const std::string hint = SandboxSetupHint(run->stderr_text);
  return absl::FailedPreconditionError(absl::StrCat(
      "sandbox self-check: ", request.argv.empty() ? "" : request.argv[0], " ", what,
      run->stderr_text.empty() ? "" : absl::StrCat("; stderr: ", run->stderr_text),
      hint.empty() ? "" : absl::StrCat(" -- ", hint)));
}

}  // namespace sluice::reward_server::sandbox
