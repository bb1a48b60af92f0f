#include "reward_server/sandbox/sandbox.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reward_server/sandbox/sandbox_pool.h"

namespace sluice::reward_server::sandbox {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPython[] = "/usr/bin/python3";

// A token unique to one test run, put in a sandboxed program's argv so that
// its processes can be found (and proven gone) from the host's /proc.
std::string UniqueMarker() {
  absl::BitGen gen;
  return absl::StrCat("sluice-sandbox-test-", getpid(), "-",
                      absl::Uniform<uint64_t>(gen, 0, uint64_t{1} << 62));
}

// All of `fd`'s bytes, or nullopt when a read fails. Reading /proc/PID/*
// of a process that exits between open and read fails with ESRCH; a
// std::ifstream turns that into an exception from its underflow (which
// aborted a run of the fork-bomb test), so /proc is read with plain read().
std::optional<std::string> ReadAllOrNullopt(int fd) {
  std::string text;
  char chunk[4096];
  while (true) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n == 0) return text;
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::nullopt;
    }
    text.append(chunk, static_cast<size_t>(n));
  }
}

// /proc/PID/cmdline, or nullopt when the process is gone (at open or later).
std::optional<std::string> ProcCmdline(absl::string_view pid) {
  const int fd = open(absl::StrCat("/proc/", pid, "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> cmdline = ReadAllOrNullopt(fd);
  close(fd);
  return cmdline;
}

// Host pids whose command line contains `marker`. Processes that exit while
// /proc is scanned are skipped: they are gone, which is what callers check.
std::vector<pid_t> ProcessesWithMarker(const std::string& marker) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    char* end;
    const long pid = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == getpid()) continue;
    const std::optional<std::string> cmdline = ProcCmdline(entry->d_name);
    if (cmdline.has_value() && cmdline->find(marker) != std::string::npos) {
      pids.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(proc);
  return pids;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

// The pid namespace of host process `pid`, or "" when it is gone.
std::string PidNamespace(pid_t pid) {
  char target[256];
  const ssize_t n =
      readlink(absl::StrCat("/proc/", pid, "/ns/pid").c_str(), target, sizeof(target) - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : "";
}

// Host pids of every process in the pid namespace of one of `inits` (a
// pool's zygotes), the inits themselves included when `with_inits`.
std::vector<pid_t> ProcessesInNamespacesOf(const std::vector<pid_t>& inits, bool with_inits) {
  std::vector<std::string> namespaces;
  for (pid_t init : inits) {
    if (std::string ns = PidNamespace(init); !ns.empty()) namespaces.push_back(ns);
  }
  std::vector<pid_t> pids;
  if (namespaces.empty()) return pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    char* end;
    const long pid = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == getpid()) continue;
    if (!with_inits && std::find(inits.begin(), inits.end(), pid) != inits.end()) continue;
    const std::string ns = PidNamespace(static_cast<pid_t>(pid));
    if (std::find(namespaces.begin(), namespaces.end(), ns) != namespaces.end()) {
      pids.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(proc);
  return pids;
}

// Every promise of the sandbox, kept by both runners: a fresh sandbox per run
// (false) and the pool of prepared ones (true).
class SandboxTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { MakeSandbox(SandboxOptions()); }

  bool pooled() const { return GetParam(); }

  void MakeSandbox(SandboxOptions options) {
    pool_ = nullptr;
    sandbox_.reset();
    if (pooled()) {
      SandboxPoolOptions pool_options;
      pool_options.slots = 2;
      absl::StatusOr<std::unique_ptr<SandboxPool>> pool =
          SandboxPool::Create(std::move(options), pool_options);
      ASSERT_TRUE(pool.ok()) << pool.status();
      pool_ = pool->get();
      sandbox_ = *std::move(pool);
    } else {
      absl::StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(std::move(options));
      ASSERT_TRUE(sandbox.ok()) << sandbox.status();
      sandbox_ = *std::move(sandbox);
    }
    // Namespaces must work where the tests run (CI included): fail loudly,
    // with the operator's hint, rather than skip.
    const absl::Status available = sandbox_->CheckAvailable();
    ASSERT_TRUE(available.ok()) << "the sandbox cannot run on this machine: " << available;
  }

  // The run's processes seen from the host: those whose command line holds
  // `marker` and, in a pool, every process in a slot's namespace (forks of
  // the zygote carry its command line, not the program's), the zygotes
  // themselves only when `with_zygotes`.
  std::vector<pid_t> SandboxProcesses(const std::string& marker, bool with_zygotes = false) {
    std::vector<pid_t> pids = ProcessesWithMarker(marker);
    if (pool_ != nullptr) {
      for (pid_t pid : ProcessesInNamespacesOf(pool_->ZygotePids(), with_zygotes)) {
        if (std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
      }
    }
    return pids;
  }

  // Runs Python `source` (as /sandbox/main.py) with `args` after it.
  absl::StatusOr<SandboxResult> RunPython(const std::string& source,
                                          absl::Duration timeout = absl::Seconds(20),
                                          std::vector<std::string> args = {},
                                          std::string secret = "") {
    SandboxRequest request;
    request.argv = {kPython, "-I", "-B", "/sandbox/main.py"};
    request.argv.insert(request.argv.end(), args.begin(), args.end());
    request.files = {{"/sandbox/main.py", source}};
    request.secret = std::move(secret);
    request.deadline = absl::Now() + timeout;
    return sandbox_->Run(request);
  }

  std::unique_ptr<SandboxRunner> sandbox_;
  SandboxPool* pool_ = nullptr;  // sandbox_, when pooled.
};

INSTANTIATE_TEST_SUITE_P(Runners, SandboxTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Pooled" : "PerRun";
                         });

// The race that once aborted ForkBombIsContainedAndLeavesNothing: /proc/PID/
// cmdline opened while the process lives and read after it was reaped.
TEST(ProcScanTest, ReadingAProcessThatWasReapedAfterOpenIsNotAnError) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  const int fd =
      open(absl::StrCat("/proc/", child, "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(ReadAllOrNullopt(fd), std::nullopt);
  close(fd);
  EXPECT_EQ(ProcCmdline(absl::StrCat(child)), std::nullopt);
}

// Scanning /proc while hundreds of marked processes start and exit finds
// some of them and never throws.
TEST(ProcScanTest, ScanningWhileProcessesComeAndGoNeverFails) {
  const std::string marker = UniqueMarker();
  std::atomic<bool> done{false};
  std::thread churn([&] {
    while (!done.load()) {
      std::vector<pid_t> children;
      for (int i = 0; i < 16; ++i) {
        const pid_t child = fork();
        if (child == 0) {
          execl("/bin/true", "true", marker.c_str(), static_cast<char*>(nullptr));
          _exit(127);
        }
        if (child > 0) children.push_back(child);
      }
      for (pid_t child : children) waitpid(child, nullptr, 0);
    }
  });
  const absl::Time until = absl::Now() + absl::Seconds(2);
  int scans = 0;
  while (absl::Now() < until) {
    ProcessesWithMarker(marker);
    ++scans;
  }
  done.store(true);
  churn.join();
  EXPECT_GT(scans, 0);
  EXPECT_THAT(ProcessesWithMarker(marker), ::testing::IsEmpty());
}

TEST(SandboxOptionsTest, ValidateNamesTheField) {
  SandboxOptions options;
  EXPECT_TRUE(options.Validate().ok());
  options.max_processes = 1;
  EXPECT_THAT(options.Validate().message(), HasSubstr("max_processes"));
  options = SandboxOptions();
  options.bwrap_path = "bwrap";
  EXPECT_THAT(options.Validate().message(), HasSubstr("bwrap_path"));
  options = SandboxOptions();
  options.uid_base = 0;
  EXPECT_THAT(options.Validate().message(), HasSubstr("uid_base"));
  options = SandboxOptions();
  options.address_space_bytes = 0;
  EXPECT_THAT(options.Validate().message(), HasSubstr("address_space_bytes"));
  options = SandboxOptions();
  options.read_only_paths.push_back("/usr/../etc");
  EXPECT_THAT(options.Validate().message(), HasSubstr("read_only_paths["));
}

TEST_P(SandboxTest, SelfCheckPasses) {
  const absl::Status status = sandbox_->CheckAvailable({kPython, "-I", "-c", "pass"});
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(SandboxTest, CapturesOutputExitCodeAndResultChannel) {
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os, sys
secret = b""
while chunk := os.read(3, 100):
    secret += chunk
os.close(3)
print("out", sys.argv[1])
print("err", file=sys.stderr)
os.write(4, b"got " + secret)
sys.exit(3)
)py",
                                                absl::Seconds(20), {"arg1"}, "s3cr3t");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kExited);
  EXPECT_EQ(run->exit_code, 3);
  EXPECT_TRUE(run->started);
  EXPECT_EQ(run->stdout_text, "out arg1\n");
  EXPECT_EQ(run->stderr_text, "err\n");
  EXPECT_EQ(run->result, "got s3cr3t");
}

TEST_P(SandboxTest, ProgramThatSkipsTheSecretHasNotStarted) {
  absl::StatusOr<SandboxResult> run = RunPython("pass", absl::Seconds(20), {}, "unread");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0);
  EXPECT_FALSE(run->started);
}

