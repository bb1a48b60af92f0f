#ifndef SLUICE_REWARD_SERVER_SANDBOX_BWRAP_LAUNCH_H_
#define SLUICE_REWARD_SERVER_SANDBOX_BWRAP_LAUNCH_H_

// How a sandbox's bubblewrap is started: its command line (namespaces,
// mounts, environment, seccomp filter, then the program), the descriptors
// and rlimits it inherits, the uid it runs as when the server is root, and
// the fork and exec that start it. The per-run sandbox (Sandbox::Run) and
// the pool's slots (SandboxPool) each describe a launch as a BwrapLaunch and
// hand it to LaunchBwrap; what happens once bwrap runs (output, deadlines,
// the verdict) is theirs.
//
//   server thread ── LaunchBwrap: fork ──> child: setsid; default signals;
//        |                fds 0..n-1 = copies of BwrapLaunch::fds, every
//        |                other fd closed at exec; BwrapLaunch::limits;
//        |                as root, setresuid(BwrapLaunch::uid); PDEATHSIG;
//        |                exec BwrapLaunch::args
//        └── returns bwrap's pid once the exec succeeded, or why it failed
//
// Not an API: only the files of sandbox/ include it.

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "reward_server/sandbox/sandbox.h"
#include "reward_server/sandbox/sandbox_internal.h"

