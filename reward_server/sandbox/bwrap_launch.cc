#include "reward_server/sandbox/bwrap_launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace sluice::reward_server::sandbox::internal {
namespace {

// The uids handed to concurrent runs when the server is root. Exclusive
// within the process (a set) and across processes (an flock per uid in
// uid_lock_dir): two runs sharing a uid would share one RLIMIT_NPROC budget,
// and a fork bomb in one would starve the other.
class UidPool {
 public:
  static UidPool& Get() {
    static UidPool* pool = new UidPool();
    return *pool;
  }

  // Blocks while every uid of the range is taken in this process;
  // RESOURCE_EXHAUSTED when the free ones are all locked by other processes.
  // On success `lock` holds the uid's lock file (flock released on close).
  absl::StatusOr<uint32_t> Acquire(uint32_t base, int count, const std::string& lock_dir,
                                   UniqueFd* lock) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock mutex_lock(&mu_);
    auto has_free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (int i = 0; i < count; ++i) {
        if (in_use_.count(base + i) == 0) return true;
      }
      return false;
    };
    mu_.Await(absl::Condition(&has_free));
    if (!lock_dir_ready_) {
      // Root-only, so no other user can hold (or swap) the lock files.
      if (mkdir(lock_dir.c_str(), 0700) != 0 && errno != EEXIST) {
        return ErrnoError(absl::StrCat("creating uid_lock_dir ", lock_dir));
      }
      lock_dir_ready_ = true;
    }
    // Start where the last run stopped (offset by the pid), so that uids
    // rotate and two processes rarely try the same one first.
    for (int i = 0; i < count; ++i) {
      const uint32_t uid = base + static_cast<uint32_t>((next_ + i) % count);
      if (in_use_.count(uid) != 0) continue;
      const std::string path = absl::StrCat(lock_dir, "/uid-", uid, ".lock");
      UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
      if (!fd.valid()) return ErrnoError(absl::StrCat("opening ", path));
      if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // Another process's.
      in_use_.insert(uid);
      next_ = (next_ + i + 1) % count;
      *lock = std::move(fd);
      return uid;
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        "every sandbox uid in [", base, ", ", base + count, ") is in use by this or another "
        "process; raise uid_count or give each server its own uid_base"));
  }

  void Release(uint32_t uid) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    in_use_.erase(uid);
  }

 private:
  UidPool() : next_(static_cast<uint64_t>(getpid()) * 7919) {}

  absl::Mutex mu_;
  std::set<uint32_t> in_use_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ ABSL_GUARDED_BY(mu_);
  bool lock_dir_ready_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

struct BwrapLauncherThread::Job {
  const SandboxOptions* options;
  const BwrapLaunch* launch;
  bool done = false;
  absl::StatusOr<pid_t> result = absl::InternalError("not launched");
};

BwrapLauncherThread::BwrapLauncherThread() : thread_([this] { Loop(); }) {}

BwrapLauncherThread::~BwrapLauncherThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::StatusOr<pid_t> BwrapLauncherThread::Launch(const SandboxOptions& options,
                                                  const BwrapLaunch& launch) {
  Job job{&options, &launch};
  absl::MutexLock lock(&mu_);
  queue_.push_back(&job);
  mu_.Await(absl::Condition(&job.done));
  return job.result;
}

void BwrapLauncherThread::Loop() {
  while (true) {
    Job* job;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    absl::StatusOr<pid_t> result = LaunchBwrap(*job->options, *job->launch);
    absl::MutexLock lock(&mu_);
    job->result = std::move(result);
    job->done = true;
  }
}

absl::StatusOr<std::unique_ptr<UidLease>> UidLease::Acquire(const SandboxOptions& options) {
  auto lease = std::unique_ptr<UidLease>(new UidLease());
  absl::StatusOr<uint32_t> uid = UidPool::Get().Acquire(options.uid_base, options.uid_count,
                                                        options.uid_lock_dir, &lease->lock_);
  if (!uid.ok()) return uid.status();
  lease->uid_ = *uid;
  lease->held_ = true;
  return lease;
}

UidLease::~UidLease() {
  if (held_) UidPool::Get().Release(uid_);
}