TEST_P(SandboxTest, ProgramSeesOnlyItsOwnDescriptorsAndRunsUnprivileged) {
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(fds)
print(os.getuid(), os.getpid())
print(open("/proc/self/status").read().split("CapEff:")[1].split()[0])
print(sorted(os.listdir("/")))
)py");
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->stderr_text;
  std::vector<std::string> lines = absl::StrSplit(run->stdout_text, '\n');
  ASSERT_GE(lines.size(), 5u);
  // 0-4 and the descriptor listdir opened.
  EXPECT_EQ(lines[0], "[0, 1, 2, 3, 4, 5]");
  std::vector<std::string> ids = absl::StrSplit(lines[1], ' ');
  EXPECT_NE(ids[0], "0") << "the program runs as root in its namespace";
  EXPECT_NE(ids[1], "1") << "the program must not be the pid namespace's init";
  EXPECT_EQ(lines[2], "0000000000000000") << "capabilities";
  EXPECT_THAT(lines[3], Not(HasSubstr("work")));
  EXPECT_THAT(lines[3], Not(HasSubstr("root")));
  EXPECT_THAT(lines[3], Not(HasSubstr("home")));
}

// Seen from the host, every process of the sandbox (bwrap's included) has a
// uid other than root's: RLIMIT_NPROC applies and root's files stay closed.
TEST_P(SandboxTest, NoSandboxProcessIsRootOnTheHost) {
  const std::string marker = UniqueMarker();
  std::atomic<bool> done{false};
  std::atomic<int> seen{0};
  std::atomic<int> as_root{0};
  std::thread watcher([&] {
    while (!done.load()) {
      for (pid_t pid : SandboxProcesses(marker, /*with_zygotes=*/true)) {
        struct stat st;
        if (stat(absl::StrCat("/proc/", pid).c_str(), &st) != 0) continue;
        ++seen;
        if (st.st_uid == 0) ++as_root;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  absl::StatusOr<SandboxResult> run = RunPython("import time\ntime.sleep(0.5)\n",
                                                absl::Seconds(20), {marker});
  done.store(true);
  watcher.join();
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_GT(seen.load(), 0);
  EXPECT_EQ(as_root.load(), 0);
}

TEST_P(SandboxTest, InfiniteLoopIsKilledAtTheDeadlineAndLeavesNothing) {
  const std::string marker = UniqueMarker();
  absl::StatusOr<SandboxResult> run = RunPython("while True:\n    pass\n", absl::Seconds(1), {marker});
  ASSERT_TRUE(run.ok()) << run.status();
  // The deadline, or SIGXCPU: RLIMIT_CPU is capped at the wall budget + 1s.
  EXPECT_TRUE(run->termination == Termination::kDeadline ||
              (run->termination == Termination::kSignaled && run->signal == SIGXCPU))
      << static_cast<int>(run->termination) << " " << run->signal;
  EXPECT_THAT(SandboxProcesses(marker), ::testing::IsEmpty());
}

TEST_P(SandboxTest, SleepingProgramIsKilledAtTheDeadlineAndLeavesNothing) {
  const std::string marker = UniqueMarker();
  absl::StatusOr<SandboxResult> run =
      RunPython("import time\nprint('sleeping', flush=True)\ntime.sleep(1000)\n",
                absl::Milliseconds(1500), {marker});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kDeadline);
  EXPECT_EQ(run->stdout_text, "sleeping\n");
  EXPECT_THAT(SandboxProcesses(marker), ::testing::IsEmpty());
}

TEST_P(SandboxTest, ForkBombIsContainedAndLeavesNothing) {
  SandboxOptions options;
  options.max_processes = 16;
  MakeSandbox(options);
  const std::string marker = UniqueMarker();
  // Counts the bomb's processes from the host while it runs.
  std::atomic<bool> done{false};
  std::atomic<size_t> most{0};
  std::thread watcher([&] {
    while (!done.load()) {
      const size_t count = SandboxProcesses(marker).size();
      if (count > most.load()) most.store(count);
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os, sys, time
reported = False
while True:
    try:
        os.fork()
    except OSError as e:
        if not reported:
            print("fork refused:", e.errno, flush=True)
            reported = True
        time.sleep(0.01)
)py",
                                                absl::Seconds(3), {marker});
  done.store(true);
  watcher.join();
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kDeadline);
  EXPECT_THAT(run->stdout_text, HasSubstr("fork refused: 11"));  // EAGAIN
  // The bomb's pythons plus bwrap's two processes (whose argv holds the
  // marker too); outside bwrap is not counted by the limit when not root.
  EXPECT_LE(most.load(), static_cast<size_t>(options.max_processes) + 1);
  EXPECT_GE(most.load(), 3u);
  EXPECT_THAT(SandboxProcesses(marker), ::testing::IsEmpty());
}

TEST_P(SandboxTest, MemoryBombHitsTheAddressSpaceLimit) {
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
chunks = []
while True:
    chunks.append(bytearray(64 << 20))
)py");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kExited);
  EXPECT_EQ(run->exit_code, 1);
  EXPECT_THAT(run->stderr_text, HasSubstr("MemoryError"));
}

TEST_P(SandboxTest, NetworkIsUnreachable) {
  // A listener on the host's loopback that the sandbox must not reach.
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);

  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import socket, sys
port = int(sys.argv[1])
for family, target in [(socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET, ("8.8.8.8", 53)),
                       (socket.AF_INET6, ("::1", port))]:
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(target)
        print("connected", target)
    except OSError as e:
        print("refused", e.errno)
for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):
    try:
        socket.socket(socket.AF_INET, kind)
        print("created", kind)
    except OSError as e:
        print("refused", e.errno)
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    print("created netlink")
except OSError as e:
    print("refused", e.errno)
a, b = socket.socketpair()
a.sendall(b"unix ok")
print(b.recv(16).decode())
)py",
                                                absl::Seconds(20), {absl::StrCat(port)});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_THAT(run->stdout_text, Not(HasSubstr("connected")));
  EXPECT_THAT(run->stdout_text, Not(HasSubstr("created")));
  EXPECT_EQ(run->stdout_text,
            "refused 1\nrefused 1\nrefused 1\nrefused 1\nrefused 1\nrefused 1\nunix ok\n");
  // Nothing reached the listener.
  EXPECT_LT(accept(listener, nullptr, nullptr), 0);
  EXPECT_EQ(errno, EAGAIN);
  close(listener);
}

