#include "tests/test_support.h"

#include <errno.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace sluice::testing {

std::string BinDir() {
  const char* dir = std::getenv("SLUICE_BIN_DIR");
  return dir != nullptr ? dir : "build/bin";
}

std::string MakeTempDir(const std::string& name) {
  const std::string info = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("sluice-" + std::to_string(getpid()) + "-" + info + "-" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

absl::StatusOr<std::unique_ptr<TmpfsMount>> TmpfsMount::Mount(const std::string& dir,
                                                              int64_t size_bytes) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  const std::string options = absl::StrCat("size=", size_bytes);
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) {
    const int mount_error = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot mount a tmpfs (", options, ") on ", dir, ": ", std::strerror(mount_error),
        "; that needs root (CAP_SYS_ADMIN), and this process has euid ", ::geteuid()));
  }
  return std::unique_ptr<TmpfsMount>(new TmpfsMount(dir));
}

TmpfsMount::~TmpfsMount() { ::umount2(dir_.c_str(), MNT_DETACH); }

int64_t TmpfsMount::FreeBytes() const {
  struct statvfs stats;
  if (::statvfs(dir_.c_str(), &stats) != 0) return -1;
  return static_cast<int64_t>(stats.f_bavail) * static_cast<int64_t>(stats.f_frsize);
}

void SkipOrFailWithoutRoot(const absl::Status& mount_status, const std::string& why) {
  if (std::getenv("SLUICE_REQUIRE_ROOT") != nullptr) {
    ADD_FAILURE() << "SLUICE_REQUIRE_ROOT is set but this test of " << why
                  << " cannot run: " << mount_status;
    return;
  }
  GTEST_SKIP() << "needs root for " << why
               << " (set SLUICE_REQUIRE_ROOT to fail instead): " << mount_status;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool WaitForPidExit(pid_t pid, absl::Time deadline) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  bool exited = false;
  while (true) {
    struct pollfd p = {fd, POLLIN, 0};
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    const int n = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left)));
    if (n < 0 && errno == EINTR) continue;
    exited = n > 0;
    break;
  }
  close(fd);
  return exited;
}

v1::Run AwaitRun(v1::ControllerService::StubInterface& controller, const std::string& run_id,
                 const std::function<bool(const v1::Run&)>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::Run last;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::WatchRunRequest request;
    request.set_run_id(run_id);
    request.set_min_interval_ms(100);
    std::unique_ptr<grpc::ClientReaderInterface<v1::RunUpdate>> reader =
        controller.WatchRun(&context, request);
    v1::RunUpdate update;
    while (reader->Read(&update)) {
      last = update.run();
      if (done(last)) {
        context.TryCancel();
        reader->Finish().IgnoreError();
        return last;
      }
    }
    reader->Finish().IgnoreError();
    if (RunEnded(last)) return last;  // It will not change any more.
    absl::SleepFor(absl::Milliseconds(200));  // The controller cannot be reached; again.
  }
  return last;
}

bool RunEnded(const v1::Run& run) {
  return run.state() == v1::RUN_STATE_SUCCEEDED || run.state() == v1::RUN_STATE_FAILED ||
         run.state() == v1::RUN_STATE_CANCELLED;
}

double MetricSum(const std::string& text, const std::string& prefix) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    double value = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) sum += value;
  }
  return sum;
}

}  // namespace sluice::testing
