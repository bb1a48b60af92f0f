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
#include <string>
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

// What the last Step() spent where, on this rank.
struct ShardedStepTimings {
  // Summing the gradients over the ranks: the time Step() spent on it, and
  // the time from its first bucket's start to its end (the same unless it
  // ran during backward).
  double reduce_seconds = 0;
  double reduce_window_seconds = 0;
  double update_seconds = 0;  // Clipping and AdamW on this rank's slice.
  double gather_seconds = 0;  // Gathering every slice into the parameters.
  // Of the gradients' reduction, the fraction that ran while backward did
  // (ReduceDuringNextBackward): 1 - the time Step() waited for it over the
  // time from its first bucket's start to its end. 0 when it ran in Step().
  double overlap_fraction = 0;
  int64_t reduced_bytes = 0;   // Gradient bytes all-reduced.
  int64_t gathered_bytes = 0;  // Parameter bytes all-gathered (every rank's slice).
};

class ShardedAdamW {
 public:
  // `params`: the model's float32 parameters, the same shapes in the same
  // order on every rank, and the same values (the caller broadcasts rank
  // 0's first). `group` outlives this.
  ShardedAdamW(std::vector<at::Tensor> params, ShardedAdamWOptions options, TrainerGroup& group);
  ~ShardedAdamW();

  void ZeroGrad();
  // Reduces the gradients in buckets while the next backward pass computes
  // them, as DDP's reducer does: each bucket (parameters in reverse order,
  // at most bucket_bytes) is summed over the ranks as soon as backward has
  // produced all of its gradients, and Step() waits for what is left. Call
  // it before the last micro-batch's backward (earlier ones accumulate
  // locally); without it, Step() reduces everything itself.
  void ReduceDuringNextBackward();
  // Sums the gradients over the ranks, clips them, updates this rank's
  // slice and gathers every slice into the parameters. Returns the global
  // gradient norm before clipping. UNAVAILABLE when a collective fails (a
  // rank is gone): the parameters are then unchanged or must be restored
  // from a checkpoint (every rank fails the same step).
  absl::Status Step(double* grad_norm = nullptr);
  void set_lr(double lr) { options_.lr = lr; }

  // Checkpoints. Each rank writes its own state, atomically, to
  // <dir>/optimizer-rank-<R>-of-<N>.safetensors: its master slice and both
  // moments over [shard_begin, shard_end), with the world size, rank,
  // parameter count, range and step count as metadata.
  absl::Status SaveShard(const std::string& dir) const;
  // Restores what SaveShard wrote into `dir`, at this group's world size or
  // another: each rank reads the slices of the checkpoint's files that
  // overlap its own range (its own file alone when the sizes match), so a
  // checkpoint of N ranks resumes on M. FAILED_PRECONDITION naming the file
  // and what disagrees when the directory holds no shards, shards of two
  // world sizes, a rank's file is missing, a file is not one of ours, or
  // the parameter count or step count differs from the checkpoint's (a
  // checkpoint of another model).
  absl::Status LoadShards(const std::string& dir);

  // This rank's slice of the flattened parameters: [shard_begin, shard_end).
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  // Bytes of optimizer state this rank holds: its master slice and the two
  // moments, allocated up front.
  int64_t state_bytes() const;
  int64_t steps() const { return steps_; }
  const ShardedStepTimings& last_step() const { return timings_; }

 private:
  struct State;
  struct Bucket;
  // A gradient hook: parameter `index`'s gradient of this backward pass.
  void OnGradient(size_t index, const at::Tensor& grad);
  absl::Status LaunchBucket(Bucket& bucket);
  // Sums the gradients over the ranks through the buckets: launches those
  // backward did not (all of them when not armed), waits for every one and
  // puts the sums into `grads`.
  absl::Status FinishReduction(const std::vector<at::Tensor>& grads);

  std::vector<at::Tensor> params_;
  ShardedAdamWOptions options_;
  TrainerGroup& group_;
  int64_t total_ = 0;
  int64_t shard_size_ = 0;  // Padded: every rank's slice has this many.
  int64_t shard_begin_ = 0;
  int64_t shard_end_ = 0;
  int64_t steps_ = 0;
  ShardedStepTimings timings_;
  std::unique_ptr<State> state_;
  bool armed_ = false;           // ReduceDuringNextBackward was called.
  std::vector<unsigned> hooks_;  // One per parameter, removed on destruction.
};

}  // namespace sluice::trainer::ranks

#endif  // SLUICE_TRAINER_RANKS_SHARDED_ADAMW_H_
