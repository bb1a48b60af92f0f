#include "reward_server/reward_server_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "reward_server/proto_convert.h"
#include "services/runtime/grpc_status.h"

namespace sluice::reward_server {

absl::Status RewardServiceOptions::Validate() const {
  if (max_batch_items < 1 || max_batch_items > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_items must be in [1, 1000000], got ", max_batch_items));
  }
  return absl::OkStatus();
}

RewardServerServiceImpl::RewardServerServiceImpl(std::shared_ptr<Scorer> scorer,
                                                 prometheus::Registry& registry,
                                                 RewardServiceOptions options)
    : scorer_(std::move(scorer)),
      options_(options),
      incarnation_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))),
      metrics_(registry) {}

grpc::Status RewardServerServiceImpl::ScoreBatch(grpc::ServerContext* context,
                                                 const v1::ScoreBatchRequest* request,
                                                 v1::ScoreBatchResponse* response) {
  if (request->items_size() > options_.max_batch_items) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("items: at most ", options_.max_batch_items, " items per batch, got ",
                     request->items_size(), "; split the batch"));
  }
  std::vector<ScoreItem> items;
  items.reserve(request->items_size());
  for (int i = 0; i < request->items_size(); ++i) {
    const v1::ScoreItem& item = request->items(i);
    if (item.item_id().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("items[", i, "].item_id: must not be empty"));
    }
    items.push_back(ScoreItemFromProto(item));
  }
  absl::StatusOr<BatchScores> scores =
      scorer_->ScoreBatch(std::move(items), CompositionFromProto(request->composition()));
  if (!scores.ok()) return runtime::ToGrpcStatus(scores.status());
  metrics_.RecordBatch(*scores);
  BatchScoresToProto(*scores, response);
  return grpc::Status::OK;
}

grpc::Status RewardServerServiceImpl::ListVerifiers(grpc::ServerContext* context,
                                                    const v1::ListVerifiersRequest* request,
                                                    v1::ListVerifiersResponse* response) {
  for (const std::shared_ptr<const Verifier>& verifier : scorer_->registry().List()) {
    VerifierInfoToProto(verifier->info(), response->add_verifiers());
  }
  response->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

}  // namespace sluice::reward_server
