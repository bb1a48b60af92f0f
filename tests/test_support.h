#ifndef SLUICE_TESTS_TEST_SUPPORT_H_
#define SLUICE_TESTS_TEST_SUPPORT_H_

#include <sys/types.h>

#include <string>

#include "absl/time/time.h"

namespace sluice::testing {

// Directory of the built binaries: $SLUICE_BIN_DIR (set by ctest).
std::string BinDir();

// A fresh empty directory under the test's temporary directory.
std::string MakeTempDir(const std::string& name);

std::string ReadFile(const std::string& path);

// Blocks until process `pid` (not necessarily our child) has exited, through
// a pidfd; false when it is still alive at `deadline`.
bool WaitForPidExit(pid_t pid, absl::Time deadline);

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TEST_SUPPORT_H_
