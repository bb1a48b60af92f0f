#include "trainer/evaluator.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/generation.h"
#include "common/run/run_model.h"
#include "common/status_macros.h"
#include "services/clients/score_batches.h"

namespace sluice::trainer {

absl::StatusOr<v1::EvalResult> Evaluate(const model::Transformer& model,
                                        const tokenizer::BpeTokenizer& tokenizer,
                                        const std::vector<task::TaskItem>& items,
                                        clients::RewardClient& reward, const EvalOptions& options) {
  const absl::Time start = absl::Now();
  // Non-owning: the caller's model outlives the call.
  const model::PolicySnapshot policy{
      std::shared_ptr<const model::Transformer>(&model, [](const model::Transformer*) {}), 0};
  model::SamplingOptions sampling;
  sampling.temperature = options.temperature;
  sampling.top_p = options.top_p;
  sampling.max_new_tokens = options.max_new_tokens;
  sampling.stop_token_ids.assign(options.stop_token_ids.begin(), options.stop_token_ids.end());
  sampling.seed = options.seed;

  v1::EvalResult result;
  result.set_phase(options.phase);
  result.set_step(options.step);
  double reward_sum = 0;
  int correct = 0;
  for (size_t begin = 0; begin < items.size(); begin += options.batch_rows) {
    const size_t end = std::min(items.size(), begin + options.batch_rows);
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = begin; i < end; ++i) {
      prompts.push_back(run::EncodePrompt(tokenizer, items[i].prompt));
    }
    if (options.should_stop && options.should_stop()) {
      return absl::CancelledError(absl::StrCat(options.phase, " evaluation stopped"));
    }
    model::GenerationHooks hooks;
    hooks.should_abort = options.should_stop;
    ASSIGN_OR_RETURN(auto completions, model::Generate(policy, prompts, sampling, hooks));
    if (options.should_stop && options.should_stop()) {
      return absl::CancelledError(absl::StrCat(options.phase, " evaluation stopped"));
    }
    v1::ScoreBatchRequest request;
    for (const auto& verifier : options.composition) *request.add_composition() = verifier;
    for (size_t i = begin; i < end; ++i) {
      v1::ScoreItem* item = request.add_items();
      item->set_item_id(items[i].prompt_id);
      const std::vector<int32_t>& tokens = completions[i - begin].tokens;
      ASSIGN_OR_RETURN(std::string text, tokenizer.Decode(tokens, /*skip_special=*/true));
      item->set_response(text);
      item->set_reference_answer(items[i].reference_answer);
      item->set_reference_is_solution(items[i].reference_is_solution);
      item->set_prompt(items[i].prompt);
      item->set_verifier(items[i].verifier);
      *item->mutable_metadata() = {items[i].metadata.begin(), items[i].metadata.end()};
      (*item->mutable_metadata())["completion_tokens"] = absl::StrCat(tokens.size());
      item->set_timeout_ms(options.item_timeout_ms);
    }
    clients::ScoreBatchesOptions score_options;
    score_options.before_call = [&](int) {
      return !(options.should_stop && options.should_stop());
    };
    ASSIGN_OR_RETURN(v1::ScoreBatchResponse scored,
                     clients::ScoreInBatches(reward, request, score_options));
    for (const auto& r : scored.results()) {
      if (r.result().retryable()) {
        return absl::UnavailableError(absl::StrCat("reward server could not score eval item ",
                                                   r.item_id(), ": ", r.result().detail()));
      }
      reward_sum += r.result().reward();
      if (r.result().reward() >= 1.0 - 1e-9) ++correct;
    }
  }
  result.set_num_prompts(static_cast<int32_t>(items.size()));
  result.set_num_correct(correct);
  result.set_accuracy(items.empty() ? 0.0 : static_cast<double>(correct) / items.size());
  result.set_reward_mean(items.empty() ? 0.0 : reward_sum / items.size());
  result.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  return result;
}

}  // namespace sluice::trainer
