#ifndef SLUICE_CLI_STATE_DIR_H_
#define SLUICE_CLI_STATE_DIR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::cli {

// Who owns a `sluice up` state directory, and what a dead owner left in it.
//
// One `sluice up` per state directory: two would share endpoints.json, the
// logs and the replay buffer's data directory. The owner holds an flock(2)
// on <state_dir>/sluice-up.lock, which also holds its pid for the error
// message. The kernel drops the lock when the owner dies in any way
// (kill -9 included), so a lock is never stale and no pid is ever guessed
// at; only endpoints.json can be stale, and ReplaceStaleEndpoints handles it.
class StateDirLock {
 public:
  // Takes the lock of `state_dir` (which must exist) for this process and
  // writes our pid into it; never blocks. FAILED_PRECONDITION naming the
  // holder's pid when another live process holds it. The descriptor is
  // close-on-exec: children never inherit the lock.
  static absl::StatusOr<std::unique_ptr<StateDirLock>> Acquire(const std::string& state_dir);

  // Releases the lock (the file stays, with the last owner's pid).
  ~StateDirLock();
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  StateDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_;
};

// Deals with an endpoints.json at `path` left by a `sluice up` that is gone
// (call it only while holding the StateDirLock, so its writer is known to be
// dead). Every service it names that is still running as the binary it
// names (it was orphaned, and is draining after the SIGTERM its dead parent
// left it) is stopped: SIGTERM, then SIGKILL after `stop_grace`, so it lets
// go of its port and data directory. A pid now running something else is
// left alone. Then the file is removed.
//
// Returns what it found and did, one line each, for the console; empty when
// there was no file. Blocks until the leftovers are gone (at most about
// stop_grace). An error only when the file cannot be removed.
absl::StatusOr<std::string> ReplaceStaleEndpoints(const std::string& path,
                                                  absl::Duration stop_grace);

// "sluice-rollout-worker" for "rollout_worker" (the kind of service).
std::string BinaryFor(const std::string& kind);

// "rollout_worker" for "rollout_worker-1"; other names are their own kind.
std::string KindOf(const std::string& service_name);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_STATE_DIR_H_
