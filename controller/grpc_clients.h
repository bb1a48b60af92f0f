#ifndef SLUICE_CONTROLLER_GRPC_CLIENTS_H_
#define SLUICE_CONTROLLER_GRPC_CLIENTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "controller/service_clients.h"

namespace sluice::controller {

// Where the services a controller drives are (its flags).
struct ServiceAddresses {
  std::string trainer;
  std::string replay_buffer;
  std::string reward_server;
};

// The gRPC implementations of service_clients.h: one channel per address,
// created lazily by gRPC (an address that is down at start-up is fine).
// Calls fail fast on a service that is down (no wait-for-ready) and give up
// after `call_timeout`; health checks after `health_timeout`. Empty
// addresses give null clients.
ServiceClients MakeGrpcServiceClients(const ServiceAddresses& addresses,
                                      absl::Duration call_timeout = absl::Seconds(10),
                                      absl::Duration health_timeout = absl::Seconds(1));

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_GRPC_CLIENTS_H_
