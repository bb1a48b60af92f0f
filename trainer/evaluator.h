#ifndef SLUICE_TRAINER_EVALUATOR_H_
#define SLUICE_TRAINER_EVALUATOR_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/transformer.h"
#include "common/task/arithmetic.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "services/clients/clients.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::trainer {

struct EvalOptions {
  std::string phase;  // EvalResult.phase
  int64_t step = 0;
  // Sampling for eval; temperature 0 = greedy (the default for evaluations).
  double temperature = 0;
  double top_p = 1.0;
  int64_t max_new_tokens = 16;
  // Generation ends at any of these (run::StopTokenIds).
  std::vector<int32_t> stop_token_ids;
  uint64_t seed = 0;
  int batch_rows = 256;
  // Verifiers and per-item deadline, from the run's RewardConfig.
  std::vector<v1::WeightedVerifier> composition;
  int64_t item_timeout_ms = 0;
  // Polled between decoding steps and scoring calls; true = stop now (the
  // trainer's run was stopped): Evaluate returns CANCELLED. Unset = never.
  std::function<bool()> should_stop;
};

// Generates one completion per item with `model` and has the reward server
// score it against the item's reference answer: the accuracy is the fraction
// scored >= 1. Scoring goes through the reward server, as for training
// rollouts, so evaluation and training agree on what "correct" means, in
// calls within its batch limit (clients::ScoreInBatches). An error from the
// reward server (unreachable, or a retryable per-item error) is returned,
// never counted as a wrong answer. CANCELLED once options.should_stop says
// so.
absl::StatusOr<v1::EvalResult> Evaluate(const model::Transformer& model,
                                        const tokenizer::BpeTokenizer& tokenizer,
                                        const std::vector<task::TaskItem>& items,
                                        clients::RewardClient& reward, const EvalOptions& options);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_EVALUATOR_H_
