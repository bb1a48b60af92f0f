#include "reward_server/sandbox/sandbox_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "reward_server/sandbox/bwrap_launch.h"
#include "reward_server/sandbox/sandbox_internal.h"
#include "reward_server/sandbox/seccomp_filter.h"
#include "reward_server/sandbox/zygote_channel.h"
#include "reward_server/sandbox/zygote_py.h"

namespace sluice::reward_server::sandbox {

using namespace internal;  // NOLINT(build/namespaces): the sandbox's shared helpers.
using nlohmann::json;

namespace {

constexpr char kFilesDir[] = "/sandbox/";
// Directories a program may write, emptied between programs.
const char* const kWritableDirs[] = {"/tmp", "/dev/shm", "/sandbox"};
// After the program has exited, how long the zygote may take to clean up
// before its slot is killed.
constexpr absl::Duration kCleanupGrace = absl::Seconds(2);
// One line of the zygote's, parsed; a discarded value when it is not JSON.
json ParseEvent(absl::string_view line) { return json::parse(line, nullptr, false); }

}  // namespace

struct SandboxPool::Slot {
  // Guarded by the pool's mu_.
  bool busy = false;
  bool live = false;
  // The holder's while busy.
  pid_t bwrap_pid = -1;
  UniqueFd zygote_pidfd;
  pid_t zygote_pid = -1;  // Host pid, for ZygotePids (read under mu_).
  UniqueFd bwrap_pidfd;
  UniqueFd control;
  UniqueFd log;     // bwrap's and the zygote's stdout and stderr.
  UniqueFd status;  // bwrap's --json-status-fd, read for the zygote's pid.
  std::string log_text;
  std::unique_ptr<UidLease> uid;
  int runs = 0;
};

// How a run left its slot.
struct SandboxPool::Outcome {
  std::string killed;    // Why the slot was killed, or empty.
  std::string recycle;   // Why the slot must be replaced, or empty.
  bool finished = false;  // The run ended normally (for the mean time).
};

absl::Status SandboxPoolOptions::Validate() const {
  if (slots < 1 || slots > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("slots must be in [1, 1024], got ", slots));
  }
  if (python_path.empty() || python_path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("python_path must be an absolute path, got \"", python_path, "\""));
  }
  for (const std::string& name : preload_modules) {
    const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
    });
    if (!valid) {
      return absl::InvalidArgumentError(
          absl::StrCat("preload_modules: \"", name, "\" is not a module name"));
    }
  }
  if (max_runs_per_slot < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_runs_per_slot must be >= 1, got ", max_runs_per_slot));
  }
  if (start_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat("start_timeout must be >= 1s, got ",
                                                   absl::FormatDuration(start_timeout)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SandboxPool>> SandboxPool::Create(SandboxOptions options,
                                                                 SandboxPoolOptions pool_options) {
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  if (absl::Status status = pool_options.Validate(); !status.ok()) return status;
  absl::StatusOr<std::string> bpf = BuildSeccompFilterBpf();
  if (!bpf.ok()) return bpf.status();
  return std::unique_ptr<SandboxPool>(
      new SandboxPool(std::move(options), std::move(pool_options), *std::move(bpf)));
}

namespace {

std::string ZygoteSettings(const SandboxOptions& options, const SandboxPoolOptions& pool) {
  json settings;
  settings["python"] = pool.python_path;
  settings["preload"] = pool.preload_modules;
  settings["writable"] = std::vector<std::string>(std::begin(kWritableDirs), std::end(kWritableDirs));
  // The zygote shares the program's uid: it takes one task of the budget
  // (and bwrap, outside the namespace, another).
  settings["max_processes"] = std::max(1, options.max_processes - 1);
  settings["max_file_bytes"] = options.max_file_bytes;
  return settings.dump();
}

}  // namespace

SandboxPool::SandboxPool(SandboxOptions options, SandboxPoolOptions pool_options,
                         std::string seccomp_bpf)
    : options_(std::move(options)),
      pool_options_(std::move(pool_options)),
      seccomp_bpf_(std::move(seccomp_bpf)),
      zygote_settings_(ZygoteSettings(options_, pool_options_)),
      launcher_(std::make_unique<BwrapLauncherThread>()) {
  for (int i = 0; i < pool_options_.slots; ++i) slots_.push_back(std::make_unique<Slot>());
  stats_.slots = pool_options_.slots;
}

SandboxPool::~SandboxPool() {
  for (const std::unique_ptr<Slot>& slot : slots_) Kill(*slot);
}

SandboxPool::Slot* SandboxPool::Acquire(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  ++stats_.waiting;
  const auto free_slot = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const std::unique_ptr<Slot>& slot : slots_) {
      if (!slot->busy) return true;
    }
    return false;
  };
  mu_.AwaitWithDeadline(absl::Condition(&free_slot), deadline);
  --stats_.waiting;
  Slot* chosen = nullptr;
  for (const std::unique_ptr<Slot>& slot : slots_) {
    if (slot->busy) continue;
    if (chosen == nullptr || (slot->live && !chosen->live)) chosen = slot.get();
  }
  if (chosen == nullptr) return nullptr;
  chosen->busy = true;
  ++stats_.busy;
  return chosen;
}

