#include "services/weights/weight_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/weights/grpc_stream_receiver.h"

namespace sluice::weights {

absl::StatusOr<std::unique_ptr<WeightReceiver>> NewWeightReceiver(v1::WeightTransport transport,
                                                                  bool delta,
                                                                  WeightReceiverDeps deps) {
  if (deps.trainer == nullptr) {
    return absl::InvalidArgumentError("a weight receiver needs the trainer's client");
  }
  switch (transport) {
    case v1::WEIGHT_TRANSPORT_UNSPECIFIED:
    case v1::WEIGHT_TRANSPORT_GRPC:
      return std::unique_ptr<WeightReceiver>(
          std::make_unique<GrpcStreamReceiver>(delta, std::move(deps)));
    default:
      return absl::UnimplementedError(
          absl::StrCat("weight_sync.transport ", v1::WeightTransport_Name(transport),
                       ": this rollout worker cannot receive weights that way"));
  }
}

}  // namespace sluice::weights
