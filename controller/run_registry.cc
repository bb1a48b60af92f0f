#include "controller/run_registry.h"

#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/run/run_paths.h"
#include "common/run/run_verification.h"
#include "common/status_macros.h"
#include "controller/run_spec.h"
#include "controller/worker_registry.h"

namespace sluice::controller {
namespace {

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;
// What one ListRuns page may take: well under the 4 MiB a gRPC client
// receives by default, whatever the runs' specs hold.
constexpr size_t kMaxListRunsPageBytes = 2 << 20;

// A new run whose record could not be written (its files in the runs
// directory): nothing of it is kept, and the caller is told what to mend.
// A full disk stays RESOURCE_EXHAUSTED and a permission PERMISSION_DENIED;
// anything else is UNAVAILABLE (the directory failing: try again later).
absl::Status RunNotRecorded(const std::string& runs_dir, const std::string& run_dir,
                            const absl::Status& error) {
  std::error_code ignored;
  std::filesystem::remove_all(run_dir, ignored);
  const absl::StatusCode code = error.code() == absl::StatusCode::kResourceExhausted ||
                                        error.code() == absl::StatusCode::kPermissionDenied
                                    ? error.code()
                                    : absl::StatusCode::kUnavailable;
  log::Warning("refused a run: its record cannot be written",
               {{"runs_dir", runs_dir}, {"error", std::string(error.message())}});
  return absl::Status(code, absl::StrCat("the runs directory ", runs_dir,
                                         " (--runs-dir) cannot record a new run: ", error.message(),
                                         "; the run was not submitted (free space there, or "
                                         "fix it, and submit again)"));
}

}  // namespace

RunRegistry::RunRegistry(RunRegistryOptions options, ServiceClients clients, RunObserver* observer)
    : options_(std::move(options)),
      clients_(std::move(clients)),
      observer_(observer),
      random_(std::random_device{}()) {}

RunRegistry::~RunRegistry() { Shutdown(); }

void RunRegistry::SetControllerAddress(const std::string& address) {
  absl::MutexLock lock(&mu_);
  controller_address_ = address;
}

absl::Status RunRegistry::CheckServicesConfigured(const v1::RunSpec& spec) const {
  std::vector<std::string> missing;
  if (clients_.trainer == nullptr) missing.push_back("--trainer-address");
  if (clients_.replay_buffer == nullptr) missing.push_back("--replay-buffer-address");
  if (clients_.reward_server_address.empty()) missing.push_back("--reward-server-address");
  if (!missing.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the controller cannot run anything yet: it was started without ",
                     absl::StrJoin(missing, ", "),
                     " (restart sluice-controller with the missing flag(s), or use `sluice up`)"));
  }
  (void)spec;  // Workers come and go: the run waits for rollout.min_workers.
  return absl::OkStatus();
}

std::string RunRegistry::NewRunIdLocked() {
  const absl::Time now = options_.driver.clock ? options_.driver.clock() : absl::Now();
  const std::string stamp = absl::FormatTime("%Y%m%d-%H%M%S", now, absl::UTCTimeZone());
  while (true) {
    char suffix[8];
    std::snprintf(suffix, sizeof(suffix), "%04x", static_cast<unsigned>(random_() & 0xffff));
    std::string id = absl::StrCat("run-", stamp, "-", suffix);
    std::error_code ignored;
    if (!by_id_.contains(id) &&
        !std::filesystem::exists(std::filesystem::path(options_.runs_dir) / id, ignored)) {
      return id;
    }
  }
}