void SandboxPool::Release(Slot* slot) const {
  absl::MutexLock lock(&mu_);
  slot->busy = false;
  --stats_.busy;
}

void SandboxPool::Count(SlotEnd end, const std::string& reason) const {
  absl::MutexLock lock(&mu_);
  if (end == SlotEnd::kKilled) {
    ++stats_.killed;
    ++stats_.killed_by_reason[reason];
  } else {
    ++stats_.recycled;
    ++stats_.recycled_by_reason[reason];
  }
}

bool SandboxPool::Alive(const Slot& slot) const {
  return slot.zygote_pidfd.valid() && !Readable(slot.zygote_pidfd.get()) &&
         (!slot.bwrap_pidfd.valid() || !Readable(slot.bwrap_pidfd.get()));
}

void SandboxPool::Kill(Slot& slot) const {
  if (slot.zygote_pidfd.valid()) PidfdSendSignal(slot.zygote_pidfd.get(), SIGKILL);
  if (slot.bwrap_pid > 0) {
    kill(-slot.bwrap_pid, SIGKILL);
    kill(slot.bwrap_pid, SIGKILL);
    int wait_status;
    while (waitpid(slot.bwrap_pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
  // The zygote's pidfd reports its exit once the kernel has emptied its
  // namespace.
  if (slot.zygote_pidfd.valid()) {
    WaitPidfd(slot.zygote_pidfd.get(), absl::Now() + kNamespaceExitGrace);
  }
  slot.bwrap_pid = -1;
  slot.zygote_pidfd.Reset();
  slot.bwrap_pidfd.Reset();
  slot.control.Reset();
  slot.log.Reset();
  slot.status.Reset();
  slot.uid.reset();
  slot.runs = 0;
  absl::MutexLock lock(&mu_);
  slot.live = false;
  slot.zygote_pid = -1;
}

absl::Status SandboxPool::Start(Slot& slot) const {
  const absl::Time deadline = absl::Now() + pool_options_.start_timeout;
  const bool as_root = geteuid() == 0;
  slot.log_text.clear();
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets) != 0) {
    return ErrnoError("socketpair");
  }
  UniqueFd control(sockets[0]);
  UniqueFd zygote_end(sockets[1]);
  // A slot that stops reading must not block a server thread for ever.
  struct timeval send_timeout = {10, 0};
  setsockopt(control.get(), SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  UniqueFd dev_null(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!dev_null.valid()) return ErrnoError("open /dev/null");
  absl::StatusOr<Pipe> log = MakePipe();
  absl::StatusOr<Pipe> status = MakePipe();
  if (!log.ok()) return log.status();
  if (!status.ok()) return status.status();
  absl::StatusOr<UniqueFd> seccomp = MakeMemfd("sluice-seccomp", seccomp_bpf_);
  if (!seccomp.ok()) return seccomp.status();
  absl::StatusOr<UniqueFd> zygote = MakeMemfd("sluice-zygote", kZygotePy);
  if (!zygote.ok()) return zygote.status();
  UniqueFd interpreter(open(pool_options_.python_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!interpreter.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox slot set-up failed: cannot open the interpreter ", pool_options_.python_path,
        ": ", strerror(errno), " -- the program to run is missing: check the interpreter path "
        "(--python) and read_only_paths"));
  }

  BwrapLaunch launch = ZygoteSlotLaunch(
      options_,
      {.dev_null = dev_null.get(), .log_fd = log->write.get(), .control_fd = zygote_end.get(),
       .seccomp_fd = seccomp->get(), .status_fd = status->write.get(), .zygote_fd = zygote->get(),
       .interpreter_fd = interpreter.get()},
      zygote_settings_, as_root);
  if (as_root) {
    absl::StatusOr<std::unique_ptr<UidLease>> lease = UidLease::Acquire(options_);
    if (!lease.ok()) return lease.status();
    slot.uid = *std::move(lease);
    launch.uid = slot.uid->uid();
  }
  absl::StatusOr<pid_t> launched = launcher_->Launch(options_, launch);
  if (!launched.ok()) {
    slot.uid.reset();
    return launched.status();
  }
  slot.bwrap_pid = *launched;
  slot.bwrap_pidfd = UniqueFd(PidfdOpen(slot.bwrap_pid));
  slot.control = std::move(control);
  slot.log = std::move(log->read);
  slot.status = std::move(status->read);
  log->write.Reset();
  status->write.Reset();
  zygote_end.Reset();
  for (int fd : {slot.log.get(), slot.status.get()}) {
    if (absl::Status s = SetNonBlocking(fd); !s.ok()) {
      Kill(slot);
      return s;
    }
  }

  // Wait for the zygote's pid (bwrap's status) and its "ready".
  std::string status_text;
  std::string control_text;
  const auto fail = [&](absl::string_view what) {
    DrainLog(slot.log.get(), slot.log_text);
    Kill(slot);
    std::string log_text = slot.log_text;
    while (!log_text.empty() && (log_text.back() == '\n' || log_text.back() == ' ')) {
      log_text.pop_back();
    }
    const std::string hint = SandboxSetupHint(log_text);
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox slot set-up failed: ", what,
                     log_text.empty() ? "" : absl::StrCat(": ", log_text),
                     hint.empty() ? "" : absl::StrCat(" -- ", hint)));
  };
  while (true) {
    struct pollfd fds[4] = {{slot.control.get(), POLLIN, 0},
                            {slot.log.get(), POLLIN, 0},
                            {slot.bwrap_pidfd.get(), POLLIN, 0},
                            {slot.status.get(), POLLIN, 0}};
    const int rc = poll(fds, slot.zygote_pidfd.valid() ? 3 : 4, PollTimeoutMs(deadline));
    if (rc < 0 && errno != EINTR) return fail(absl::StrCat("poll: ", strerror(errno)));
    if (rc == 0) {
      return fail(absl::StrCat("the slot did not start within ",
                               absl::FormatDuration(pool_options_.start_timeout)));
    }
    if (fds[1].revents != 0) DrainLog(slot.log.get(), slot.log_text);
    if (!slot.zygote_pidfd.valid() && fds[3].revents != 0) {
      char chunk[1024];
      const ssize_t n = read(slot.status.get(), chunk, sizeof(chunk));
      if (n > 0) status_text.append(chunk, static_cast<size_t>(n));
      if (std::optional<pid_t> init = ParseChildPid(status_text); init.has_value()) {
        slot.zygote_pidfd = OpenChildPidfd(*init, slot.bwrap_pid);
        if (!slot.zygote_pidfd.valid()) return fail("the slot's init is gone");
        absl::MutexLock lock(&mu_);
        slot.zygote_pid = *init;
      }
    }
    if (fds[0].revents != 0) {
      if (!ReadControl(slot.control.get(), control_text)) {
        return fail("the interpreter exited before it was ready");
      }
      if (std::optional<std::string> line = NextLine(control_text); line.has_value()) {
        const json event = ParseEvent(*line);
        if (!event.is_object() || event.value("event", "") != "ready") {
          return fail(absl::StrCat("unexpected first message from the slot: ", *line));
        }
        if (!slot.zygote_pidfd.valid()) return fail("bwrap did not report the slot's init");
        break;
      }
    }
    if (fds[2].revents != 0) {
      DrainLog(slot.log.get(), slot.log_text);
      return fail("bwrap exited");
    }
  }
  absl::MutexLock lock(&mu_);
  slot.live = true;  // Its runs count from 0 (Kill reset them, or it is new).
  ++stats_.slots_started;
  return absl::OkStatus();
}

