#ifndef SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_H_
#define SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::reward_server::sandbox {

// Runs an untrusted program (model-written code) under bubblewrap (bwrap),
// with limits, and captures what it printed and how it ended.
//
// How a run is built (Sandbox::Run):
//
//   server thread ── fork ──> child: setsid; fds 0-4 (+ data fds) in place,
//        |                    every other fd closed; rlimits; when the server
//        |                    is root, setresuid to a per-run uid; PDEATHSIG;
//        |                    exec bwrap
//        |                       └── bwrap: new user, pid, net, mount, ipc,
//        |                           uts, cgroup namespaces; read-only /usr,
//        |                           /lib*, /bin, a few /etc files; private
//        |                           size-capped tmpfs /tmp and /dev/shm;
//        |                           /proc of the new pid ns; minimal /dev;
//        |                           seccomp filter; --die-with-parent
//        |                              └── pid 1 (bwrap's reaper)
//        |                                    └── the program (argv)
//        └── poll(stdout, stderr, result pipe, pidfd) until exit or deadline
//
// Threat model. Defended, whatever the program does:
//   - Escaping to the host file system: only the listed read-only paths and
//     the private tmpfs mounts exist; the root is read-only; nothing the
//     program writes survives the run (the tmpfs dies with the mount ns).
//   - Network: a fresh network namespace (no interfaces up) and a seccomp
//     filter refusing every socket family but AF_UNIX.
//   - Other processes: a pid namespace, so kill(-1), kill(getppid()) and
//     /proc reach only the sandbox's own processes; ptrace is denied.
//   - Outliving the run: when the program exits, is killed at the deadline,
//     or the server dies, the pid namespace's init dies and the kernel kills
//     everything in the namespace (daemons, double forks, setsid included).
//     Run returns only after the namespace is empty.
//   - Exhausting the host: RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE,
//     RLIMIT_NOFILE, RLIMIT_NPROC (see max_processes), size-capped tmpfs,
//     output drained as it comes (a flood never blocks nor grows the
//     server beyond output_bytes_kept per stream) and killed beyond
//     max_output_bytes; the wall-clock deadline kills the whole group.
//   - Reading the server's secrets: the program runs as an unprivileged uid
//     (never as root, see uid_base) and sees only the read-only paths.
// Not defended: kernel exploits through the allowed system calls (the
// filter is a deny list); CPU and memory bandwidth contention with the
// server (no cgroup); the host's /usr and selected /etc being readable;
// timing side channels.
//
// Requirements: Linux >= 5.3 (pidfd), bwrap 0.8 (Debian 12; --size), and user
// namespaces usable by an unprivileged uid (Debian 12 allows them by
// default). CheckAvailable() says what to change when they are not.
struct SandboxOptions {
  // bubblewrap; "apt-get install bubblewrap".
  std::string bwrap_path = "/usr/bin/bwrap";
  // Host paths visible read-only at the same place in the sandbox. A path
  // that is a symlink on the host (Debian's merged /bin -> usr/bin) becomes
  // the same symlink; a missing path is skipped.
  std::vector<std::string> read_only_paths = {
      "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
      // What the dynamic loader and Python read from /etc; not all of it.
      "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
      "/etc/alternatives", "/etc/python3", "/etc/python3.11",
  };
  // util-linux prlimit, used inside the sandbox to apply RLIMIT_NPROC when
  // the server is not root (see max_processes). Unused when root.
  std::string prlimit_path = "/usr/bin/prlimit";

  // RLIMIT_AS of every sandboxed process (and of bwrap).
  uint64_t address_space_bytes = uint64_t{1} << 30;
  // RLIMIT_CPU of every sandboxed process, per process: SIGXCPU at this
  // many seconds, SIGKILL one second later. Each run also caps it at its
  // wall-clock budget plus one second.
  absl::Duration cpu_time = absl::Seconds(60);
  // Tasks (processes and threads) the sandbox may hold at once, bwrap's two
  // included. RLIMIT_NPROC counts tasks per uid: as root, each run gets a
  // uid of its own (uid_base...), so the limit holds in the host's user
  // namespace too; as non-root, RLIMIT_NPROC is applied inside the
  // sandbox's user namespace only (through prlimit), because in the host's
  // it would count every process of the server's uid.
  int max_processes = 32;
  // RLIMIT_FSIZE: the largest file a program may write.
  uint64_t max_file_bytes = uint64_t{16} << 20;
  // RLIMIT_NOFILE.
  int max_open_files = 64;
  // Size of each of the private tmpfs mounts (/tmp, /dev/shm); their pages
  // count against the server's memory (cgroup), not the program's RLIMIT_AS.
  uint64_t tmpfs_bytes = uint64_t{64} << 20;
  // Bytes of stdout and of stderr kept in the result (the beginning of
  // stdout, the end of stderr, where a traceback is); the rest is read and
  // dropped.
  size_t output_bytes_kept = 64 << 10;
  // Total bytes the program may write to stdout and stderr together before
  // it is killed (kOutputLimit). 0 = no limit (read and drop forever).
  uint64_t max_output_bytes = uint64_t{16} << 20;
  // When the server runs as root, each concurrent run takes a uid (and gid)
  // from [uid_base, uid_base + uid_count) for its processes. Pick a range
  // that no account or /etc/subuid range of the host uses.
  uint32_t uid_base = 990000;
  int uid_count = 1024;
  // Root-only directory (created 0700) of one lock file per uid in use, so
  // that server processes sharing a uid range never run two sandboxes as
  // the same uid at once.
  std::string uid_lock_dir = "/run/sluice-sandbox";

