#include "rollout_worker/rollout_worker_service.h"

#include <atomic>
#include <map>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "common/run/run_paths.h"
#include "google/protobuf/util/time_util.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/clients/clients.h"
#include "services/clients/grpc_clients.h"
#include "services/clients/retry_metrics.h"
#include "services/clients/retrying_clients.h"
#include "services/runtime/auth.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/request_limits.h"

namespace sluice::rollout_worker {

struct RolloutMetrics {
  explicit RolloutMetrics(prometheus::Registry& registry)
      : tokens(prometheus::BuildCounter()
                   .Name("sluice_rollout_tokens_generated_total")
                   .Help("Completion tokens generated")
                   .Register(registry)
                   .Add({})),
        groups(prometheus::BuildCounter()
                   .Name("sluice_rollout_groups_inserted_total")
                   .Help("Groups stored in the replay buffer")
                   .Register(registry)
                   .Add({})),
        weight_syncs(prometheus::BuildCounter()
                         .Name("sluice_rollout_weight_syncs_total")
                         .Help("Weight versions downloaded from the trainer")
                         .Register(registry)
                         .Add({})),
        weight_versions_refused(prometheus::BuildCounter()
                                    .Name("sluice_rollout_weight_versions_refused_total")
                                    .Help("Weight versions refused (non-finite values or shapes "
                                          "that do not fit the model); the worker keeps the one "
                                          "it has")
                                    .Register(registry)
                                    .Add({})),
        mid_generation_swaps(prometheus::BuildCounter()
                                 .Name("sluice_rollout_mid_generation_swaps_total")
                                 .Help("Completions whose decoding switched to newer weights")
                                 .Register(registry)
                                 .Add({})),
        late_groups_refused(prometheus::BuildCounter()
                                .Name("sluice_rollout_late_groups_refused_total")
                                .Help("Groups the buffer refused as late: their prompt already "
                                      "had a stored group, or they became staler than eta")
                                .Register(registry)
                                .Add({})),
        client_retries(registry),
        policy_version(prometheus::BuildGauge()
                           .Name("sluice_rollout_policy_version")
                           .Help("Policy version the worker generates with")
                           .Register(registry)
                           .Add({})),
        tokens_per_second(prometheus::BuildGauge()
                              .Name("sluice_rollout_tokens_per_second")
                              .Help("Decoding throughput of the latest batch")
                              .Register(registry)
                              .Add({})),
        batch_seconds(prometheus::BuildHistogram()
                          .Name("sluice_rollout_generation_seconds")
                          .Help("Wall time to generate one batch of groups")
                          .Register(registry)
                          .Add({}, prometheus::Histogram::BucketBoundaries{
                                       0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30})),
        weight_sync_seconds(prometheus::BuildHistogram()
                                .Name("sluice_rollout_weight_sync_seconds")
                                .Help("Time to download and load one weight version")
                                .Register(registry)
                                .Add({}, prometheus::Histogram::BucketBoundaries{
                                             0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5})),
        weight_sync_wire_bytes(prometheus::BuildCounter()
                                   .Name("sluice_rollout_weight_sync_wire_bytes_total")
                                   .Help("Weight bytes received, by transport (grpc: full "
                                         "versions, grpc_delta: sparse deltas)")
                                   .Register(registry)),
        weight_sync_full_bytes(prometheus::BuildCounter()
                                   .Name("sluice_rollout_weight_sync_full_bytes_total")
                                   .Help("What the versions received take in full, by "
                                         "transport: against wire bytes, what deltas saved")
                                   .Register(registry)),
        weight_transfer_seconds(prometheus::BuildHistogram()
                                    .Name("sluice_rollout_weight_transfer_seconds")
                                    .Help("Time to download (and for a delta, apply and "
                                          "verify) one weight version, by transport")
                                    .Register(registry)),
        weight_sync_gigabytes_per_second(
            prometheus::BuildGauge()
                .Name("sluice_rollout_weight_sync_gigabytes_per_second")
                .Help("Wire rate (1e9 bytes/s) of the latest weight download, by transport")
                .Register(registry)),
        weight_delta_fallbacks(prometheus::BuildCounter()
                                   .Name("sluice_rollout_weight_delta_fallbacks_total")
                                   .Help("Delta downloads that failed, by reason (data_loss: it "
                                         "did not apply or verify; unavailable: the stream "
                                         "failed), after which the full version was fetched")
                                   .Register(registry)) {}