TEST_P(SandboxTest, WritesOutsideThePrivateTmpDoNotReachTheHost) {
  const std::string marker = UniqueMarker();
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const std::vector<std::string> targets = {
      absl::StrCat("/etc/", marker),      absl::StrCat("/usr/", marker),
      absl::StrCat("/usr/lib/", marker),  absl::StrCat("/work/", marker),
      absl::StrCat("/tmp/", marker),      absl::StrCat("/", marker),
      absl::StrCat("/dev/", marker),      absl::StrCat(cwd, "/", marker),
      absl::StrCat("/proc/", marker),     absl::StrCat(SLUICE_TESTDATA_DIR, "/", marker),
  };
  std::vector<std::string> args = targets;
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os, sys
for path in sys.argv[1:]:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("escaped")
        print("wrote", path)
    except OSError as e:
        print("denied", path, e.errno)
try:
    open("/proc/sys/kernel/hostname", "w").write("x")
    print("wrote hostname")
except OSError as e:
    print("denied hostname")
)py",
                                                absl::Seconds(20), args);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  // Only the private /tmp is writable inside...
  EXPECT_THAT(run->stdout_text, HasSubstr(absl::StrCat("wrote /tmp/", marker)));
  EXPECT_THAT(run->stdout_text, HasSubstr("denied hostname"));
  for (const std::string& target : targets) {
    // A path under /tmp (the test's own directories, when the checkout lives
    // in /tmp) lands in the sandbox's private tmpfs: writable inside, and it
    // must still not reach the host.
    if (!absl::StartsWith(target, "/tmp/")) {
      EXPECT_THAT(run->stdout_text, HasSubstr(absl::StrCat("denied ", target))) << target;
    }
    // ...and nothing reached the host.
    EXPECT_FALSE(PathExists(target)) << target;
  }
}

