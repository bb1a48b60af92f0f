#include "services/cli/local_stack.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "services/runtime/health_client.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

std::string BinaryFor(const std::string& name) {
  std::string binary = "sluice-" + name;
  for (char& c : binary) {
    if (c == '_') c = '-';
  }
  return binary;
}

bool UsesTorch(const std::string& name) { return name == "trainer" || name == "rollout_worker"; }

}  // namespace

std::string TailOfFile(const std::string& path, int max_lines) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
  }
  return absl::StrJoin(lines, "\n");
}

absl::Status LocalStackOptions::Validate() const {
  if (bin_dir.empty()) return absl::InvalidArgumentError("bin_dir must be set");
  if (state_dir.empty()) return absl::InvalidArgumentError("state_dir must be set");
  for (const std::string& name : LocalStack::ServiceNames()) {
    const fs::path binary = fs::path(bin_dir) / BinaryFor(name);
    if (access(binary.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("service binary ", binary.string(),
                                              " is missing or not executable; build it first "
                                              "(cmake --build build) or pass --bin-dir"));
    }
  }
  const MemoryShares& shares = memory_shares;
  if (!(shares.trainer >= 0 && shares.rollout_workers >= 0 && shares.replay_buffer >= 0) ||
      shares.trainer + shares.rollout_workers + shares.replay_buffer > 100) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory_shares must be >= 0 and add up to at most 100%%; got trainer %g%%, rollout "
        "workers %g%%, replay buffer %g%%",
        shares.trainer, shares.rollout_workers, shares.replay_buffer));
  }
  if (torch_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("torch_threads must be >= 0; got ", torch_threads));
  }
  return log::ParseFormat(log_format).status();
}

const std::vector<std::string>& LocalStack::ServiceNames() {
  static const auto* names = new std::vector<std::string>{
      "reward_server", "replay_buffer", "trainer", "rollout_worker", "controller"};
  return *names;
}

LocalStack::LocalStack(LocalStackOptions options) : options_(std::move(options)) {}

LocalStack::~LocalStack() { Stop().IgnoreError(); }

std::string LocalStack::endpoints_path() const {
  return (fs::path(options_.state_dir) / "endpoints.json").string();
}

std::string LocalStack::runs_dir() const {
  const fs::path dir = options_.runs_dir.empty() ? fs::path(options_.state_dir) / ".." / "runs"
                                                 : fs::path(options_.runs_dir);
  std::error_code error;
  const fs::path absolute = fs::absolute(dir, error);
  return (error ? dir : absolute).lexically_normal().string();
}

std::vector<std::string> LocalStack::ControllerFlags() const {
  std::vector<std::string> flags = {absl::StrCat("--runs-dir=", runs_dir())};
  std::vector<std::string> workers;
  for (const ServiceEndpoint& endpoint : endpoints_) {
    if (endpoint.name == "trainer") {
      flags.push_back(absl::StrCat("--trainer-address=", endpoint.grpc));
    } else if (endpoint.name == "replay_buffer") {
      flags.push_back(absl::StrCat("--replay-buffer-address=", endpoint.grpc));
    } else if (endpoint.name == "reward_server") {
      flags.push_back(absl::StrCat("--reward-server-address=", endpoint.grpc));
    } else if (endpoint.name == "rollout_worker") {
      workers.push_back(endpoint.grpc);
    }
  }
  if (!workers.empty()) {
    flags.push_back(absl::StrCat("--rollout-worker-addresses=", absl::StrJoin(workers, ",")));
  }
  return flags;
}

std::string LocalStack::MemoryBudgetFlag(const std::string& name) const {
  const MemoryShares& shares = options_.memory_shares;
  double share = 0;
  if (name == "trainer") {
    share = shares.trainer;
  } else if (name == "replay_buffer") {
    share = shares.replay_buffer;
  } else if (name == "rollout_worker") {
    const auto& names = ServiceNames();
    share = shares.rollout_workers /
            static_cast<double>(std::count(names.begin(), names.end(), "rollout_worker"));
  }
  if (share <= 0) return "";
  return absl::StrFormat("--memory-budget=%g%%", share);
}

absl::Status LocalStack::Start() {
  RETURN_IF_ERROR(options_.Validate());
  std::error_code error;
  fs::create_directories(fs::path(options_.state_dir) / "logs", error);
  if (error) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create state directory ", options_.state_dir, ": ", error.message()));
  }
  for (const std::string& name : ServiceNames()) {
    if (absl::Status status = StartOne(name); !status.ok()) {
      Stop().IgnoreError();
      return status;
    }
  }
  return WriteEndpoints();
}

