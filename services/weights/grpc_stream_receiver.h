#ifndef SLUICE_SERVICES_WEIGHTS_GRPC_STREAM_RECEIVER_H_
#define SLUICE_SERVICES_WEIGHTS_GRPC_STREAM_RECEIVER_H_

#include <string>

#include "services/weights/weight_transport.h"

namespace sluice::weights {

// weight_sync.transport GRPC: versions as a stream of chunks
// (TrainerService.StreamWeights), through the trainer's fan-out tree of
// relays when the worker has a RelayFetcher and the trainer places workers
// (GetWeightSource), else straight from the trainer. With deltas, first as a
// sparse delta against the version held, straight from the trainer, falling
// back to the full version when the trainer has none (the worker skipped a
// version) or it fails (reported through on_delta_fallback).
class GrpcStreamReceiver final : public WeightReceiver {
 public:
  GrpcStreamReceiver(bool delta, WeightReceiverDeps deps);

  absl::StatusOr<ReceivedWeights> ReceiveLatest(const std::string& run_id,
                                                const clients::FetchedWeights* held) override;

 private:
  // The full latest version: relay tree, or the trainer.
  absl::StatusOr<clients::FetchedWeights> ReceiveFull(const std::string& run_id);

  const bool delta_;
  const WeightReceiverDeps deps_;
  // The trainer answered GetWeightSource with UNIMPLEMENTED: fetch from it
  // directly from then on.
  bool relay_unsupported_ = false;
};

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_GRPC_STREAM_RECEIVER_H_
