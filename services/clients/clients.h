#ifndef SLUICE_SERVICES_CLIENTS_CLIENTS_H_
#define SLUICE_SERVICES_CLIENTS_CLIENTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "sluice/v1/controller.pb.h"
#include "sluice/v1/replay_buffer.pb.h"
#include "sluice/v1/reward_server.pb.h"
#include "sluice/v1/trainer.pb.h"

// What the trainer and the rollout worker need from the other services, as
// small interfaces: the core libraries are written (and tested, with fakes)
// against these, and grpc_clients.h implements them over gRPC (the
// sluice_grpc_clients library; this one, sluice_clients, links no gRPC). Messages are
// the sluice.v1 protos; no gRPC types appear here.
//
// Every method blocks for at most its timeout (or the stated default) and
// returns the RPC's status as an absl::Status (UNAVAILABLE when the service is
// unreachable). All implementations are thread-safe unless noted.
namespace sluice::clients {

class RewardClient {
 public:
  virtual ~RewardClient() = default;
  virtual absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                           absl::Duration timeout) = 0;
};

class ReplayBufferClient {
 public:
  virtual ~ReplayBufferClient() = default;
  virtual absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest& request) = 0;
  virtual absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest& request) = 0;
  // One InsertGroups exchange: the groups in one request, one result each.
  virtual absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(
      const v1::InsertGroupsRequest& request) = 0;
  // One Sample exchange on a stream the client keeps open between calls (and
  // reopens after an error). Blocks up to request.timeout_ms plus a margin.
  // Not thread-safe: one sampling thread per client.
  virtual absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request) = 0;
  virtual absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest& request) = 0;
  virtual absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest& request) = 0;
  // Makes a Sample blocked in another thread return CANCELLED promptly.
  virtual void CancelSample() = 0;
  // The trainer's checkpoint covers every step up to request.step: the
  // buffer lets go of their recorded batches (SampleRequest.step).
  // UNIMPLEMENTED unless overridden: only the trainer calls it, so test
  // fakes of the other services' clients need not; a decorator of a real
  // client must forward it, or the buffer keeps every step's batch.
  virtual absl::StatusOr<v1::CommitTrainedStepsResponse> CommitTrainedSteps(
      const v1::CommitTrainedStepsRequest& request) {
    return absl::UnimplementedError(
        absl::StrCat("CommitTrainedSteps is not implemented by this replay buffer client (run ",
                     request.run_id(), ", step ", request.step(), ")"));
  }
};

class ControllerClient {
 public:
  virtual ~ControllerClient() = default;
  virtual absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(
      const v1::LeasePromptsRequest& request) = 0;
  virtual absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest& request) = 0;
  virtual absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest& request) = 0;
};

// One weight version as received: the manifest and each tensor's bytes, in
// manifest order, every chunk CRC-checked.
struct FetchedWeights {
  v1::WeightsManifest manifest;
  std::vector<std::string> tensor_bytes;
};

class TrainerClient {
 public:
  virtual ~TrainerClient() = default;
  // NOT_FOUND while the trainer has published nothing for the run.
  virtual absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string& run_id) = 0;
  // Blocks until a version newer than `after_version` is published (returns
  // it) or `timeout` passes (DEADLINE_EXCEEDED).
  virtual absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string& run_id,
                                                                    int64_t after_version,
                                                                    absl::Duration timeout) = 0;
  // Downloads one version (unset = latest) with StreamWeights. DATA_LOSS on a
  // CRC mismatch or a stream that does not add up to its manifest.
  virtual absl::StatusOr<FetchedWeights> FetchWeights(const std::string& run_id,
                                                      int64_t version) = 0;
  // Where to download a version from (the trainer or a relaying worker).
  // UNIMPLEMENTED from a trainer without relays: download from it directly.
  virtual absl::StatusOr<v1::GetWeightSourceResponse> GetWeightSource(
      const v1::GetWeightSourceRequest& request) {
    return absl::UnimplementedError("GetWeightSource is not implemented by this trainer client");
  }
};

// One weight stream: from the trainer (TrainerService.StreamWeights) or
// from a worker relaying a version (WeightRelay.StreamWeights).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Calls `on_chunk` with each message, the manifest first. An error from
  // `on_chunk` cancels the stream and is returned. A stream that goes
  // `stall` without a message (a source that hangs, or whose host was cut
  // off) is cancelled: UNAVAILABLE.
  virtual absl::Status StreamWeights(
      const v1::StreamWeightsRequest& request, absl::Duration stall,
      const std::function<absl::Status(v1::WeightsChunk& chunk)>& on_chunk) = 0;
};

}  // namespace sluice::clients

#endif  // SLUICE_SERVICES_CLIENTS_CLIENTS_H_