absl::Status LocalStack::StartOne(const std::string& name) {
  Child child;
  child.endpoint.name = name;
  child.endpoint.log_path = (fs::path(options_.state_dir) / "logs" / (name + ".log")).string();
  // Truncate the log of a previous run so that errors quoted from it are ours.
  std::ofstream(child.endpoint.log_path, std::ios::trunc);

  SubprocessOptions spawn;
  spawn.argv = {(fs::path(options_.bin_dir) / BinaryFor(name)).string(),
                "--listen-address=127.0.0.1:0",
                "--metrics-port=0",
                absl::StrCat("--ready-fd=", Subprocess::kReadyFd),
                absl::StrCat("--log-format=", options_.log_format)};
  if (UsesTorch(name)) {
    spawn.argv.push_back(absl::StrCat("--torch-threads=", options_.torch_threads));
  }
  if (std::string flag = MemoryBudgetFlag(name); !flag.empty()) spawn.argv.push_back(flag);
  if (name == "controller") {
    for (std::string& flag : ControllerFlags()) spawn.argv.push_back(std::move(flag));
  }
  // The services share the machine's cores: each OpenBLAS pool gets one
  // thread unless the user chose otherwise.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    spawn.env.emplace_back("OPENBLAS_NUM_THREADS", "1");
  }
  spawn.log_path = child.endpoint.log_path;
  spawn.ready_pipe = true;

  const auto failed = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat(
        name, " failed to start: ", why, "\n--- last lines of ", child.endpoint.log_path,
        " ---\n", TailOfFile(child.endpoint.log_path, 15)));
  };

  ASSIGN_OR_RETURN(child.process, Subprocess::Start(spawn));
  child.endpoint.pid = child.process->pid();
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  absl::StatusOr<std::string> ready = child.process->WaitReady(deadline);
  if (!ready.ok()) {
    child.process->Stop(options_.stop_grace);
    return failed(ready.status().message());
  }
  const nlohmann::json info = nlohmann::json::parse(*ready, nullptr, /*allow_exceptions=*/false);
  if (!info.is_object() || !info.contains("grpc") || !info["grpc"].is_string()) {
    child.process->Stop(options_.stop_grace);
    return failed(absl::StrCat("unexpected ready line: ", *ready));
  }
  child.endpoint.grpc = info["grpc"].get<std::string>();
  child.endpoint.metrics = info.value("metrics", "");

  absl::StatusOr<std::string> health =
      runtime::CheckHealth(child.endpoint.grpc, "", deadline - absl::Now());
  if (!health.ok() || *health != "SERVING") {
    child.process->Stop(options_.stop_grace);
    return failed(health.ok() ? absl::StrCat("health is ", *health) : health.status().message());
  }
  log::Info("service healthy", {{"service", name},
                                {"grpc", child.endpoint.grpc},
                                {"metrics", child.endpoint.metrics},
                                {"pid", static_cast<int64_t>(child.endpoint.pid)}});
  endpoints_.push_back(child.endpoint);
  children_.push_back(std::move(child));
  return absl::OkStatus();
}

absl::Status LocalStack::WriteEndpoints() const {
  nlohmann::ordered_json services = nlohmann::ordered_json::object();
  for (const ServiceEndpoint& endpoint : endpoints_) {
    services[endpoint.name] = {{"grpc", endpoint.grpc},
                               {"metrics", endpoint.metrics},
                               {"pid", static_cast<int64_t>(endpoint.pid)},
                               {"log", endpoint.log_path}};
  }
  const nlohmann::ordered_json document = {{"services", services}, {"runs_dir", runs_dir()}};
  // Written whole then renamed, so a reader never sees half a file.
  const std::string path = endpoints_path();
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << document.dump(2) << "\n";
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write ", temporary));
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status LocalStack::Supervise(std::string* reason, int wake_fd) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  const int signal_fd = signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd < 0) return absl::InternalError(absl::StrCat("signalfd: ", strerror(errno)));

  std::vector<struct pollfd> fds;
  fds.push_back({signal_fd, POLLIN, 0});
  for (const Child& child : children_) fds.push_back({child.process->pidfd(), POLLIN, 0});
  // Last, so a child that died at the same moment is reported first.
  if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
  const size_t children_end = wake_fd >= 0 ? fds.size() - 1 : fds.size();
  absl::Status result = absl::OkStatus();
  while (true) {
    const int n = poll(fds.data(), fds.size(), -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      result = absl::InternalError(absl::StrCat("poll: ", strerror(errno)));
      break;
    }
    if (fds[0].revents & POLLIN) {
      struct signalfd_siginfo info;
      if (read(signal_fd, &info, sizeof(info)) == sizeof(info) && reason != nullptr) {
        *reason = strsignal(static_cast<int>(info.ssi_signo));
      }
      break;
    }
    bool died = false;
    for (size_t i = 1; i < children_end; ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      Child& child = children_[i - 1];
      const std::optional<ExitStatus> exit = child.process->TryWait();
      result = absl::AbortedError(absl::StrCat(
          child.endpoint.name, " (pid ", child.endpoint.pid, ") ",
          exit.has_value() ? exit->ToString() : "exited", "\n--- last lines of ",
          child.endpoint.log_path, " ---\n", TailOfFile(child.endpoint.log_path, 15)));
      died = true;
      break;
    }
    if (died) break;
    if (wake_fd >= 0 && (fds.back().revents & POLLIN)) {
      if (reason != nullptr) *reason = "woken";
      break;
    }
  }
  close(signal_fd);
  return result;
}

absl::Status LocalStack::Stop() {
  std::vector<std::string> unclean;
  // Signal every service first so they drain in parallel, newest first, then
  // collect them.
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    it->process->Signal(SIGTERM).IgnoreError();
  }
  const absl::Time deadline = absl::Now() + options_.stop_grace;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    absl::StatusOr<ExitStatus> exit = it->process->Wait(deadline);
    if (!exit.ok()) {
      it->process->Signal(SIGKILL).IgnoreError();
      exit = it->process->Wait(absl::InfiniteFuture());
      unclean.push_back(absl::StrCat(it->endpoint.name, " did not stop within ",
                                     absl::FormatDuration(options_.stop_grace),
                                     " and was killed"));
    } else if (!exit->success() && !(exit->signaled && exit->signal == SIGTERM)) {
      unclean.push_back(absl::StrCat(it->endpoint.name, " ", exit->ToString()));
    }
  }
  children_.clear();
  if (!endpoints_.empty()) {
    std::error_code ignored;
    fs::remove(endpoints_path(), ignored);
  }
  endpoints_.clear();
  if (!unclean.empty()) return absl::InternalError(absl::StrJoin(unclean, "; "));
  return absl::OkStatus();
}

}  // namespace sluice::cli
