#include "replay_buffer/replay_buffer_service.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "replay_buffer/proto_convert.h"
#include "absl/time/clock.h"
#include "services/runtime/auth.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/request_limits.h"

namespace sluice::replay_buffer {
namespace {

using runtime::CheckId;
using runtime::CheckItems;
using runtime::ToGrpcStatus;

grpc::Status ShuttingDown() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "replay buffer is shutting down");
}

// One insert message: how many groups and trajectories, and how long its
// identifiers (the message-size limit alone would let 64 MiB of ids through).
grpc::Status CheckInsertWithinLimits(const v1::InsertGroupsRequest& request) {
  SLUICE_RETURN_IF_REFUSED(CheckItems("groups", request.groups_size()));
  for (const v1::Group& group : request.groups()) {
    SLUICE_RETURN_IF_REFUSED(CheckId("group.run_id", group.run_id()));
    SLUICE_RETURN_IF_REFUSED(CheckId("group.group_id", group.group_id()));
    SLUICE_RETURN_IF_REFUSED(CheckId("group.prompt_id", group.prompt_id()));
    SLUICE_RETURN_IF_REFUSED(CheckId("group.idempotency_key", group.idempotency_key()));
    SLUICE_RETURN_IF_REFUSED(CheckId("group.slot_lease_id", group.slot_lease_id()));
    SLUICE_RETURN_IF_REFUSED(CheckItems("group.trajectories", group.trajectories_size()));
    for (const v1::Trajectory& trajectory : group.trajectories()) {
      SLUICE_RETURN_IF_REFUSED(
          CheckId("trajectory.rollout_worker_id", trajectory.rollout_worker_id()));
    }
  }
  return grpc::Status::OK;
}

// Every trajectory a worker inserts must carry its own identity: groups are
// attributed (and verified, and quarantined) per worker.
grpc::Status CheckGroupsAreTheCallers(const grpc::ServerContext* context,
                                      const v1::InsertGroupsRequest& request) {
  for (const v1::Group& group : request.groups()) {
    for (const v1::Trajectory& trajectory : group.trajectories()) {
      grpc::Status self = runtime::CheckWorkerIdentity(
          context, trajectory.rollout_worker_id(),
          absl::StrCat("group '", group.group_id(), "' of run '", group.run_id(), "'"));
      if (!self.ok()) return self;
    }
  }
  return grpc::Status::OK;
}

}  // namespace

ReplayBufferServiceImpl::ReplayBufferServiceImpl(std::shared_ptr<ReplayBuffer> buffer,
                                                 prometheus::Registry& registry, Options options)
    : buffer_(std::move(buffer)),
      options_(options),
      incarnation_(static_cast<uint64_t>(absl::GetCurrentTimeNanos())),
      metrics_(registry) {}

void ReplayBufferServiceImpl::Shutdown() {
  buffer_->Shutdown();
  absl::MutexLock lock(&streams_mu_);
  shutting_down_ = true;
  for (grpc::ServerContext* context : open_streams_) context->TryCancel();
}

bool ReplayBufferServiceImpl::OpenStream(grpc::ServerContext* context) {
  absl::MutexLock lock(&streams_mu_);
  if (shutting_down_) return false;
  open_streams_.insert(context);
  return true;
}

void ReplayBufferServiceImpl::CloseStream(grpc::ServerContext* context) {
  absl::MutexLock lock(&streams_mu_);
  open_streams_.erase(context);
}

grpc::Status ReplayBufferServiceImpl::ConfigureRun(grpc::ServerContext* context,
                                                   const v1::ConfigureRunRequest* request,
                                                   v1::ConfigureRunResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  absl::StatusOr<ReplayBuffer::ConfigureResult> result =
      buffer_->ConfigureRun(RunConfigFromProto(*request));
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_created(result->created);
  RunStatsToProto(result->stats, response->mutable_stats());
  if (absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request->run_id());
      table.ok()) {
    metrics_.Sync(**table);
  }
  return grpc::Status::OK;
}

