#ifndef SLUICE_TESTS_TEST_SUPPORT_H_
#define SLUICE_TESTS_TEST_SUPPORT_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/v1/controller.grpc.pb.h"

namespace sluice::testing {

// Directory of the built binaries: $SLUICE_BIN_DIR (set by ctest).
std::string BinDir();

// A fresh empty directory under the test's temporary directory.
std::string MakeTempDir(const std::string& name);

std::string ReadFile(const std::string& path);

// Blocks until process `pid` (not necessarily our child) has exited, through
// a pidfd; false when it is still alive at `deadline`.
bool WaitForPidExit(pid_t pid, absl::Time deadline);

// Follows the run with WatchRun (reopened while the controller cannot be
// reached) until `done` holds for a snapshot or `timeout` passes; returns
// that snapshot, or the last one seen (a default Run if none).
v1::Run AwaitRun(v1::ControllerService::StubInterface& controller, const std::string& run_id,
                 const std::function<bool(const v1::Run&)>& done, absl::Duration timeout);

// The run is SUCCEEDED, FAILED or CANCELLED.
bool RunEnded(const v1::Run& run);

// A small tmpfs mounted on a directory for the life of the object, for tests
// of a full disk: a real file system that says ENOSPC once `size_bytes` are
// used. Mounting needs root (CAP_SYS_ADMIN). A test that uses it skips when
// it cannot mount and SLUICE_REQUIRE_ROOT is unset, and fails naming what is
// missing when it is set (CI runs as root and sets it, so that a full-disk
// test never silently skips there): see SkipOrFailWithoutRoot.
class TmpfsMount {
 public:
  // Creates `dir` and mounts the tmpfs on it. FAILED_PRECONDITION saying
  // what is missing when this process may not mount.
  static absl::StatusOr<std::unique_ptr<TmpfsMount>> Mount(const std::string& dir,
                                                           int64_t size_bytes);
  // Unmounts (lazily, should a process still hold a file there).
  ~TmpfsMount();
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  const std::string& dir() const { return dir_; }
  // Bytes free on it now (statvfs).
  int64_t FreeBytes() const;

 private:
  explicit TmpfsMount(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

// True when the test may go on without root. Otherwise: when
// SLUICE_REQUIRE_ROOT is set, a failure naming `why` and what was missing
// (`mount_status`); when it is not, a skip. Use as
//   if (!mounted.ok()) { SkipOrFailWithoutRoot(mounted.status(), "a full disk"); return; }
// (GTEST_SKIP and FAIL return only from the function they are in).
void SkipOrFailWithoutRoot(const absl::Status& mount_status, const std::string& why);

// Sum of the samples in Prometheus text `text` whose line starts with
// `prefix` (a metric name, optionally with the start of its labels).
double MetricSum(const std::string& text, const std::string& prefix);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TEST_SUPPORT_H_
