#ifndef SLUICE_TRAINER_RANKS_TRAINER_GROUP_H_
#define SLUICE_TRAINER_RANKS_TRAINER_GROUP_H_

// The trainer's ranks as one c10d process group: rank 0 serves a TCPStore at
// the rendezvous, every rank joins a ProcessGroupGloo through it (NCCL is
// the GPU build's, a later step). LibTorch's own collectives: nothing here
// moves bytes itself.
//
// Joining checks what the ranks must agree on before any tensor moves, so a
// misconfigured rank fails at start naming what disagrees: its world size
// against rank 0's, a rank number another process already holds, a
// rendezvous nobody serves. Every collective has the group's timeout: a rank
// that died (kill -9) or stopped (SIGSTOP) fails the others' next
// collective within it, not in minutes.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/ranks/rank_config.h"

namespace at {
class Tensor;
}  // namespace at

namespace sluice::trainer::ranks {

class TrainerGroup {
 public:
  // Joins the group `config` names (world size 1: a group of one that
  // needs no store and whose collectives do nothing). Blocks until every
  // rank has joined or config.timeout passed. UNAVAILABLE when the
  // rendezvous cannot be reached or not every rank came; FAILED_PRECONDITION
  // when this rank disagrees with the group (world size, a rank taken).
  static absl::StatusOr<std::unique_ptr<TrainerGroup>> Join(const RankConfig& config);
  ~TrainerGroup();
  TrainerGroup(const TrainerGroup&) = delete;
  TrainerGroup& operator=(const TrainerGroup&) = delete;

  int rank() const { return config_.rank; }
  int world_size() const { return config_.world_size; }
  const RankConfig& config() const { return config_; }

  // Sums `tensors` (of one dtype, on the CPU) over the ranks in
  // place, flattened into buckets of at most `bucket_bytes` so that one
  // collective carries many small tensors. UNAVAILABLE naming the group's
  // timeout when a rank does not take part in time.
  absl::Status AllReduceSum(const std::vector<at::Tensor>& tensors,
                            int64_t bucket_bytes = 25 << 20);
  // A sum over the ranks started and not yet waited for: gloo runs it on its
  // own threads while the caller goes on (the trainer's backward pass).
  class PendingSum {
   public:
    ~PendingSum();
    // Blocks until the sum is in the tensor it was started on.
    // UNAVAILABLE as AllReduceSum.
    absl::Status Wait();

   private:
    friend class TrainerGroup;
    struct Work;
    PendingSum(std::unique_ptr<Work> work, int rank, absl::Duration timeout);
    std::unique_ptr<Work> work_;
    int rank_;
    absl::Duration timeout_;
  };
  // Starts summing one flat float32 tensor over the ranks, in place. Every
  // rank must start its sums in the same order. Alone: nothing to wait for.
  absl::StatusOr<std::unique_ptr<PendingSum>> StartAllReduceSum(const at::Tensor& flat);

  // Every rank's `mine` (the same shape on each), in rank order, into
  // `all` (world_size times mine's elements).
  absl::Status AllGather(const at::Tensor& mine, const at::Tensor& all);
  // Root's `tensors` to every rank, in place.
  absl::Status Broadcast(const std::vector<at::Tensor>& tensors, int root);
  // Waits until every rank got here.
  absl::Status Barrier();

 private:
  struct Backend;
  TrainerGroup(RankConfig config, std::unique_ptr<Backend> backend);

  RankConfig config_;
  std::unique_ptr<Backend> backend_;  // Null alone.
};

}  // namespace sluice::trainer::ranks

#endif  // SLUICE_TRAINER_RANKS_TRAINER_GROUP_H_
