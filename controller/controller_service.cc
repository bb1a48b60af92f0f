#include "controller/controller_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/runtime/auth.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/request_limits.h"

namespace sluice::controller {
namespace {

using runtime::CheckId;
using runtime::CheckItems;
using runtime::ToGrpcStatus;

constexpr int64_t kDefaultWatchIntervalMs = 1000;
// A watcher that wants fewer updates than one an hour wants GetRun.
constexpr int64_t kMaxWatchIntervalMs = 3600 * 1000;
// Longest cancel reason or failure description kept in a run's record.
constexpr int64_t kMaxReasonBytes = 16 << 10;

}  // namespace

ControllerServiceImpl::ControllerServiceImpl(RunRegistry* registry,
                                             absl::Duration watch_poll_interval)
    : registry_(registry), watch_poll_interval_(watch_poll_interval) {}

void ControllerServiceImpl::BeginShutdown() {
  // The flag first: a watcher woken by its run's driver shutting down then
  // sends one last snapshot and ends UNAVAILABLE (the run goes on under the
  // next controller), rather than spin on a driver that no longer changes.
  shutting_down_ = true;
  registry_->BeginShutdown();
}

grpc::Status ControllerServiceImpl::SubmitRun(grpc::ServerContext* context,
                                              const v1::SubmitRunRequest* request,
                                              v1::SubmitRunResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("request_id", request->request_id()));
  absl::StatusOr<v1::Run> run = registry_->Submit(*request);
  if (!run.ok()) return ToGrpcStatus(run.status());
  *response->mutable_run() = std::move(*run);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::GetRun(grpc::ServerContext* context,
                                           const v1::GetRunRequest* request,
                                           v1::GetRunResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  absl::StatusOr<v1::Run> run = registry_->Get(request->run_id());
  if (!run.ok()) return ToGrpcStatus(run.status());
  *response->mutable_run() = std::move(*run);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::WatchRun(grpc::ServerContext* context,
                                             const v1::WatchRunRequest* request,
                                             grpc::ServerWriter<v1::RunUpdate>* writer) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(
      runtime::CheckRange("min_interval_ms", request->min_interval_ms(), 0, kMaxWatchIntervalMs));
  runtime::StreamGate::Slot stream_slot;
  SLUICE_RETURN_IF_REFUSED(runtime::AcquireStreamSlot(context, "WatchRun", &stream_slot));
  absl::StatusOr<std::shared_ptr<RunDriver>> found = registry_->Find(request->run_id());
  if (!found.ok()) return ToGrpcStatus(found.status());
  const std::shared_ptr<RunDriver> driver = std::move(*found);
  const absl::Duration min_interval = absl::Milliseconds(
      request->min_interval_ms() == 0 ? kDefaultWatchIntervalMs : request->min_interval_ms());

  int64_t sequence = 0;
  // Set once shutdown was seen before taking a snapshot: that snapshot is the
  // last (the run stays active for the next controller to re-adopt; the
  // client reconnects on UNAVAILABLE).
  bool shutdown_seen = false;
  while (true) {
    RunDriver::Snapshot snapshot = driver->Get();
    const v1::RunState state = snapshot.run.state();
    v1::RunUpdate update;
    *update.mutable_run() = std::move(snapshot.run);
    update.set_sequence(sequence++);
    if (!writer->Write(update)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
    }
    if (IsTerminal(state)) return grpc::Status::OK;
    if (shutdown_seen) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the controller is shutting down");
    }
    const absl::Time sent_at = absl::Now();
    // Poll in short slices so that a departed client or a shutdown is noticed.
    while (!driver->AwaitUpdate(snapshot.generation, state, sent_at + min_interval,
                                absl::Now() + watch_poll_interval_)) {
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      }
      if (shutting_down_) break;
    }
    shutdown_seen = shutting_down_;
  }
}