absl::StatusOr<RunSizes> RunRegistry::CheckAgainstServices(const v1::RunSpec& spec) const {
  if (clients_.reward_server != nullptr) {
    absl::StatusOr<std::vector<std::string>> verifiers = clients_.reward_server->ListVerifiers();
    if (!verifiers.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "cannot check reward.verifiers: the reward server at ", clients_.reward_server->address(),
          " did not answer ListVerifiers: ", verifiers.status().message()));
    }
    RETURN_IF_ERROR(CheckVerifierNames(
        spec, *verifiers, absl::StrCat("the reward server at ", clients_.reward_server->address())));
  }
  // Budgets the services report; one that does not answer is not checked
  // here (the run then fails at start, naming it).
  ServiceMemoryBudgets budgets;
  if (clients_.trainer != nullptr) {
    if (absl::StatusOr<v1::TrainerStatus> status = clients_.trainer->GetStatus(); status.ok()) {
      budgets.trainer = {status->memory_budget_bytes(),
                         absl::StrCat("the trainer at ", clients_.trainer->address())};
    }
  }
  // The smallest budget among the workers registered now (a worker that
  // joins later checks the run itself and fails it if it does not fit).
  if (clients_.workers != nullptr) {
    for (const RunWorker& worker : clients_.workers->LiveWorkers()) {
      const int64_t budget = worker.status.memory_budget_bytes();
      if (budget <= 0) continue;
      if (budgets.rollout_worker.bytes <= 0 || budget < budgets.rollout_worker.bytes) {
        budgets.rollout_worker = {budget, absl::StrCat("the rollout worker ", worker.worker_id,
                                                       " at ", worker.address)};
      }
    }
  }
  if (clients_.replay_buffer != nullptr) {
    if (absl::StatusOr<v1::GetStatsResponse> stats = clients_.replay_buffer->GetServerStats();
        stats.ok() && stats->memory_budget_bytes() > 0) {
      budgets.replay_buffer = {
          std::max<int64_t>(1, stats->memory_budget_bytes() - stats->memory_used_bytes()),
          absl::StrCat("the replay buffer at ", clients_.replay_buffer->address(), " (",
                       run::FormatBytes(stats->memory_used_bytes()), " of ",
                       run::FormatBytes(stats->memory_budget_bytes()), " in use)")};
    }
  }
  const bool budgeted = budgets.trainer.bytes > 0 || budgets.rollout_worker.bytes > 0 ||
                        budgets.replay_buffer.bytes > 0;
  absl::StatusOr<run::RunMemoryEstimate> estimate = EstimateSpecMemory(spec);
  if (!estimate.ok()) {
    if (budgeted) return estimate.status();
    return RunSizes{};  // Unknown: the services assume the context.
  }
  RETURN_IF_ERROR(CheckRunMemory(*estimate, budgets));
  return RunSizes{.max_prompt_tokens = estimate->max_prompt_tokens,
                  .max_sequence_tokens = estimate->sequence_tokens};
}