TEST_P(SandboxTest, SecretsOfTheHostAreNotVisible) {
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os
for path in ["/etc/shadow", "/etc/passwd", "/root", "/home", "/run"]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read()
        print("read", path)
    except OSError as e:
        print("denied", path)
)py");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_THAT(run->stdout_text, Not(HasSubstr("read")));
}

TEST_P(SandboxTest, KillingParentAndEverythingHarmsOnlyTheSandbox) {
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os, signal
for target in (os.getppid(), 1, -1):
    try:
        os.kill(target, signal.SIGKILL)
        print("sent", target)
    except OSError as e:
        print("refused", target, e.errno)
print("alive")
)py");
  ASSERT_TRUE(run.ok()) << run.status();
  // We are still here, and so is the program: kill(-1) skips the caller and
  // the namespace's init ignores signals from inside.
  EXPECT_EQ(run->termination, Termination::kExited);
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_THAT(run->stdout_text, HasSubstr("alive"));
  EXPECT_EQ(kill(getpid(), 0), 0);
}

TEST_P(SandboxTest, DaemonIsKilledWhenTheProgramExits) {
  const std::string marker = UniqueMarker();
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os, sys, time
marker = sys.argv[1]
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(ready_r)
        os.write(ready_w, str(os.getpid()).encode())
        os.close(ready_w)
        for fd in (0, 1, 2):
            os.close(fd)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", marker])
    os._exit(0)
os.close(ready_w)
print("daemon", os.read(ready_r, 32).decode(), flush=True)
time.sleep(0.3)
)py",
                                                absl::Seconds(20), {marker});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_THAT(run->stdout_text, HasSubstr("daemon "));
  EXPECT_THAT(SandboxProcesses(marker), ::testing::IsEmpty());
}

TEST_P(SandboxTest, DaemonIsKilledAtTheDeadline) {
  const std::string marker = UniqueMarker();
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", sys.argv[1]])
    os._exit(0)
print("forked", flush=True)
time.sleep(1000)
)py",
                                                absl::Seconds(1), {marker});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kDeadline);
  EXPECT_THAT(SandboxProcesses(marker), ::testing::IsEmpty());
}

TEST_P(SandboxTest, OutputFloodIsTruncatedAndKilledAtTheOutputLimit) {
  SandboxOptions options;
  options.output_bytes_kept = 1000;
  options.max_output_bytes = 4 << 20;
  MakeSandbox(options);
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import sys
block = b"x" * (1 << 20)
for _ in range(1024):
    sys.stdout.buffer.write(block)
)py");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kOutputLimit);
  EXPECT_EQ(run->stdout_text, std::string(1000, 'x'));
  EXPECT_GT(run->stdout_bytes, uint64_t{4} << 20);
}

