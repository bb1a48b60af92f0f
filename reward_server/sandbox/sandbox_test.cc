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

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeSandbox(SandboxOptions()); }

  void MakeSandbox(SandboxOptions options) {
    absl::StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(std::move(options));
    ASSERT_TRUE(sandbox.ok()) << sandbox.status();
    sandbox_ = *std::move(sandbox);
    // Namespaces must work where the tests run (CI included): fail loudly,
    // with the operator's hint, rather than skip.
    const absl::Status available = sandbox_->CheckAvailable();
    ASSERT_TRUE(available.ok()) << "the sandbox cannot run on this machine: " << available;
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

  std::unique_ptr<Sandbox> sandbox_;
};

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

TEST_F(SandboxTest, SelfCheckPasses) {
  const absl::Status status = sandbox_->CheckAvailable({kPython, "-I", "-c", "pass"});
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(SandboxTest, CapturesOutputExitCodeAndResultChannel) {
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

TEST_F(SandboxTest, ProgramThatSkipsTheSecretHasNotStarted) {
  absl::StatusOr<SandboxResult> run = RunPython("pass", absl::Seconds(20), {}, "unread");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code, 0);
  EXPECT_FALSE(run->started);
}

TEST_F(SandboxTest, ProgramSeesOnlyItsOwnDescriptorsAndRunsUnprivileged) {
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
TEST_F(SandboxTest, NoSandboxProcessIsRootOnTheHost) {
  const std::string marker = UniqueMarker();
  std::atomic<bool> done{false};
  std::atomic<int> seen{0};
  std::atomic<int> as_root{0};
  std::thread watcher([&] {
    while (!done.load()) {
      for (pid_t pid : ProcessesWithMarker(marker)) {
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

TEST_F(SandboxTest, InfiniteLoopIsKilledAtTheDeadlineAndLeavesNothing) {
  const std::string marker = UniqueMarker();
  absl::StatusOr<SandboxResult> run = RunPython("while True:\n    pass\n", absl::Seconds(1), {marker});
  ASSERT_TRUE(run.ok()) << run.status();
  // The deadline, or SIGXCPU: RLIMIT_CPU is capped at the wall budget + 1s.
  EXPECT_TRUE(run->termination == Termination::kDeadline ||
              (run->termination == Termination::kSignaled && run->signal == SIGXCPU))
      << static_cast<int>(run->termination) << " " << run->signal;
  EXPECT_THAT(ProcessesWithMarker(marker), ::testing::IsEmpty());
}

TEST_F(SandboxTest, SleepingProgramIsKilledAtTheDeadlineAndLeavesNothing) {
  const std::string marker = UniqueMarker();
  absl::StatusOr<SandboxResult> run =
      RunPython("import time\nprint('sleeping', flush=True)\ntime.sleep(1000)\n",
                absl::Milliseconds(1500), {marker});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kDeadline);
  EXPECT_EQ(run->stdout_text, "sleeping\n");
  EXPECT_THAT(ProcessesWithMarker(marker), ::testing::IsEmpty());
}

TEST_F(SandboxTest, ForkBombIsContainedAndLeavesNothing) {
  SandboxOptions options;
  options.max_processes = 16;
  MakeSandbox(options);
  const std::string marker = UniqueMarker();
  // Counts the bomb's processes from the host while it runs.
  std::atomic<bool> done{false};
  std::atomic<size_t> most{0};
  std::thread watcher([&] {
    while (!done.load()) {
      const size_t count = ProcessesWithMarker(marker).size();
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
  EXPECT_THAT(ProcessesWithMarker(marker), ::testing::IsEmpty());
}

TEST_F(SandboxTest, MemoryBombHitsTheAddressSpaceLimit) {
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

TEST_F(SandboxTest, NetworkIsUnreachable) {
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

TEST_F(SandboxTest, WritesOutsideThePrivateTmpDoNotReachTheHost) {
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

TEST_F(SandboxTest, SecretsOfTheHostAreNotVisible) {
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

TEST_F(SandboxTest, KillingParentAndEverythingHarmsOnlyTheSandbox) {
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

TEST_F(SandboxTest, DaemonIsKilledWhenTheProgramExits) {
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
  EXPECT_THAT(ProcessesWithMarker(marker), ::testing::IsEmpty());
}

TEST_F(SandboxTest, DaemonIsKilledAtTheDeadline) {
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
  EXPECT_THAT(ProcessesWithMarker(marker), ::testing::IsEmpty());
}

TEST_F(SandboxTest, OutputFloodIsTruncatedAndKilledAtTheOutputLimit) {
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

TEST_F(SandboxTest, GigabyteOfOutputIsDrainedWithoutLimit) {
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

TEST_F(SandboxTest, FileSizeAndTmpfsLimitsHold) {
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

TEST_F(SandboxTest, DangerousSystemCallsAreDenied) {
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

TEST_F(SandboxTest, SegfaultIsReportedAsASignal) {
  absl::StatusOr<SandboxResult> run =
      RunPython("import ctypes\nctypes.string_at(0)\n");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->termination, Termination::kSignaled);
  EXPECT_EQ(run->signal, SIGSEGV);
}

TEST_F(SandboxTest, ConcurrentRunsAreIndependent) {
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
  // Inside Docker with seccomp=unconfined but the default masked /proc.
  EXPECT_THAT(SandboxSetupHint("bwrap: Can't mount proc on /newroot/proc: Operation not permitted"),
              HasSubstr("systempaths=unconfined"));
}

}  // namespace
}  // namespace sluice::reward_server::sandbox