absl::StatusOr<v1::Run> RunRegistry::Submit(const v1::SubmitRunRequest& request) {
  // First, and on the spec as sent: an absurd one is judged on its bounds
  // alone, before anything copies, resolves or reads what it names.
  RETURN_IF_ERROR(ValidateRunSpecSizes(request.spec()));
  // Validating a spec builds its task and tokenizes every prompt (megabytes
  // for a default arithmetic task), freed at once but kept by the malloc
  // arena of whichever gRPC thread served the call: with many concurrent
  // submits that, not the runs, was what a long queue cost. Given back to
  // the system when the call is done.
  struct TrimOnReturn {
    ~TrimOnReturn() { malloc_trim(0); }
  } trim;
  v1::RunSpec spec = ResolveDefaults(request.spec());
  run::ResolveRolloutVerificationDefaults(options_.trusted_worker_ids,
                                          spec.mutable_algorithm()->mutable_rollout_verification());
  // Before ValidateRunSpec opens the model and the dataset: a path outside
  // the roots is refused in words that tell nothing of what is there.
  RETURN_IF_ERROR(run::ConfineRunSpecPaths(options_.allowed_paths, &spec));
  if (absl::Status valid = ValidateRunSpec(spec); !valid.ok()) return valid;
  if (request.validate_only()) {
    // Without creating anything: the services are asked only when they are
    // configured (a controller alone still validates specs).
    if (clients_.trainer != nullptr || clients_.reward_server != nullptr) {
      RETURN_IF_ERROR(CheckAgainstServices(spec).status());
    }
    v1::Run run;
    *run.mutable_spec() = std::move(spec);
    return run;
  }
  if (absl::Status configured = CheckServicesConfigured(spec); !configured.ok()) {
    return configured;
  }
  ASSIGN_OR_RETURN(const RunSizes sizes, CheckAgainstServices(spec));

  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("the controller is shutting down");
  if (!request.request_id().empty()) {
    if (auto it = by_request_id_.find(request.request_id()); it != by_request_id_.end()) {
      return by_id_.at(it->second)->Get().run;
    }
  }
  if (active_ != nullptr && static_cast<int>(queue_.size()) >= options_.max_queued_runs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full: ", queue_.size(), " runs wait behind run ", active_->run_id(),
        ", the most this controller takes (--max-queued-runs ", options_.max_queued_runs,
        "); submit again once one has started or been cancelled (sluice runs cancel RUN_ID)"));
  }
  const std::string run_id = NewRunIdLocked();
  absl::StatusOr<RunFiles> files = RunFiles::Create(options_.runs_dir, run_id);
  const std::string run_dir = (std::filesystem::path(options_.runs_dir) / run_id).string();
  if (!files.ok()) return RunNotRecorded(options_.runs_dir, run_dir, files.status());
  if (absl::Status written = files->WriteSpec(spec); !written.ok()) {
    return RunNotRecorded(options_.runs_dir, run_dir, written);
  }

  v1::Run run;
  run.set_run_id(run_id);
  *run.mutable_spec() = std::move(spec);
  const absl::Time now = options_.driver.clock ? options_.driver.clock() : absl::Now();
  SetTimestamp(now, run.mutable_created_at());
  RunRecord record = NewRunRecord(std::move(run), request.request_id(), next_sequence_++, sizes);
  // Recorded before it is acknowledged: a controller restarted from here on
  // knows the run.
  if (absl::Status written = files->WriteState(EncodeRunState(record), /*durable=*/true);
      !written.ok()) {
    return RunNotRecorded(options_.runs_dir, run_dir, written);
  }
  std::shared_ptr<RunDriver> driver = AddDriverLocked(std::move(record), std::move(*files));
  queue_.push_back(driver);
  DispatchLocked();
  log::Info("run submitted", {{"run_id", run_id},
                              {"name", driver->Get().run.spec().name()},
                              {"state", v1::RunState_Name(driver->Get().run.state())},
                              {"runs_dir", options_.runs_dir}});
  return driver->Get().run;
}

v1::ServiceEndpoints RunRegistry::EndpointsLocked() const {
  v1::ServiceEndpoints endpoints;
  endpoints.set_controller_address(controller_address_);
  endpoints.set_reward_server_address(clients_.reward_server_address);
  if (clients_.replay_buffer) {
    endpoints.set_replay_buffer_address(clients_.replay_buffer->address());
  }
  if (clients_.trainer) endpoints.set_trainer_address(clients_.trainer->address());
  return endpoints;
}

std::shared_ptr<RunDriver> RunRegistry::AddDriverLocked(RunRecord record, RunFiles files) {
  const std::string run_id = record.run.run_id();
  const std::string request_id = record.request_id;
  auto driver = std::make_shared<RunDriver>(std::move(record), std::move(files), clients_,
                                            EndpointsLocked(), options_.driver, observer_);
  runs_.push_back(driver);
  by_id_[run_id] = driver;
  if (!request_id.empty()) by_request_id_[request_id] = run_id;
  driver->SetOnStopped([this] { OnRunStopped(); });
  return driver;
}

