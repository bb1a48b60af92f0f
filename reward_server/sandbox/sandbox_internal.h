#ifndef SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_INTERNAL_H_
#define SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_INTERNAL_H_

// What the per-run sandbox (sandbox.cc) and the pool (sandbox_pool.cc)
// share: descriptors, pipes, pidfds, the uid leases of a root server,
// bwrap's command line and its launch. Not an API: only these two files
// include it.

#include <errno.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "reward_server/sandbox/sandbox.h"

namespace sluice::reward_server::sandbox::internal {

// Descriptors of bwrap (and, for 0-4, of the program).
inline constexpr int kStdinFd = 0;
inline constexpr int kStdoutFd = 1;
inline constexpr int kStderrFd = 2;
inline constexpr int kSeccompFd = 5;
inline constexpr int kStatusFd = 6;  // bwrap --json-status-fd: reports the pid ns init.
inline constexpr int kFirstFileFd = 7;
inline constexpr int kMaxFiles = 16;
inline constexpr int kMaxChildFds = kFirstFileFd + kMaxFiles;

inline constexpr size_t kResultBytesKept = 4096;
inline constexpr size_t kStatusBytesKept = 4096;
inline constexpr size_t kReadChunk = 64 << 10;
// After the program exits, how long its pipes may stay open (only a process
// outside the pid namespace could hold them: none should).
inline constexpr absl::Duration kDrainGrace = absl::Seconds(2);
// How long the pid namespace may take to empty once its init is killed.
inline constexpr absl::Duration kNamespaceExitGrace = absl::Seconds(5);

// An owned file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

absl::Status ErrnoError(absl::string_view what, int error = errno);

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};
// Both ends O_CLOEXEC.
absl::StatusOr<Pipe> MakePipe();
absl::Status WriteAll(int fd, absl::string_view data);
// A sealed-size anonymous file holding `contents`, positioned at its start,
// for bwrap to read (--seccomp, --ro-bind-data).
absl::StatusOr<UniqueFd> MakeMemfd(const char* name, absl::string_view contents);
absl::Status SetNonBlocking(int fd);
int PidfdOpen(pid_t pid);
int PidfdSendSignal(int pidfd, int sig);
// poll()'s timeout for `deadline`: -1 for never, 0 when past.
int PollTimeoutMs(absl::Time deadline);
// Blocks until `pidfd`'s process has exited or `deadline` passes.
bool WaitPidfd(int pidfd, absl::Time deadline);
// A pidfd for `child`, a child of `parent` (which we have not reaped, so its
// pid is still its own); invalid when `child` is gone or is not `parent`'s.
UniqueFd OpenChildPidfd(pid_t child, pid_t parent);
// "child-pid": N from bwrap's first JSON status document.
std::optional<pid_t> ParseChildPid(const std::string& status);
// INVALID_ARGUMENT unless `path` is absolute without "..".
absl::Status ValidPath(absl::string_view field, absl::string_view path);

// A uid of the range [uid_base, uid_base + uid_count), exclusive within the
// process and, through an flock in uid_lock_dir, across processes; for a
// root server only. Held until destruction.
class UidLease {
 public:
  // Blocks while every uid of the range is taken in this process;
  // RESOURCE_EXHAUSTED when the free ones are all locked by other processes.
  static absl::StatusOr<std::unique_ptr<UidLease>> Acquire(const SandboxOptions& options);
  ~UidLease();
  UidLease(const UidLease&) = delete;
  UidLease& operator=(const UidLease&) = delete;
  uint32_t uid() const { return uid_; }

 private:
  UidLease() = default;
  uint32_t uid_ = 0;
  bool held_ = false;
  UniqueFd lock_;  // Closed after Release: the flock outlives the set entry.
};

// Output of one pipe, drained as it comes.
struct Stream {
  int fd = -1;
  bool open = false;
  bool keep_tail = false;  // Keep the last `kept_limit` bytes, else the first.
  size_t kept_limit = 0;
  std::string kept;
  uint64_t total = 0;

  // Reads what is available (`buffer` holds kReadChunk bytes). Returns the
  // bytes read; closes at EOF or error.
  size_t ReadSome(char* buffer);
  void Finish();
};

// A run's result from its drained streams (stdout, stderr, the result
// channel): the output kept and counted, whether the program read its secret
// to the end (nothing left unread in `secret_read_fd`), and the wall time since
// `start`. The termination is the caller's to fill in.
SandboxResult CollectOutput(Stream (&streams)[3], int secret_read_fd, bool has_secret,
                            absl::Time start);

// RLIMIT_CPU of a program: the configured cpu_time, or its wall budget
// (deadline - start) plus a second when that is shorter, at least 1.
int64_t RunCpuSeconds(const SandboxOptions& options, absl::Time deadline, absl::Time start);
// RLIMIT_AS, _FSIZE, _NOFILE and _CORE of every sandboxed process.
std::vector<std::pair<int, struct rlimit>> ProgramLimits(const SandboxOptions& options);

// bwrap's options that make the sandbox, common to a run and a pool slot:
// every namespace, the read-only host paths, /proc, a read-only minimal
// /dev, size-capped private /tmp and /dev/shm. Callers add their own mounts,
// then "--remount-ro /", environment, seccomp and the command.
std::vector<std::string> BwrapSandboxArgs(const SandboxOptions& options);
// The program's environment: PATH, HOME=/tmp, TMPDIR=/tmp, LANG=C.UTF-8,
// then `overrides` (replacing or adding).
std::vector<std::pair<std::string, std::string>> SandboxEnv(
    const std::vector<std::pair<std::string, std::string>>& overrides);

// How to start bwrap: its argv, the descriptor each of its fds 0..n-1 is a
// copy of, its rlimits, and (root only) the uid to switch to first.
struct BwrapLaunch {
  std::vector<std::string> args;
  std::vector<int> fds;
  std::vector<std::pair<int, struct rlimit>> limits;
  std::optional<uint32_t> uid;
};
// Forks, prepares the child (new session, default signals, descriptors,
// rlimits, uid, PDEATHSIG) and execs bwrap; returns its pid once the exec
// succeeded. FAILED_PRECONDITION with what to change when bwrap cannot be
// executed or the uid cannot be taken; INTERNAL for a failed system call.
absl::StatusOr<pid_t> LaunchBwrap(const SandboxOptions& options, const BwrapLaunch& launch);

}  // namespace sluice::reward_server::sandbox::internal

#endif  // SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_INTERNAL_H_
