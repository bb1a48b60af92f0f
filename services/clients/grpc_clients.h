#ifndef SLUICE_SERVICES_CLIENTS_GRPC_CLIENTS_H_
#define SLUICE_SERVICES_CLIENTS_GRPC_CLIENTS_H_

#include <memory>
#include <string>

#include "services/clients/clients.h"

// The gRPC edge of the clients (library sluice_grpc_clients): clients.h's
// interfaces over gRPC channels, with the transport security and tokens of
// services/runtime. Core libraries take the interfaces; only services and
// tools that open connections include this.
namespace sluice::clients {

// gRPC implementations; `target` is "host:port". Channels are created lazily
// and reconnect by themselves.
std::unique_ptr<RewardClient> NewGrpcRewardClient(const std::string& target);
std::unique_ptr<ReplayBufferClient> NewGrpcReplayBufferClient(const std::string& target);
std::unique_ptr<ControllerClient> NewGrpcControllerClient(const std::string& target);
std::unique_ptr<TrainerClient> NewGrpcTrainerClient(const std::string& target);
// The trainer's StreamWeights, and a worker's WeightRelay.StreamWeights.
std::unique_ptr<WeightSource> NewGrpcTrainerWeightSource(const std::string& target);
std::unique_ptr<WeightSource> NewGrpcRelayWeightSource(const std::string& target);

}  // namespace sluice::clients

#endif  // SLUICE_SERVICES_CLIENTS_GRPC_CLIENTS_H_