grpc::Status ControllerServiceImpl::CancelRun(grpc::ServerContext* context,
                                              const v1::CancelRunRequest* request,
                                              v1::CancelRunResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(
      runtime::CheckRange("reason (bytes)", static_cast<int64_t>(request->reason().size()), 0,
                          kMaxReasonBytes));
  // Ended before this call: cancelling changes nothing, and the caller is
  // told so rather than left to read a CANCELLED it did not cause.
  const absl::StatusOr<v1::Run> before = registry_->Get(request->run_id());
  if (!before.ok()) return ToGrpcStatus(before.status());
  const v1::RunState state = before->state();
  response->set_already_ended(state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED ||
                              state == v1::RUN_STATE_CANCELLED);
  absl::StatusOr<v1::Run> run = registry_->Cancel(request->run_id(), request->reason());
  if (!run.ok()) return ToGrpcStatus(run.status());
  *response->mutable_run() = std::move(*run);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::ListRuns(grpc::ServerContext* context,
                                             const v1::ListRunsRequest* request,
                                             v1::ListRunsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("page_token", request->page_token()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("states", request->states_size()));
  absl::StatusOr<v1::ListRunsResponse> runs = registry_->List(*request);
  if (!runs.ok()) return ToGrpcStatus(runs.status());
  *response = std::move(*runs);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::LeasePrompts(grpc::ServerContext* context,
                                                 const v1::LeasePromptsRequest* request,
                                                 v1::LeasePromptsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(CheckId("worker_id", request->worker_id()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("max_prompts", request->max_prompts()));
  if (grpc::Status self =
          runtime::CheckWorkerIdentity(context, request->worker_id(), "LeasePromptsRequest");
      !self.ok()) {
    return self;
  }
  absl::StatusOr<v1::LeasePromptsResponse> leased = registry_->LeasePrompts(*request);
  if (!leased.ok()) return ToGrpcStatus(leased.status());
  *response = std::move(*leased);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::ReportRolloutProgress(
    grpc::ServerContext* context, const v1::ReportRolloutProgressRequest* request,
    v1::ReportRolloutProgressResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(CheckId("worker_id", request->worker_id()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("completed_prompt_ids + abandoned_prompt_ids",
                                      request->completed_prompt_ids_size() +
                                          request->abandoned_prompt_ids_size()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("renew_lease_ids", request->renew_lease_ids_size()));
  if (grpc::Status self =
          runtime::CheckWorkerIdentity(context, request->worker_id(), "ReportRolloutProgressRequest");
      !self.ok()) {
    return self;
  }
  absl::StatusOr<v1::ReportRolloutProgressResponse> reported =
      registry_->ReportRolloutProgress(*request);
  if (!reported.ok()) return ToGrpcStatus(reported.status());
  *response = std::move(*reported);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::ReportTrainerProgress(
    grpc::ServerContext* context, const v1::ReportTrainerProgressRequest* request,
    v1::ReportTrainerProgressResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  absl::StatusOr<v1::ReportTrainerProgressResponse> reported =
      registry_->ReportTrainerProgress(*request);
  if (!reported.ok()) return ToGrpcStatus(reported.status());
  *response = std::move(*reported);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::WorkerHeartbeat(grpc::ServerContext* context,
                                                    const v1::WorkerHeartbeatRequest* request,
                                                    v1::WorkerHeartbeatResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("worker_id", request->worker_id()));
  if (grpc::Status self =
          runtime::CheckWorkerIdentity(context, request->worker_id(), "WorkerHeartbeatRequest");
      !self.ok()) {
    return self;
  }
  absl::StatusOr<v1::WorkerHeartbeatResponse> answer = registry_->WorkerHeartbeat(*request);
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  *response = std::move(*answer);
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::ListWorkers(grpc::ServerContext* context,
                                                const v1::ListWorkersRequest*,
                                                v1::ListWorkersResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  *response = registry_->ListWorkers();
  return grpc::Status::OK;
}

grpc::Status ControllerServiceImpl::ReportServiceFailure(
    grpc::ServerContext* context, const v1::ReportServiceFailureRequest* request,
    v1::ReportServiceFailureResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("service", request->service()));
  SLUICE_RETURN_IF_REFUSED(CheckId("worker_id", request->worker_id()));
  SLUICE_RETURN_IF_REFUSED(runtime::CheckRange(
      "description (bytes)", static_cast<int64_t>(request->description().size()), 0,
      kMaxReasonBytes));
  absl::StatusOr<v1::ReportServiceFailureResponse> answer =
      registry_->ReportServiceFailure(*request);
  if (!answer.ok()) return ToGrpcStatus(answer.status());
  *response = std::move(*answer);
  return grpc::Status::OK;
}

}  // namespace sluice::controller
