#include "cli/local_stack.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/runtime/grpc_status.h"
#include "services/runtime/health_client.h"
#include "services/runtime/transport_security.h"
#include "sluice/v1/controller.grpc.pb.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

// The port of "host:port"; "0" when there is none.
std::string PortOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? "0" : address.substr(colon + 1);
}

constexpr int kLogTailLines = 15;

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

LocalStack::LocalStack(LocalStackOptions options) : options_(std::move(options)) {}

LocalStack::~LocalStack() { Stop().IgnoreError(); }

std::vector<std::string> LocalStack::ServiceNames() const {
  std::vector<std::string> names;
  for (const std::string& kind : ServiceKinds()) {
    if (kind != "rollout_worker") {
      names.push_back(kind);
      continue;
    }
    for (int i = 0; i < options_.rollout_workers; ++i) names.push_back(absl::StrCat(kind, "-", i));
  }
  return names;
}

const ServiceEndpoint* LocalStack::endpoint(const std::string& name) const {
  for (const ServiceEndpoint& endpoint : endpoints_) {
    if (endpoint.name == name) return &endpoint;
  }
  return nullptr;
}

void LocalStack::Say(const std::string& line) const {
  if (options_.console == nullptr) return;
  *options_.console << options_.console_prefix << ": " << line << std::endl;
}

std::vector<ServiceEndpoint> LocalStack::StackEndpoints() const {
  std::vector<ServiceEndpoint> stack;
  for (const Child& child : children_) stack.push_back(child.endpoint);
  return stack;
}

absl::Status LocalStack::Start() {
  RETURN_IF_ERROR(options_.Validate());
  if (lock_ != nullptr) return absl::FailedPreconditionError("the local stack is already started");
  std::error_code error;
  fs::create_directories(fs::path(options_.state_dir) / "logs", error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create state directory ", options_.state_dir, ": ", error.message()));
  }
  ASSIGN_OR_RETURN(lock_, StateDirLock::Acquire(options_.state_dir));
  absl::StatusOr<std::string> stale = ReplaceStaleEndpoints(endpoints_path(), options_.stop_grace);
  if (!stale.ok()) {
    lock_.reset();
    return stale.status();
  }
  if (!stale->empty()) {
    for (absl::string_view line : absl::StrSplit(*stale, '\n')) Say(std::string(line));
  }

  policy_ = std::make_unique<RestartPolicy>(options_.restart);
  children_.clear();
  for (const std::string& name : ServiceNames()) {
    Child child;
    child.endpoint.name = name;
    child.endpoint.kind = KindOf(name);
    child.endpoint.log_path = layout_.log_path(name);
    if (child.endpoint.kind == "rollout_worker") {
      child.endpoint.worker_id = absl::StrCat("worker-", name.substr(name.rfind('-') + 1));
    }
    children_.push_back(std::move(child));
  }
  if (options_.tls) {
    absl::StatusOr<StackSecurity> security =
        WriteStackSecurity(layout_.tls_dir(), StackEndpoints());
    if (!security.ok()) {
      lock_.reset();
      return security.status();
    }
    security_ = *security;
    // This process (health checks, reports to the controller, the CLI's
    // own calls) dials as the operator.
    runtime::ClientSecurity client;
    client.ca_file = security_->ca_cert;
    client.token_file = security_->operator_token_file;
    runtime::SetProcessClientSecurity(client);
    Say(absl::StrCat("TLS on: CA and certificates in ", security_->dir, "; operator token in ",
                     security_->operator_token_file));
  }
  for (Child& child : children_) {
    if (absl::Status status = StartProcess(child, /*restart=*/false); !status.ok()) {
      const std::string log_path = child.endpoint.log_path;
      Stop().IgnoreError();
      return absl::Status(status.code(),
                          absl::StrCat(status.message(), "\n--- last lines of ", log_path, " ---\n",
                                       TailOfFile(log_path, kLogTailLines)));
    }
  }
  return Publish();
}

