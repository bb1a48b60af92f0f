#ifndef SLUICE_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_
#define SLUICE_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_

#include "sluice/v1/controller.grpc.pb.h"

namespace sluice::controller {

// The gRPC edge of the controller: converts between protos and the core
// library's types and maps absl::Status to grpc::Status. It holds no logic of
// its own. In this release every RPC of sluice.v1.ControllerService answers
// UNIMPLEMENTED (see README, "What exists"); the issues that build the
// controller override them here.
class ControllerServiceImpl final : public sluice::v1::ControllerService::Service {};

}  // namespace sluice::controller

#endif  // SLUICE_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_
