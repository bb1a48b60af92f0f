#include "trainer/trainer_service.h"

#include <algorithm>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "common/run/run_paths.h"
#include "common/run/run_weight_sync.h"
#include "services/clients/clients.h"
#include "services/clients/grpc_clients.h"
#include "services/clients/retrying_clients.h"
#include "services/runtime/auth.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/request_limits.h"
#include "services/weights/weight_stream_server.h"
#include "trainer/checkpoint_state.h"
#include "trainer/trainer_metrics.h"
#include "trainer/weight_publisher.h"

namespace sluice::trainer {

using runtime::ToGrpcStatus;

struct TrainerServiceImpl::ActiveRun {
  std::string run_id;
  std::unique_ptr<clients::ReplayBufferClient> buffer;
  std::unique_ptr<clients::RewardClient> reward;
  std::unique_ptr<clients::ControllerClient> controller;
  // Shared by the clients' retries; cancelled when the run is stopped.
  std::shared_ptr<clients::RetryCancellation> retry_cancellation;
  std::unique_ptr<TrainerRun> run;
  std::thread thread;
  // Joins `thread` once, however many callers stop the run at once.
  absl::once_flag joined;
};

TrainerServiceImpl::TrainerServiceImpl(prometheus::Registry& registry,
                                       int64_t memory_budget_bytes,
                                       weights::RelayTreeOptions relay,
                                       PathPolicy allowed_paths)
    : memory_budget_bytes_(memory_budget_bytes),
      allowed_paths_(std::move(allowed_paths)),
      incarnation_(static_cast<uint64_t>(absl::GetCurrentTimeNanos())),
      relay_tree_(relay),
      metrics_(std::make_unique<TrainerMetrics>(registry)) {}

TrainerServiceImpl::~TrainerServiceImpl() { Shutdown(); }

void TrainerServiceImpl::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  weights_.Close();
  StopActiveRun(/*checkpoint=*/true);  // SIGTERM: keep what was trained
}

void TrainerServiceImpl::StopActiveRun(bool checkpoint) {
  std::shared_ptr<ActiveRun> run;
  {
    absl::MutexLock lock(&mu_);
    run = run_;
  }
  if (run == nullptr) return;
  run->retry_cancellation->Cancel();  // no waiting out a service that is away
  run->run->Stop(checkpoint);
  // The run stays in the status (its state, e.g. TRAINING through the step
  // in progress) until its thread has returned: a trainer that says IDLE
  // computes nothing.
  absl::call_once(run->joined, [&] {
    if (run->thread.joinable()) run->thread.join();
  });
  absl::MutexLock lock(&mu_);
  if (run_ == run) run_ = nullptr;
}

absl::Status TrainerServiceImpl::CheckResumable(const std::string& run_id, const v1::RunSpec& spec,
                                                clients::ReplayBufferClient& buffer) {
  v1::GetStatsRequest request;
  request.set_run_id(run_id);
  absl::StatusOr<v1::GetStatsResponse> stats = buffer.GetStats(request);
  v1::BufferStats known;
  if (stats.ok()) {
    known = stats->stats();
  } else if (stats.status().code() != absl::StatusCode::kNotFound) {
    return absl::OkStatus();  // cannot ask now: the run asks again
  }
  std::vector<std::string> warnings;
  std::vector<FoundCheckpoint> found;
  if (!spec.checkpoint().dir().empty()) {
    found = FindRunCheckpoints(spec.checkpoint().dir(), run_id, &warnings);
  }
  return PlanResume(run_id, spec, std::move(found), known, warnings).status();
}

v1::TrainerStatus TrainerServiceImpl::CurrentStatus() const {
  v1::TrainerStatus status;
  {
    absl::MutexLock lock(&mu_);
    if (run_ == nullptr) {
      status.set_state(v1::TRAINER_STATE_IDLE);
    } else {
      status = run_->run->Status();
    }
  }
  status.set_memory_budget_bytes(memory_budget_bytes_);
  status.set_incarnation(incarnation_);
  return status;
}

