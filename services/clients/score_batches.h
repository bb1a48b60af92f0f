#ifndef SLUICE_SERVICES_CLIENTS_SCORE_BATCHES_H_
#define SLUICE_SERVICES_CLIENTS_SCORE_BATCHES_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/wire_limits.h"
#include "services/clients/clients.h"
#include "sluice/v1/reward_server.pb.h"

namespace sluice::clients {

struct ScoreBatchesOptions {
  // Items per ScoreBatch call (>= 1): the reward server refuses more than
  // its --max-batch-items.
  int max_items = kDefaultMaxBatchItems;
  // Deadline of each call.
  absl::Duration timeout = absl::Seconds(60);
  // Calls per batch (>= 1): a failed call is repeated up to this many
  // times in all.
  int attempts = 1;
  // Called before each batch after the first (`retry` = 0) and before each
  // repeated call (`retry` = its number, from 1); it may wait (a backoff)
  // and returns false to stop: the scoring ends with CANCELLED. Unset = go
  // on at once. The caller's stop flag belongs here, so that a stop is seen
  // between batches rather than after all of them.
  std::function<bool(int retry)> before_call;
};

// Scores `request`'s items in consecutive batches of at most
// options.max_items (each carrying the request's composition) and returns
// one response with every result in the order of the items, as one call
// would. Blocks for the calls, up to options.timeout each. The first batch
// that still fails after options.attempts calls ends it with that call's
// status, saying which items it held; a response whose result count does
// not match its batch is INTERNAL. Thread-safe as `reward` is.
absl::StatusOr<v1::ScoreBatchResponse> ScoreInBatches(RewardClient& reward,
                                                      const v1::ScoreBatchRequest& request,
                                                      const ScoreBatchesOptions& options = {});

}  // namespace sluice::clients

#endif  // SLUICE_SERVICES_CLIENTS_SCORE_BATCHES_H_