TEST_P(SandboxTest, GigabyteOfOutputIsDrainedWithoutLimit) {
  SandboxOptions options;
  options.output_bytes_kept = 1000;
  options.max_output_bytes = 0;  // Drain and drop all of it.
  MakeSandbox(options);
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import sys
block = b"y" * (1 << 20)
for _ in range(1024):
    sys.stdout.buffer.write(block)
sys.stderr.write("e" * 5000 + "END")
)py",
                                                absl::Seconds(60));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kExited);
  EXPECT_EQ(run->exit_code, 0);
  EXPECT_EQ(run->stdout_bytes, uint64_t{1} << 30);
  EXPECT_EQ(run->stdout_text, std::string(1000, 'y'));
  // stderr keeps its end, where a traceback would be.
  EXPECT_EQ(run->stderr_text.size(), 1000u);
  EXPECT_THAT(run->stderr_text, ::testing::EndsWith("END"));
}

TEST_P(SandboxTest, FileSizeAndTmpfsLimitsHold) {
  SandboxOptions options;
  options.max_file_bytes = 1 << 20;
  options.tmpfs_bytes = 4 << 20;
  MakeSandbox(options);
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import os
try:
    with open("/tmp/big", "wb") as f:
        f.write(b"x" * (2 << 20))
    print("wrote big")
except OSError as e:
    print("big", e.errno)
os.remove("/tmp/big")
try:
    for i in range(16):
        with open(f"/tmp/part{i}", "wb") as f:
            f.write(b"x" * (1 << 20))
    print("filled")
except OSError as e:
    print("full", e.errno)
)py");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_EQ(run->stdout_text, "big 27\nfull 28\n");  // EFBIG, ENOSPC
}

TEST_P(SandboxTest, DangerousSystemCallsAreDenied) {
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    ctypes.set_errno(0)
    result = getattr(libc, name)(*args)
    print(name, ctypes.get_errno() if result == -1 else "allowed")
call("unshare", 0x10000000)  # CLONE_NEWUSER
call("unshare", 0x00020000)  # CLONE_NEWNS
call("ptrace", 16, os.getppid(), 0, 0)  # PTRACE_ATTACH
call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
call("setns", 0, 0)
call("syscall", {"x86_64": 250, "aarch64": 219}[os.uname().machine], 0, 0, 0, 0)  # keyctl
call("syscall", {"x86_64": 321, "aarch64": 280}[os.uname().machine], 0, 0, 0)  # bpf
)py");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
  EXPECT_EQ(run->stdout_text, "unshare 1\nunshare 1\nptrace 1\nmount 1\nsetns 1\nsyscall 1\nsyscall 1\n");
}

TEST_P(SandboxTest, SegfaultIsReportedAsASignal) {
  absl::StatusOr<SandboxResult> run =
      RunPython("import ctypes\nctypes.string_at(0)\n");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kSignaled);
  EXPECT_EQ(run->signal, SIGSEGV);
}

TEST_P(SandboxTest, ConcurrentRunsAreIndependent) {
  constexpr int kThreads = 4;
  constexpr int kRunsPerThread = 3;
  std::atomic<int> passed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRunsPerThread; ++i) {
        const std::string expected = absl::StrCat(t, "-", i);
        absl::StatusOr<SandboxResult> run = RunPython(
            "import sys, os\nopen('/tmp/f', 'w').write(sys.argv[1])\n"
            "print(open('/tmp/f').read(), len(os.listdir('/tmp')))\n",
            absl::Seconds(30), {expected});
        if (run.ok() && run->exit_code == 0 && run->stdout_text == expected + " 1\n") ++passed;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(passed.load(), kThreads * kRunsPerThread);
}

TEST(SandboxSetupTest, MissingBwrapIsAnActionableError) {
  SandboxOptions options;
  options.bwrap_path = "/nonexistent/bwrap";
  absl::StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(options);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status();
  const absl::Status status = (*sandbox)->CheckAvailable();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("apt-get install bubblewrap"));
}

TEST(SandboxSetupTest, MissingProgramIsASetupError) {
  absl::StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(SandboxOptions());
  ASSERT_TRUE(sandbox.ok()) << sandbox.status();
  const absl::Status status = (*sandbox)->CheckAvailable({"/usr/bin/no-such-program"});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no-such-program"));
}

TEST(SandboxSetupTest, SetupHintRecognisesRefusedNamespaces) {
  EXPECT_THAT(SandboxSetupHint("bwrap: setting up uid map: Permission denied"),
              HasSubstr("unprivileged_userns_clone"));
  EXPECT_THAT(SandboxSetupHint("bwrap: No permissions to creating new namespace"),
              HasSubstr("user namespaces"));
  EXPECT_EQ(SandboxSetupHint("something else"), "");
  EXPECT_THAT(SandboxSetupHint("ModuleNotFoundError: No module named 'resource'"),
              HasSubstr("python3-minimal"));
  // Inside Docker with seccomp=unconfined but the default masked /proc.
  EXPECT_THAT(SandboxSetupHint("bwrap: Can't mount proc on /newroot/proc: Operation not permitted"),
              HasSubstr("systempaths=unconfined"));
}

}  // namespace
}  // namespace sluice::reward_server::sandbox