grpc::Status TrainerServiceImpl::StartTraining(grpc::ServerContext* context,
                                               const v1::StartTrainingRequest* request,
                                               v1::StartTrainingResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  if (request->run_id().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "run_id: required"};
  }
  const auto& endpoints = request->endpoints();
  if (endpoints.replay_buffer_address().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "endpoints.replay_buffer_address: required"};
  }
  if (endpoints.reward_server_address().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "endpoints.reward_server_address: required"};
  }
  if (request->max_prompt_tokens() < 0) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("max_prompt_tokens: must be >= 0 (0 = unknown), got ",
                         request->max_prompt_tokens())};
  }
  // The spec's paths, before anything here opens one (the model's config
  // below, the checkpoints of CheckResumable, the run): the controller
  // confined them at submit, another client may not have. Relative ones
  // come back resolved against this trainer's first root.
  v1::RunSpec spec = request->spec();
  if (absl::Status confined = run::ConfineRunSpecPaths(allowed_paths_, &spec); !confined.ok()) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("spec on this trainer: ", confined.message())};
  }
  // Where versions will go: the store StreamWeights serves from (gRPC), or
  // the run's transport's publisher; refused before anything here changes.
  const absl::StatusOr<WeightPublisher*> publisher =
      WeightPublisherFor(run::ResolveWeightSync(spec).transport, &weights_);
  if (!publisher.ok()) return ToGrpcStatus(publisher.status());
  // Whoever asks (the controller checked at submit, another client may not
  // have). A model whose config cannot be read is left to the run, which
  // fails naming it.
  if (absl::StatusOr<model::ModelConfig> config = run::LoadRunModelConfig(spec.model());
      config.ok()) {
    const run::RunMemoryEstimate estimate =
        run::EstimateRunMemory(spec, *config, request->max_prompt_tokens());
    if (std::string problem = run::CheckMemoryBudget(
            "trainer", estimate.trainer, {memory_budget_bytes_, "this trainer's --memory-budget"});
        !problem.empty()) {
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, problem};
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return {grpc::StatusCode::UNAVAILABLE, "trainer is shutting down"};
    if (run_ != nullptr) {
      if (run_->run_id == request->run_id()) {
        // The same run again (a controller that restarted re-sends it): its
        // status, nothing restarted.
        *response->mutable_status() = run_->run->Status();
        response->mutable_status()->set_memory_budget_bytes(memory_budget_bytes_);
        response->mutable_status()->set_incarnation(incarnation_);
        return grpc::Status::OK;
      }
      const v1::TrainerState state = run_->run->Status().state();
      if (state != v1::TRAINER_STATE_FINISHED && state != v1::TRAINER_STATE_FAILED &&
          state != v1::TRAINER_STATE_IDLE) {
        return {grpc::StatusCode::FAILED_PRECONDITION,
                absl::StrCat("trainer is busy with run ", run_->run_id,
                             "; stop it first (StopTraining)")};
      }
    }
  }
  StopActiveRun(/*checkpoint=*/false);  // a finished or failed previous run: join its thread

  auto active = std::make_shared<ActiveRun>();
  active->run_id = request->run_id();
  // A run that cannot be continued losslessly is refused here, to the
  // caller (asked without retries: the caller's call has a deadline); the
  // run checks again (and fails) when the buffer cannot be asked now.
  {
    std::unique_ptr<clients::ReplayBufferClient> buffer =
        clients::NewGrpcReplayBufferClient(endpoints.replay_buffer_address());
    if (absl::Status resumable = CheckResumable(request->run_id(), spec, *buffer);
        !resumable.ok()) {
      return ToGrpcStatus(resumable);
    }
  }
  // Every client rides out its service's restart (retrying_clients.h).
  clients::RetryOptions retry;
  retry.seed = absl::HashOf(request->run_id(), absl::ToUnixNanos(absl::Now()));
  retry.cancellation = active->retry_cancellation = std::make_shared<clients::RetryCancellation>();
  retry.observer = metrics_->ClientRetryObserver();
  active->buffer = clients::WithRetries(
      clients::NewGrpcReplayBufferClient(endpoints.replay_buffer_address()), retry);
  active->reward =
      clients::WithRetries(clients::NewGrpcRewardClient(endpoints.reward_server_address()), retry);
  if (!endpoints.controller_address().empty()) {
    active->controller = clients::WithRetries(
        clients::NewGrpcControllerClient(endpoints.controller_address()), retry);
  }
  weights_.Reset(request->run_id());
  relay_tree_.Reset();
  TrainerRunDeps deps;
  deps.buffer = active->buffer.get();
  deps.reward = active->reward.get();
  deps.controller = active->controller.get();
  deps.publisher = *publisher;
  deps.memory_budget_bytes = memory_budget_bytes_;
  deps.incarnation = incarnation_;
  TrainerMetrics* metrics = metrics_.get();
  deps.on_step = [metrics](const v1::TrainingStepMetrics& m) { metrics->RecordStep(m); };
  deps.on_eval = [metrics](const v1::EvalResult& e) { metrics->RecordEval(e); };
  deps.on_published = [metrics](const PublishedVersion& v) { metrics->RecordPublished(v); };
  active->run = std::make_unique<TrainerRun>(request->run_id(), std::move(spec), std::move(deps));
  TrainerRun* run = active->run.get();
  active->thread = std::thread([run] { run->Run().IgnoreError(); });
  log::Info("training started", {{"run_id", request->run_id()}});
  *response->mutable_status() = run->Status();
  response->mutable_status()->set_memory_budget_bytes(memory_budget_bytes_);
  response->mutable_status()->set_incarnation(incarnation_);
  absl::MutexLock lock(&mu_);
  run_ = std::move(active);
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::StopTraining(grpc::ServerContext* context,
                                              const v1::StopTrainingRequest* request,
                                              v1::StopTrainingResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  {
    absl::MutexLock lock(&mu_);
    if (run_ != nullptr && !request->run_id().empty() && request->run_id() != run_->run_id) {
      return {grpc::StatusCode::NOT_FOUND,
              absl::StrCat("run ", request->run_id(), " is not this trainer's run (", run_->run_id, ")")};
    }
  }
  StopActiveRun(request->checkpoint());
  response->mutable_status()->set_state(v1::TRAINER_STATE_IDLE);
  response->mutable_status()->set_memory_budget_bytes(memory_budget_bytes_);
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::GetLatestVersion(grpc::ServerContext* context,
                                                  const v1::GetLatestVersionRequest* request,
                                                  v1::GetLatestVersionResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(runtime::CheckId("run_id", request->run_id()));
  auto latest = weights_.Latest(request->run_id());
  if (!latest.ok()) return ToGrpcStatus(latest.status());
  *response->mutable_version() = (*latest)->info;
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::WatchVersions(grpc::ServerContext* context,
                                               const v1::WatchVersionsRequest* request,
                                               grpc::ServerWriter<v1::VersionAnnouncement>* writer) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(runtime::CheckId("run_id", request->run_id()));
  runtime::StreamGate::Slot stream_slot;
  SLUICE_RETURN_IF_REFUSED(runtime::AcquireStreamSlot(context, "WatchVersions", &stream_slot));
  // The watch is established: a watcher waiting for the next version can
  // tell it apart from a refused one without waiting for a version.
  writer->SendInitialMetadata();
  int64_t after = request->has_after_version() ? request->after_version() : -1;
  if (!request->has_after_version()) {
    // Announce the current latest at once, if any.
    auto latest = weights_.Latest(request->run_id());
    if (latest.ok()) {
      v1::VersionAnnouncement announcement;
      *announcement.mutable_version() = (*latest)->info;
      if (!writer->Write(announcement)) return grpc::Status::OK;
      after = (*latest)->info.version();
    }
  }
  while (!context->IsCancelled()) {
    // Short waits so a cancelled client is noticed promptly.
    auto next = weights_.WaitForNewer(request->run_id(), after, absl::Now() + absl::Milliseconds(500));
    if (absl::IsDeadlineExceeded(next.status())) continue;
    if (!next.ok()) return ToGrpcStatus(next.status());
    v1::VersionAnnouncement announcement;
    *announcement.mutable_version() = (*next)->info;
    if (!writer->Write(announcement)) break;
    after = (*next)->info.version();
  }
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::StreamWeights(grpc::ServerContext* context,
                                               const v1::StreamWeightsRequest* request,
                                               grpc::ServerWriter<v1::WeightsChunk>* writer) {
  runtime::StreamGate::Slot stream_slot;
  if (grpc::Status admitted = weights::AdmitWeightStream(context, *request, &stream_slot);
      !admitted.ok()) {
    return admitted;
  }
  auto found = request->has_version() ? weights_.Get(request->run_id(), request->version())
                                      : weights_.Latest(request->run_id());
  if (!found.ok()) return ToGrpcStatus(found.status());
  const std::shared_ptr<const PublishedVersion> version = *found;  // pinned for the stream
  const int64_t chunk_size =
      std::clamp<int64_t>(request->chunk_size_bytes() > 0 ? request->chunk_size_bytes() : (1 << 20),
                          64 << 10, 16 << 20);
  std::vector<size_t> selected;
  if (request->tensor_names().empty()) {
    for (size_t i = 0; i < version->tensors.size(); ++i) selected.push_back(i);
  } else {
    for (const auto& name : request->tensor_names()) {
      auto it = std::find_if(version->tensors.begin(), version->tensors.end(),
                             [&](const v1::TensorSpec& t) { return t.name() == name; });
      if (it == version->tensors.end()) {
        return {grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("tensor_names: unknown tensor ", name)};
      }
      selected.push_back(static_cast<size_t>(it - version->tensors.begin()));
    }
  }
  // A delta against the version the receiver holds, when this version was
  // encoded against it at publish (the version before it); otherwise the
  // full version, and the manifest says why.
  const VersionDelta* delta = nullptr;
  std::string full_reason;
  if (request->has_base_version()) {
    const int64_t base = request->base_version();
    if (version->delta == nullptr) {
      full_reason = absl::StrCat("version ", version->info.version(),
                                 " has no delta (weight_sync.delta is off for this run, or no "
                                 "version was published before it)");
    } else if (version->delta->base_version != base) {
      full_reason = absl::StrCat("version ", version->info.version(),
                                 " is kept as a delta against version ",
                                 version->delta->base_version, " only, not against ", base);
    } else {
      delta = version->delta.get();
    }
  }
  const std::string transport = delta != nullptr ? "grpc_delta" : "grpc";
  const absl::Time stream_start = absl::Now();
  TrainerMetrics::WeightStream stream_metrics = metrics_->StartWeightStream(transport);
  v1::WeightsManifest manifest;
  *manifest.mutable_version() = version->info;
  for (size_t i : selected) {
    *manifest.add_tensors() = delta != nullptr ? delta->tensors[i] : version->tensors[i];
  }
  if (delta != nullptr) manifest.set_delta_base_version(delta->base_version);
  manifest.set_full_reason(full_reason);
  if (!writer->Write(weights::ManifestChunk(version->info.version(), std::move(manifest)))) {
    return grpc::Status::OK;
  }
  int64_t index = 0;  // data chunks so far, sent or skipped (start_chunk)
  int64_t sent = 0;
  for (size_t i : selected) {
    const v1::TensorSpec& spec = delta != nullptr ? delta->tensors[i] : version->tensors[i];
    // A delta stream carries each tensor's encoding: the delta, or the
    // version's own bytes for a tensor that went FULL. Deterministic for a
    // (version, base, chunk size), so start_chunk resumes it.
    const std::string& bytes = spec.encoding() == v1::TENSOR_ENCODING_SPARSE_DELTA
                                   ? delta->encoded[i]
                                   : version->bytes[i];
    // What this tensor's chunks stand for in full, per byte sent.
    const double full_per_byte =
        bytes.empty() ? 0.0 : static_cast<double>(spec.size_bytes()) / bytes.size();
    int64_t offset = 0;
    do {
      if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "client cancelled"};
      const int64_t n = std::min<int64_t>(chunk_size, static_cast<int64_t>(bytes.size()) - offset);
      if (index++ < request->start_chunk()) {
        offset += n;
        continue;
      }
      v1::WeightsChunk chunk;
      chunk.set_version(version->info.version());
      chunk.set_tensor_name(spec.name());
      chunk.set_dtype(spec.dtype());
      *chunk.mutable_shape() = spec.shape();
      chunk.set_tensor_size_bytes(static_cast<int64_t>(bytes.size()));
      chunk.set_offset_bytes(offset);
      chunk.set_data(bytes.data() + offset, n);
      chunk.set_is_last_chunk_of_tensor(offset + n == static_cast<int64_t>(bytes.size()));
      chunk.set_crc32c(Crc32c(chunk.data()));
      if (!writer->Write(chunk)) return grpc::Status::OK;
      stream_metrics.RecordChunk(n, static_cast<double>(n) * full_per_byte);
      sent += n;
      offset += n;
    } while (offset < static_cast<int64_t>(bytes.size()));
  }
  stream_metrics.RecordFinished(absl::ToDoubleSeconds(absl::Now() - stream_start), sent);
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::GetTrainerStatus(grpc::ServerContext* context,
                                                  const v1::GetTrainerStatusRequest*,
                                                  v1::GetTrainerStatusResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  *response->mutable_status() = CurrentStatus();
  return grpc::Status::OK;
}

grpc::Status TrainerServiceImpl::GetWeightSource(grpc::ServerContext* context,
                                                 const v1::GetWeightSourceRequest* request,
                                                 v1::GetWeightSourceResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  auto found = request->has_version() ? weights_.Get(request->run_id(), request->version())
                                      : weights_.Latest(request->run_id());
  if (!found.ok()) return ToGrpcStatus(found.status());
  if (request->worker_id().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "worker_id is required"};
  }
  const std::vector<std::string> failed(request->failed_sources().begin(),
                                        request->failed_sources().end());
  const weights::RelayAssignment placed = relay_tree_.Assign(
      (*found)->info.version(), request->worker_id(), request->relay_address(), failed);
  *response->mutable_version() = (*found)->info;
  response->set_source_address(placed.source_address);
  response->set_depth(placed.depth);
  metrics_->RecordWeightSource(/*from_relay=*/!placed.source_address.empty());
  return grpc::Status::OK;
}

}  // namespace sluice::trainer