grpc::Status ReplayBufferServiceImpl::AcquireGenerationSlots(
    grpc::ServerContext* context, const v1::AcquireGenerationSlotsRequest* request,
    v1::AcquireGenerationSlotsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(CheckId("worker_id", request->worker_id()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("num_groups", request->num_groups()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("renew_lease_ids", request->renew_lease_ids_size()));
  if (grpc::Status self = runtime::CheckWorkerIdentity(context, request->worker_id(),
                                                        "AcquireGenerationSlotsRequest");
      !self.ok()) {
    return self;
  }
  absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request->run_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  AcquireRequest acquire = AcquireRequestFromProto(*request);
  acquire.caller = runtime::CallerAttribution(context);
  acquire.wait_timeout = runtime::CapWait(acquire.wait_timeout, *context);
  absl::StatusOr<AcquireResult> result = (*table)->AcquireSlots(acquire);
  if (!result.ok()) return ToGrpcStatus(result.status());
  if (request->num_groups() > 0) metrics_.ObserveAdmissionWait(result->waited);
  AcquireResultToProto(*result, response);
  metrics_.Sync(**table);
  return grpc::Status::OK;
}

grpc::Status ReplayBufferServiceImpl::ReleaseGenerationSlots(
    grpc::ServerContext* context, const v1::ReleaseGenerationSlotsRequest* request,
    v1::ReleaseGenerationSlotsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(CheckId("worker_id", request->worker_id()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("lease_ids", request->lease_ids_size()));
  if (grpc::Status self = runtime::CheckWorkerIdentity(context, request->worker_id(),
                                                        "ReleaseGenerationSlotsRequest");
      !self.ok()) {
    return self;
  }
  absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request->run_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  const ReleaseResult result = (*table)->ReleaseSlots(ReleaseRequestFromProto(*request));
  response->set_released(result.released);
  response->set_running(result.running);
  metrics_.Sync(**table);
  return grpc::Status::OK;
}

std::vector<runtime::BoundedStreamMethod> ReplayBufferServiceImpl::BoundedStreams() {
  return {runtime::BoundedStream(this, "/sluice.v1.ReplayBufferService/InsertGroups",
                                 &ReplayBufferServiceImpl::InsertGroupsStream),
          runtime::BoundedStream(this, "/sluice.v1.ReplayBufferService/Sample",
                                 &ReplayBufferServiceImpl::SampleStream)};
}

grpc::Status ReplayBufferServiceImpl::InsertGroupsStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriterInterface<v1::InsertGroupsResponse, v1::InsertGroupsRequest>* stream) {
  SLUICE_RETURN_IF_DENIED(context);
  runtime::StreamGate::Slot stream_slot;
  SLUICE_RETURN_IF_REFUSED(runtime::AcquireStreamSlot(context, "InsertGroups", &stream_slot));
  if (!OpenStream(context)) return ShuttingDown();
  const std::string attribution = runtime::CallerAttribution(context);
  v1::InsertGroupsRequest request;
  grpc::Status status = grpc::Status::OK;
  while (stream->Read(&request)) {
    if (grpc::Status limited = CheckInsertWithinLimits(request); !limited.ok()) {
      status = limited;
      break;
    }
    if (grpc::Status self = CheckGroupsAreTheCallers(context, request); !self.ok()) {
      status = self;
      break;
    }
    std::vector<v1::Group> groups;
    groups.reserve(static_cast<size_t>(request.groups_size()));
    absl::flat_hash_set<std::string> runs;
    for (v1::Group& group : *request.mutable_groups()) {
      // What the buffer saw, never what the client says (verification
      // quarantines by it).
      group.set_inserted_by(attribution);
      runs.insert(group.run_id());
      groups.push_back(std::move(group));
    }
    // Blocks while the rate limiter holds inserts back; meanwhile the stream
    // is not read, so gRPC's flow control pushes back on the writer.
    const std::vector<InsertResult> results = buffer_->Insert(
        std::move(groups), runtime::CapWait(options_.insert_rate_limit_wait, *context));
    v1::InsertGroupsResponse response;
    std::string quarantined;  // why, when a group's worker is quarantined
    for (const InsertResult& result : results) {
      InsertResultToProto(result, response.add_results());
      if (result.status == InsertStatus::kQuarantined) quarantined = result.message;
    }
    for (const std::string& run_id : runs) {
      if (absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(run_id); table.ok()) {
        metrics_.Sync(**table);
      }
    }
    metrics_.SyncDurability(buffer_->durability_stats());
    if (!stream->Write(response)) {
      status = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      break;
    }
    if (!quarantined.empty()) {
      // The results say which groups; the stream's end says it to a caller
      // that only looks at the status.
      status = grpc::Status(grpc::StatusCode::PERMISSION_DENIED, quarantined);
      break;
    }
  }
  CloseStream(context);
  return status;
}

grpc::Status ReplayBufferServiceImpl::SampleStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriterInterface<v1::SampleResponse, v1::SampleRequest>* stream) {
  SLUICE_RETURN_IF_DENIED(context);
  runtime::StreamGate::Slot stream_slot;
  SLUICE_RETURN_IF_REFUSED(runtime::AcquireStreamSlot(context, "Sample", &stream_slot));
  if (!OpenStream(context)) return ShuttingDown();
  v1::SampleRequest request;
  grpc::Status status = grpc::Status::OK;
  while (stream->Read(&request)) {
    if (grpc::Status limited = CheckId("run_id", request.run_id()); !limited.ok()) {
      status = limited;
      break;
    }
    if (grpc::Status limited = CheckItems("batch_size_groups", request.batch_size_groups());
        !limited.ok()) {
      status = limited;
      break;
    }
    absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request.run_id());
    if (!table.ok()) {
      status = ToGrpcStatus(table.status());
      break;
    }
    SampleRequest sample = SampleRequestFromProto(request, options_.default_sample_timeout);
    sample.timeout = runtime::CapWait(sample.timeout, *context);
    absl::StatusOr<SampleResult> result = (*table)->Sample(sample);
    if (result.status().code() == absl::StatusCode::kDeadlineExceeded) {
      // A wait that ran out is an answer on this stream, not its end: the
      // trainer asks again.
      v1::SampleResponse timed_out;
      timed_out.set_timed_out(true);
      timed_out.set_policy_version(request.trainer_policy_version());
      metrics_.Sync(**table);
      if (!stream->Write(timed_out)) {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
        break;
      }
      continue;
    }
    if (!result.ok()) {
      status = ToGrpcStatus(result.status());
      break;
    }
    bool written;
    {
      // Serialized by Write itself (synchronous), so the groups need no copy.
      const AliasedSampleResponse response(*result);
      written = stream->Write(response.get());
    }
    if (!written) {
      (*table)->ReturnUndelivered(*result);
      metrics_.Sync(**table);
      status = grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      break;
    }
    if (!result->replayed) metrics_.ObserveDelivered(request.run_id(), *result);
    metrics_.Sync(**table);
  }
  CloseStream(context);
  return status;
}