absl::Status LocalStack::StartProcess(Child& child, bool restart) {
  ServiceEndpoint& endpoint = child.endpoint;
  // A first start truncates the log of a previous stack so that errors
  // quoted from it are ours; a restart keeps the previous process's last
  // lines, after which its caller wrote a marker.
  if (!restart) std::ofstream(endpoint.log_path, std::ios::trunc);
  const std::string port = restart && child.singleton() ? PortOf(endpoint.grpc) : "0";

  SubprocessOptions spawn;
  spawn.argv = layout_.Argv(endpoint, port, Subprocess::kReadyFd, StackEndpoints(), security_);
  // The services share the machine's cores: each OpenBLAS pool gets one
  // thread unless the user chose otherwise.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) {
    spawn.env.emplace_back("OPENBLAS_NUM_THREADS", "1");
  }
  spawn.log_path = endpoint.log_path;
  spawn.ready_pipe = true;

  ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> process, Subprocess::Start(spawn));
  const auto failed = [&](absl::string_view why) {
    const ExitStatus exit = process->Stop(options_.stop_grace);
    return absl::UnavailableError(absl::StrCat(endpoint.name, " failed to start: ", why, " (pid ",
                                               process->pid(), " ", DescribeExit(exit), ")"));
  };
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  absl::StatusOr<std::string> ready = process->WaitReady(deadline);
  if (!ready.ok()) return failed(ready.status().message());
  const nlohmann::json info = nlohmann::json::parse(*ready, nullptr, /*allow_exceptions=*/false);
  if (!info.is_object() || !info.contains("grpc") || !info["grpc"].is_string()) {
    return failed(absl::StrCat("unexpected ready line: ", *ready));
  }
  const std::string grpc = info["grpc"].get<std::string>();
  absl::StatusOr<std::string> health = runtime::CheckHealth(grpc, "", deadline - absl::Now());
  if (!health.ok() || *health != "SERVING") {
    return failed(health.ok() ? absl::StrCat("health is ", *health) : health.status().message());
  }
  endpoint.grpc = grpc;
  endpoint.metrics = info.value("metrics", "");
  endpoint.pid = process->pid();
  child.process = std::move(process);
  child.state = State::kRunning;
  log::Info("service healthy", {{"service", endpoint.name},
                                {"grpc", endpoint.grpc},
                                {"metrics", endpoint.metrics},
                                {"pid", static_cast<int64_t>(endpoint.pid)}});
  return absl::OkStatus();
}

absl::Status LocalStack::OnExit(Child& child) {
  const std::optional<ExitStatus> exit = child.process->TryWait();
  if (!exit.has_value()) return absl::OkStatus();  // Not gone after all.
  std::string event =
      absl::StrCat(child.endpoint.name, " (pid ", child.endpoint.pid, ") ", DescribeExit(*exit));
  if (!child.killed_because.empty()) {
    // Killed by this stack for not answering: why, not only how.
    event = absl::StrCat(child.endpoint.name, " (pid ", child.endpoint.pid, ") ",
                         child.killed_because, "; killed (SIGKILL) by ", options_.console_prefix);
    child.killed_because.clear();
  }
  child.process.reset();
  child.endpoint.pid = 0;
  child.endpoint.last_exit = event;
  if (IsFailure(*exit)) return OnFailure(child, event);

  // It chose to stop (a SIGTERM sent to it directly, a worker scaled down):
  // not restarted, as Kubernetes' OnFailure policy does.
  child.state = State::kExited;
  Republish();
  if (child.singleton()) {
    return absl::FailedPreconditionError(absl::StrCat(
        event,
        " by itself; a service that exits cleanly is not restarted, and the stack cannot "
        "go on without it\n--- last lines of ",
        child.endpoint.log_path, " ---\n", TailOfFile(child.endpoint.log_path, kLogTailLines)));
  }
  Say(absl::StrCat(event, " by itself; not restarting it (only failures are restarted)"));
  return absl::OkStatus();
}