  prometheus::Counter& tokens;
  prometheus::Counter& groups;
  prometheus::Counter& weight_syncs;
  prometheus::Counter& weight_versions_refused;
  prometheus::Counter& mid_generation_swaps;
  prometheus::Counter& late_groups_refused;
  // sluice_client_retries_total{service} of every run's clients.
  clients::ClientRetryMetrics client_retries;
  prometheus::Gauge& policy_version;
  prometheus::Gauge& tokens_per_second;
  prometheus::Histogram& batch_seconds;
  prometheus::Histogram& weight_sync_seconds;
  prometheus::Family<prometheus::Counter>& weight_sync_wire_bytes;
  prometheus::Family<prometheus::Counter>& weight_sync_full_bytes;
  prometheus::Family<prometheus::Histogram>& weight_transfer_seconds;
  prometheus::Family<prometheus::Gauge>& weight_sync_gigabytes_per_second;
  prometheus::Family<prometheus::Counter>& weight_delta_fallbacks;
  std::atomic<double> recent_tokens_per_second{0};

  void OnTransfer(const WeightTransfer& t) {
    const std::map<std::string, std::string> labels = {{"transport", t.transport}};
    weight_sync_wire_bytes.Add(labels).Increment(static_cast<double>(t.wire_bytes));
    weight_sync_full_bytes.Add(labels).Increment(static_cast<double>(t.full_bytes));
    weight_transfer_seconds
        .Add(labels, prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.5,
                                                             1, 5, 30})
        .Observe(t.seconds);
    if (t.seconds > 0) {
      weight_sync_gigabytes_per_second.Add(labels).Set(static_cast<double>(t.wire_bytes) /
                                                       t.seconds / 1e9);
    }
  }
};

struct RolloutWorkerServiceImpl::ActiveRun {
  std::string run_id;
  std::unique_ptr<clients::TrainerClient> trainer;
  std::unique_ptr<clients::ReplayBufferClient> buffer;
  std::unique_ptr<clients::ControllerClient> controller;
  std::unique_ptr<clients::RewardClient> reward;
  // Where the run relays the versions it receives (null: it does not).
  std::shared_ptr<weights::RelayCache> relay_cache;
  std::unique_ptr<RolloutRun> run;
  std::thread thread;
  // Joins `thread` once, however many callers stop the run at once.
  absl::once_flag joined;
  std::atomic<bool> finished{false};
  absl::Mutex mu;
  std::string last_error ABSL_GUARDED_BY(mu);
};

namespace {
// Increasing across restarts (the controller takes a higher incarnation of
// a worker id as its restart): the start time in nanoseconds.
uint64_t NewIncarnation() { return static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())); }
}  // namespace

RolloutWorkerServiceImpl::RolloutWorkerServiceImpl(prometheus::Registry& registry,
                                                   std::string worker_id,
                                                   int64_t memory_budget_bytes,
                                                   PathPolicy allowed_paths)
    : worker_id_(std::move(worker_id)),
      incarnation_(NewIncarnation()),
      memory_budget_bytes_(memory_budget_bytes),
      allowed_paths_(std::move(allowed_paths)),
      started_at_(absl::Now()),
      metrics_(std::make_unique<RolloutMetrics>(registry)) {}

RolloutWorkerServiceImpl::~RolloutWorkerServiceImpl() { Shutdown(); }

void RolloutWorkerServiceImpl::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  StopActiveRun(/*abort=*/true);
}

