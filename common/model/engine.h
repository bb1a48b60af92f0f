#ifndef SLUICE_COMMON_MODEL_ENGINE_H_
#define SLUICE_COMMON_MODEL_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/decode_graphs.h"
#include "common/model/generation.h"
#include "common/model/transformer.h"

namespace sluice::model {

// What a weight swap does to sequences mid-generation (EngineOptions).
enum class SwapMode {
  // Keep their KV cache, computed by the old weights; tokens sampled from
  // then on carry the new version (PipelineRL, prime-rl). Costs nothing.
  kKeepCache,
  // Throw the KV cache away and recompute it under the new weights from the
  // tokens so far, then go on (AReaL's interruptible generation): later
  // tokens are sampled from the new policy's own view of the sequence. Costs
  // one prefill of every running sequence per swap.
  kRecompute,
};

struct EngineOptions {
  // Sequences decoded together (the running batch); more wait their turn.
  int64_t max_rows = 64;
  // Positions per sequence (prompt + completion) the cache holds; 0 = the
  // model's context. The cache is max_rows x capacity, allocated once.
  int64_t capacity = 0;
  SwapMode swap_mode = SwapMode::kKeepCache;
  // Stop strings: a sample ends (kStop) at the token whose text completes
  // one of them (the token is kept). `detokenize` turns token ids into text
  // and is required when stop_strings is not empty.
  std::vector<std::string> stop_strings;
  std::function<std::string(const std::vector<int32_t>&)> detokenize;
  // On a CUDA device, decode steps replay CUDA graphs (decode_graphs.h):
  // one more copy of the weights on the device, a capture per (batch,
  // width) bucket the first time it is used, and the launches of a step
  // gone. false = eager steps. Ignored on the CPU.
  bool cuda_graphs = true;
};

// One sample of a group.
struct SampleRequest {
  // The sample's random stream: the draw for its t-th completion token is a
  // pure function of (seed, t) (SampleUniform), so the sample's tokens do not
  // depend on what else is in the batch, when it joins, or whether it was
  // interrupted and resumed.
  uint64_t seed = 0;
  // Completion tokens at most (including a stop token, and the prefix's);
  // 0 = the engine's sampling.max_new_tokens. Capped by the capacity.
  int64_t max_new_tokens = 0;
  // A partial rollout to continue (a completion an earlier Drain returned as
  // kPartial): its tokens, log-probs and versions are kept, its KV is
  // recomputed under the policy in use, and decoding goes on from its end.
  // Empty = a fresh sample.
  Completion prefix;
};

struct FinishedSample {
  int64_t group = 0;   // AddGroup's handle
  int32_t sample = 0;  // index in the group's samples
  Completion completion;
};

// Counters since Create.
struct EngineStats {
  int64_t decode_steps = 0;       // ForwardRows calls
  int64_t decoded_rows = 0;       // rows fed over those steps (the batch sizes summed)
  int64_t sampled_tokens = 0;     // tokens sampled (decoded rows and first tokens)
  int64_t prefills = 0;           // Prefill calls
  int64_t prompt_prefills = 0;    // prompts prefilled (once per group, and again after a swap)
  int64_t prefill_tokens = 0;     // tokens through Prefill
  int64_t recomputed_tokens = 0;  // of those, re-prefilled because of a swap or a resume
  int64_t swaps = 0;              // version changes seen by Step
  int64_t compactions = 0;        // rows moved to close a gap
  int64_t graph_captures = 0;     // decode graphs captured (CUDA)
  int64_t graph_replays = 0;      // decode steps replayed from a graph
  std::string graph_error;        // why decode graphs were given up, if they were
};

// Continuous-batching generation. Sequences join and leave the running
// batch at every step: a finished sample frees its row at once, the next
// waiting sample takes it (the last running row moves into a gap, so the
// running rows stay the first rows of the cache and no step decodes a
// finished row). The G samples of a group share one prefill of the prompt:
// its KV is computed once (batched with other groups that join in the same
// step) and copied into each sample's row, and each sample draws its first
// token from the prompt's last logits with its own stream.
//
// Sampling is as model::Generate's (temperature, top-k, top-p, behaviour
// log-prob before truncation, stop ids kept) but by inverse CDF with one
// uniform per token from the sample's own stream, which makes a sample's
// tokens a function of its prompt, seed and the policy sequence, not of the
// batch: a sample decoded among others gets the tokens of a batch of one
// (and log-probs equal to float rounding of the batched matrix products).
//
// Not thread-safe: one thread drives it (AddGroup, Step, Drain).
class Engine {
 public:
  // `sampling.seed` is unused (each sample has its own); the rest is
  // validated as Generate validates it. INVALID_ARGUMENT for bad options,
  // stop strings without detokenize, or max_rows < 1.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const ModelConfig& config,
                                                        const EngineOptions& options,
                                                        const SamplingOptions& sampling);

  // Queues a group: samples.size() samples of `prompt`. Returns its handle
  // (FinishedSample::group). INVALID_ARGUMENT for an empty prompt or group,
  // out-of-range ids, a prompt + prefix that leaves no room in the
  // capacity, or a prefix whose tokens, log-probs and versions differ in
  // length.
  absl::StatusOr<int64_t> AddGroup(const std::vector<int32_t>& prompt,
                                   std::vector<SampleRequest> samples);

