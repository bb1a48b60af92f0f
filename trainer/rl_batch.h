#ifndef SLUICE_TRAINER_RL_BATCH_H_
#define SLUICE_TRAINER_RL_BATCH_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sluice/v1/replay_buffer.pb.h"

// From sampled groups to the tensors a training step runs: which samples a
// minibatch trains on (rows), their advantages, behaviour log-probs and
// token versions, padded into one [rows, positions] layout. No model, no
// gRPC: the trainer (trainer.cc) feeds the result to its forward pass and
// to the objective (objective.h).
namespace sluice::trainer {

// A token row: the prefix (prompt) and the trained part (completion).
using TokenRow = std::pair<std::vector<int32_t>, std::vector<int32_t>>;

// Right-padded token rows and, per row, where its trained tokens start.
struct PaddedBatch {
  torch::Tensor inputs;   // [R, L-1] int64: the sequence minus its last token
  torch::Tensor targets;  // [R, L-1] int64: the sequence shifted by one
  torch::Tensor mask;     // [R, L-1] float: 1 where the target is a trained token
  int64_t real_tokens = 0;
};

// `rows[r]` = prefix ++ trained; the mask covers the `trained` part.
PaddedBatch PadRows(const std::vector<TokenRow>& rows, int32_t pad_id);

// Scatters per-completion-token values into the [R, width] target layout of
// PadRows: completion token j of row r sits at target index
// prefix_lengths[r] - 1 + j. Positions with no token are 0.
torch::Tensor ScatterCompletionValues(const std::vector<std::vector<float>>& values,
                                      const std::vector<int64_t>& prefix_lengths, int64_t width);
// The same for int64 values (token policy versions), as an int64 tensor.
torch::Tensor ScatterCompletionVersions(const std::vector<std::vector<int64_t>>& values,
                                        const std::vector<int64_t>& prefix_lengths, int64_t width);

struct RlRowOptions {
  int64_t vocab_size = 0;
  // The trainer's version (what token versions are checked against).
  int64_t trainer_version = 0;
  // GRPO advantages (advantages.h).
  bool normalize_advantage_by_std = true;
  double advantage_eps = 1e-6;
  // Groups whose rewards are all equal: trained on (true: their advantages
  // are 0, but trajectory balance, a KL or entropy term still learn from
  // them) or left out (false: counted in groups_zero_advantage).
  bool train_uniform_groups = false;
};

// A minibatch's rows and the figures the step reports about its groups.
struct RlRows {
  std::vector<TokenRow> rows;
  std::vector<int64_t> prefix_lengths;
  std::vector<std::vector<float>> behaviour;
  std::vector<std::vector<float>> advantages;
  std::vector<std::vector<int64_t>> versions;
  // Per row: the trajectory's reward and its group's index in the batch.
  std::vector<double> rewards;
  std::vector<int64_t> groups;

  // Over the minibatch's trainable groups (every trajectory, trained or not).
  std::map<int64_t, int64_t> staleness_counts;  // group staleness -> groups
  int64_t staleness_sum = 0;
  int64_t staleness_max = 0;
  double reward_sum = 0;
  int64_t trajectories = 0;
  int64_t passed = 0;  // reward >= 1
  int64_t completion_tokens = 0;
  int64_t zero_advantage = 0;  // uniform groups left out
  // Groups the model cannot train on (step_guard.h), left out: (group id,
  // why), for the caller to log.
  std::vector<std::pair<std::string, std::string>> invalid;
  std::vector<std::string> group_ids;  // every group of the minibatch
};

// Rows of groups [begin, end) of `batch`. A trajectory that was aborted or
// has no completion token is not a row (its reward still counts in its
// group's advantages). O(tokens).
RlRows BuildRlRows(const v1::SampleResponse& batch, int begin, int end,
                   const RlRowOptions& options);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_RL_BATCH_H_