void RolloutWorkerServiceImpl::StopActiveRun(bool abort) {
  std::shared_ptr<ActiveRun> run;
  {
    absl::MutexLock lock(&mu_);
    run = run_;
  }
  if (run == nullptr) return;
  run->run->Stop(abort);
  // The run stays in the status (DRAINING, its groups in flight) until its
  // thread has returned: a worker that says it holds no run holds nothing.
  absl::call_once(run->joined, [&] {
    if (run->thread.joinable()) run->thread.join();
  });
  absl::MutexLock lock(&mu_);
  if (run_ == run) run_ = nullptr;
}

grpc::Status RolloutWorkerServiceImpl::StartRollouts(grpc::ServerContext* context,
                                                     const v1::StartRolloutsRequest* request,
                                                     v1::StartRolloutsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(runtime::CheckId("run_id", request->run_id()));
  const absl::Status started = Start(request->run_id(), request->spec(), request->endpoints(),
                                     request->max_prompt_tokens());
  if (!started.ok()) return runtime::ToGrpcStatus(started);
  *response->mutable_status() = CurrentStatus();
  return grpc::Status::OK;
}

absl::Status RolloutWorkerServiceImpl::StartRun(const v1::RolloutAssignment& assignment) {
  absl::Status started = Start(assignment.run_id(), assignment.spec(), assignment.endpoints(),
                               assignment.max_prompt_tokens());
  if (!started.ok() && started.code() != absl::StatusCode::kUnavailable) {
    absl::MutexLock lock(&mu_);
    refused_run_id_ = assignment.run_id();
    refused_error_ = std::string(started.message());
  }
  return started;
}

void RolloutWorkerServiceImpl::StopRun(const std::string& run_id) {
  {
    absl::MutexLock lock(&mu_);
    if (run_ == nullptr || run_->run_id != run_id) return;
  }
  StopActiveRun(/*abort=*/true);
}

v1::RolloutWorkerStatus RolloutWorkerServiceImpl::Status() { return CurrentStatus(); }

void RolloutWorkerServiceImpl::EnableWeightRelay(std::shared_ptr<weights::RelayCache> cache,
                                                 std::string relay_address) {
  absl::MutexLock lock(&mu_);
  relay_cache_ = std::move(cache);
  relay_address_ = std::move(relay_address);
}

