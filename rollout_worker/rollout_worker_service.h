#ifndef SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_
#define SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_

#include "sluice/v1/rollout_worker.grpc.pb.h"

namespace sluice::rollout_worker {

// The gRPC edge of the rollout worker: converts between protos and the core
// library's types and maps absl::Status to grpc::Status. It holds no logic of
// its own. In this release every RPC of sluice.v1.RolloutWorkerService answers
// UNIMPLEMENTED (see README, "What exists"); the issues that build the
// rollout worker override them here.
class RolloutWorkerServiceImpl final : public sluice::v1::RolloutWorkerService::Service {};

}  // namespace sluice::rollout_worker

#endif  // SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_