absl::StatusOr<RunRegistryRestore> RunRegistry::Restore() {
  namespace fs = std::filesystem;
  struct Loaded {
    std::string run_id;
    std::string dir;
    absl::StatusOr<RunRecord> record;
  };
  // Read before taking the lock: a long history only delays the start.
  std::vector<Loaded> loaded;
  std::error_code error;
  if (fs::exists(options_.runs_dir, error)) {
    fs::directory_iterator it(options_.runs_dir, error);
    if (error) {
      return absl::PermissionDeniedError(absl::StrCat("cannot list the runs directory ",
                                                      options_.runs_dir, ": ", error.message()));
    }
    for (const fs::directory_entry& entry : it) {
      if (!entry.is_directory(error)) continue;
      const std::string run_id = entry.path().filename().string();
      absl::StatusOr<RunRecord> record = LoadRunRecord(entry.path().string(), run_id);
      if (absl::IsNotFound(record.status())) continue;  // Not a run, e.g. quickstart's stack/.
      loaded.push_back({run_id, entry.path().string(), std::move(record)});
    }
  }
  // Submission order; unreadable records first (their order is unknown).
  std::sort(loaded.begin(), loaded.end(), [](const Loaded& a, const Loaded& b) {
    const int64_t sa = a.record.ok() ? a.record->sequence : 0;
    const int64_t sb = b.record.ok() ? b.record->sequence : 0;
    return sa != sb ? sa < sb : a.run_id < b.run_id;
  });

  absl::MutexLock lock(&mu_);
  if (restored_ || !runs_.empty()) {
    return absl::FailedPreconditionError(
        "RunRegistry::Restore: call once, before the first Submit");
  }
  restored_ = true;
  RunRegistryRestore report;
  std::shared_ptr<RunDriver> adopt;
  for (Loaded& run : loaded) {
    if (!run.record.ok()) {
      const std::string reason =
          absl::StrCat("cannot restore the run after a controller restart: ",
                       run.record.status().message(), " (in ", run.dir, ")");
      log::Error("unreadable run record", {{"run_id", run.run_id}, {"error", reason}});
      RunRecord failed;
      failed.run.set_run_id(run.run_id);
      failed.run.set_state(v1::RUN_STATE_FAILED);
      failed.run.set_error_message(reason);
      failed.run.mutable_progress()->set_phase("failed");
      failed.run.mutable_summary()->set_run_id(run.run_id);
      failed.run.mutable_summary()->set_state(v1::RunState_Name(v1::RUN_STATE_FAILED));
      failed.run.mutable_summary()->set_error_message(reason);
      AddDriverLocked(std::move(failed), RunFiles::At(run.dir));
      ++report.unreadable;
      continue;
    }
    RunRecord& record = *run.record;
    next_sequence_ = std::max(next_sequence_, record.sequence + 1);
    const v1::RunState state = record.run.state();
    const RunFiles files = RunFiles::At(run.dir);
    if (!IsTerminal(state)) {
      if (absl::Status repaired = files.RepairAppendedFiles(); !repaired.ok()) {
        log::Warning("cannot repair a run file",
                     {{"run_id", run.run_id}, {"error", std::string(repaired.message())}});
      }
    }
    const absl::Status configured =
        IsTerminal(state) ? absl::OkStatus() : CheckServicesConfigured(record.run.spec());
    std::shared_ptr<RunDriver> driver = AddDriverLocked(std::move(record), files);
    if (IsTerminal(state)) {
      ++report.terminal;
    } else if (!configured.ok()) {
      // Failing it would end a run over an operator's missing flag.
      log::Error("run not resumed: this controller lacks a service it needs; it stays as "
                 "recorded for a controller started with it",
                 {{"run_id", run.run_id},
                  {"state", v1::RunState_Name(state)},
                  {"error", std::string(configured.message())}});
      ++report.not_resumed;
    } else if (state == v1::RUN_STATE_QUEUED) {
      queue_.push_back(driver);
      ++report.queued;
    } else if (adopt != nullptr) {
      driver->Fail(absl::StrCat("found active alongside run ", adopt->run_id(),
                                " when the controller restarted; only one run is active at a "
                                "time, and that one was re-adopted"));
      ++report.failed;
    } else {
      adopt = driver;
    }
  }
  if (adopt != nullptr && adopt->Adopt()) {
    active_ = adopt;
    ++report.adopted;
  }
  DispatchLocked();
  log::Info("runs restored", {{"runs_dir", options_.runs_dir},
                              {"terminal", report.terminal},
                              {"queued", report.queued},
                              {"adopted", report.adopted},
                              {"failed", report.failed},
                              {"not_resumed", report.not_resumed},
                              {"unreadable", report.unreadable}});
  return report;
}

