#ifndef SLUICE_SERVICES_WEIGHTS_WEIGHT_STREAM_SERVER_H_
#define SLUICE_SERVICES_WEIGHTS_WEIGHT_STREAM_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>

#include "services/runtime/request_limits.h"
#include "sluice/v1/trainer.pb.h"

// What the two servers of StreamWeights (the trainer's TrainerService and a
// rollout worker's WeightRelay) share on the gRPC edge: the checks before a
// version is looked up, and the stream's first message. The chunks that
// follow are each server's own (the trainer cuts a version's bytes, a relay
// forwards the chunks it receives).
namespace sluice::weights {

// The caller is allowed (runtime::CheckCaller), the run id well-formed, one of
// the method's stream slots is held in `slot` for the stream's life, and
// start_chunk >= 0. OK, or the status to answer with.
grpc::Status AdmitWeightStream(grpc::ServerContext* context,
                               const v1::StreamWeightsRequest& request,
                               runtime::StreamGate::Slot* slot);

// The first message of every StreamWeights answer: the version and its
// manifest, before any data.
v1::WeightsChunk ManifestChunk(int64_t version, v1::WeightsManifest manifest);

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_WEIGHT_STREAM_SERVER_H_
