#ifndef SLUICE_COMMON_WIRE_LIMITS_H_
#define SLUICE_COMMON_WIRE_LIMITS_H_

// Limits of one service's requests that its clients must keep to, where both
// sides see them: the service refuses more, the clients split to fit. Header
// only and dependency free.
namespace sluice {

// Items one ScoreBatchRequest may carry unless sluice-reward-server was
// started with another --max-batch-items: a larger batch is refused with
// INVALID_ARGUMENT ("items: at most 4096 items per batch, ..."), so clients
// (the rollout worker, the trainer's evaluator, through
// services/clients/score_batches.h) split theirs into batches of at most this
// many.
inline constexpr int kDefaultMaxBatchItems = 4096;

}  // namespace sluice

#endif  // SLUICE_COMMON_WIRE_LIMITS_H_