absl::Status RolloutWorkerServiceImpl::Start(const std::string& run_id,
                                             const v1::RunSpec& requested_spec,
                                             const v1::ServiceEndpoints& endpoints,
                                             int64_t max_prompt_tokens) {
  if (run_id.empty()) return absl::InvalidArgumentError("run_id: required");
  for (const auto& [field, value] :
       {std::pair<const char*, const std::string*>{"trainer_address", &endpoints.trainer_address()},
        {"replay_buffer_address", &endpoints.replay_buffer_address()},
        {"controller_address", &endpoints.controller_address()},
        {"reward_server_address", &endpoints.reward_server_address()}}) {
    if (value->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("endpoints.", field, ": required"));
    }
  }
  if (max_prompt_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_prompt_tokens: must be >= 0 (0 = unknown), got ", max_prompt_tokens));
  }
  // The model's paths (the only ones a worker opens), before it opens one:
  // the controller confined them at submit, another client may not have.
  v1::RunSpec spec = requested_spec;
  if (absl::Status confined = run::ConfineRunSpecPaths(
          allowed_paths_, &spec, {.model = true, .dataset = false, .checkpoint = false});
      !confined.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec on this worker: ", confined.message()));
  }
  // The model's config and tokenizer must be readable here (a worker on
  // another machine needs the model directory too): say so now, not from
  // the generation thread.
  absl::StatusOr<model::ModelConfig> config = run::LoadRunModelConfig(spec.model());
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.model on this worker: ", config.status().message()));
  }
  // Whoever asks (the controller checked at submit, another client may
  // not have): a run that cannot fit is refused before anything is loaded.
  const run::RunMemoryEstimate estimate =
      run::EstimateRunMemory(spec, *config, max_prompt_tokens);
  if (std::string problem = run::CheckMemoryBudget(
          "rollout worker", estimate.rollout_worker,
          {memory_budget_bytes_, absl::StrCat("--memory-budget of rollout worker ", worker_id_)});
      !problem.empty()) {
    return absl::ResourceExhaustedError(problem);
  }
  if (auto tokenizer = run::LoadRunTokenizer(spec.model()); !tokenizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.model tokenizer on this worker: ", tokenizer.status().message()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("worker is shutting down");
    if (run_ != nullptr && !run_->finished.load()) {
      if (run_->run_id == run_id) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat("worker is busy with run ", run_->run_id, "; stop it first"));
    }
  }
  StopActiveRun(/*abort=*/true);  // join a finished previous run

  auto active = std::make_shared<ActiveRun>();
  active->run_id = run_id;
  // Every client rides out its service's restart (retrying_clients.h); the
  // run's Stop() cancels the retries.
  clients::RetryOptions retry;
  retry.seed = absl::HashOf(worker_id_, incarnation_);
  retry.cancellation = std::make_shared<clients::RetryCancellation>();
  retry.observer = metrics_->client_retries.Observer();
  active->trainer =
      clients::WithRetries(clients::NewGrpcTrainerClient(endpoints.trainer_address()), retry);
  active->buffer = clients::WithRetries(
      clients::NewGrpcReplayBufferClient(endpoints.replay_buffer_address()), retry);
  active->controller =
      clients::WithRetries(clients::NewGrpcControllerClient(endpoints.controller_address()), retry);
  active->reward =
      clients::WithRetries(clients::NewGrpcRewardClient(endpoints.reward_server_address()), retry);
  RolloutRunDeps deps;
  deps.retry_cancellation = retry.cancellation;
  deps.retry_deadline = retry.deadline;
  deps.trainer = active->trainer.get();
  deps.buffer = active->buffer.get();
  deps.controller = active->controller.get();
  deps.reward = active->reward.get();
  deps.worker_id = worker_id_;
  deps.incarnation = incarnation_;
  deps.memory_budget_bytes = memory_budget_bytes_;
  RolloutMetrics* m = metrics_.get();
  deps.on_batch_generated = [m](int64_t tokens, double seconds) {
    m->tokens.Increment(static_cast<double>(tokens));
    m->batch_seconds.Observe(seconds);
    const double rate = seconds > 0 ? tokens / seconds : 0.0;
    m->tokens_per_second.Set(rate);
    m->recent_tokens_per_second.store(rate);
  };
  deps.on_groups_inserted = [m](int64_t groups) { m->groups.Increment(static_cast<double>(groups)); };
  deps.on_weights_loaded = [m](int64_t version, double seconds) {
    m->weight_syncs.Increment();
    m->policy_version.Set(static_cast<double>(version));
    m->weight_sync_seconds.Observe(seconds);
  };
  deps.on_weights_refused = [m](int64_t) { m->weight_versions_refused.Increment(); };
  deps.on_weights_transferred = [m](const WeightTransfer& t) { m->OnTransfer(t); };
  deps.on_weight_delta_fallback = [m](const std::string& reason) {
    m->weight_delta_fallbacks.Add({{"reason", reason}}).Increment();
  };
  deps.on_mid_generation_swaps = [m](int64_t swaps) {
    m->mid_generation_swaps.Increment(static_cast<double>(swaps));
  };
  deps.on_late_groups_refused = [m](int64_t groups) {
    m->late_groups_refused.Increment(static_cast<double>(groups));
  };
  {
    absl::MutexLock lock(&mu_);
    weights::RelayFetcherOptions fetch;
    fetch.worker_id = worker_id_;
    fetch.relay_address = relay_cache_ != nullptr ? relay_address_ : "";
    const std::string trainer_address = endpoints.trainer_address();
    deps.weight_fetcher = std::make_shared<weights::RelayFetcher>(
        *active->trainer,
        [trainer_address](const std::string& address) {
          return address.empty() ? clients::NewGrpcTrainerWeightSource(trainer_address)
                                 : clients::NewGrpcRelayWeightSource(address);
        },
        relay_cache_, std::move(fetch));
    active->relay_cache = relay_cache_;
  }
  active->run = std::make_unique<RolloutRun>(run_id, spec, std::move(deps));
  ActiveRun* raw = active.get();
  active->thread = std::thread([raw] {
    absl::Status status = raw->run->Run();
    if (!status.ok()) {
      absl::MutexLock lock(&raw->mu);
      raw->last_error = std::string(status.message());
    }
    // What it relayed is no use to anyone now.
    if (raw->relay_cache != nullptr) raw->relay_cache->Forget(raw->run_id);
    raw->finished.store(true);
  });
  log::Info("rollouts started", {{"run_id", run_id}, {"worker_id", worker_id_}});
  absl::MutexLock lock(&mu_);
  run_ = std::move(active);
  refused_run_id_.clear();
  refused_error_.clear();
  return absl::OkStatus();
}

