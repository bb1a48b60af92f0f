#ifndef SLUICE_COMMON_RUN_RUN_MEMORY_H_
#define SLUICE_COMMON_RUN_RUN_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/model_config.h"
#include "sluice/v1/common.pb.h"

// How much memory a run needs on each kind of service, estimated from the
// model's shape and the spec's batch sizes, before anything is allocated.
// The controller refuses a run at submit when an estimate exceeds the budget
// the service reports; the services apply the same estimate to what they
// are asked to do, so that a client other than the controller cannot make
// them allocate past their budget either.
//
// The estimates are upper bounds of the big allocations (weights, optimizer
// state, KV caches, saved activations, logits, stored groups) in float32,
// which is what the model computes in; small objects are not counted. They
// assume every sequence reaches the longest length the spec allows:
// min(context, longest prompt + max new tokens).
namespace sluice::run {

// One term of an estimate, e.g. {"KV cache", 17179869184, "128 sequences x
// 4096 tokens x 24 layers ..."}.
struct MemoryTerm {
  std::string what;
  int64_t bytes = 0;
  std::string how;
};

struct ServiceMemoryEstimate {
  int64_t bytes = 0;  // Sum of the terms, saturating at INT64_MAX.
  // The term of the largest batch the service computes (a worker's
  // generation batch, the trainer's largest training or evaluation batch);
  // bytes - batch_bytes is what it holds throughout (weights, optimizer
  // state, published versions). What a service checks each batch against.
  int64_t batch_bytes = 0;
  std::vector<MemoryTerm> terms;
  // Spec fields that move the estimate most, in the order a user should
  // look at them ("rollout.max_concurrent_groups_per_worker", ...).
  std::vector<std::string> fields;
};

struct RunMemoryEstimate {
  ServiceMemoryEstimate rollout_worker;  // Each worker.
  ServiceMemoryEstimate trainer;
  ServiceMemoryEstimate replay_buffer;   // The run's table.
  int64_t sequence_tokens = 0;           // Longest sequence assumed.
  // Longest prompt assumed, as given; 0 = unknown (prompts as long as the
  // context). The controller passes it on to the trainer and the workers
  // (StartTrainingRequest / StartRolloutsRequest.max_prompt_tokens), and
  // sequence_tokens to the buffer, so that their own checks agree with
  // its estimate.
  int64_t max_prompt_tokens = 0;
};

// The run's context: model.max_context_tokens, else the model's
// max_position_embeddings (at least 1).
int64_t ContextTokens(const v1::RunSpec& spec, const model::ModelConfig& config);

// The longest sequence a run can produce: min(context, max_prompt_tokens +
// max new tokens), with context = model.max_context_tokens (0 = the
// model's) and max new tokens = rollout.sampling.max_new_tokens (0 = up to
// the context). `max_prompt_tokens` <= 0 = unknown (then the context): as
// in the requests that carry it, a prompt has at least one token.
int64_t RunSequenceTokens(const v1::RunSpec& spec, const model::ModelConfig& config,
                          int64_t max_prompt_tokens);

// The estimate for a resolved spec whose model has `config`.
// `max_prompt_tokens`: as for RunSequenceTokens.
RunMemoryEstimate EstimateRunMemory(const v1::RunSpec& spec, const model::ModelConfig& config,
                                    int64_t max_prompt_tokens);

// The replay buffer's term of EstimateRunMemory alone, from what a table is
// configured with (ConfigureRunRequest): B, eta, G, the buffer section, the
// longest sequence in tokens and the step batches the trainer keeps
// uncommitted (RetainedStepBatches). The buffer checks a new table with it.
// `length_how` says where that length comes from, for messages ("" = "N
// tokens").
ServiceMemoryEstimate EstimateReplayBufferMemory(int64_t batch_size_groups, int64_t max_staleness,
                                                 int64_t group_size,
                                                 const v1::BufferConfig& buffer,
                                                 int64_t sequence_tokens,
                                                 std::string length_how = "",
                                                 int64_t retained_step_batches = 0);

// How many trained batches the replay buffer keeps for the run beyond what
// it holds for sampling: each step's batch is kept until the trainer's
// checkpoint covers it (SampleRequest.step, CommitTrainedSteps), so that a
// trainer killed and resumed from its checkpoint redoes the steps after it
// on the same data. With periodic checkpoints (checkpoint.dir and
// checkpoint.every_n_steps = n > 0) that is up to n batches (ceil(n / m) + 1
// with m = minibatches_per_batch > 1: a checkpoint may fall inside a batch).
// Without them the trainer commits each batch once trained (there is no
// checkpoint to resume from), and the one batch in training is within the
// estimate's room for max_times_sampled batches: 0.
int64_t RetainedStepBatches(const v1::RunSpec& spec);

// The rollout worker's generation batch alone (KV cache, logits and the
// prefill's transients) for `sequences` sequences of prompts up to
// `prompt_tokens` long growing to `total_tokens`; what a worker checks
// before it allocates a batch. The prefill counts the logits of every prompt
// position, as model::Generate computes them.
int64_t GenerationBatchBytes(const model::ModelConfig& config, int64_t sequences,
                             int64_t prompt_tokens, int64_t total_tokens);

// The trainer's forward + backward of one minibatch of `sequences`
// sequences of `tokens` tokens (saved activations, attention scores and
// logits with their gradients; with `entropy_gradient`, an entropy bonus's
// softmax and its gradient over the vocabulary too).
int64_t TrainingBatchBytes(const model::ModelConfig& config, int64_t sequences, int64_t tokens,
                           bool entropy_gradient = false);

// Whether the trainer keeps a second copy of the weights for the run: the
// batch start's, for decoupled PPO recomputing pi_prox over several
// minibatches (proximal_logprobs RECOMPUTE, no truncated importance
// sampling, minibatches_per_batch > 1).
bool KeepsProximalPolicy(const v1::AlgorithmConfig& algorithm);
// The frozen reference policy (the weights when RL starts): kl_coef > 0 for
// GRPO and decoupled PPO, tb_use_reference for trajectory balance.
bool KeepsReferencePolicy(const v1::AlgorithmConfig& algorithm);

// Bytes a group of `group_size` trajectories of `tokens` tokens takes in the
// replay buffer (ids, log-probs, versions, per-trajectory overhead).
int64_t StoredGroupBytes(int64_t group_size, int64_t tokens);

// The service's budget, for messages: "--memory-budget of the rollout
// worker at 127.0.0.1:5".
struct MemoryBudget {
  int64_t bytes = 0;  // <= 0: unknown (not checked).
  std::string owner;
};

// "" when `estimate` fits `budget` (or the budget is unknown), else one line
// naming the service, the estimate, its largest terms, the budget and the
// fields to change:
//   "rollout worker: the run needs about 18.3 GiB (KV cache 16.0 GiB: 128
//    sequences x 4,096 tokens ...; weights ...), over the 9.6 GiB budget of
//    ...; lower rollout.max_concurrent_groups_per_worker, ..."
std::string CheckMemoryBudget(absl::string_view service, const ServiceMemoryEstimate& estimate,
                              const MemoryBudget& budget);

// "1.5 GiB", "512.0 MiB", "900 B".
std::string FormatBytes(int64_t bytes);

// Parses a memory size: "17179869184", "16GiB", "16G", "512MiB", "512M",
// "64KiB" (K/M/G/T are powers of 1024, with or without "iB"/"B"), or
// "80%": that share of MachineMemoryBytes(). INVALID_ARGUMENT naming the
// text otherwise (negative, zero, overflow, unknown unit).
absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text);

// The memory this process may use: the cgroup's limit (v2 memory.max, v1
// memory.limit_in_bytes) when one is set and lower, else MemTotal from
// /proc/meminfo. nullopt when neither can be read.
std::optional<int64_t> MachineMemoryBytes();

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_MEMORY_H_
