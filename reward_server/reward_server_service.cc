#include "reward_server/reward_server_service.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "reward_server/proto_convert.h"
#include "services/runtime/auth.h"
#include "services/runtime/grpc_status.h"

namespace sluice::reward_server {

absl::Status RewardServiceOptions::Validate() const {
  if (max_batch_items < 1 || max_batch_items > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_items must be in [1, 1000000], got ", max_batch_items));
  }
  if (sandbox_max_queued < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sandbox_max_queued must be >= 0, got ", sandbox_max_queued));
  }
  return absl::OkStatus();
}

RewardServerServiceImpl::RewardServerServiceImpl(std::shared_ptr<Scorer> scorer,
                                                 prometheus::Registry& registry,
                                                 RewardServiceOptions options,
                                                 std::shared_ptr<const sandbox::SandboxPool> pool)
    : scorer_(std::move(scorer)),
      options_(options),
      pool_(std::move(pool)),
      incarnation_(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))),
      metrics_(registry) {
  if (pool_ != nullptr) {
    SandboxAdmissionOptions admission;
    admission.slots = pool_->pool_options().slots;
    admission.max_queued = options_.sandbox_max_queued;
    const sandbox::SandboxPool* pool_ptr = pool_.get();
    admission_ = std::make_unique<SandboxAdmission>(
        admission, [pool_ptr] { return pool_ptr->GetStats().mean_run_time; });
  }
}

void RewardServerServiceImpl::UpdateScorerGauges() {
  metrics_.RecordScorerStats(scorer_->GetStats());
  if (pool_ != nullptr) metrics_.RecordSandboxPool(pool_->GetStats(), admission_->admitted());
}

namespace {

// Returns a SandboxAdmission's programs when the batch is done.
class AdmittedPrograms {
 public:
  AdmittedPrograms(SandboxAdmission* admission, int64_t programs)
      : admission_(admission), programs_(programs) {}
  ~AdmittedPrograms() {
    if (admission_ != nullptr) admission_->Release(programs_);
  }
  AdmittedPrograms(const AdmittedPrograms&) = delete;
  AdmittedPrograms& operator=(const AdmittedPrograms&) = delete;

 private:
  SandboxAdmission* const admission_;
  const int64_t programs_;
};

}  // namespace

grpc::Status RewardServerServiceImpl::ScoreBatch(grpc::ServerContext* context,
                                                 const v1::ScoreBatchRequest* request,
                                                 v1::ScoreBatchResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
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
  std::vector<WeightedVerifier> composition = CompositionFromProto(request->composition());
  // Backpressure: a batch that would overfill the code sandbox's backlog is
  // refused now, with when to come back, rather than left to time out in the
  // queue.
  const int64_t programs =
      admission_ != nullptr ? CountSandboxedPrograms(items, composition) : 0;
  if (programs > 0) {
    const absl::Status admitted = admission_->TryAdmit(programs);
    if (!admitted.ok()) {
      metrics_.RecordRefusedBatch("sandbox_full");
      if (std::optional<absl::Duration> after = RetryAfter(admitted)) {
        context->AddTrailingMetadata(std::string(runtime::kRetryPushbackMetadataKey),
                                     absl::StrCat(absl::ToInt64Milliseconds(*after)));
      }
      return runtime::ToGrpcStatus(admitted);
    }
  }
  AdmittedPrograms release(programs > 0 ? admission_.get() : nullptr, programs);
  absl::StatusOr<BatchScores> scores = scorer_->ScoreBatch(std::move(items), composition);
  if (!scores.ok()) return runtime::ToGrpcStatus(scores.status());
  metrics_.RecordBatch(*scores);
  BatchScoresToProto(*scores, response);
  return grpc::Status::OK;
}

grpc::Status RewardServerServiceImpl::ListVerifiers(grpc::ServerContext* context,
                                                    const v1::ListVerifiersRequest* request,
                                                    v1::ListVerifiersResponse* response) {
  SLUICE_RETURN_IF_DENIED(context);
  for (const std::shared_ptr<const Verifier>& verifier : scorer_->registry().List()) {
    VerifierInfoToProto(verifier->info(), response->add_verifiers());
  }
  response->set_incarnation(incarnation_);
  return grpc::Status::OK;
}

}  // namespace sluice::reward_server
