#ifndef SLUICE_TRAINER_TRAINER_SERVICE_H_
#define SLUICE_TRAINER_TRAINER_SERVICE_H_

#include "sluice/v1/trainer.grpc.pb.h"

namespace sluice::trainer {

// The gRPC edge of the trainer: converts between protos and the core
// library's types and maps absl::Status to grpc::Status. It holds no logic of
// its own. In this release every RPC of sluice.v1.TrainerService answers
// UNIMPLEMENTED (see README, "What exists"); the issues that build the
// trainer override them here.
class TrainerServiceImpl final : public sluice::v1::TrainerService::Service {};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAINER_SERVICE_H_