absl::Status LocalStack::OnFailure(Child& child, const std::string& event) {
  const std::string& name = child.endpoint.name;
  child.endpoint.last_exit = event;
  const RestartDecision decision = policy_->OnFailure(name, event);
  if (decision.action == RestartDecision::Action::kRestart) {
    child.state = State::kRestarting;
    child.restart_at = absl::Now() + decision.delay;
    Say(absl::StrCat(event, "; restarting in ", absl::FormatDuration(decision.delay), " (",
                     policy_->DescribeRestart(decision), ")"));
    Republish();
    return absl::OkStatus();
  }

  child.state = State::kGaveUp;
  std::string report =
      absl::StrCat("GIVING UP on ", name, ": ", decision.give_up_reason, ". What happened to it:");
  for (const ServiceFailure& failure : decision.recent_failures) {
    absl::StrAppend(&report, "\n  ",
                    absl::FormatTime("%H:%M:%S", failure.at, absl::LocalTimeZone()), "  ",
                    failure.description);
  }
  absl::StrAppend(&report, "\n--- last lines of ", child.endpoint.log_path, " ---\n",
                  TailOfFile(child.endpoint.log_path, kLogTailLines));
  const std::string description =
      absl::StrCat(event, "; sluice up gave up restarting it: ", decision.give_up_reason);
  if (child.singleton()) {
    Say(absl::StrCat(event, "; giving up on it (", decision.give_up_reason, ")"));
    ReportToController(child, description);
    Republish();
    return absl::AbortedError(absl::StrCat(report, "\nthe stack cannot go on without ", name));
  }
  Say(report);
  ReportToController(child, description);
  int workers_left = 0;
  for (const Child& other : children_) {
    if (!other.singleton() &&
        (other.state == State::kRunning || other.state == State::kRestarting)) {
      ++workers_left;
    }
  }
  Say(absl::StrCat("going on without ", name, ": ", workers_left, " of ", options_.rollout_workers,
                   " rollout workers left"));
  // Last, so that a reader who sees "gave_up" finds all of the above said.
  Republish();
  return absl::OkStatus();
}

void LocalStack::ReportToController(const Child& child, const std::string& description) {
  if (child.endpoint.kind == "controller") {
    Say("the controller itself is gone: there is no one to record this in the runs");
    return;
  }
  const Child* controller = nullptr;
  for (const Child& other : children_) {
    if (other.endpoint.kind == "controller") controller = &other;
  }
  if (controller == nullptr || controller->state != State::kRunning) {
    Say("cannot tell the controller (it is not running)");
    return;
  }
  auto stub = v1::ControllerService::NewStub(runtime::CreateChannel(controller->endpoint.grpc));
  v1::ReportServiceFailureRequest request;
  request.set_service(child.endpoint.kind);
  request.set_description(description);
  if (!child.endpoint.worker_id.empty()) request.set_worker_id(child.endpoint.worker_id);
  v1::ReportServiceFailureResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  const grpc::Status status = stub->ReportServiceFailure(&context, request, &response);
  if (!status.ok()) {
    Say(absl::StrCat("could not tell the controller at ", controller->endpoint.grpc, ": ",
                     runtime::FromGrpcStatus(status).ToString()));
    return;
  }
  Say(absl::StrCat("told the controller; ",
                   response.failed_run_ids().empty()
                       ? std::string("no run failed because of it")
                       : absl::StrCat("runs failed because of it: ",
                                      absl::StrJoin(response.failed_run_ids(), ", "))));
}