namespace sluice::reward_server::sandbox {
namespace {

// What a pool adds: programs share a slot one after the other, so nothing
// one program does may be visible to the next. One slot, so that every run
// lands in it.
class SandboxPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { MakePool(SandboxOptions(), SandboxPoolOptions()); }

  void MakePool(SandboxOptions options, SandboxPoolOptions pool_options) {
    pool_options.slots = 1;
    absl::StatusOr<std::unique_ptr<SandboxPool>> pool =
        SandboxPool::Create(std::move(options), std::move(pool_options));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    ASSERT_TRUE(pool_->Warm().ok());
  }

  absl::StatusOr<SandboxResult> RunPython(const std::string& source,
                                          absl::Duration timeout = absl::Seconds(20),
                                          std::vector<std::string> args = {}) {
    SandboxRequest request;
    request.argv = {kPython, "-I", "-B", "/sandbox/main.py"};
    request.argv.insert(request.argv.end(), args.begin(), args.end());
    request.files = {{"/sandbox/main.py", source}};
    request.deadline = absl::Now() + timeout;
    return pool_->Run(request);
  }

  // Runs `source` and expects it to exit 0; returns its stdout.
  std::string RunOk(const std::string& source) {
    absl::StatusOr<SandboxResult> run = RunPython(source);
    EXPECT_TRUE(run.ok()) << run.status();
    if (!run.ok()) return "";
    EXPECT_EQ(run->termination, Termination::kExited);
    EXPECT_EQ(run->exit_code, 0) << run->stderr_text;
    return run->stdout_text;
  }

  std::unique_ptr<SandboxPool> pool_;
};

TEST_F(SandboxPoolTest, ProgramsReuseTheSlot) {
  for (int i = 0; i < 5; ++i) EXPECT_EQ(RunOk("print('hi')"), "hi\n");
  const SandboxPoolStats stats = pool_->GetStats();
  EXPECT_EQ(stats.slots_started, 1u);
  EXPECT_EQ(stats.runs, 5u);
  EXPECT_EQ(stats.killed, 0u);
  EXPECT_EQ(stats.recycled, 0u);
  EXPECT_EQ(stats.busy, 0);
  EXPECT_EQ(stats.live, 1);
}

// bwrap's parent-death signal fires when the thread that forked it exits: a
// slot started for a caller's thread must outlive that thread.
TEST(SandboxPoolThreadTest, ASlotOutlivesTheThreadThatStartedIt) {
  SandboxPoolOptions pool_options;
  pool_options.slots = 1;
  absl::StatusOr<std::unique_ptr<SandboxPool>> pool =
      SandboxPool::Create(SandboxOptions(), pool_options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const auto run = [&] {
    SandboxRequest request;
    request.argv = {kPython, "-I", "-c", "print('ok')"};
    request.deadline = absl::Now() + absl::Seconds(20);
    return (*pool)->Run(request);
  };
  std::thread([&] { EXPECT_TRUE(run().ok()); }).join();
  absl::SleepFor(absl::Milliseconds(100));
  absl::StatusOr<SandboxResult> after = run();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->stdout_text, "ok\n");
  EXPECT_EQ((*pool)->GetStats().slots_started, 1u);
  EXPECT_EQ((*pool)->GetStats().killed, 0u);
}

TEST_F(SandboxPoolTest, FilesLeftBehindAreGoneForTheNextProgram) {
  RunOk(R"py(
import os
os.makedirs("/tmp/a/b/c")
open("/tmp/a/b/c/f", "w").write("left")
open("/tmp/top", "w").write("left")
os.symlink("/tmp/top", "/tmp/link")
os.mkfifo("/tmp/fifo")
os.chmod("/tmp/a/b", 0)          # a directory the next one could not list
os.chmod("/tmp/a", 0o500)        # nor delete from
open("/dev/shm/shared", "w").write("left")
open("/sandbox/extra.py", "w").write("left")
os.chmod("/tmp", 0o500)          # the directory itself
)py");
  const std::string seen = RunOk(R"py(
import os, stat
print(sorted(os.listdir("/tmp")), sorted(os.listdir("/dev/shm")), sorted(os.listdir("/sandbox")))
print(oct(stat.S_IMODE(os.stat("/tmp").st_mode)))
)py");
  std::vector<std::string> lines = absl::StrSplit(seen, '\n');
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0], "[] [] ['main.py']");
  absl::StatusOr<SandboxResult> fresh = RunPython("import os, stat\nprint(oct(stat.S_IMODE(os.stat('/tmp').st_mode)))");
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(lines[1] + "\n", fresh->stdout_text) << "/tmp's mode is restored";
  EXPECT_EQ(pool_->GetStats().slots_started, 1u) << "cleaned in place, not replaced";
}