void RunRegistry::DispatchLocked() {
  if (!shut_down_ && (active_ == nullptr || active_->Stopped())) {
    active_ = nullptr;
    while (!queue_.empty() && active_ == nullptr) {
      std::shared_ptr<RunDriver> next = std::move(queue_.front());
      queue_.pop_front();
      if (next->Start()) active_ = std::move(next);  // Else cancelled while queued.
    }
  }
  RenumberQueueLocked();
}

void RunRegistry::RenumberQueueLocked() {
  int position = 0;
  for (const auto& driver : queue_) driver->SetQueuePosition(++position);
}

void RunRegistry::OnRunStopped() {
  absl::MutexLock lock(&mu_);
  DispatchLocked();
}

absl::StatusOr<std::shared_ptr<RunDriver>> RunRegistry::Find(const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(run_id);
  if (it == by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("no run with id \"", run_id, "\""));
  }
  return it->second;
}

absl::StatusOr<v1::Run> RunRegistry::Get(const std::string& run_id) const {
  absl::StatusOr<std::shared_ptr<RunDriver>> driver = Find(run_id);
  if (!driver.ok()) return driver.status();
  return (*driver)->Get().run;
}

absl::StatusOr<v1::Run> RunRegistry::Cancel(const std::string& run_id, const std::string& reason) {
  absl::StatusOr<std::shared_ptr<RunDriver>> driver = Find(run_id);
  if (!driver.ok()) return driver.status();
  v1::Run run = (*driver)->Cancel(reason);
  absl::MutexLock lock(&mu_);
  if (auto it = std::find(queue_.begin(), queue_.end(), *driver); it != queue_.end()) {
    queue_.erase(it);
    RenumberQueueLocked();
  }
  return run;
}

absl::StatusOr<v1::ListRunsResponse> RunRegistry::List(const v1::ListRunsRequest& request) const {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be >= 0 (0 = default 50), got ", request.page_size()));
  }
  const int page_size =
      request.page_size() == 0 ? kDefaultPageSize : std::min(request.page_size(), kMaxPageSize);
  std::vector<std::shared_ptr<RunDriver>> runs;
  {
    absl::MutexLock lock(&mu_);
    runs = runs_;
  }
  // Newest first: reverse creation order. The token is the id of the last
  // run of the previous page, so pages stay stable while runs are added.
  size_t start = 0;
  std::reverse(runs.begin(), runs.end());
  if (!request.page_token().empty()) {
    auto it = std::find_if(runs.begin(), runs.end(), [&](const auto& driver) {
      return driver->run_id() == request.page_token();
    });
    if (it == runs.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_token: \"", request.page_token(), "\" is not a token of this list"));
    }
    start = static_cast<size_t>(it - runs.begin()) + 1;
  }
  v1::ListRunsResponse response;
  size_t bytes = 0;
  for (size_t i = start; i < runs.size(); ++i) {
    v1::Run run = runs[i]->Get().run;
    if (!request.states().empty() && std::find(request.states().begin(), request.states().end(),
                                               run.state()) == request.states().end()) {
      continue;
    }
    // A spec over the bounds (recorded by an older controller) would take
    // the page past what a client receives: listed without it (spec.json
    // in the run's directory has it).
    if (run.spec().ByteSizeLong() > kMaxRunSpecBytes) run.clear_spec();
    const size_t size = run.ByteSizeLong();
    // A page ends at page_size runs or kMaxListRunsPageBytes, whichever
    // comes first (at least one run), so that it fits any client.
    if (response.runs_size() == page_size ||
        (response.runs_size() > 0 && bytes + size > kMaxListRunsPageBytes)) {
      response.set_next_page_token(response.runs(response.runs_size() - 1).run_id());
      break;
    }
    bytes += size;
    *response.add_runs() = std::move(run);
  }
  return response;
}

