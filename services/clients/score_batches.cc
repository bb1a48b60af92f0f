#include "services/clients/score_batches.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "services/clients/retrier.h"

namespace sluice::clients {

absl::StatusOr<v1::ScoreBatchResponse> ScoreInBatches(RewardClient& reward,
                                                      const v1::ScoreBatchRequest& request,
                                                      const ScoreBatchesOptions& options) {
  if (options.max_items < 1 || options.attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ScoreInBatches: max_items and attempts must be >= 1, got ", options.max_items, " and ",
        options.attempts));
  }
  const int total = request.items_size();
  // One batch: options.attempts calls at most, the stop checked before each
  // repeat.
  const auto score = [&](const v1::ScoreBatchRequest& batch) {
    absl::StatusOr<v1::ScoreBatchResponse> scored;
    for (int attempt = 0; attempt < options.attempts; ++attempt) {
      if (attempt > 0 && options.before_call && !options.before_call(attempt)) {
        return absl::StatusOr<v1::ScoreBatchResponse>(absl::CancelledError("scoring stopped"));
      }
      scored = reward.ScoreBatch(batch, options.timeout);
      if (scored.ok()) break;
    }
    return scored;
  };
  if (total <= options.max_items) {  // One call, without copying the items.
    absl::StatusOr<v1::ScoreBatchResponse> scored = score(request);
    if (scored.ok() && scored->results_size() != total) {
      return absl::InternalError(absl::StrCat("reward server returned ", scored->results_size(),
                                              " results for ", total, " items"));
    }
    return scored;
  }
  v1::ScoreBatchResponse all;
  all.mutable_results()->Reserve(total);
  for (int begin = 0; begin < total; begin += options.max_items) {
    const int end = std::min(total, begin + options.max_items);
    if (begin > 0 && options.before_call && !options.before_call(0)) {
      return absl::CancelledError("scoring stopped");
    }
    v1::ScoreBatchRequest batch;
    *batch.mutable_composition() = request.composition();
    batch.mutable_items()->Reserve(end - begin);
    for (int i = begin; i < end; ++i) *batch.add_items() = request.items(i);
    absl::StatusOr<v1::ScoreBatchResponse> scored = score(batch);
    if (!scored.ok()) {
      // Payloads kept: the caller tells a final give-up (IsRetriesExhausted)
      // from a failure of one batch by them.
      return PrefixMessage(scored.status(),
                           absl::StrCat("items [", begin, ", ", end, ") of ", total));
    }
    if (scored->results_size() != end - begin) {
      return absl::InternalError(absl::StrCat("reward server returned ", scored->results_size(),
                                              " results for items [", begin, ", ", end, ")"));
    }
    all.set_duration_ms(all.duration_ms() + scored->duration_ms());
    for (v1::ScoreResult& result : *scored->mutable_results()) {
      *all.add_results() = std::move(result);
    }
  }
  return all;
}

}  // namespace sluice::clients