TEST_F(SandboxPoolTest, EnvironmentAndInterpreterStateDoNotCarryOver) {
  RunOk(R"py(
import builtins, math, os, sys, resource
os.environ["LEAK"] = "1"
os.environ["PATH"] = "/nowhere"
os.putenv("LEAK2", "1")
math.pi = 3
builtins.len = lambda x: 0
sys.modules["json"] = None
sys.path.insert(0, "/tmp")
resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20))
os.umask(0o777)
os.chdir("/")
)py");
  const std::string seen = RunOk(R"py(
import json, math, os, resource, sys
print(sorted(k for k in os.environ if k not in ("LC_CTYPE",)))
print(os.environ["PATH"], math.pi == 3.141592653589793, len("abc"), json.dumps(1))
print(resource.getrlimit(resource.RLIMIT_NOFILE), oct(os.umask(0)), os.getcwd(), "/tmp" in sys.path)
)py");
  EXPECT_EQ(seen,
            "['HOME', 'LANG', 'PATH', 'TMPDIR']\n"
            "/usr/local/bin:/usr/bin:/bin True 3 1\n"
            "(64, 64) 0o22 /tmp False\n");
}

TEST_F(SandboxPoolTest, SignalHandlersAndMaskDoNotCarryOver) {
  RunOk(R"py(
import signal
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
    signal.signal(sig, signal.SIG_IGN)
signal.signal(signal.SIGINT, lambda *a: None)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2, signal.SIGALRM])
signal.alarm(100)
)py");
  const std::string seen = RunOk(R"py(
import signal
print([signal.getsignal(s) == signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)])
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
print(signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN, sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
print(signal.alarm(0))
)py");
  // As a fresh python3: SIGPIPE ignored, SIGINT raising KeyboardInterrupt,
  // nothing blocked, no alarm pending.
  EXPECT_EQ(seen, "[True, True, True]\nTrue\nTrue []\n0\n");
}

TEST_F(SandboxPoolTest, LeftoverProcessesAreKilledBeforeTheNextProgram) {
  RunOk(R"py(
import os, signal, time
for _ in range(3):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_IGN)
            while True:
                time.sleep(1)
        os._exit(0)
    if os.fork() == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # a stopped one, too
time.sleep(0.2)
)py");
  // Only the zygote (pid 1) and the program itself are left.
  EXPECT_EQ(RunOk(R"py(
import os
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()) == sorted([1, os.getpid()]))
)py"),
            "True\n");
  EXPECT_THAT(ProcessesInNamespacesOf(pool_->ZygotePids(), /*with_inits=*/false),
              ::testing::IsEmpty());
}

TEST_F(SandboxPoolTest, TheZygoteIsOutOfReach) {
  const std::string seen = RunOk(R"py(
import os, signal
def attempt(what, f):
    try:
        f()
        print(what, "allowed")
    except OSError as e:
        print(what, "denied", e.errno)
attempt("mem", lambda: open("/proc/1/mem", "r+b"))
attempt("fd", lambda: os.listdir("/proc/1/fd"))
attempt("environ", lambda: open("/proc/1/environ", "rb").read())
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP):
    os.kill(1, sig)
print("signalled")
)py");
  EXPECT_THAT(seen, HasSubstr("mem denied 13"));
  EXPECT_THAT(seen, HasSubstr("fd denied 13"));
  EXPECT_THAT(seen, HasSubstr("environ denied 13"));
  EXPECT_THAT(seen, HasSubstr("signalled"));
  // The slot still serves, and it is the same one.
  EXPECT_EQ(RunOk("print('next')"), "next\n");
  EXPECT_EQ(pool_->GetStats().slots_started, 1u);
  EXPECT_EQ(pool_->GetStats().killed, 0u);
}

TEST_F(SandboxPoolTest, SystemVIpcLeftBehindReplacesTheSlot) {
  RunOk(R"py(
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget(0, 4096, 0o1600) >= 0  # IPC_PRIVATE, IPC_CREAT | 0600
assert libc.semget(0, 1, 0o1600) >= 0
)py");
  SandboxPoolStats stats = pool_->GetStats();
  EXPECT_EQ(stats.recycled, 1u);
  EXPECT_EQ(stats.recycled_by_reason["dirty"], 1u);
  EXPECT_EQ(RunOk("print(len(open('/proc/sysvipc/shm').read().splitlines()))"), "1\n");
  EXPECT_EQ(pool_->GetStats().slots_started, 2u);
}

TEST_F(SandboxPoolTest, MessageQueuesAreDenied) {
  EXPECT_EQ(RunOk(R"py(
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.mq_open(b"/q", 0o100 | 2, 0o600, None), ctypes.get_errno())
)py"),
            "-1 1\n");
}

TEST_F(SandboxPoolTest, DeadlineKillsTheSlotAndTheNextRunGetsAFreshOne) {
  absl::StatusOr<SandboxResult> run = RunPython("while True: pass", absl::Seconds(1));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->termination == Termination::kDeadline ||
              (run->termination == Termination::kSignaled && run->signal == SIGXCPU));
  EXPECT_EQ(RunOk("print('after')"), "after\n");
  const SandboxPoolStats stats = pool_->GetStats();
  if (run->termination == Termination::kDeadline) {
    EXPECT_EQ(stats.killed_by_reason.at("deadline"), 1u);
    EXPECT_EQ(stats.slots_started, 2u);
  }
}

