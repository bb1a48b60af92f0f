#ifndef SLUICE_TESTS_TEST_SUPPORT_H_
#define SLUICE_TESTS_TEST_SUPPORT_H_

#include <sys/types.h>

#include <functional>
#include <string>

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

// Sum of the samples in Prometheus text `text` whose line starts with
// `prefix` (a metric name, optionally with the start of its labels).
double MetricSum(const std::string& text, const std::string& prefix);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TEST_SUPPORT_H_
