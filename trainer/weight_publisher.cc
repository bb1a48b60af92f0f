#include "trainer/weight_publisher.h"

#include "absl/strings/str_cat.h"
#include "trainer/weight_store.h"

namespace sluice::trainer {

absl::StatusOr<WeightPublisher*> WeightPublisherFor(v1::WeightTransport transport,
                                                    WeightStore* store) {
  switch (transport) {
    case v1::WEIGHT_TRANSPORT_UNSPECIFIED:
    case v1::WEIGHT_TRANSPORT_GRPC:
      return store;
    default:
      return absl::UnimplementedError(
          absl::StrCat("weight_sync.transport ", v1::WeightTransport_Name(transport),
                       ": this trainer cannot publish weights that way"));
  }
}

}  // namespace sluice::trainer
