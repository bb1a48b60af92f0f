#include "reward_server/sandbox/bwrap_launch.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::reward_server::sandbox::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Pair;

// A fresh directory under the test's temporary directory, removed with
// everything in it when this goes out of scope.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& name)
      : path_(absl::StrCat(::testing::TempDir(), "/bwrap_launch_test_", getpid(), "_", name)) {
    EXPECT_EQ(mkdir(path_.c_str(), 0700), 0) << path_;
  }
  ~ScopedTempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  const std::string path_;
};

// Whether `args` holds `sequence` as consecutive elements.
bool HasSequence(const std::vector<std::string>& args, const std::vector<std::string>& sequence) {
  return std::search(args.begin(), args.end(), sequence.begin(), sequence.end()) != args.end();
}

// The (resource, soft, hard) triples of `launch`, comparable in assertions.
std::vector<std::pair<int, std::pair<rlim_t, rlim_t>>> Limits(const BwrapLaunch& launch) {
  std::vector<std::pair<int, std::pair<rlim_t, rlim_t>>> limits;
  for (const auto& [resource, limit] : launch.limits) {
    limits.push_back({resource, {limit.rlim_cur, limit.rlim_max}});
  }
  return limits;
}

SandboxOptions OptionsWithoutHostPaths() {
  SandboxOptions options;
  options.read_only_paths.clear();  // What is bound from the host is tested apart.
  return options;
}

TEST(BwrapSandboxArgsTest, BindsDirectoriesRecreatesSymlinksAndSkipsMissingPaths) {
  const ScopedTempDir temp("paths");
  const std::string& dir = temp.path();
  const std::string bound = dir + "/bound";
  const std::string link = dir + "/link";
  ASSERT_EQ(mkdir(bound.c_str(), 0700), 0);
  ASSERT_EQ(symlink("usr/bin", link.c_str()), 0);
  SandboxOptions options;
  options.tmpfs_bytes = 8192;
  options.read_only_paths = {bound, link, dir + "/missing"};

  const std::vector<std::string> args = BwrapSandboxArgs(options);

  ASSERT_FALSE(args.empty());
  EXPECT_EQ(args[0], options.bwrap_path);
  for (const char* flag : {"--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
                           "--unshare-uts", "--die-with-parent", "--new-session"}) {
    EXPECT_TRUE(HasSequence(args, {flag})) << flag;
  }
  EXPECT_TRUE(HasSequence(args, {"--cap-drop", "ALL"}));
  EXPECT_TRUE(HasSequence(args, {"--ro-bind", bound, bound}));
  EXPECT_TRUE(HasSequence(args, {"--symlink", "usr/bin", link}));
  EXPECT_FALSE(HasSequence(args, {dir + "/missing"}));
  EXPECT_TRUE(HasSequence(args, {"--size", "8192", "--tmpfs", "/tmp"}));
  EXPECT_TRUE(HasSequence(args, {"--size", "8192", "--tmpfs", "/dev/shm"}));
  EXPECT_THAT(std::vector<std::string>(args.end() - 2, args.end()),
              ElementsAre("--remount-ro", "/dev"));
}

TEST(SandboxEnvTest, OverridesReplaceDefaultsInPlaceAndNewKeysFollow) {
  EXPECT_THAT(
      SandboxEnv({{"HOME", "/home/x"}, {"PYTHONHASHSEED", "0"}}),
      ElementsAre(Pair("PATH", "/usr/local/bin:/usr/bin:/bin"), Pair("HOME", "/home/x"),
                  Pair("TMPDIR", "/tmp"), Pair("LANG", "C.UTF-8"), Pair("PYTHONHASHSEED", "0")));
}

TEST(RunCpuSecondsTest, IsTheShorterOfCpuTimeAndTheWallBudgetPlusOneSecond) {
  SandboxOptions options;
  options.cpu_time = absl::Seconds(60);
  const absl::Time start = absl::FromUnixSeconds(1000);
  EXPECT_EQ(RunCpuSeconds(options, absl::InfiniteFuture(), start), 60);
  EXPECT_EQ(RunCpuSeconds(options, start + absl::Seconds(100), start), 60);
  EXPECT_EQ(RunCpuSeconds(options, start + absl::Milliseconds(2500), start), 4);  // ceil + 1
  EXPECT_EQ(RunCpuSeconds(options, start - absl::Seconds(5), start), 1);          // Never below 1.
}