absl::Status SandboxPool::Warm() const {
  absl::Status first = absl::OkStatus();
  std::vector<Slot*> taken;
  for (int i = 0; i < pool_options_.slots; ++i) {
    Slot* slot = Acquire(absl::Now() + pool_options_.start_timeout);
    if (slot == nullptr) break;
    taken.push_back(slot);
    if (!slot->live || !Alive(*slot)) {
      if (slot->live) Kill(*slot);
      if (absl::Status status = Start(*slot); !status.ok() && first.ok()) first = status;
    }
  }
  for (Slot* slot : taken) Release(slot);
  return first;
}

absl::StatusOr<SandboxResult> SandboxPool::Run(const SandboxRequest& request) const {
  const absl::Time start = absl::Now();
  if (request.argv.empty()) return absl::InvalidArgumentError("argv must not be empty");
  if (request.deadline == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("deadline must be set");
  }
  if (absl::Status s = ValidPath("argv[0]", request.argv[0]); !s.ok()) return s;
  if (request.files.size() > static_cast<size_t>(kMaxFiles)) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxFiles, " files"));
  }
  uint64_t file_bytes = 0;
  for (const SandboxFile& file : request.files) {
    if (absl::Status s = ValidPath("files[].path", file.path); !s.ok()) return s;
    if (!absl::StartsWith(file.path, kFilesDir) || file.path.size() <= strlen(kFilesDir) ||
        absl::StrContains(file.path, "//") || absl::EndsWith(file.path, "/")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "files[].path must name a file under ", kFilesDir, " in a pooled sandbox, got \"",
          file.path, "\""));
    }
    if (file.contents.size() > options_.max_file_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "file ", file.path, " exceeds max_file_bytes (", options_.max_file_bytes, ")"));
    }
    file_bytes += file.contents.size();
  }
  if (file_bytes > options_.tmpfs_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the files' ", file_bytes,
                                                   " bytes exceed tmpfs_bytes (",
                                                   options_.tmpfs_bytes, ")"));
  }
  if (request.secret.size() > 4096) return absl::InvalidArgumentError("secret exceeds 4096 bytes");

  Slot* slot = Acquire(request.deadline);
  if (slot == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no sandbox slot came free before the deadline (", pool_options_.slots,
                     " slots, all busy)"));
  }
  if (slot->live && !Alive(*slot)) {
    Kill(*slot);
    Count(SlotEnd::kKilled, "died");
  }
  if (!slot->live) {
    if (absl::Status started = Start(*slot); !started.ok()) {
      Release(slot);
      return started;
    }
  }
  Outcome outcome;
  absl::StatusOr<SandboxResult> result = RunOn(*slot, request, start, outcome);
  ++slot->runs;
  if (!outcome.killed.empty()) {
    Kill(*slot);
    Count(SlotEnd::kKilled, outcome.killed);
  } else if (!outcome.recycle.empty() || slot->runs >= pool_options_.max_runs_per_slot) {
    const std::string reason = outcome.recycle.empty() ? "max_runs" : outcome.recycle;
    Kill(*slot);
    Count(SlotEnd::kRecycled, reason);
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.runs;
    if (outcome.finished && result.ok()) {
      // An exponential mean over the last ~20 runs.
      stats_.mean_run_time = stats_.mean_run_time == absl::ZeroDuration()
                                 ? result->wall_time
                                 : stats_.mean_run_time * 0.95 + result->wall_time * 0.05;
    }
  }
  Release(slot);
  return result;
}

