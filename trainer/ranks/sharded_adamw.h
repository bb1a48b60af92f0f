#ifndef SLUICE_TRAINER_RANKS_SHARDED_ADAMW_H_
#define SLUICE_TRAINER_RANKS_SHARDED_ADAMW_H_

// AdamW over a trainer group whose optimizer state is split across the
// ranks (ZeRO stage 1). Every rank holds the whole model and computes the
// gradients of its share of the batch; Step() sums the gradients over the
// ranks (bucketed all-reduce), lets each rank update only its slice of the
// flattened parameters (its float32 master copy and AdamW's two moments for
// that slice alone: about 1/N of one rank's optimizer state), then
// all-gathers the updated slices into every rank's model. With one rank it
// is AdamW.
//
// Equivalence: when each rank's loss is its share of the batch's loss (the
// loss of the whole batch summed over ranks, e.g. each rank's token sum
// divided by the batch's token count), N ranks give the weights one rank
// gives on the whole batch, up to float32 reduction order (the test states
// the tolerance measured). Gradient accumulation over micro-batches is
// autograd's: call backward once per micro-batch, then Step().

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace at {
class Tensor;
}  // namespace at

namespace sluice::trainer::ranks {

class TrainerGroup;

struct ShardedAdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // Gradients are clipped to this global norm after they are summed (0:
  // not clipped).
  double max_grad_norm = 0;
  // All-reduce bucket, bytes.
  int64_t bucket_bytes = 25 << 20;
};

class ShardedAdamW {
 public:
  // `params`: the model's float32 parameters, the same shapes in the same
  // order on every rank, and the same values (the caller broadcasts rank
  // 0's first). `group` outlives this.
  ShardedAdamW(std::vector<at::Tensor> params, ShardedAdamWOptions options, TrainerGroup& group);
  ~ShardedAdamW();

  void ZeroGrad();
  // Sums the gradients over the ranks, clips them, updates this rank's
  // slice and gathers every slice into the parameters. Returns the global
  // gradient norm before clipping. UNAVAILABLE when a collective fails (a
  // rank is gone): the parameters are then unchanged or must be restored
  // from a checkpoint (every rank fails the same step).
  absl::Status Step(double* grad_norm = nullptr);
  void set_lr(double lr) { options_.lr = lr; }

  // This rank's slice of the flattened parameters: [shard_begin, shard_end).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  // Bytes of optimizer state this rank holds: its master slice and the two
  // moments (0 before the first step allocates the moments' storage is not
  // the case: they are allocated up front).
  int64_t state_bytes() const;
  int64_t steps() const { return steps_; }

 private:
  struct State;
  std::vector<at::Tensor> params_;
  ShardedAdamWOptions options_;
  TrainerGroup& group_;
  int64_t total_ = 0;
  int64_t shard_size_ = 0;  // Padded: every rank's slice has this many.
  int64_t shard_begin_ = 0;
  int64_t shard_end_ = 0;
  int64_t steps_ = 0;
  std::unique_ptr<State> state_;
};

}  // namespace sluice::trainer::ranks

#endif  // SLUICE_TRAINER_RANKS_SHARDED_ADAMW_H_