namespace {

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

// Everything the forked child needs, prepared before fork: between fork and
// exec only async-signal-safe calls are allowed (the server is
// multi-threaded; another thread may hold malloc's lock).
struct ChildPlan {
  const char* path;
  char* const* argv;
  char* const* envp;
  int fds[kMaxChildFds];  // Source descriptor for each target 0..num_fds-1.
  int num_fds;
  int resources[8];
  struct rlimit limits[8];
  int num_limits;
  bool switch_uid;
  uid_t uid;
  pid_t parent_pid;
  int report_fd;  // Gets a ChildFailure when a step fails; closed by exec.
};

struct ChildFailure {
  int step;
  int error;
};
enum ChildStep { kStepFds = 1, kStepRlimit, kStepUid, kStepParent, kStepExec };

[[noreturn]] void ChildFail(int report_fd, int step) {
  const ChildFailure failure = {step, errno};
  // Best effort: the parent reads a short report as "exec failed".
  [[maybe_unused]] ssize_t n = write(report_fd, &failure, sizeof(failure));
  _exit(127);
}

// Runs in the forked child. Async-signal-safe system calls only.
[[noreturn]] void RunChild(const ChildPlan& plan) {
  // A new session: bwrap leads its own process group (killed as one) and
  // loses the server's controlling terminal.
  setsid();

  // Signal state is inherited across exec: undo the server's.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &default_action, nullptr);
  }

  // Move every source above the targets first, so that placing one never
  // clobbers another.
  int report_fd = fcntl(plan.report_fd, F_DUPFD_CLOEXEC, plan.num_fds);
  if (report_fd < 0) ChildFail(plan.report_fd, kStepFds);
  int moved[kMaxChildFds];
  for (int i = 0; i < plan.num_fds; ++i) {
    moved[i] = fcntl(plan.fds[i], F_DUPFD_CLOEXEC, plan.num_fds);
    if (moved[i] < 0) ChildFail(report_fd, kStepFds);
  }
  for (int i = 0; i < plan.num_fds; ++i) {
    if (dup2(moved[i], i) < 0) ChildFail(report_fd, kStepFds);  // dup2 clears CLOEXEC.
  }
  // Every other descriptor closes at exec, whether or not the server (or a
  // library in it) opened it with O_CLOEXEC.
  if (syscall(SYS_close_range, plan.num_fds, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = plan.num_fds; fd < 65536; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
  }

  for (int i = 0; i < plan.num_limits; ++i) {
    if (setrlimit(plan.resources[i], &plan.limits[i]) != 0) ChildFail(report_fd, kStepRlimit);
  }

  if (plan.switch_uid) {
    // Raw system calls: glibc's wrappers synchronise the ids of all threads
    // (there is one here) through machinery not meant for a forked child.
    if (syscall(SYS_setgroups, 0, nullptr) != 0 ||
        syscall(SYS_setresgid, plan.uid, plan.uid, plan.uid) != 0 ||
        syscall(SYS_setresuid, plan.uid, plan.uid, plan.uid) != 0) {
      ChildFail(report_fd, kStepUid);
    }
  }

  // After the uid change, which clears it: bwrap dies with the server (and
  // --die-with-parent takes the sandbox with it).
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != plan.parent_pid) {
    ChildFail(report_fd, kStepParent);
  }
  if (chdir("/") != 0) ChildFail(report_fd, kStepExec);
  execve(plan.path, plan.argv, plan.envp);
  ChildFail(report_fd, kStepExec);
}

// argv/envp as the NULL-terminated arrays execve wants; the strings stay
// owned by `strings`.
std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

int64_t RunCpuSeconds(const SandboxOptions& options, absl::Time deadline, absl::Time start) {
  int64_t cpu_seconds = absl::ToInt64Seconds(absl::Ceil(options.cpu_time, absl::Seconds(1)));
  if (deadline != absl::InfiniteFuture()) {
    const int64_t wall = absl::ToInt64Seconds(absl::Ceil(deadline - start, absl::Seconds(1))) + 1;
    cpu_seconds = std::max<int64_t>(1, std::min(cpu_seconds, wall));
  }
  return cpu_seconds;
}

std::vector<std::pair<int, struct rlimit>> ProgramLimits(const SandboxOptions& options) {
  return {
      {RLIMIT_AS, {options.address_space_bytes, options.address_space_bytes}},
      {RLIMIT_FSIZE, {options.max_file_bytes, options.max_file_bytes}},
      {RLIMIT_NOFILE, {static_cast<rlim_t>(options.max_open_files),
                       static_cast<rlim_t>(options.max_open_files)}},
      {RLIMIT_CORE, {0, 0}},
  };
}