absl::StatusOr<SandboxResult> SandboxPool::RunOn(Slot& slot, const SandboxRequest& request,
                                                 absl::Time start, Outcome& outcome) const {
  absl::StatusOr<Pipe> out = MakePipe();
  absl::StatusOr<Pipe> err = MakePipe();
  absl::StatusOr<Pipe> secret = MakePipe();
  absl::StatusOr<Pipe> result = MakePipe();
  for (const auto* pipe : {&out, &err, &secret, &result}) {
    if (!pipe->ok()) return pipe->status();
  }
  if (absl::Status s = WriteAll(secret->write.get(), request.secret); !s.ok()) return s;
  secret->write.Reset();

  json header;
  header["argv"] = request.argv;
  header["env"] = json::array();
  for (const auto& [key, value] : SandboxEnv(request.env)) header["env"].push_back({key, value});
  header["files"] = json::array();
  for (const SandboxFile& file : request.files) {
    header["files"].push_back({{"path", file.path}, {"size", file.contents.size()}});
  }
  header["cpu_seconds"] = RunCpuSeconds(options_, request.deadline, start);
  // Program text is not necessarily UTF-8: the JSON carries only ASCII-safe
  // fields (argv and env must be valid UTF-8 for the dump).
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("argv and env must be valid UTF-8 in a pooled sandbox: ", e.what()));
  }
  const int fds[4] = {out->write.get(), err->write.get(), secret->read.get(),
                      result->write.get()};
  absl::Status sent =
      SendLengthWithFds(slot.control.get(), static_cast<uint32_t>(header_text.size()), fds, 4);
  if (sent.ok()) sent = SendAll(slot.control.get(), header_text);
  for (size_t i = 0; sent.ok() && i < request.files.size(); ++i) {
    sent = SendAll(slot.control.get(), request.files[i].contents);
  }
  out->write.Reset();
  err->write.Reset();
  result->write.Reset();
  if (!sent.ok()) {
    outcome.killed = "died";
    return absl::InternalError(absl::StrCat("the sandbox slot stopped taking programs: ",
                                            sent.message()));
  }

  Stream streams[3];
  streams[0] = {out->read.get(), true, false, options_.output_bytes_kept};
  streams[1] = {err->read.get(), true, true, options_.output_bytes_kept};
  streams[2] = {result->read.get(), true, false, kResultBytesKept};
  for (int fd : {out->read.get(), err->read.get(), result->read.get()}) {
    if (absl::Status s = SetNonBlocking(fd); !s.ok()) {
      outcome.killed = "protocol";
      return s;
    }
  }

  std::optional<Termination> killed_for;
  std::optional<json> exit_event;
  std::optional<std::string> exec_error;
  bool done = false;
  bool clean = false;
  std::string dirty_reason;
  std::string control_text;
  bool control_open = true;
  absl::Time cleanup_deadline = absl::InfiniteFuture();
  absl::Time drain_deadline = absl::InfiniteFuture();
  std::vector<char> buffer(kReadChunk);
  const auto kill_slot = [&](Termination reason, const char* why) {
    if (killed_for.has_value() || !outcome.killed.empty()) return;
    if (reason != Termination::kExited) killed_for = reason;
    outcome.killed = why;
    if (absl::string_view(why) == "died" && slot.zygote_pidfd.valid()) {
      // Let it finish saying why (a traceback) before it is killed.
      WaitPidfd(slot.zygote_pidfd.get(), absl::Now() + absl::Milliseconds(500));
    }
    if (slot.log.valid()) DrainLog(slot.log.get(), slot.log_text);
    // The pipes' writers all live in the namespace: killing it closes them.
    Kill(slot);
    drain_deadline = absl::Now() + kDrainGrace;
  };
  while (true) {
    const bool pipes_open = streams[0].open || streams[1].open || streams[2].open;
    const bool settled = done || !outcome.killed.empty();
    if (settled && (!pipes_open || absl::Now() >= drain_deadline)) break;
    struct pollfd polled_fds[5];
    Stream* polled[5];
    int n = 0;
    for (Stream& stream : streams) {
      if (!stream.open) continue;
      polled_fds[n] = {stream.fd, POLLIN, 0};
      polled[n++] = &stream;
    }
    const int control_index = n;
    const bool watch_slot = outcome.killed.empty() && !done;
    if (watch_slot && control_open) polled_fds[n++] = {slot.control.get(), POLLIN, 0};
    const int pidfd_index = n;
    if (watch_slot) polled_fds[n++] = {slot.zygote_pidfd.get(), POLLIN, 0};
    const absl::Time wake = settled ? drain_deadline
                            : exit_event.has_value() || exec_error.has_value()
                                ? cleanup_deadline
                                : request.deadline;
    const int rc = poll(polled_fds, n, PollTimeoutMs(wake));
    if (rc < 0 && errno != EINTR) {
      kill_slot(Termination::kDeadline, "protocol");
      continue;
    }
    for (int i = 0; i < control_index; ++i) {
      if (polled_fds[i].revents != 0) polled[i]->ReadSome(buffer.data());
    }
    const uint64_t output = streams[0].total + streams[1].total + streams[2].total;
    if (options_.max_output_bytes > 0 && output > options_.max_output_bytes && !done) {
      kill_slot(Termination::kOutputLimit, "output_limit");
      continue;
    }
    if (watch_slot && control_open && polled_fds[control_index].revents != 0) {
      if (!ReadControl(slot.control.get(), control_text)) control_open = false;
      while (std::optional<std::string> line = NextLine(control_text)) {
        const json event = ParseEvent(*line);
        const std::string kind = event.is_object() ? event.value("event", "") : "";
        if (kind == "exit" && !exit_event.has_value()) {
          exit_event = event;
          cleanup_deadline = absl::Now() + kCleanupGrace;
        } else if (kind == "exec_error" && !exec_error.has_value()) {
          exec_error = event.value("message", "");
          cleanup_deadline = absl::Now() + kCleanupGrace;
        } else if (kind == "done" && (exit_event.has_value() || exec_error.has_value())) {
          done = true;
          clean = event.value("clean", false);
          dirty_reason = event.value("reason", "");
          drain_deadline = absl::Now() + kDrainGrace;
        } else {
          kill_slot(Termination::kExited, "protocol");
          break;
        }
      }
    }
    if (!outcome.killed.empty() || done) continue;
    if (!control_open || (pidfd_index < n && polled_fds[pidfd_index].revents != 0)) {
      // The zygote ended on its own (nothing inside can kill it: the kernel
      // did, or it failed).
      kill_slot(Termination::kExited, "died");
      continue;
    }
    const absl::Time now = absl::Now();
    if (!exit_event.has_value() && !exec_error.has_value() && now >= request.deadline) {
      kill_slot(Termination::kDeadline, "deadline");
    } else if ((exit_event.has_value() || exec_error.has_value()) && now >= cleanup_deadline) {
      kill_slot(Termination::kExited, "unresponsive");
    }
  }
  if (done && !clean) {
    outcome.recycle = "dirty";
  }

  SandboxResult run =
      CollectOutput(streams, secret->read.get(), !request.secret.empty(), start);
  if (killed_for.has_value()) {
    run.termination = *killed_for;
    return run;
  }
  if (exec_error.has_value()) {
    const std::string hint = SandboxSetupHint(*exec_error);
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox set-up failed: ", *exec_error, hint.empty() ? "" : " -- ", hint));
  }
  if (!exit_event.has_value()) {
    return absl::InternalError(absl::StrCat(
        "the sandbox slot ended before the program did (", outcome.killed, ")",
        slot.log_text.empty() ? "" : absl::StrCat(": ", slot.log_text)));
  }
  outcome.finished = outcome.killed.empty();
  const int code = exit_event->value("code", 0);
  if (exit_event->value("kind", "") == "signaled") {
    run.termination = Termination::kSignaled;
    run.signal = code;
  } else {
    run.termination = Termination::kExited;
    run.exit_code = code;
  }
  return run;
}

SandboxPoolStats SandboxPool::GetStats() const {
  absl::MutexLock lock(&mu_);
  SandboxPoolStats stats = stats_;
  stats.live = 0;
  for (const std::unique_ptr<Slot>& slot : slots_) stats.live += slot->live ? 1 : 0;
  return stats;
}

bool SandboxPool::AwaitBusy(int busy, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  const auto reached = [this, busy]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stats_.busy >= busy;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

std::vector<pid_t> SandboxPool::ZygotePids() const {
  absl::MutexLock lock(&mu_);
  std::vector<pid_t> pids;
  for (const std::unique_ptr<Slot>& slot : slots_) {
    if (slot->live && slot->zygote_pid > 0) pids.push_back(slot->zygote_pid);
  }
  return pids;
}

}  // namespace sluice::reward_server::sandbox