TEST(FreshSandboxLaunchTest, AsNonRootRunsTheProgramUnderPrlimitWithItsFilesAndEnvironment) {
  const SandboxOptions options = OptionsWithoutHostPaths();
  SandboxRequest request;
  request.argv = {"/usr/bin/python3", "/sandbox/main.py"};
  request.files = {{"/sandbox/main.py", "print(1)"}, {"/sandbox/data.txt", "x"}};
  request.env = {{"LANG", "C"}};
  const absl::Time start = absl::FromUnixSeconds(1000);
  request.deadline = start + absl::Seconds(10);
  FreshSandboxFds fds;
  fds.stdin_fd = 100;
  fds.stdout_fd = 101;
  fds.stderr_fd = 102;
  fds.secret_fd = 103;
  fds.result_fd = 104;
  fds.seccomp_fd = 105;
  fds.status_fd = 106;
  fds.file_fds = {107, 108};

  const BwrapLaunch launch = FreshSandboxLaunch(options, request, fds, /*as_root=*/false, start);

  // BwrapSandboxArgs, then these, in this order.
  const std::vector<std::vector<std::string>> groups = {
      {"--ro-bind-data", "7", "/sandbox/main.py"},
      {"--ro-bind-data", "8", "/sandbox/data.txt"},
      {"--remount-ro", "/", "--chdir", "/tmp", "--clearenv"},
      {"--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"},
      {"--setenv", "HOME", "/tmp"},
      {"--setenv", "TMPDIR", "/tmp"},
      {"--setenv", "LANG", "C"},
      {"--seccomp", "5", "--json-status-fd", "6", "--"},
      {options.prlimit_path, "--nproc=32", "--"},
      {"/usr/bin/python3", "/sandbox/main.py"},
  };
  std::vector<std::string> expected = BwrapSandboxArgs(options);
  for (const auto& group : groups) expected.insert(expected.end(), group.begin(), group.end());
  EXPECT_THAT(launch.args, ElementsAreArray(expected));
  // Each descriptor lands where sandbox.h and bwrap_launch.h say.
  ASSERT_EQ(launch.fds.size(), 9u);
  EXPECT_EQ(launch.fds[kStdinFd], 100);
  EXPECT_EQ(launch.fds[kStdoutFd], 101);
  EXPECT_EQ(launch.fds[kStderrFd], 102);
  EXPECT_EQ(launch.fds[kSecretFd], 103);
  EXPECT_EQ(launch.fds[kResultFd], 104);
  EXPECT_EQ(launch.fds[kSeccompFd], 105);
  EXPECT_EQ(launch.fds[kStatusFd], 106);
  EXPECT_EQ(launch.fds[kFirstFileFd], 107);
  EXPECT_EQ(launch.fds[kFirstFileFd + 1], 108);
  // RLIMIT_NPROC only inside the user namespace (prlimit), not on bwrap.
  const rlim_t address_space = options.address_space_bytes;
  const rlim_t file_bytes = options.max_file_bytes;
  EXPECT_THAT(Limits(launch), ElementsAre(Pair(RLIMIT_AS, Pair(address_space, address_space)),
                                          Pair(RLIMIT_FSIZE, Pair(file_bytes, file_bytes)),
                                          Pair(RLIMIT_NOFILE, Pair(rlim_t{64}, rlim_t{64})),
                                          Pair(RLIMIT_CORE, Pair(rlim_t{0}, rlim_t{0})),
                                          Pair(RLIMIT_CPU, Pair(rlim_t{11}, rlim_t{12}))));
  EXPECT_FALSE(launch.uid.has_value());
}

TEST(FreshSandboxLaunchTest, AsRootLimitsTasksOnBwrapAndRunsTheProgramDirectly) {
  SandboxOptions options = OptionsWithoutHostPaths();
  options.max_processes = 7;
  SandboxRequest request;
  request.argv = {"/usr/bin/true"};
  const absl::Time start = absl::FromUnixSeconds(1000);
  request.deadline = start + absl::Seconds(1000);

  const BwrapLaunch launch =
      FreshSandboxLaunch(options, request, FreshSandboxFds(), /*as_root=*/true, start);

  EXPECT_THAT(std::vector<std::string>(launch.args.end() - 3, launch.args.end()),
              ElementsAre("6", "--", "/usr/bin/true"));  // "--json-status-fd", "6", ...
  EXPECT_FALSE(HasSequence(launch.args, {options.prlimit_path}));
  EXPECT_EQ(launch.fds.size(), static_cast<size_t>(kFirstFileFd));
  const std::vector<std::pair<int, std::pair<rlim_t, rlim_t>>> limits = Limits(launch);
  ASSERT_EQ(limits.size(), 6u);
  EXPECT_THAT(limits[4],
              Pair(RLIMIT_CPU, Pair(rlim_t{60}, rlim_t{61})));  // cpu_time: shorter than the wall.
  EXPECT_THAT(limits[5], Pair(RLIMIT_NPROC, Pair(rlim_t{7}, rlim_t{7})));
}