absl::Status LocalStack::RestartDue() {
  for (Child& child : children_) {
    if (child.state != State::kRestarting || child.restart_at > absl::Now()) continue;
    const std::string& name = child.endpoint.name;
    {
      std::ofstream log(child.endpoint.log_path, std::ios::app);
      log << "\n=== " << options_.console_prefix << ": starting " << name << " again at "
          << absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::Now(), absl::LocalTimeZone())
          << " (after: " << child.endpoint.last_exit << ") ===\n";
    }
    if (absl::Status status = StartProcess(child, /*restart=*/true); !status.ok()) {
      RETURN_IF_ERROR(OnFailure(child, std::string(status.message())));
      continue;
    }
    policy_->OnRestarted(name);
    // Liveness starts afresh with the new process.
    child.liveness.reset();
    child.probe_at = absl::Now() + options_.liveness.period;
    child.endpoint.restarts = policy_->restarts(name);
    Say(absl::StrCat(name, " restarted: pid ", child.endpoint.pid, " at ", child.endpoint.grpc));
    Republish();
  }
  return absl::OkStatus();
}

absl::Time LocalStack::ProbeLiveness() {
  if (!options_.liveness.enabled()) return absl::InfiniteFuture();
  // How soon to look again for an answer in flight.
  constexpr absl::Duration kAnswerPoll = absl::Milliseconds(20);
  const absl::Time now = absl::Now();
  absl::Time next = absl::InfiniteFuture();
  for (Child& child : children_) {
    if (child.state != State::kRunning || child.process == nullptr) continue;
    if (child.probe != nullptr && child.probed_pid != child.endpoint.pid) {
      child.probe.reset();  // It asked a process that is gone.
    }
    if (child.probe != nullptr) {
      if (child.probe->wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        next = std::min(next, now + kAnswerPoll);
        continue;
      }
      const absl::Status answer = child.probe->get();
      child.probe.reset();
      if (child.liveness == nullptr) {
        child.liveness = std::make_shared<LivenessCount>(options_.liveness);
      }
      if (child.liveness->OnProbe(answer.ok(), std::string(answer.message())) &&
          child.killed_because.empty()) {
        child.killed_because = child.liveness->Describe();
        Say(absl::StrCat(child.endpoint.name, " (pid ", child.endpoint.pid, ") ",
                         child.killed_because, "; killing it (liveness check)"));
        // Its exit then shows on its pidfd, and OnExit restarts it. SIGKILL
        // ends a process stopped with SIGSTOP too.
        child.process->Signal(SIGKILL).IgnoreError();
        continue;
      }
    }
    if (now >= child.probe_at) {
      child.probe_at = now + options_.liveness.period;
      child.probed_pid = child.endpoint.pid;
      const std::string target = child.endpoint.grpc;
      const absl::Duration timeout = options_.liveness.timeout;
      // On its own thread: a hung service must not hold the supervision.
      // Any answer (NOT_SERVING included) is one: the process is alive.
      child.probe = std::make_shared<std::future<absl::Status>>(
          std::async(std::launch::async, [target, timeout]() -> absl::Status {
            absl::StatusOr<std::string> health = runtime::CheckHealth(target, "", timeout);
            return health.ok() ? absl::OkStatus() : health.status();
          }));
      next = std::min(next, now + kAnswerPoll);
      continue;
    }
    next = std::min(next, child.probe_at);
  }
  return next;
}

absl::Status LocalStack::Publish() {
  endpoints_.clear();
  for (const Child& child : children_) {
    ServiceEndpoint endpoint = child.endpoint;
    switch (child.state) {
      case State::kRunning:
        endpoint.state = "running";
        break;
      case State::kRestarting:
        endpoint.state = "restarting";
        break;
      case State::kGaveUp:
        endpoint.state = "gave_up";
        break;
      case State::kExited:
        endpoint.state = "exited";
        break;
    }
    endpoints_.push_back(std::move(endpoint));
  }
  return WriteEndpoints();
}

void LocalStack::Republish() {
  if (absl::Status written = Publish(); !written.ok()) Say(std::string(written.message()));
}