  // One iteration under `policy`: a version different from the one in use
  // is a swap (per SwapMode); waiting samples join while rows are free (their
  // prompts prefilled, their first tokens sampled); then every running row
  // decodes one token. Returns the samples that finished (kStop or kLength).
  // INVALID_ARGUMENT for a policy without a model or of another shape;
  // FAILED_PRECONDITION, naming the version, when the policy's logits are
  // not finite (nothing is sampled from them; the engine is then unusable).
  absl::StatusOr<std::vector<FinishedSample>> Step(const PolicySnapshot& policy);

  // Ends every running and waiting sample now, as `finish` (kAborted, or
  // kPartial to resume them later); returns them, running ones first. The
  // engine is empty afterwards and can take new groups.
  std::vector<FinishedSample> Drain(Finish finish);

  int64_t running() const { return static_cast<int64_t>(rows_.size()); }
  int64_t waiting() const { return static_cast<int64_t>(queue_.size()); }
  bool idle() const { return rows_.empty() && queue_.empty(); }
  const EngineStats& stats() const { return stats_; }
  const EngineOptions& options() const { return options_; }

 private:
  struct Group {
    std::vector<int32_t> prompt;
    int32_t samples = 0;
    int32_t to_admit = 0;     // samples not yet given a row
    int32_t outstanding = 0;  // samples not yet finished
    // The prompt's KV (per layer [kv_heads, P, head_dim]) and last logits
    // [vocab] under the policy in use, kept while samples of the group wait;
    // empty until the prompt is prefilled, and again after a swap or once
    // every sample has a row.
    std::vector<torch::Tensor> keys, values;
    torch::Tensor last_logits;
  };
  struct Waiting {
    int64_t group;
    int32_t sample;
    SampleRequest request;
  };
  struct Row {
    int64_t group;
    int32_t sample;
    uint64_t seed;
    int64_t max_new;  // completion tokens at most
    int64_t cached;   // positions in the cache (prompt + tokens fed)
    Completion completion;
    bool done = false;
  };

  Engine(ModelConfig config, EngineOptions options, SamplingOptions sampling)
      : config_(std::move(config)), options_(std::move(options)), sampling_(std::move(sampling)) {}

  absl::Status Swap(const PolicySnapshot& policy);
  absl::Status Admit();
  // Prefills `sequences` under the policy in use; returns each one's KV
  // (per layer [B, kv, L, hd], row b valid up to its length) and last logits.
  struct Prefilled {
    KVCache cache;
    torch::Tensor last_logits;  // [B, vocab]
  };
  Prefilled PrefillSequences(const std::vector<std::vector<int32_t>>& sequences);
  // Samples one token for each row of logits [n, V], each with its row's
  // draw; appends it to the rows' completions and marks finished ones.
  // logits may be in the model's compute dtype and on its device.
  absl::Status SampleInto(const torch::Tensor& logits, const std::vector<Row*>& rows);
  void FinishRow(Row& row, Finish finish);
  bool StopStringHit(const Row& row) const;
  // Copies `length` positions of row from_row of `from` into cache row slot.
  void CopyIntoRow(int64_t slot, const KVCache& from, int64_t from_row, int64_t length);
  // Removes finished rows, moving the last running rows into the gaps.
  std::vector<FinishedSample> Compact();
  // One sample of `group` is done; the group goes when all are.
  void ReleaseSample(int64_t group);

  ModelConfig config_;
  EngineOptions options_;
  SamplingOptions sampling_;
  int64_t capacity_ = 0;
  size_t longest_stop_string_ = 0;
  PolicySnapshot policy_;
  bool has_policy_ = false;
  KVCache cache_;  // max_rows x capacity, allocated at the first Step
  std::unique_ptr<DecodeGraphs> graphs_;  // CUDA, options_.cuda_graphs; reads cache_
  std::map<int64_t, Group> groups_;
  std::deque<Waiting> queue_;
  std::vector<Row> rows_;  // row i is cache row i
  std::vector<FinishedSample> finished_early_;  // finished at admission
  int64_t next_group_ = 0;
  EngineStats stats_;
};

// The uniform in [0, 1) that sample stream `seed` uses for its t-th token.
double SampleUniform(uint64_t seed, int64_t t);

// Every group (prompts[p] with samples[p]) generated to the end on an
// Engine under hooks.current_policy (asked before every step; unset = the
// initial policy) and hooks.should_abort (polled before every step;
// unfinished samples end kAborted). Returns the completions group-major
// (group p's samples in order, then group p + 1's). The errors of Create,
// AddGroup and Step.
absl::StatusOr<std::vector<Completion>> GenerateContinuous(
    const PolicySnapshot& initial, const std::vector<std::vector<int32_t>>& prompts,
    std::vector<std::vector<SampleRequest>> samples, const EngineOptions& options,
    const SamplingOptions& sampling, const GenerationHooks& hooks = {});

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_ENGINE_H_