grpc::Status RolloutWorkerServiceImpl::StopRollouts(grpc::ServerContext* context,
                                                    const v1::StopRolloutsRequest* request,
                                                    v1::StopRolloutsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(runtime::CheckId("run_id", request->run_id()));
  {
    absl::MutexLock lock(&mu_);
    if (run_ != nullptr && !request->run_id().empty() && request->run_id() != run_->run_id) {
      return {grpc::StatusCode::NOT_FOUND,
              absl::StrCat("run ", request->run_id(), " is not running on this worker")};
    }
  }
  StopActiveRun(request->mode() != v1::STOP_MODE_DRAIN);
  response->set_stopped(true);
  *response->mutable_status() = CurrentStatus();
  return grpc::Status::OK;
}

grpc::Status RolloutWorkerServiceImpl::GetWorkerStatus(grpc::ServerContext* context,
                                                       const v1::GetWorkerStatusRequest*,
                                                       v1::GetWorkerStatusResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  *response->mutable_status() = CurrentStatus();
  return grpc::Status::OK;
}

v1::RolloutWorkerStatus RolloutWorkerServiceImpl::CurrentStatus() const {
  absl::MutexLock lock(&mu_);
  return CurrentStatusLocked();
}

v1::RolloutWorkerStatus RolloutWorkerServiceImpl::CurrentStatusLocked() const {
  v1::RolloutWorkerStatus status;
  status.set_worker_id(worker_id_);
  status.set_incarnation(incarnation_);
  status.set_device("cpu");
  *status.mutable_started_at() =
      google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(started_at_));
  status.set_tokens_per_second(metrics_->recent_tokens_per_second.load());
  status.set_memory_budget_bytes(memory_budget_bytes_);
  if (!refused_run_id_.empty()) {
    // The controller assigned a run this worker could not start.
    status.set_state(v1::ROLLOUT_WORKER_STATE_FAILED);
    status.add_runs()->set_run_id(refused_run_id_);
    status.set_last_error(refused_error_);
    return status;
  }
  if (run_ == nullptr) {
    status.set_state(v1::ROLLOUT_WORKER_STATE_IDLE);
    return status;
  }
  const v1::RolloutRunStatus run = run_->run->Status();
  *status.add_runs() = run;
  status.set_current_policy_version(run.policy_version());
  status.set_groups_in_flight(run.groups_in_flight());
  {
    absl::MutexLock lock(&run_->mu);
    status.set_last_error(run_->last_error);
  }
  if (run_->finished.load()) {
    status.set_state(status.last_error().empty() ? v1::ROLLOUT_WORKER_STATE_IDLE
                                                 : v1::ROLLOUT_WORKER_STATE_FAILED);
  } else {
    status.set_state(run.draining() ? v1::ROLLOUT_WORKER_STATE_DRAINING
                                    : v1::ROLLOUT_WORKER_STATE_RUNNING);
  }
  return status;
}

}  // namespace sluice::rollout_worker