grpc::Status ReplayBufferServiceImpl::UpdatePolicyVersion(
    grpc::ServerContext* context, const v1::UpdatePolicyVersionRequest* request,
    v1::UpdatePolicyVersionResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(
      CheckItems("quarantined_worker_ids", request->quarantined_worker_ids_size()));
  SLUICE_RETURN_IF_REFUSED(
      CheckItems("quarantined_connections", request->quarantined_connections_size()));
  absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request->run_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  if (request->quarantined_worker_ids_size() > 0) {
    absl::StatusOr<std::vector<std::string>> added = (*table)->QuarantineWorkers(
        {request->quarantined_worker_ids().begin(), request->quarantined_worker_ids().end()});
    if (!added.ok()) return ToGrpcStatus(added.status());
    for (const std::string& worker : *added) {
      log::Warning("quarantined rollout worker: its generation slots are dropped and its "
                   "slots and inserts refused (the trainer's rollout verification)",
                   {{"run_id", request->run_id()}, {"worker", worker}});
    }
  }
  if (request->quarantined_connections_size() > 0) {
    for (const std::string& connection :
         (*table)->QuarantineConnections({request->quarantined_connections().begin(),
                                          request->quarantined_connections().end()})) {
      log::Warning(
          "quarantined a connection: its slots and inserts are refused (the trainer's "
          "rollout verification failed groups it inserted without an identity)",
          {{"run_id", request->run_id()}, {"connection", connection}});
    }
  }
  absl::StatusOr<UpdateVersionResult> result =
      (*table)->UpdatePolicyVersion(request->policy_version());
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_policy_version(result->policy_version);
  response->set_evicted_stale_groups(result->evicted_stale_groups);
  response->set_admission_limit(result->admission_limit);
  metrics_.Sync(**table);
  return grpc::Status::OK;
}

