#ifndef SLUICE_SERVICES_WEIGHTS_WEIGHT_RELAY_SERVICE_H_
#define SLUICE_SERVICES_WEIGHTS_WEIGHT_RELAY_SERVICE_H_

#include <memory>

#include "absl/time/time.h"
#include "services/weights/version_stream.h"
#include "sluice/v1/trainer.grpc.pb.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
class Gauge;
}  // namespace prometheus

namespace sluice::weights {

struct WeightRelayOptions {
  // How long a child may wait for a version its parent has not started to
  // receive yet (the trainer placed both at about the same time).
  absl::Duration wait_for_version = absl::Seconds(10);
  // How long a child waits for the next chunk before giving up on this
  // relay (it asks the trainer for another source).
  absl::Duration stall = absl::Seconds(10);
};

// The WeightRelay service of a rollout worker: serves the versions in its
// RelayCache to other workers, each chunk as soon as it has arrived here.
class WeightRelayServiceImpl final : public v1::WeightRelay::Service {
 public:
  WeightRelayServiceImpl(std::shared_ptr<RelayCache> cache, prometheus::Registry& registry,
                         WeightRelayOptions options = {});

  grpc::Status StreamWeights(grpc::ServerContext* context, const v1::StreamWeightsRequest* request,
                             grpc::ServerWriter<v1::WeightsChunk>* writer) override;

 private:
  const std::shared_ptr<RelayCache> cache_;
  const WeightRelayOptions options_;
  prometheus::Counter& bytes_sent_;
  prometheus::Counter& streams_;
  prometheus::Counter& streams_failed_;
  prometheus::Gauge& streams_active_;
};

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_WEIGHT_RELAY_SERVICE_H_
