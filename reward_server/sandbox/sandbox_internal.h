#ifndef SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_INTERNAL_H_
#define SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_INTERNAL_H_

// What the per-run sandbox (sandbox.cc), the pool (sandbox_pool.cc) and
// bwrap's launch (bwrap_launch.h) share: descriptors, pipes, pidfds, output
// streams. Not an API: only the files of sandbox/ include it.

#include <errno.h>
#include <sys/types.h>
#include <unistd.h>

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

}  // namespace sluice::reward_server::sandbox::internal

#endif  // SLUICE_REWARD_SERVER_SANDBOX_SANDBOX_INTERNAL_H_
