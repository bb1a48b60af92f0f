#ifndef SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_POOL_H_
#define SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_POOL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "reward_server/sandbox/sandbox.h"

namespace sluice::reward_server::sandbox {

namespace internal {
class BwrapLauncherThread;  // bwrap_launch.h
}  // namespace internal

struct SandboxPoolOptions {
  // Programs run at once; one prepared sandbox (a slot) each. Give it the
  // number of threads that call Run (the reward server's --workers).
  int slots = 2;
  // The warm interpreter each slot keeps: a request whose argv is this path
  // in isolated mode (-I, optionally -B -E -s) with a script or -c runs in a
  // fork of it; any other argv is exec()ed in the slot. It must lie under one
  // of SandboxOptions::read_only_paths.
  std::string python_path = "/usr/bin/python3";
  // Modules the warm interpreter imports once, so that programs find them
  // loaded (what `import typing` costs a fresh python3 is most of a short
  // program's run). Each program still gets its own copy of them.
  std::vector<std::string> preload_modules = {
      "abc",     "bisect",  "collections", "copy",   "dataclasses", "decimal", "enum",
      "fractions", "functools", "hashlib", "heapq", "itertools", "json",  "math",
      "operator", "random", "re",          "string", "typing",
  };
  // A slot is replaced by a fresh one after this many programs, whatever
  // its checks say (defence in depth against state we do not know to check).
  int max_runs_per_slot = 10000;
  // How long a slot may take to start (bwrap, then the interpreter and its
  // preloads) before the start is an error.
  absl::Duration start_timeout = absl::Seconds(30);

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// The pool's counters since it was created, and its slots now.
struct SandboxPoolStats {
  int slots = 0;    // Configured.
  int live = 0;     // Started and not yet torn down.
  int busy = 0;     // Running a program (or being started for one).
  int waiting = 0;  // Run calls waiting for a free slot.
  uint64_t runs = 0;
  uint64_t slots_started = 0;
  // Slots torn down and replaced on schedule: "dirty" (the check between
  // programs found something left behind) or "max_runs".
  uint64_t recycled = 0;
  std::map<std::string, uint64_t> recycled_by_reason;
  // Slots killed mid-run: "deadline", "output_limit", "unresponsive" (no
  // answer from the slot after the program), "died" (the slot ended on its
  // own), "protocol" (it said something unexpected).
  uint64_t killed = 0;
  std::map<std::string, uint64_t> killed_by_reason;
  // Mean wall time of the runs that ended normally, for a retry hint.
  absl::Duration mean_run_time;
};

// Runs programs in prepared sandboxes: the namespaces, mounts and seccomp
// filter are made once per slot, and each program is a fork of a warm Python
// interpreter (the slot's zygote) instead of a new bwrap and a new python3.
// Same contract and threat model as Sandbox (sandbox.h), plus:
//
//   One slot = one bwrap sandbox (user, pid, net, mount, ipc, uts, cgroup
//   namespaces; read-only host paths; private size-capped /tmp, /dev/shm and
//   /sandbox; seccomp) whose pid 1 is the zygote (zygote.py). For a run, the
//   zygote writes the request's files under /sandbox, forks, and the child
//   sets up descriptors 0-4, rlimits (CPU from the deadline, processes),
//   environment and signal dispositions, then runs the program. When the
//   program has exited, the zygote kills every other process in the
//   namespace (it is init: orphans are its own to reap), empties /tmp,
//   /dev/shm and /sandbox, checks that no process and no System V IPC object
//   is left, and only then reports the run done.
//
//   What one program can leave for the next one in its slot, and why it
//   cannot: files (the writable directories are emptied and checked);
//   processes (killed and reaped; /proc is checked); environment, signal
//   handlers, rlimits, modules and builtins (they change in the child's own
//   copy of the interpreter; the zygote's are untouched); the zygote itself
//   (pid 1 ignores signals from inside its namespace, it is not dumpable so
//   /proc/1/mem and /proc/1/fd are closed, ptrace and process_vm_* are
//   denied by seccomp, and its socket to the server is closed before the
//   program runs); System V IPC (checked; a slot with any is replaced) and
//   POSIX message queues (denied by seccomp). A check that fails replaces
//   the slot. Not isolated across programs of one slot: the interpreter's
//   hash seed and the preloaded modules' import-time state (both fixed when
//   the slot starts, and no program's doing).
//
//   A program past its deadline or its output limit, or a slot that does
//   not answer, has its whole slot killed (the kernel empties the
//   namespace); a fresh slot is started for the next run that needs it.
//
// Thread-safe: up to `slots` runs at once; more wait for a free slot until
// their deadline (then RESOURCE_EXHAUSTED). Destroy only when no Run is in
// progress; the destructor kills every slot.
class SandboxPool final : public SandboxRunner {
 public:
  // INVALID_ARGUMENT for invalid options; INTERNAL when the seccomp filter
  // cannot be built. Starts no slot (Warm, or the first runs do).
  static absl::StatusOr<std::unique_ptr<SandboxPool>> Create(SandboxOptions options,
                                                             SandboxPoolOptions pool_options);
  ~SandboxPool() override;

  SandboxPool(const SandboxPool&) = delete;
  SandboxPool& operator=(const SandboxPool&) = delete;

  absl::StatusOr<SandboxResult> Run(const SandboxRequest& request) const override;

  // Starts every slot that is not running, so that the first programs do
  // not pay for it. The first error, with what to change.
  absl::Status Warm() const;

  const SandboxOptions& options() const { return options_; }
  const SandboxPoolOptions& pool_options() const { return pool_options_; }
  SandboxPoolStats GetStats() const;
  // Blocks until at least `busy` slots are busy (taken by Run calls, their
  // programs starting or running); false if that has not happened within
  // `timeout`. For tests that need the pool full before they go on, without
  // guessing how long a slot takes to be taken.
  bool AwaitBusy(int busy, absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  // Host pids of the live slots' zygotes (pid 1 of each slot's namespace):
  // every process of a slot is in that process's pid namespace. For tests.
  std::vector<pid_t> ZygotePids() const;

 private:
  struct Slot;
  struct Outcome;

  SandboxPool(SandboxOptions options, SandboxPoolOptions pool_options, std::string seccomp_bpf);

  // Takes a free slot (live ones first), waiting until `deadline`.
  Slot* Acquire(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);
  void Release(Slot* slot) const ABSL_LOCKS_EXCLUDED(mu_);
  // On a slot the caller holds (busy).
  absl::Status Start(Slot& slot) const;
  void Kill(Slot& slot) const;
  bool Alive(const Slot& slot) const;
  absl::StatusOr<SandboxResult> RunOn(Slot& slot, const SandboxRequest& request, absl::Time start,
                                      Outcome& outcome) const;
  enum class SlotEnd { kKilled, kRecycled };
  void Count(SlotEnd end, const std::string& reason) const ABSL_LOCKS_EXCLUDED(mu_);

  const SandboxOptions options_;
  const SandboxPoolOptions pool_options_;
  const std::string seccomp_bpf_;
  const std::string zygote_settings_;
  const std::unique_ptr<internal::BwrapLauncherThread> launcher_;

  mutable absl::Mutex mu_;
  // Fixed size; a slot's fields are its holder's while it is busy.
  std::vector<std::unique_ptr<Slot>> slots_;
  mutable SandboxPoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::reward_server::sandbox

#endif  // SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_POOL_H_
