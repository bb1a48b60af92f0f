#ifndef SLUICE_SERVICES_WEIGHTS_WEIGHT_TRANSPORT_H_
#define SLUICE_SERVICES_WEIGHTS_WEIGHT_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/clients/clients.h"
#include "services/weights/relay_fetcher.h"
#include "sluice/v1/common.pb.h"

// The seam between a rollout worker and the way weight versions reach it
// (a run's resolved `weight_sync.transport`, common/run/run_weight_sync.h).
// The worker's weight follower asks its receiver for the latest version and
// builds a model from what comes back; how the bytes moved (a gRPC chunk
// stream from the trainer or a relay, a sparse delta, and later device
// memory or a collective) is the receiver's. A new transport implements
// WeightReceiver here, next to the gRPC stream's, and is chosen in
// NewWeightReceiver (docs/architecture.md, "A weight transport").
namespace sluice::weights {

// One version received, and what moving it cost (for the run's weight_sync
// figures and the worker's metrics).
struct ReceivedWeights {
  clients::FetchedWeights weights;
  // The metrics label: "grpc" (a full version), "grpc_delta" (a sparse
  // delta), as run::WeightTransportLabel names them.
  std::string transport;
  // Bytes that crossed the wire, and what the version takes in full.
  int64_t wire_bytes = 0;
  int64_t full_bytes = 0;
};

// A worker's end of a weight transport. Not thread-safe: one receive at a
// time (a worker's weight follower).
class WeightReceiver {
 public:
  virtual ~WeightReceiver() = default;

  // The latest version of `run_id` the trainer published, whole and checked
  // against the trainer's checksum. `held`: the version the worker holds as
  // it came (the transfer dtype), or null; a transport may send only what
  // changed against it. An error: nothing usable arrived (the caller keeps
  // the version it has and asks again).
  virtual absl::StatusOr<ReceivedWeights> ReceiveLatest(const std::string& run_id,
                                                        const clients::FetchedWeights* held) = 0;
};

// What a receiver may use from the worker.
struct WeightReceiverDeps {
  // The trainer (WatchVersions, FetchWeights, GetWeightSource). Required.
  clients::TrainerClient* trainer = nullptr;
  // Downloads through the trainer's fan-out tree, relaying to other workers;
  // null: straight from the trainer.
  std::shared_ptr<RelayFetcher> relay_fetcher;
  // A delta failed and the full version was fetched instead: "data_loss" or
  // "unavailable" (may be unset).
  std::function<void(const std::string& reason)> on_delta_fallback;
};

// The receiver of `transport` (with sparse deltas when `delta`).
// UNIMPLEMENTED for a transport this build cannot receive with (the
// controller refuses such specs at submit, saying why); INVALID_ARGUMENT
// without a trainer.
absl::StatusOr<std::unique_ptr<WeightReceiver>> NewWeightReceiver(v1::WeightTransport transport,
                                                                  bool delta,
                                                                  WeightReceiverDeps deps);

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_WEIGHT_TRANSPORT_H_