namespace sluice::reward_server::sandbox::internal {

// Descriptors of bwrap (and, for 0-4, of the program; kSecretFd and
// kResultFd are sandbox.h's).
inline constexpr int kStdinFd = 0;
inline constexpr int kStdoutFd = 1;
inline constexpr int kStderrFd = 2;
inline constexpr int kSeccompFd = 5;
inline constexpr int kStatusFd = 6;  // bwrap --json-status-fd: reports the pid ns init.
inline constexpr int kFirstFileFd = 7;
inline constexpr int kMaxFiles = 16;
inline constexpr int kMaxChildFds = kFirstFileFd + kMaxFiles;

// RLIMIT_CPU of a program: the configured cpu_time, or its wall budget
// (deadline - start) plus a second when that is shorter, at least 1.
int64_t RunCpuSeconds(const SandboxOptions& options, absl::Time deadline, absl::Time start);
// RLIMIT_AS, _FSIZE, _NOFILE and _CORE of every sandboxed process.
std::vector<std::pair<int, struct rlimit>> ProgramLimits(const SandboxOptions& options);

// bwrap's options that make the sandbox, common to a run and a pool slot:
// every namespace, the read-only host paths, /proc, a read-only minimal
// /dev, size-capped private /tmp and /dev/shm. Callers add their own mounts,
// then "--remount-ro /", environment, seccomp and the command. Reads the
// host's file system (lstat, readlink): a read-only path that is a symlink
// becomes the same symlink, a missing one is left out.
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

// The server's descriptors that a fresh sandbox (Sandbox::Run) is given,
// each placed at bwrap's descriptor named beside it.
struct FreshSandboxFds {
  int stdin_fd = -1;          // kStdinFd: /dev/null.
  int stdout_fd = -1;         // kStdoutFd: a pipe's write end.
  int stderr_fd = -1;         // kStderrFd: a pipe's write end.
  int secret_fd = -1;         // kSecretFd: a pipe's read end holding the secret.
  int result_fd = -1;         // kResultFd: a pipe's write end.
  int seccomp_fd = -1;        // kSeccompFd: the seccomp filter's BPF.
  int status_fd = -1;         // kStatusFd: a pipe's write end, for bwrap's JSON status.
  std::vector<int> file_fds;  // kFirstFileFd + i: request.files[i]'s contents.
};

// The launch of a fresh sandbox running `request` (started at `start`):
//
//   args    BwrapSandboxArgs; request.files[i] bound read-only from fd
//           kFirstFileFd + i; "--remount-ro /"; the working directory /tmp;
//           only SandboxEnv(request.env) in the environment; the seccomp
//           filter and the JSON status on their fds; then, unless `as_root`,
//           prlimit --nproc=max_processes (RLIMIT_NPROC inside the user
//           namespace); then request.argv.
//   fds     `fds`, at the descriptors FreshSandboxFds names.
//   limits  ProgramLimits; RLIMIT_CPU of RunCpuSeconds (hard limit one
//           second more); as root, RLIMIT_NPROC of max_processes (each run
//           has a uid of its own).
//   uid     unset: the caller leases one when root (UidLease).
//
// `fds.file_fds` holds one descriptor per request.files entry, at most
// kMaxFiles (Sandbox::Run checks the request first). Starts nothing; reads
// the host's file system as BwrapSandboxArgs does.
BwrapLaunch FreshSandboxLaunch(const SandboxOptions& options, const SandboxRequest& request,
                               const FreshSandboxFds& fds, bool as_root, absl::Time start);

// Where a pool slot's zygote (SandboxPool) finds its control socket, and
// the descriptors of zygote.py and of the interpreter that bwrap copies in.
inline constexpr int kControlFd = 3;
inline constexpr int kZygoteFd = 7;
inline constexpr int kInterpreterFd = 8;
inline constexpr char kZygotePath[] = "/sluice/zygote.py";
// An execute-only copy of the interpreter: a process that execs a file it
// cannot read is made not dumpable by the kernel, which closes the zygote's
// /proc/1/mem and /proc/1/fd to the programs (same uid) without ctypes.
inline constexpr char kInterpreterCopy[] = "/sluice/python3";

// The server's descriptors that a pool slot is given, each placed at
// bwrap's descriptor named beside it.
struct ZygoteSlotFds {
  int dev_null = -1;        // kStdinFd, and fd 4 (unused).
  int log_fd = -1;          // kStdoutFd and kStderrFd: a pipe's write end.
  int control_fd = -1;      // kControlFd: the zygote's end of a socketpair.
  int seccomp_fd = -1;      // kSeccompFd: the seccomp filter's BPF.
  int status_fd = -1;       // kStatusFd: a pipe's write end, for bwrap's JSON status.
  int zygote_fd = -1;       // kZygoteFd: zygote.py's source.
  int interpreter_fd = -1;  // kInterpreterFd: the interpreter's binary.
};

// The launch of a pool slot, a sandbox whose program is the zygote that
// forks each run (zygote.py, started with `zygote_settings`):
//
//   args    BwrapSandboxArgs; a size-capped tmpfs at /sandbox; zygote.py
//           and an execute-only copy of the interpreter bound from their
//           fds; "--remount-ro /"; the working directory /; only
//           SandboxEnv({}) in the environment; the seccomp filter and the
//           JSON status on their fds; bwrap's --as-pid-1; then the
//           interpreter, isolated (-I -B), running zygote.py.
//   fds     `fds`, at the descriptors ZygoteSlotFds names.
//   limits  ProgramLimits but RLIMIT_FSIZE (the zygote sets it in each
//           program: bwrap writes the interpreter's copy under these); as
//           root, RLIMIT_NPROC of max_processes.
//   uid     unset: the caller leases one when root (UidLease).
//
// Starts nothing; reads the host's file system as BwrapSandboxArgs does.
BwrapLaunch ZygoteSlotLaunch(const SandboxOptions& options, const ZygoteSlotFds& fds,
                             const std::string& zygote_settings, bool as_root);

// Forks, prepares the child (new session, default signals, descriptors,
// rlimits, uid, PDEATHSIG) and execs bwrap; returns its pid once the exec
// succeeded, blocking only until then. The caller owns the child: it reaps
// it (waitpid) and kills it. FAILED_PRECONDITION with what to change when
// bwrap cannot be executed or the uid cannot be taken (the child is reaped);
// INTERNAL for a failed system call or a launch with more than kMaxChildFds
// descriptors or 8 limits. Thread-safe: between fork and exec the child
// makes async-signal-safe calls only.
absl::StatusOr<pid_t> LaunchBwrap(const SandboxOptions& options, const BwrapLaunch& launch);

// Calls LaunchBwrap from one thread that lives as long as this object.
// bwrap's PR_SET_PDEATHSIG (which takes a sandbox down with the server)
// fires when the *thread* that forked it exits, not the process: a pool
// slot started from a caller's thread would die with that thread.
// Thread-safe; launches one at a time, in the order asked.
class BwrapLauncherThread {
 public:
  BwrapLauncherThread();
  // Waits for a launch in progress, then joins the thread.
  ~BwrapLauncherThread();
  BwrapLauncherThread(const BwrapLauncherThread&) = delete;
  BwrapLauncherThread& operator=(const BwrapLauncherThread&) = delete;

  // LaunchBwrap(options, launch) on the thread; blocks until it returned.
  absl::StatusOr<pid_t> Launch(const SandboxOptions& options, const BwrapLaunch& launch)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job;
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // Last: it starts once the rest is made.
};

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

}  // namespace sluice::reward_server::sandbox::internal

#endif  // SLUICE_REWARD_SERVER_SANDBOX_BWRAP_LAUNCH_H_
