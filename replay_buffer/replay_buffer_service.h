#ifndef SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_SERVICE_H_
#define SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_SERVICE_H_

#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::replay_buffer {

// The gRPC edge of the replay buffer: converts between protos and the core
// library's types and maps absl::Status to grpc::Status. It holds no logic of
// its own. In this release every RPC of sluice.v1.ReplayBufferService answers
// UNIMPLEMENTED (see README, "What exists"); the issues that build the
// replay buffer override them here.
class ReplayBufferServiceImpl final : public sluice::v1::ReplayBufferService::Service {};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_SERVICE_H_