TEST_F(SandboxPoolTest, MaxRunsPerSlotReplacesTheSlot) {
  SandboxPoolOptions options;
  options.max_runs_per_slot = 2;
  MakePool(SandboxOptions(), options);
  for (int i = 0; i < 5; ++i) RunOk("pass");
  const SandboxPoolStats stats = pool_->GetStats();
  EXPECT_EQ(stats.recycled_by_reason.at("max_runs"), 2u);
  EXPECT_EQ(stats.slots_started, 3u);
}

TEST_F(SandboxPoolTest, WarmInterpreterBehavesLikeAFreshOne) {
  // Script: __main__, argv, exit statuses, tracebacks, atexit.
  absl::StatusOr<SandboxResult> run = RunPython(R"py(
import atexit, sys
atexit.register(lambda: print("atexit ran"))
print(__name__, sys.argv)
raise SystemExit("bye")
)py",
                                                absl::Seconds(20), {"x"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 1);
  EXPECT_EQ(run->stdout_text, "__main__ ['/sandbox/main.py', 'x']\natexit ran\n");
  EXPECT_EQ(run->stderr_text, "bye\n");
  run = RunPython("def f():\n    raise ValueError('boom')\nf()\n");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 1);
  EXPECT_THAT(run->stderr_text, HasSubstr("ValueError: boom"));
  EXPECT_THAT(run->stderr_text, HasSubstr("/sandbox/main.py"));
  EXPECT_THAT(run->stderr_text, Not(HasSubstr("zygote")));
  // -c, and a program that is not the warm interpreter (exec()ed).
  SandboxRequest request;
  request.argv = {kPython, "-I", "-c", "import sys; print(sys.argv); sys.exit(7)", "a"};
  request.deadline = absl::Now() + absl::Seconds(20);
  run = pool_->Run(request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 7);
  EXPECT_EQ(run->stdout_text, "['-c', 'a']\n");
  request.argv = {"/bin/sh", "-c", "echo $HOME; exit 3"};
  run = pool_->Run(request);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 3);
  EXPECT_EQ(run->stdout_text, "/tmp\n");
  request.argv = {"/usr/bin/no-such-program"};
  run = pool_->Run(request);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(run.status().message(), HasSubstr("no-such-program"));
  EXPECT_EQ(RunOk("print('still')"), "still\n");
}

TEST_F(SandboxPoolTest, RefusesFilesOutsideTheSandboxDirectory) {
  SandboxRequest request;
  request.argv = {kPython, "-I", "-c", "pass"};
  request.files = {{"/tmp/main.py", "pass"}};
  request.deadline = absl::Now() + absl::Seconds(20);
  absl::StatusOr<SandboxResult> run = pool_->Run(request);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("/sandbox/"));
}

TEST_F(SandboxPoolTest, AFullPoolAnswersResourceExhaustedAtTheDeadline) {
  // The slot is taken (however long this machine takes to get there), then
  // held for seconds after: far more than the 300 ms the next run waits.
  std::thread busy([&] { EXPECT_TRUE(RunPython("import time; time.sleep(3)").ok()); });
  EXPECT_TRUE(pool_->AwaitBusy(1, absl::Seconds(60)));
  EXPECT_EQ(pool_->GetStats().busy, 1);
  absl::StatusOr<SandboxResult> run = RunPython("pass", absl::Milliseconds(300));
  EXPECT_EQ(run.status().code(), absl::StatusCode::kResourceExhausted) << run.status();
  busy.join();
  EXPECT_EQ(RunOk("print('free')"), "free\n");
}

TEST(SandboxPoolSetupTest, MissingBwrapIsAnActionableError) {
  SandboxOptions options;
  options.bwrap_path = "/nonexistent/bwrap";
  absl::StatusOr<std::unique_ptr<SandboxPool>> pool = SandboxPool::Create(options, {});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const absl::Status status = (*pool)->CheckAvailable();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("apt-get install bubblewrap"));
}

TEST(SandboxPoolSetupTest, MissingInterpreterIsAnActionableError) {
  SandboxPoolOptions pool_options;
  pool_options.python_path = "/usr/bin/no-such-python";
  absl::StatusOr<std::unique_ptr<SandboxPool>> pool =
      SandboxPool::Create(SandboxOptions(), pool_options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const absl::Status status = (*pool)->Warm();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no-such-python"));
}

TEST(SandboxPoolOptionsTest, ValidateNamesTheField) {
  SandboxPoolOptions options;
  EXPECT_TRUE(options.Validate().ok());
  options.slots = 0;
  EXPECT_THAT(options.Validate().message(), HasSubstr("slots"));
  options = {};
  options.preload_modules = {"os; import evil"};
  EXPECT_THAT(options.Validate().message(), HasSubstr("preload_modules"));
  options = {};
  options.python_path = "python3";
  EXPECT_THAT(options.Validate().message(), HasSubstr("python_path"));
}

}  // namespace
}  // namespace sluice::reward_server::sandbox
