#ifndef SLUICE_COMMON_MODEL_GENERATION_H_
#define SLUICE_COMMON_MODEL_GENERATION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/transformer.h"

namespace sluice::model {

struct SamplingOptions {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;        // nucleus mass in (0, 1]
  int64_t top_k = 0;         // 0 = off
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_token_ids;  // kept in the completion
  uint64_t seed = 0;
};

// A weight version in use: the model and its policy version.
struct PolicySnapshot {
  std::shared_ptr<const Transformer> model;
  int64_t version = 0;
};

// kPartial: cut by a step budget (Engine::Drain), resumable: hand the
// completion back as SampleRequest::prefix and it goes on where it stopped.
enum class Finish { kStop, kLength, kAborted, kPartial };

struct Completion {
  std::vector<int32_t> tokens;          // includes the stop token
  std::vector<float> logprobs;          // behaviour log-prob per token
  std::vector<int64_t> versions;        // policy version per token
  Finish finish = Finish::kLength;
  // Swaps while this row was decoding: after its first token and before it
  // finished (a swap before the prefill changes no token of the row), i.e.
  // the number of version changes along `versions`.
  int32_t weight_swaps = 0;
};

struct GenerationHooks {
  // Called before every decoding step (including the prefill). Returns the
  // policy to use for that step; when its version differs from the one in
  // use the generator swaps to it without draining the batch: the KV cache
  // is kept, and tokens sampled from then on carry the new version. Unset =
  // the initial policy throughout.
  std::function<PolicySnapshot()> current_policy;
  // Polled before every step; true = stop now, unfinished rows end kAborted.
  std::function<bool()> should_abort;
};

// Batched sampling with a KV cache. Prompts may differ in length (left
// padding inside). Each row gets the behaviour log-probability
// log_softmax(logits / T)[token] of every sampled token, computed before any
// top-k / top-p truncation (T = 1 when greedy), and the version of the policy
// that sampled it. Finished rows stop growing; generation ends when every row
// has finished or max_new_tokens (capped by the model's context) is reached.
// Deterministic for a given seed, prompts and policy sequence (the random
// draws come from a private generator seeded with options.seed; a row's
// tokens depend on the whole batch). Runs under c10::InferenceMode.
// Finished rows are fed pad tokens while the others go on; an empty list of
// prompts gives an empty result.
// INVALID_ARGUMENT for empty prompts, out-of-range ids, a prompt that leaves
// no room in the context, out-of-range options (temperature < 0, top_p
// outside (0, 1], top_k < 0, max_new_tokens < 1), or a current_policy that
// returns no model or one whose shape (layers, KV heads, head dim, vocab,
// context) differs from the initial one. FAILED_PRECONDITION, naming the
// step and the policy version, when the policy's logits hold a NaN or +inf
// (broken weights) or the sampling distribution is not finite: nothing is
// sampled from it (torch::multinomial would throw).
// INVALID_ARGUMENT, naming the option, when `options` is out of range (as
// Generate checks it).
absl::Status ValidateSamplingOptions(const SamplingOptions& options);
// INVALID_ARGUMENT unless a KV cache written by a model of `current`'s shape
// can be read by one of `next`'s (vocab, hidden size, layers, KV heads, head
// dim, context): what a weight swap mid-generation needs.
absl::Status CheckSwappable(const ModelConfig& current, const ModelConfig& next);

// Temperature-scaled logits [..., V] with every token outside the top_k
// (0 = off) and outside the smallest most-likely set holding top_p of the
// mass (1 = off) set to -inf: what sampling draws from.
torch::Tensor TruncateLogits(const torch::Tensor& scaled, int64_t top_k, double top_p);

// Why logits [..., V] give no distribution to sample from at `temperature`:
// FAILED_PRECONDITION saying the weights are broken (a NaN or +inf logit),
// else that the temperature over- or underflows the softmax. For a check
// that already failed (it makes one more pass over the logits).
absl::Status NoDistribution(const torch::Tensor& logits, double temperature);

absl::StatusOr<std::vector<Completion>> Generate(const PolicySnapshot& initial,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 const SamplingOptions& options,
                                                 const GenerationHooks& hooks = {});

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_GENERATION_H_