grpc::Status ReplayBufferServiceImpl::UpdatePriorities(grpc::ServerContext* context,
                                                       const v1::UpdatePrioritiesRequest* request,
                                                       v1::UpdatePrioritiesResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  SLUICE_RETURN_IF_REFUSED(CheckItems("priorities", request->priorities_size()));
  absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request->run_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  std::vector<std::pair<std::string, double>> priorities(request->priorities().begin(),
                                                         request->priorities().end());
  absl::StatusOr<UpdatePrioritiesResult> result = (*table)->UpdatePriorities(priorities);
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_updated(result->updated);
  for (std::string& id : result->not_found_group_ids) response->add_not_found_group_ids(std::move(id));
  metrics_.Sync(**table);
  return grpc::Status::OK;
}

grpc::Status ReplayBufferServiceImpl::GetStats(grpc::ServerContext* context,
                                               const v1::GetStatsRequest* request,
                                               v1::GetStatsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  response->set_memory_budget_bytes(buffer_->memory_budget_bytes());
  response->set_memory_used_bytes(buffer_->memory_used_bytes());
  response->set_incarnation(incarnation_);
  if (const WriteHealth health = buffer_->write_health(); !health.error.ok()) {
    response->set_write_error(std::string(health.error.message()));
    const int64_t since_ns = absl::ToUnixNanos(health.since);
    response->mutable_write_error_since()->set_seconds(since_ns / 1000000000);
    response->mutable_write_error_since()->set_nanos(static_cast<int32_t>(since_ns % 1000000000));
  }
  response->set_starts(options_.starts);
  if (request->run_id().empty()) {
    for (const std::string& run_id : buffer_->RunIds()) {
      absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(run_id);
      if (!table.ok()) continue;
      RunStatsToProto((*table)->Stats(), response->add_runs());
    }
    return grpc::Status::OK;
  }
  absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request->run_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  RunStatsToProto((*table)->Stats(), response->mutable_stats());
  metrics_.Sync(**table);
  return grpc::Status::OK;
}

grpc::Status ReplayBufferServiceImpl::CommitTrainedSteps(
    grpc::ServerContext* context, const v1::CommitTrainedStepsRequest* request,
    v1::CommitTrainedStepsResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(CheckId("run_id", request->run_id()));
  absl::StatusOr<std::shared_ptr<RunTable>> table = buffer_->GetRun(request->run_id());
  if (!table.ok()) return ToGrpcStatus(table.status());
  absl::StatusOr<CommitResult> result = (*table)->CommitTrainedSteps(request->step());
  if (!result.ok()) return ToGrpcStatus(result.status());
  response->set_committed_step(result->committed_step);
  response->set_released_groups(result->released_groups);
  metrics_.Sync(**table);
  return grpc::Status::OK;
}

}  // namespace sluice::replay_buffer
