#ifndef SLUICE_REWARD_SERVER_LIMITS_H_
#define SLUICE_REWARD_SERVER_LIMITS_H_

// Limits of the reward server that its clients must keep to. Header only
// and dependency free, so that clients (the rollout worker, the trainer's
// evaluator, through services/clients/score_batches.h) share the numbers
// instead of copying them.
namespace sluice::reward_server {

// Items one ScoreBatchRequest may carry unless sluice-reward-server was
// started with another --max-batch-items: a larger batch is refused with
// INVALID_ARGUMENT ("items: at most 4096 items per batch, ..."), so clients
// split theirs into batches of at most this many.
inline constexpr int kDefaultMaxBatchItems = 4096;

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_LIMITS_H_