std::vector<std::string> BwrapSandboxArgs(const SandboxOptions& options) {
  std::vector<std::string> args = {
      options.bwrap_path,
      "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
      "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
      "--hostname", "sandbox",
  };
  for (const std::string& path : options.read_only_paths) {
    struct stat st;
    if (lstat(path.c_str(), &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      args.insert(args.end(), {"--symlink", std::string(target, n), path});
    } else {
      args.insert(args.end(), {"--ro-bind", path, path});
    }
  }
  const std::string tmpfs_size = absl::StrCat(options.tmpfs_bytes);
  args.insert(args.end(), {"--proc", "/proc", "--dev", "/dev",
                           "--size", tmpfs_size, "--tmpfs", "/tmp",
                           "--size", tmpfs_size, "--tmpfs", "/dev/shm",
                           "--remount-ro", "/dev"});
  return args;
}

std::vector<std::pair<std::string, std::string>> SandboxEnv(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", "/tmp"}, {"TMPDIR", "/tmp"},
      {"LANG", "C.UTF-8"}};
  for (const auto& entry : overrides) {
    // (Not a structured binding: C++17 lambdas cannot capture those.)
    const std::string& key = entry.first;
    auto it = std::find_if(env.begin(), env.end(), [&](const auto& kv) { return kv.first == key; });
    if (it != env.end()) {
      it->second = entry.second;
    } else {
      env.emplace_back(key, entry.second);
    }
  }
  return env;
}

BwrapLaunch FreshSandboxLaunch(const SandboxOptions& options, const SandboxRequest& request,
                               const FreshSandboxFds& fds, bool as_root, absl::Time start) {
  std::vector<std::string> args = BwrapSandboxArgs(options);
  for (size_t i = 0; i < request.files.size(); ++i) {
    args.insert(args.end(),
                {"--ro-bind-data", absl::StrCat(kFirstFileFd + i), request.files[i].path});
  }
  args.insert(args.end(), {"--remount-ro", "/", "--chdir", "/tmp", "--clearenv"});
  for (const auto& [key, value] : SandboxEnv(request.env)) {
    args.insert(args.end(), {"--setenv", key, value});
  }
  args.insert(args.end(), {"--seccomp", absl::StrCat(kSeccompFd), "--json-status-fd",
                           absl::StrCat(kStatusFd), "--"});
  if (!as_root) {
    // Inside the sandbox's user namespace RLIMIT_NPROC counts only its own
    // tasks; set before bwrap it would count every task of the server's uid.
    args.insert(args.end(), {options.prlimit_path,
                             absl::StrCat("--nproc=", options.max_processes), "--"});
  }
  args.insert(args.end(), request.argv.begin(), request.argv.end());

  BwrapLaunch launch;
  launch.args = std::move(args);
  launch.fds.resize(kFirstFileFd + fds.file_fds.size());
  launch.fds[kStdinFd] = fds.stdin_fd;
  launch.fds[kStdoutFd] = fds.stdout_fd;
  launch.fds[kStderrFd] = fds.stderr_fd;
  launch.fds[kSecretFd] = fds.secret_fd;
  launch.fds[kResultFd] = fds.result_fd;
  launch.fds[kSeccompFd] = fds.seccomp_fd;
  launch.fds[kStatusFd] = fds.status_fd;
  for (size_t i = 0; i < fds.file_fds.size(); ++i) {
    launch.fds[kFirstFileFd + i] = fds.file_fds[i];
  }
  // CPU: the configured limit, or the wall budget when that is shorter (a
  // busy loop dies by SIGXCPU rather than holding a core until the kill).
  const int64_t cpu_seconds = RunCpuSeconds(options, request.deadline, start);
  launch.limits = ProgramLimits(options);
  launch.limits.push_back({RLIMIT_CPU, {static_cast<rlim_t>(cpu_seconds),
                                        static_cast<rlim_t>(cpu_seconds + 1)}});
  if (as_root) {
    launch.limits.push_back({RLIMIT_NPROC, {static_cast<rlim_t>(options.max_processes),
                                            static_cast<rlim_t>(options.max_processes)}});
  }
  return launch;
}

