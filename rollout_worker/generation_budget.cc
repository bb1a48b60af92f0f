#include "rollout_worker/generation_budget.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/run/run_memory.h"

namespace sluice::rollout_worker {

int64_t WorkerWeightBytes(const model::ModelConfig& config) {
  return config.ParameterCount() * 2 * 4;  // float32, twice
}

absl::StatusOr<std::vector<size_t>> PlanGenerationChunks(const GenerationBudget& budget,
                                                         const std::vector<int64_t>& prompt_tokens,
                                                         int group_size, int64_t max_new_tokens) {
  const size_t prompts = prompt_tokens.size();
  if (budget.budget_bytes <= 0 || prompts == 0) return std::vector<size_t>{prompts};
  const int64_t weights = WorkerWeightBytes(budget.config);
  const int64_t left = budget.budget_bytes - weights;
  const std::string fields =
      "lower algorithm.group_size, rollout.sampling.max_new_tokens or the prompts' length, or "
      "give the worker a larger --memory-budget";
  if (left <= 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rollout worker: the weights alone (", run::FormatBytes(weights),
        ", the current and an incoming version) take the whole ",
        run::FormatBytes(budget.budget_bytes), " --memory-budget; give the worker a larger one"));
  }
  const auto batch_bytes = [&](size_t groups, int64_t longest) {
    const int64_t total = std::min(budget.context_tokens, longest + max_new_tokens);
    return run::GenerationBatchBytes(budget.config, static_cast<int64_t>(groups) * group_size,
                                     longest, std::max(total, longest));
  };
  std::vector<size_t> ends;
  size_t begin = 0;
  int64_t longest = 0;
  for (size_t i = 0; i < prompts;) {
    const int64_t with = std::max(longest, prompt_tokens[i]);
    if (batch_bytes(i - begin + 1, with) <= left) {
      longest = with;
      ++i;
      continue;
    }
    if (i == begin) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "rollout worker: one group of prompt ", i, " (", prompt_tokens[i], " tokens, ",
          group_size, " sequences of up to ", max_new_tokens, " new tokens) needs about ",
          run::FormatBytes(batch_bytes(1, prompt_tokens[i])),
          " to generate (KV cache, prefill and logits), more than the ", run::FormatBytes(left),
          " its --memory-budget of ", run::FormatBytes(budget.budget_bytes),
          " leaves after the weights (", run::FormatBytes(weights), "); ", fields));
    }
    ends.push_back(i);  // prompt i starts the next chunk
    begin = i;
    longest = 0;
  }
  ends.push_back(prompts);
  return ends;
}

}  // namespace sluice::rollout_worker