TEST(ZygoteSlotLaunchTest, RunsTheZygoteFromItsOwnCopiesWithTheSlotsDescriptorsInPlace) {
  SandboxOptions options = OptionsWithoutHostPaths();
  options.max_processes = 9;
  const ZygoteSlotFds fds{.dev_null = 20,
                          .log_fd = 21,
                          .control_fd = 22,
                          .seccomp_fd = 23,
                          .status_fd = 24,
                          .zygote_fd = 25,
                          .interpreter_fd = 26};

  const BwrapLaunch launch = ZygoteSlotLaunch(options, fds, "{\"x\":1}", /*as_root=*/false);

  EXPECT_TRUE(HasSequence(launch.args, {"--tmpfs", "/sandbox"}));
  EXPECT_TRUE(HasSequence(launch.args, {"--ro-bind-data", "7", "/sluice/zygote.py"}));
  EXPECT_TRUE(
      HasSequence(launch.args, {"--perms", "0111", "--ro-bind-data", "8", "/sluice/python3"}));
  EXPECT_TRUE(HasSequence(launch.args, {"--remount-ro", "/", "--chdir", "/", "--clearenv"}));
  EXPECT_THAT(std::vector<std::string>(launch.args.end() - 7, launch.args.end()),
              ElementsAre("--as-pid-1", "--", "/sluice/python3", "-I", "-B", "/sluice/zygote.py",
                          "{\"x\":1}"));
  EXPECT_THAT(launch.fds, ElementsAre(20, 21, 21, 22, 20, 23, 24, 25, 26));
  // The program's file size limit is the zygote's to set, in each child.
  for (const auto& [resource, limit] : Limits(launch)) EXPECT_NE(resource, RLIMIT_FSIZE);
  EXPECT_FALSE(launch.uid.has_value());

  const BwrapLaunch as_root = ZygoteSlotLaunch(options, fds, "{}", /*as_root=*/true);
  EXPECT_THAT(Limits(as_root).back(), Pair(RLIMIT_NPROC, Pair(rlim_t{9}, rlim_t{9})));
}

// A child whose exec fails is forked from the launcher's thread; the caller
// gets LaunchBwrap's answer, and launches from several threads are each
// answered.
TEST(BwrapLauncherThreadTest, LaunchesOnItsThreadAndAnswersEveryCaller) {
  SandboxOptions options;
  options.bwrap_path = "/nonexistent/sluice-test/bwrap";
  BwrapLaunch launch;
  launch.args = {options.bwrap_path};
  BwrapLauncherThread launcher;
  std::vector<std::thread> callers;
  std::vector<absl::Status> results(4);
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&, i] { results[i] = launcher.Launch(options, launch).status(); });
  }
  for (std::thread& caller : callers) caller.join();
  for (const absl::Status& result : results) {
    EXPECT_EQ(result.code(), absl::StatusCode::kFailedPrecondition) << result;
    EXPECT_THAT(result.message(), HasSubstr("cannot execute bwrap at " + options.bwrap_path));
  }
}

TEST(LaunchBwrapTest, RefusesMoreDescriptorsThanTheChildCanPlace) {
  BwrapLaunch launch;
  launch.args = {"/usr/bin/bwrap"};
  launch.fds.assign(kMaxChildFds + 1, 0);
  absl::StatusOr<pid_t> pid = LaunchBwrap(SandboxOptions(), launch);
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kInternal) << pid.status();
}

// Forks a child whose exec fails; no sandbox is made.
TEST(LaunchBwrapTest, AMissingBwrapIsAFailedPreconditionSayingWhatToInstall) {
  SandboxOptions options;
  options.bwrap_path = "/nonexistent/sluice-test/bwrap";
  BwrapLaunch launch;
  launch.args = {options.bwrap_path};
  absl::StatusOr<pid_t> pid = LaunchBwrap(options, launch);
  ASSERT_EQ(pid.status().code(), absl::StatusCode::kFailedPrecondition) << pid.status();
  EXPECT_THAT(pid.status().message(), HasSubstr("cannot execute bwrap at " + options.bwrap_path));
  EXPECT_THAT(pid.status().message(), HasSubstr("apt-get install bubblewrap"));
}

TEST(UidLeaseTest, ConcurrentLeasesTakeDistinctUidsOfTheRangeAndReturnThem) {
  SandboxOptions options;
  options.uid_base = 991000;
  options.uid_count = 2;
  const ScopedTempDir lock_dir("uid_locks");
  options.uid_lock_dir = lock_dir.path();
  for (int round = 0; round < 2; ++round) {  // The second round reuses the returned uids.
    absl::StatusOr<std::unique_ptr<UidLease>> first = UidLease::Acquire(options);
    absl::StatusOr<std::unique_ptr<UidLease>> second = UidLease::Acquire(options);
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_NE((*first)->uid(), (*second)->uid());
    for (const auto* lease : {&*first, &*second}) {
      EXPECT_GE((*lease)->uid(), options.uid_base);
      EXPECT_LT((*lease)->uid(), options.uid_base + 2);
    }
  }
}

}  // namespace
}  // namespace sluice::reward_server::sandbox::internal