BwrapLaunch ZygoteSlotLaunch(const SandboxOptions& options, const ZygoteSlotFds& fds,
                             const std::string& zygote_settings, bool as_root) {
  std::vector<std::string> args = BwrapSandboxArgs(options);
  args.insert(args.end(), {"--size", absl::StrCat(options.tmpfs_bytes), "--tmpfs", "/sandbox",
                           "--ro-bind-data", absl::StrCat(kZygoteFd), kZygotePath,
                           "--perms", "0111", "--ro-bind-data", absl::StrCat(kInterpreterFd),
                           kInterpreterCopy,
                           "--remount-ro", "/", "--chdir", "/", "--clearenv"});
  for (const auto& [key, value] : SandboxEnv({})) {
    args.insert(args.end(), {"--setenv", key, value});
  }
  args.insert(args.end(), {"--seccomp", absl::StrCat(kSeccompFd), "--json-status-fd",
                           absl::StrCat(kStatusFd), "--as-pid-1", "--",
                           kInterpreterCopy, "-I", "-B", kZygotePath, zygote_settings});
  BwrapLaunch launch;
  launch.args = std::move(args);
  launch.fds.assign(kInterpreterFd + 1, fds.dev_null);
  launch.fds[kStdoutFd] = fds.log_fd;
  launch.fds[kStderrFd] = fds.log_fd;
  launch.fds[kControlFd] = fds.control_fd;
  launch.fds[kSeccompFd] = fds.seccomp_fd;
  launch.fds[kStatusFd] = fds.status_fd;
  launch.fds[kZygoteFd] = fds.zygote_fd;
  launch.fds[kInterpreterFd] = fds.interpreter_fd;
  // RLIMIT_FSIZE is the program's, set by the zygote in each child: bwrap
  // writes the interpreter's copy under the limits given here.
  for (const auto& limit : ProgramLimits(options)) {
    if (limit.first != RLIMIT_FSIZE) launch.limits.push_back(limit);
  }
  if (as_root) {
    launch.limits.push_back({RLIMIT_NPROC, {static_cast<rlim_t>(options.max_processes),
                                            static_cast<rlim_t>(options.max_processes)}});
  }
  return launch;
}

absl::StatusOr<pid_t> LaunchBwrap(const SandboxOptions& options, const BwrapLaunch& launch) {
  if (launch.fds.size() > static_cast<size_t>(kMaxChildFds) || launch.limits.size() > 8) {
    return absl::InternalError("LaunchBwrap: too many descriptors or limits");
  }
  absl::StatusOr<Pipe> report = MakePipe();
  if (!report.ok()) return report.status();
  std::vector<std::string> args = launch.args;
  std::vector<std::string> bwrap_env = {"PATH=/usr/bin:/bin"};
  std::vector<char*> argv = CStrings(args);
  std::vector<char*> envp = CStrings(bwrap_env);

  // --- The child's plan: everything prepared before fork.
  ChildPlan plan = {};
  plan.path = options.bwrap_path.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  for (size_t i = 0; i < launch.fds.size(); ++i) plan.fds[i] = launch.fds[i];
  plan.num_fds = static_cast<int>(launch.fds.size());
  for (const auto& [resource, limit] : launch.limits) {
    plan.resources[plan.num_limits] = resource;
    plan.limits[plan.num_limits] = limit;
    ++plan.num_limits;
  }
  plan.switch_uid = launch.uid.has_value();
  plan.uid = launch.uid.value_or(0);
  plan.parent_pid = getpid();
  plan.report_fd = report->write.get();

  const pid_t pid = fork();
  if (pid < 0) return ErrnoError("fork");
  if (pid == 0) RunChild(plan);
  report->write.Reset();

  // Blocks only until the child execs (the report pipe closes) or fails.
  ChildFailure failure = {};
  ssize_t report_bytes;
  do {
    report_bytes = read(report->read.get(), &failure, sizeof(failure));
  } while (report_bytes < 0 && errno == EINTR);
  if (report_bytes <= 0) return pid;
  int wait_status;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  const char* step = failure.step == kStepExec     ? "exec"
                     : failure.step == kStepRlimit ? "setrlimit"
                     : failure.step == kStepUid    ? "switching to the sandbox uid"
                                                   : "preparing descriptors";
  if (failure.step == kStepExec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot execute bwrap at ", options.bwrap_path, ": ", strerror(failure.error),
        ". Install bubblewrap (apt-get install bubblewrap) or set bwrap_path"));
  }
  if (failure.step == kStepUid) {
    return absl::FailedPreconditionError(absl::StrCat(
        "running as root, the sandbox could not switch to uid ", plan.uid, ": ",
        strerror(failure.error),
        ". The server is root without CAP_SETUID over that uid (e.g. root of a user namespace "
        "that does not map uid_base..uid_base+uid_count): map that range, pick a mapped "
        "uid_base, or run the server as an ordinary user"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("sandbox child failed ", step, ": ", strerror(failure.error)));
}

}  // namespace sluice::reward_server::sandbox::internal
