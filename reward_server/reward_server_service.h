#ifndef SLUICE_REWARD_SERVER_REWARD_SERVER_SERVICE_H_
#define SLUICE_REWARD_SERVER_REWARD_SERVER_SERVICE_H_

#include "sluice/v1/reward_server.grpc.pb.h"

namespace sluice::reward_server {

// The gRPC edge of the reward server: converts between protos and the core
// library's types and maps absl::Status to grpc::Status. It holds no logic of
// its own. In this release every RPC of sluice.v1.RewardService answers
// UNIMPLEMENTED (see README, "What exists"); the issues that build the
// reward server override them here.
class RewardServerServiceImpl final : public sluice::v1::RewardService::Service {};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_REWARD_SERVER_SERVICE_H_
