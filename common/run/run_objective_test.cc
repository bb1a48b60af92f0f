#include "common/run/run_objective.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::run {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Problems(const v1::AlgorithmConfig& a) {
  std::vector<std::string> problems;
  ValidateObjectiveChoices(a, &problems);
  return problems;
}

TEST(ResolveObjectiveDefaultsTest, AnEmptySectionGetsEveryDefault) {
  v1::AlgorithmConfig a;
  ResolveObjectiveDefaults(&a, /*max_new_tokens=*/64, /*max_context_tokens=*/0);
  EXPECT_EQ(a.objective(), v1::OBJECTIVE_DECOUPLED_PPO);
  EXPECT_EQ(a.max_staleness(), kDefaultMaxStaleness);
  EXPECT_EQ(a.clip_eps_low(), kDefaultClipEps);
  EXPECT_EQ(a.clip_eps_high(), kDefaultClipEps);
  EXPECT_EQ(a.behaviour_weight_cap(), kDefaultBehaviourWeightCap);
  EXPECT_EQ(a.behaviour_weight_mode(), v1::BEHAVIOUR_WEIGHT_MODE_TRUNCATE);
  EXPECT_EQ(a.tb_beta(), kDefaultTbBeta);
  EXPECT_TRUE(a.normalize_advantage_by_std());
  EXPECT_EQ(a.advantage_eps(), kDefaultAdvantageEps);
  EXPECT_EQ(a.staleness_bound(), v1::STALENESS_BOUND_GROUP);
  EXPECT_EQ(a.proximal_logprobs(), v1::PROXIMAL_LOGPROBS_METHOD_RECOMPUTE);
  EXPECT_EQ(a.loss_aggregation(), v1::LOSS_AGGREGATION_TOKEN_MEAN);
  EXPECT_EQ(a.dynamic_sampling(), v1::DYNAMIC_SAMPLING_DROP);
  EXPECT_THAT(Problems(a), IsEmpty());
}

TEST(ResolveObjectiveDefaultsTest, KeepsWhatIsSetAndIsIdempotent) {
  v1::AlgorithmConfig a;
  a.set_objective(v1::OBJECTIVE_TRAJECTORY_BALANCE);
  a.set_max_staleness(0);  // set to 0: synchronous, not the default
  a.set_clip_eps_low(0.1);
  a.set_normalize_advantage_by_std(false);
  ResolveObjectiveDefaults(&a, 64, 0);
  EXPECT_EQ(a.max_staleness(), 0);
  EXPECT_EQ(a.clip_eps_low(), 0.1);
  EXPECT_EQ(a.clip_eps_high(), 0.1);
  EXPECT_FALSE(a.normalize_advantage_by_std());
  EXPECT_EQ(a.dynamic_sampling(), v1::DYNAMIC_SAMPLING_KEEP);
  v1::AlgorithmConfig again = a;
  ResolveObjectiveDefaults(&again, 64, 0);
  EXPECT_EQ(again.SerializeAsString(), a.SerializeAsString());
}

TEST(ResolveObjectiveDefaultsTest, AConstantNormalizerTakesTheLongestCompletionOrTheContext) {
  v1::AlgorithmConfig a;
  a.set_loss_aggregation(v1::LOSS_AGGREGATION_CONSTANT_NORMALIZER);
  v1::AlgorithmConfig from_completion = a;
  ResolveObjectiveDefaults(&from_completion, 512, 4096);
  EXPECT_EQ(from_completion.loss_normalizer_tokens(), 512);
  v1::AlgorithmConfig from_context = a;
  ResolveObjectiveDefaults(&from_context, 0, 4096);
  EXPECT_EQ(from_context.loss_normalizer_tokens(), 4096);
}

TEST(ResolvedMaxStalenessTest, UnsetIsTheDefaultAndZeroIsZero) {
  v1::AlgorithmConfig a;
  EXPECT_EQ(ResolvedMaxStaleness(a), kDefaultMaxStaleness);
  a.set_max_staleness(0);
  EXPECT_EQ(ResolvedMaxStaleness(a), 0);
}

TEST(ValidateObjectiveChoicesTest, ACorrectionWithAnObjectiveItDoesNotActOnIsRefused) {
  v1::AlgorithmConfig a;
  a.set_objective(v1::OBJECTIVE_GRPO);
  a.set_second_moment_threshold(0.04);
  a.set_tb_use_reference(true);
  ResolveObjectiveDefaults(&a, 64, 0);
  EXPECT_THAT(Problems(a),
              ElementsAre(HasSubstr("algorithm.second_moment_threshold: masks by decoupled PPO's "
                                    "behaviour weight; OBJECTIVE_GRPO has none"),
                          HasSubstr("algorithm.tb_use_reference: is trajectory balance's")));
}

}  // namespace
}  // namespace sluice::run