  // INVALID_ARGUMENT naming the field: paths absolute, limits > 0,
  // uid range within [1, 2^32 - 2).
  absl::Status Validate() const;
};

// A file placed read-only in the sandbox before the program starts.
struct SandboxFile {
  std::string path;  // Absolute path inside the sandbox, e.g. "/sandbox/main.py".
  std::string contents;
};

// One program to run.
struct SandboxRequest {
  // argv[0] is the executable's absolute path inside the sandbox (no PATH
  // search); it must lie under one of read_only_paths or be one of files.
  std::vector<std::string> argv;
  std::vector<SandboxFile> files;
  // Environment of the program (the server's is not passed on). PATH,
  // HOME=/tmp, TMPDIR=/tmp and LANG=C.UTF-8 unless given here.
  std::vector<std::pair<std::string, std::string>> env;
  // Readable by the program on fd kSecretFd, then end of file. A program
  // that reads it shows it has started (so a failure before that is blamed
  // on the sandbox set-up, see SandboxResult::started); a program that does
  // not read it still runs.
  std::string secret;
  // The run is killed at this time (kDeadline). Required: Run refuses an
  // infinite deadline.
  absl::Time deadline = absl::InfiniteFuture();
};

// The program's descriptors, besides 0 (/dev/null), 1 and 2 (pipes).
inline constexpr int kSecretFd = 3;  // Read end holding SandboxRequest::secret.
inline constexpr int kResultFd = 4;  // Write end; its bytes become result.

enum class Termination {
  kExited,       // exit_code is the program's exit status.
  kSignaled,     // signal killed the program (SIGXCPU: CPU limit).
  kDeadline,     // Run killed it at the deadline.
  kOutputLimit,  // Run killed it for writing more than max_output_bytes.
};

struct SandboxResult {
  Termination termination = Termination::kExited;
  int exit_code = 0;
  int signal = 0;
  // Whether the program read the secret to its end (see SandboxRequest).
  bool started = false;
  std::string stdout_text;  // The first output_bytes_kept bytes.
  std::string stderr_text;  // The last output_bytes_kept bytes.
  uint64_t stdout_bytes = 0;  // Written in all.
  uint64_t stderr_bytes = 0;
  std::string result;  // What the program wrote to kResultFd (first 4 KiB).
  absl::Duration wall_time;
};

// What runs programs in a sandbox: a fresh sandbox per run (Sandbox) or a
// pool of prepared ones (SandboxPool, sandbox_pool.h). Both keep the same
// promises (the threat model above) and answer the same way.
class SandboxRunner {
 public:
  virtual ~SandboxRunner() = default;

  // Runs `request` to completion and returns how it ended; blocks until
  // then, and at most until shortly after the deadline (killing is
  // immediate; the kernel empties the namespace in milliseconds). When it
  // returns, no process of the run is left and its files are gone.
  //
  // Errors (the infrastructure's, never the program's): INVALID_ARGUMENT
  // for a bad request; FAILED_PRECONDITION when bwrap cannot be executed or
  // cannot set the sandbox up (the message quotes bwrap and says what to
  // change); RESOURCE_EXHAUSTED when, as root, every uid of the range is
  // taken (or, for a pool, no slot came free before the deadline); INTERNAL
  // for a failed system call in the server.
  virtual absl::StatusOr<SandboxResult> Run(const SandboxRequest& request) const = 0;

  // Runs `argv` (a trivial program) in the sandbox and returns OK when it
  // exits 0, else FAILED_PRECONDITION with an actionable message (what bwrap
  // said and what to change). For start-up checks; takes a few ms.
  absl::Status CheckAvailable(std::vector<std::string> argv = {"/usr/bin/true"}) const;
};

// A fresh sandbox for every run: bwrap sets up the namespaces and mounts
// (about 25 ms) and the program starts from scratch.
//
// Thread-safe: Run may be called from many threads at once; each run is
// independent (own namespaces, own uid when root).
class Sandbox final : public SandboxRunner {
 public:
  // INVALID_ARGUMENT for invalid options; INTERNAL when the seccomp filter
  // cannot be built. Does not check that bwrap works (CheckAvailable).
  static absl::StatusOr<std::unique_ptr<Sandbox>> Create(SandboxOptions options);

  const SandboxOptions& options() const { return options_; }

  absl::StatusOr<SandboxResult> Run(const SandboxRequest& request) const override;

 private:
  Sandbox(SandboxOptions options, std::string seccomp_bpf)
      : options_(std::move(options)), seccomp_bpf_(std::move(seccomp_bpf)) {}

  const SandboxOptions options_;
  const std::string seccomp_bpf_;
};

// A hint for the operator when bwrap's error message `bwrap_stderr` says
// namespaces are refused; empty when it does not recognise the message.
std::string SandboxSetupHint(const std::string& bwrap_stderr);

}  // namespace sluice::reward_server::sandbox

#endif  // SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_H_