absl::Status LocalStack::WriteEndpoints() const {
  nlohmann::ordered_json services = nlohmann::ordered_json::object();
  for (const ServiceEndpoint& endpoint : endpoints_) {
    nlohmann::ordered_json service = {
        {"grpc", endpoint.grpc},
        {"metrics", endpoint.metrics},
        {"pid", endpoint.pid > 0 ? nlohmann::ordered_json(static_cast<int64_t>(endpoint.pid))
                                 : nlohmann::ordered_json(nullptr)},
        {"log", endpoint.log_path},
        {"state", endpoint.state},
        {"restarts", endpoint.restarts}};
    if (!endpoint.last_exit.empty()) service["last_exit"] = endpoint.last_exit;
    if (!endpoint.worker_id.empty()) service["worker_id"] = endpoint.worker_id;
    services[endpoint.name] = std::move(service);
  }
  const std::string data_dir = buffer_data_dir();
  const nlohmann::ordered_json document = {
      {"supervisor_pid", static_cast<int64_t>(getpid())},
      {"services", services},
      {"runs_dir", runs_dir()},
      {"security",
       !security_.has_value()
           ? nlohmann::ordered_json(nullptr)
           : nlohmann::ordered_json{{"tls_ca", security_->ca_cert},
                                    {"token_file", security_->operator_token_file},
                                    {"viewer_token_file", security_->viewer_token_file}}},
      {"buffer_data_dir",
       data_dir.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(data_dir)}};
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

  absl::Status result = absl::OkStatus();
  while (result.ok()) {
    result = RestartDue();
    if (!result.ok()) break;

    std::vector<struct pollfd> fds;
    std::vector<Child*> watched;  // watched[i] owns fds[i + 1].
    fds.push_back({signal_fd, POLLIN, 0});
    absl::Time next_restart = absl::InfiniteFuture();
    for (Child& child : children_) {
      if (child.state == State::kRunning) {
        fds.push_back({child.process->pidfd(), POLLIN, 0});
        watched.push_back(&child);
      } else if (child.state == State::kRestarting) {
        next_restart = std::min(next_restart, child.restart_at);
      }
    }
    // Last, so a child that died at the same moment is handled first.
    if (wake_fd >= 0) fds.push_back({wake_fd, POLLIN, 0});
    const absl::Time next_event = std::min(next_restart, ProbeLiveness());
    int timeout_ms = -1;
    if (next_event != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(absl::Ceil(next_event - absl::Now(), absl::Milliseconds(1))), 0,
          1 << 30));
    }
    const int n = poll(fds.data(), fds.size(), timeout_ms);
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
    for (size_t i = 0; i < watched.size() && result.ok(); ++i) {
      if (fds[i + 1].revents & POLLIN) result = OnExit(*watched[i]);
    }
    if (!result.ok()) break;
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
    if (it->process != nullptr) it->process->Signal(SIGTERM).IgnoreError();
  }
  const absl::Time deadline = absl::Now() + options_.stop_grace;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    if (it->process == nullptr) continue;
    absl::StatusOr<ExitStatus> exit = it->process->Wait(deadline);
    if (!exit.ok()) {
      it->process->Signal(SIGKILL).IgnoreError();
      exit = it->process->Wait(absl::InfiniteFuture());
      unclean.push_back(absl::StrCat(it->endpoint.name, " did not stop within ",
                                     absl::FormatDuration(options_.stop_grace), " and was killed"));
    } else if (!exit->success() && !(exit->signaled && exit->signal == SIGTERM)) {
      unclean.push_back(absl::StrCat(it->endpoint.name, " ", exit->ToString()));
    }
  }
  children_.clear();
  endpoints_.clear();
  if (lock_ != nullptr) {
    std::error_code ignored;
    fs::remove(endpoints_path(), ignored);
    lock_.reset();
  }
  policy_.reset();
  if (!unclean.empty()) return absl::InternalError(absl::StrJoin(unclean, "; "));
  return absl::OkStatus();
}

}  // namespace sluice::cli
