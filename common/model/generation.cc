#include "common/model/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace sluice::model {

absl::Status ValidateSamplingOptions(const SamplingOptions& options) {
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature: must be >= 0 (0 = greedy), got ", options.temperature));
  }
  if (!(options.top_p > 0 && options.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p: must be in (0, 1], got ", options.top_p));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k: must be >= 0 (0 = off), got ", options.top_k));
  }
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens: must be >= 1, got ", options.max_new_tokens));
  }
  return absl::OkStatus();
}

// The KV cache written by one model is read by the next after a swap, so
// both must agree on everything that shapes it.
absl::Status CheckSwappable(const ModelConfig& current, const ModelConfig& next) {
  if (current.vocab_size != next.vocab_size || current.hidden_size != next.hidden_size ||
      current.num_hidden_layers != next.num_hidden_layers ||
      current.num_key_value_heads != next.num_key_value_heads ||
      current.resolved_head_dim() != next.resolved_head_dim() ||
      current.max_position_embeddings != next.max_position_embeddings) {
    return absl::InvalidArgumentError(
        "current_policy returned a model whose shape (vocab, hidden size, layers, KV heads, head "
        "dim or context) differs from the one generating");
  }
  return absl::OkStatus();
}

torch::Tensor TruncateLogits(const torch::Tensor& scaled, int64_t top_k, double top_p) {
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  const int64_t vocab = scaled.size(-1);
  torch::Tensor filtered = scaled;
  if (top_k > 0 && top_k < vocab) {
    const torch::Tensor kth = std::get<0>(scaled.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
    filtered = filtered.masked_fill(filtered < kth, minus_infinity);
  }
  if (top_p < 1.0) {
    auto [sorted, order] = filtered.sort(-1, /*descending=*/true);
    const torch::Tensor probs = torch::softmax(sorted, -1);
    // Drop a token when the tokens ranked above it already hold top_p of
    // the mass: what is left is the smallest prefix with mass >= top_p,
    // and the top token (nothing above it) always stays.
    const torch::Tensor mass_above = probs.cumsum(-1) - probs;
    sorted = sorted.masked_fill(mass_above >= top_p, minus_infinity);
    filtered = torch::empty_like(filtered).scatter_(-1, order, sorted);
  }
  return filtered;
}

absl::Status NoDistribution(const torch::Tensor& logits, double temperature) {
  if ((torch::isnan(logits) | torch::isposinf(logits)).any().item<bool>()) {
    return absl::FailedPreconditionError(
        "the policy produced NaN or infinite logits: its weights are broken");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the sampling distribution is not finite at temperature ", temperature));
}

namespace {

// Samples one token per row from logits [B, V]; returns the tokens [B] and
// their behaviour log-probabilities [B] (before truncation).
// FAILED_PRECONDITION when a row has no distribution to sample from (a NaN
// or +inf logit, from broken weights): torch::multinomial would throw, and
// a NaN log-prob would poison the trainer. A NaN anywhere in a row makes
// its every log-prob NaN, and a +inf makes them -inf or NaN, so checking the
// B sampled log-probs finds them; only multinomial's input needs a check
// of its own, one pass over [B, V] per sampled step.
absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> Sample(const torch::Tensor& logits,
                                                               const SamplingOptions& options,
                                                               at::Generator& generator) {
  torch::Tensor tokens;
  torch::Tensor logprobs;
  if (options.temperature == 0) {
    tokens = logits.argmax(-1);
    logprobs = torch::log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  } else {
    const torch::Tensor scaled = logits / options.temperature;
    const torch::Tensor log_probs = torch::log_softmax(scaled, -1);
    const torch::Tensor filtered = TruncateLogits(scaled, options.top_k, options.top_p);
    const torch::Tensor probabilities = torch::softmax(filtered, -1);
    if (!torch::isfinite(probabilities).all().item<bool>()) {
      return NoDistribution(logits, options.temperature);
    }
    tokens = torch::multinomial(probabilities, 1, /*replacement=*/false, generator).squeeze(-1);
    logprobs = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  }
  if (!torch::isfinite(logprobs).all().item<bool>()) {
    return NoDistribution(logits, options.temperature);
  }
  return std::make_pair(tokens, logprobs);
}

}  // namespace

absl::StatusOr<std::vector<Completion>> Generate(const PolicySnapshot& initial,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 const SamplingOptions& options,
                                                 const GenerationHooks& hooks) {
  if (initial.model == nullptr) return absl::InvalidArgumentError("the initial policy has no model");
  if (absl::Status status = ValidateSamplingOptions(options); !status.ok()) return status;
  const ModelConfig& config = initial.model->config();
  const int64_t batch = static_cast<int64_t>(prompts.size());
  if (batch == 0) return std::vector<Completion>();

  int64_t longest = 0;
  for (size_t row = 0; row < prompts.size(); ++row) {
    if (prompts[row].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt ", row, " is empty"));
    }
    for (size_t i = 0; i < prompts[row].size(); ++i) {
      const int32_t id = prompts[row][i];
      if (id < 0 || id >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("prompt ", row, " has token id ", id,
                                                       " at index ", i, ", outside [0, ",
                                                       config.vocab_size, ")"));
      }
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[row].size()));
  }
  const int64_t room = config.max_position_embeddings - longest;
  if (room < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the longest prompt has ", longest, " tokens, which leaves no room in the model's context of ",
        config.max_position_embeddings, " positions"));
  }
  const int64_t max_new = std::min(options.max_new_tokens, room);
  const int64_t pad = config.pad_token_id >= 0 ? config.pad_token_id : 0;
  const std::unordered_set<int64_t> stop(options.stop_token_ids.begin(),
                                         options.stop_token_ids.end());

  c10::InferenceMode inference;
  // Left padding: row b's prompt ends at column `longest` - 1. The key mask
  // covers the whole cache; generated positions are real for every row (a
  // finished row's are never read back).
  torch::Tensor prompt_ids = torch::full({batch, longest}, pad, torch::kInt64);
  torch::Tensor key_mask = torch::ones({batch, longest + max_new}, torch::kBool);
  torch::Tensor next_positions = torch::empty({batch, 1}, torch::kInt64);
  {
    auto ids = prompt_ids.accessor<int64_t, 2>();
    auto mask = key_mask.accessor<bool, 2>();
    auto positions = next_positions.accessor<int64_t, 2>();
    for (int64_t row = 0; row < batch; ++row) {
      const int64_t length = static_cast<int64_t>(prompts[row].size());
      const int64_t offset = longest - length;
      for (int64_t col = 0; col < offset; ++col) mask[row][col] = false;
      for (int64_t i = 0; i < length; ++i) ids[row][offset + i] = prompts[row][i];
      positions[row][0] = length;
    }
  }
  const torch::Tensor prompt_positions =
      (key_mask.narrow(1, 0, longest).to(torch::kInt64).cumsum(1) - 1).clamp_min(0);

  at::Generator generator = at::detail::createCPUGenerator(options.seed);
  std::vector<Completion> completions(static_cast<size_t>(batch));
  std::vector<bool> finished(static_cast<size_t>(batch), false);
  int64_t unfinished = batch;
  PolicySnapshot policy = initial;
  KVCache cache = policy.model->NewCache(batch, longest + max_new);
  torch::Tensor last_tokens;

  for (int64_t step = 0; step < max_new && unfinished > 0; ++step) {
    if (hooks.should_abort && hooks.should_abort()) {
      for (int64_t row = 0; row < batch; ++row) {
        if (!finished[row]) completions[row].finish = Finish::kAborted;
        finished[row] = true;
      }
      unfinished = 0;
      break;
    }
    if (hooks.current_policy) {
      PolicySnapshot next = hooks.current_policy();
      if (next.model == nullptr) {
        return absl::InvalidArgumentError("current_policy returned a policy without a model");
      }
      if (next.version != policy.version) {
        if (absl::Status status = CheckSwappable(config, next.model->config()); !status.ok()) {
          return status;
        }
        // Before the first token nothing of the old version is in a row's
        // completion, so only later swaps count.
        if (step > 0) {
          for (int64_t row = 0; row < batch; ++row) {
            if (!finished[row]) ++completions[row].weight_swaps;
          }
        }
        policy = std::move(next);
      }
    }

    torch::Tensor logits;
    if (step == 0) {
      logits = policy.model->ForwardCached(prompt_ids, prompt_positions,
                                           key_mask.narrow(1, 0, longest), cache);
    } else {
      logits = policy.model->ForwardCached(last_tokens, next_positions,
                                           key_mask.narrow(1, 0, cache.length + 1), cache);
      next_positions += 1;
    }
    // Sampled on the host with a CPU generator, so a seed gives the same
    // tokens on every device (this is the reference path: the engine
    // samples on the device).
    absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> sampled = Sample(
        logits.select(1, logits.size(1) - 1).to(torch::kCPU, torch::kFloat32), options, generator);
    if (!sampled.ok()) {
      return absl::Status(sampled.status().code(),
                          absl::StrCat("decoding step ", step, " with policy version ",
                                       policy.version, ": ", sampled.status().message()));
    }
    auto [tokens, logprobs] = *std::move(sampled);

    auto token_values = tokens.accessor<int64_t, 1>();
    auto logprob_values = logprobs.accessor<float, 1>();
    for (int64_t row = 0; row < batch; ++row) {
      if (finished[row]) continue;
      Completion& completion = completions[row];
      const int64_t token = token_values[row];
      completion.tokens.push_back(static_cast<int32_t>(token));
      completion.logprobs.push_back(logprob_values[row]);
      completion.versions.push_back(policy.version);
      if (stop.count(token) > 0) {
        completion.finish = Finish::kStop;
        finished[row] = true;
        --unfinished;
      }
    }
    // Finished rows keep being fed (the batch stays rectangular) with pad.
    last_tokens = tokens.unsqueeze(1).clone();
    {
      auto feed = last_tokens.accessor<int64_t, 2>();
      for (int64_t row = 0; row < batch; ++row) {
        if (finished[row]) feed[row][0] = pad;
      }
    }
  }
  for (int64_t row = 0; row < batch; ++row) {
    if (!finished[row]) completions[row].finish = Finish::kLength;
  }
  return completions;
}

}  // namespace sluice::model
