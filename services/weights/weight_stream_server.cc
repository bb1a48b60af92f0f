#include "services/weights/weight_stream_server.h"

#include <utility>

#include "services/runtime/auth.h"

namespace sluice::weights {

grpc::Status AdmitWeightStream(grpc::ServerContext* context,
                               const v1::StreamWeightsRequest& request,
                               runtime::StreamGate::Slot* slot) {
  SLUICE_RETURN_IF_DENIED(context);
  SLUICE_RETURN_IF_REFUSED(runtime::CheckId("run_id", request.run_id()));
  SLUICE_RETURN_IF_REFUSED(runtime::AcquireStreamSlot(context, "StreamWeights", slot));
  if (request.start_chunk() < 0) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "start_chunk must be >= 0"};
  }
  return grpc::Status::OK;
}

v1::WeightsChunk ManifestChunk(int64_t version, v1::WeightsManifest manifest) {
  v1::WeightsChunk first;
  first.set_version(version);
  *first.mutable_manifest() = std::move(manifest);
  return first;
}

}  // namespace sluice::weights