absl::StatusOr<v1::LeasePromptsResponse> RunRegistry::LeasePrompts(
    const v1::LeasePromptsRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: must be set");
  if (request.max_prompts() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_prompts: must be > 0, got ", request.max_prompts()));
  }
  absl::StatusOr<std::shared_ptr<RunDriver>> driver = Find(request.run_id());
  if (!driver.ok()) {
    v1::LeasePromptsResponse done;
    done.set_run_done(true);
    return done;
  }
  return (*driver)->LeasePrompts(request);
}

absl::StatusOr<v1::ReportRolloutProgressResponse> RunRegistry::ReportRolloutProgress(
    const v1::ReportRolloutProgressRequest& request) {
  if (request.worker_id().empty()) return absl::InvalidArgumentError("worker_id: must be set");
  absl::StatusOr<std::shared_ptr<RunDriver>> driver = Find(request.run_id());
  if (!driver.ok()) {
    v1::ReportRolloutProgressResponse done;
    done.set_run_done(true);
    return done;
  }
  return (*driver)->ReportRolloutProgress(request);
}

absl::StatusOr<v1::ReportTrainerProgressResponse> RunRegistry::ReportTrainerProgress(
    const v1::ReportTrainerProgressRequest& request) {
  absl::StatusOr<std::shared_ptr<RunDriver>> driver = Find(request.run_id());
  if (!driver.ok()) {
    v1::ReportTrainerProgressResponse stop;
    stop.set_stop(true);
    return stop;
  }
  return (*driver)->ReportTrainerProgress(request);
}

void RunRegistry::BeginShutdown() {
  std::vector<std::shared_ptr<RunDriver>> runs;
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
    runs = runs_;
  }
  for (const auto& driver : runs) driver->BeginShutdown();
}

absl::StatusOr<v1::WorkerHeartbeatResponse> RunRegistry::WorkerHeartbeat(
    const v1::WorkerHeartbeatRequest& request) {
  if (clients_.workers == nullptr) {
    return absl::UnavailableError("this controller takes no rollout workers");
  }
  return clients_.workers->Heartbeat(request);
}

v1::ListWorkersResponse RunRegistry::ListWorkers() {
  if (clients_.workers == nullptr) return {};
  return clients_.workers->List();
}

absl::StatusOr<v1::ReportServiceFailureResponse> RunRegistry::ReportServiceFailure(
    const v1::ReportServiceFailureRequest& request) {
  static const auto* kServices = new std::set<std::string>{"trainer", "replay_buffer",
                                                          "reward_server", "rollout_worker"};
  if (kServices->count(request.service()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "service: must be one of trainer, replay_buffer, reward_server, rollout_worker; got \"",
        request.service(), "\""));
  }
  if (request.service() == "rollout_worker") {
    if (request.worker_id().empty()) {
      return absl::InvalidArgumentError("worker_id: required for a rollout_worker");
    }
    if (clients_.workers != nullptr) {
      clients_.workers->GiveUp(request.worker_id(), request.description());
    }
  }
  log::Error("a supervisor gave up on a service", {{"service", request.service()},
                                                   {"worker_id", request.worker_id()},
                                                   {"description", request.description()}});
  std::shared_ptr<RunDriver> active;
  {
    absl::MutexLock lock(&mu_);
    active = active_;
  }
  v1::ReportServiceFailureResponse response;
  if (active != nullptr &&
      active->OnServiceFailure(request.service(), request.description(), request.worker_id())) {
    response.add_failed_run_ids(active->run_id());
  }
  return response;
}

void RunRegistry::Shutdown() {
  // Wake every watcher first, then join the threads.
  BeginShutdown();
  std::vector<std::shared_ptr<RunDriver>> runs;
  {
    absl::MutexLock lock(&mu_);
    runs = runs_;
  }
  for (const auto& driver : runs) driver->Shutdown();
}

}  // namespace sluice::controller
