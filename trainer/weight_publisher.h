#ifndef SLUICE_TRAINER_WEIGHT_PUBLISHER_H_
#define SLUICE_TRAINER_WEIGHT_PUBLISHER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "sluice/v1/common.pb.h"

// The trainer's end of a weight transport (a rollout worker's end is
// services/weights/weight_transport.h), chosen from the run's resolved
// weight_sync.transport. The trainer hands every version it publishes to its
// publisher, bytes and delta encoded, before any worker may load it.
// The gRPC stream is pull-based: its publisher is the WeightStore that
// TrainerService.StreamWeights (and the relay tree under it) serves from. A
// transport that pushes versions (a collective broadcast, device memory)
// implements WeightPublisher here, and its case in WeightPublisherFor
// (docs/architecture.md, "A weight transport").
namespace sluice::trainer {

struct PublishedVersion;  // weight_store.h
class WeightStore;

class WeightPublisher {
 public:
  virtual ~WeightPublisher() = default;
  // `version` is the latest (versions increase). Thread-safe.
  virtual void Publish(std::shared_ptr<const PublishedVersion> version) = 0;
};

// The publisher of `transport` for a trainer that serves versions from
// `store` (not owned; outlives the publisher's use): the store itself for
// GRPC. UNIMPLEMENTED for a transport this build cannot publish with (the
// controller refuses such specs at submit).
absl::StatusOr<WeightPublisher*> WeightPublisherFor(v1::WeightTransport transport,
                                                    WeightStore* store);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_WEIGHT_PUBLISHER_H_
