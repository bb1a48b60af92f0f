#include "rollout_worker/generation_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/run/run_memory.h"

namespace sluice::rollout_worker {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

GenerationBudget Budget(int64_t bytes) {
  GenerationBudget budget;
  budget.config.vocab_size = 100;
  budget.config.hidden_size = 32;
  budget.config.intermediate_size = 64;
  budget.config.num_hidden_layers = 2;
  budget.config.num_attention_heads = 2;
  budget.config.num_key_value_heads = 1;
  budget.config.head_dim = 16;
  budget.config.max_position_embeddings = 64;
  budget.context_tokens = 64;
  budget.budget_bytes = bytes;
  return budget;
}

TEST(PlanGenerationChunksTest, EverythingInOneBatchWithoutABudgetOrWhenItFits) {
  const std::vector<int64_t> prompts = {8, 8, 8, 8};
  EXPECT_THAT(*PlanGenerationChunks(Budget(0), prompts, 4, 16), ElementsAre(4));
  EXPECT_THAT(*PlanGenerationChunks(Budget(int64_t{1} << 30), prompts, 4, 16), ElementsAre(4));
}

TEST(PlanGenerationChunksTest, ShrinksTheGroupsGeneratedAtOnceToWhatFits) {
  GenerationBudget budget = Budget(0);
  const int64_t two_groups = run::GenerationBatchBytes(budget.config, 2 * 4, 8, 24);
  budget.budget_bytes = WorkerWeightBytes(budget.config) + two_groups;
  EXPECT_THAT(*PlanGenerationChunks(budget, {8, 8, 8, 8, 8}, 4, 16), ElementsAre(2, 4, 5));
  // A long prompt makes its chunk's batch bigger: it goes on its own.
  EXPECT_THAT(*PlanGenerationChunks(budget, {8, 8, 12, 8}, 4, 16), ElementsAre(2, 3, 4));
}

TEST(PlanGenerationChunksTest, NotEvenOneGroupFittingIsAnErrorNamingThePromptAndTheFields) {
  GenerationBudget budget = Budget(0);
  budget.budget_bytes =
      WorkerWeightBytes(budget.config) + run::GenerationBatchBytes(budget.config, 4, 8, 24);
  absl::StatusOr<std::vector<size_t>> plan = PlanGenerationChunks(budget, {8, 40}, 4, 16);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(plan.status().message()),
              AllOf(HasSubstr("one group of prompt 1 (40 tokens, 4 sequences"),
                    HasSubstr("leaves after the weights"), HasSubstr("algorithm.group_size"),
                    HasSubstr("rollout.sampling.max_new_tokens")));
  budget.budget_bytes = WorkerWeightBytes(budget.config);
  EXPECT_THAT(std::string(PlanGenerationChunks(budget, {8}, 4, 16).status().message()),
              HasSubstr("the weights alone"));
}

}  // namespace
}  // namespace sluice::rollout_worker
