#include "replay_buffer/group_validation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using testing::MakeGroup;

constexpr char kRun[] = "run-v";

GroupLimits Limits() {
  GroupLimits limits;
  limits.run_id = kRun;
  limits.group_size = 4;
  limits.vocab_size = 1000;  // MakeGroup's ids are 0..9 and 100..109
  limits.min_reward = 0.0;
  limits.max_reward = 1.0;
  return limits;
}

v1::Group ValidGroup() { return MakeGroup(kRun, "g", 4, /*policy_version=*/3); }

TEST(GroupValidationTest, AWellFormedGroupPassesWithItsVersions) {
  v1::Group group = ValidGroup();
  group.mutable_trajectories(2)->set_token_policy_versions(9, 5);
  absl::StatusOr<GroupVersions> versions = ValidateGroup(group, Limits());
  ASSERT_TRUE(versions.ok()) << versions.status();
  EXPECT_EQ(versions->min_policy_version, 3);
  EXPECT_EQ(versions->max_policy_version, 5);
}

// Each poison the issue lists, and its message naming the field and index.
TEST(GroupValidationTest, EachPoisonIsRefusedNamingTheFieldAndIndex) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::string name;
    std::function<void(v1::Group&)> poison;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"NaN log-prob",
       [&](v1::Group& g) { g.mutable_trajectories(3)->set_behaviour_logprobs(7, nan); },
       "trajectories[3].behaviour_logprobs[7]: must be finite and <= 0, got nan"},
      {"-inf log-prob",
       [&](v1::Group& g) { g.mutable_trajectories(0)->set_behaviour_logprobs(0, -inf); },
       "trajectories[0].behaviour_logprobs[0]: must be finite and <= 0, got -inf"},
      {"+inf log-prob",
       [&](v1::Group& g) { g.mutable_trajectories(1)->set_behaviour_logprobs(2, inf); },
       "trajectories[1].behaviour_logprobs[2]: must be finite and <= 0, got inf"},
      {"positive log-prob",
       [&](v1::Group& g) { g.mutable_trajectories(1)->set_behaviour_logprobs(4, 0.5f); },
       "trajectories[1].behaviour_logprobs[4]: must be finite and <= 0, got 0.5"},
      {"NaN reward",
       [&](v1::Group& g) { g.mutable_trajectories(2)->set_reward(std::nan("")); },
       "trajectories[2].reward: must be finite, got nan"},
      {"1e300 reward", [&](v1::Group& g) { g.mutable_trajectories(2)->set_reward(1e300); },
       "trajectories[2].reward: must be in the run's reward range [0, 1], got 1e+300"},
      {"negative reward", [&](v1::Group& g) { g.mutable_trajectories(0)->set_reward(-0.5); },
       "trajectories[0].reward: must be in the run's reward range [0, 1], got -0.5"},
      {"completion id -1",
       [&](v1::Group& g) { g.mutable_trajectories(1)->set_completion_token_ids(3, -1); },
       "trajectories[1].completion_token_ids[3]: must be in [0, 1000) (the model's "
       "vocabulary), got -1"},
      {"completion id 1e9",
       [&](v1::Group& g) { g.mutable_trajectories(0)->set_completion_token_ids(9, 1000000000); },
       "trajectories[0].completion_token_ids[9]: must be in [0, 1000) (the model's "
       "vocabulary), got 1000000000"},
      {"prompt id = vocab size",
       [&](v1::Group& g) { g.mutable_trajectories(2)->set_prompt_token_ids(0, 1000); },
       "trajectories[2].prompt_token_ids[0]: must be in [0, 1000) (the model's vocabulary), "
       "got 1000"},
      {"empty completion",
       [&](v1::Group& g) {
         v1::Trajectory* t = g.mutable_trajectories(1);
         t->clear_completion_token_ids();
         t->clear_behaviour_logprobs();
         t->clear_token_policy_versions();
         t->set_finish_reason(v1::FINISH_REASON_STOP);
       },
       "trajectories[1].completion_token_ids: must not be empty unless finish_reason is "
       "FINISH_REASON_ABORTED, finish_reason is FINISH_REASON_STOP"},
      {"empty prompt",
       [&](v1::Group& g) { g.mutable_trajectories(3)->clear_prompt_token_ids(); },
       "trajectories[3].prompt_token_ids: must not be empty"},
      {"fewer log-probs than tokens",
       [&](v1::Group& g) { g.mutable_trajectories(2)->mutable_behaviour_logprobs()->RemoveLast(); },
       "trajectories[2]: completion_token_ids has 10 entries, behaviour_logprobs 9 and "
       "token_policy_versions 10; each needs one entry per completion token"},
      {"more log-probs than tokens",
       [&](v1::Group& g) { g.mutable_trajectories(0)->add_behaviour_logprobs(-1.0f); },
       "trajectories[0]: completion_token_ids has 10 entries, behaviour_logprobs 11 and "
       "token_policy_versions 10; each needs one entry per completion token"},
      {"negative version",
       [&](v1::Group& g) { g.mutable_trajectories(0)->set_token_policy_versions(0, -1); },
       "trajectories[0].token_policy_versions[0]: must be >= 0, got -1"},
      {"wrong group size", [&](v1::Group& g) { g.mutable_trajectories()->RemoveLast(); },
       "trajectories: expected group_size = 4, got 3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::Group group = ValidGroup();
    c.poison(group);
    absl::StatusOr<GroupVersions> versions = ValidateGroup(group, Limits());
    EXPECT_EQ(versions.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(versions.status().message(), c.message);
  }
}

// The per-token checks run a branch-free pass over blocks of 16 first: a
// poison in any position, inside a block, at its edges or in the tail, is
// found and named.
TEST(GroupValidationTest, APoisonAnywhereInALongCompletionIsFound) {
  for (int position : {0, 1, 15, 16, 17, 31, 32, 47, 48, 49}) {
    SCOPED_TRACE(position);
    const auto group = [] { return MakeGroup(kRun, "g", 4, 3, /*tokens=*/50); };
    v1::Group g = group();
    g.mutable_trajectories(2)->set_behaviour_logprobs(position, std::nanf(""));
    EXPECT_EQ(ValidateGroup(g, Limits()).status().message(),
              absl::StrCat("trajectories[2].behaviour_logprobs[", position,
                           "]: must be finite and <= 0, got nan"));
    g = group();
    g.mutable_trajectories(2)->set_behaviour_logprobs(position,
                                                      -std::numeric_limits<float>::infinity());
    EXPECT_FALSE(ValidateGroup(g, Limits()).ok());
    g = group();
    g.mutable_trajectories(2)->set_behaviour_logprobs(position, 2e-5f);
    EXPECT_FALSE(ValidateGroup(g, Limits()).ok());
    g = group();
    g.mutable_trajectories(1)->set_completion_token_ids(position, 1000);
    EXPECT_EQ(ValidateGroup(g, Limits()).status().message(),
              absl::StrCat("trajectories[1].completion_token_ids[", position,
                           "]: must be in [0, 1000) (the model's vocabulary), got 1000"));
    g = group();
    g.mutable_trajectories(1)->set_prompt_token_ids(position, -7);
    EXPECT_THAT(std::string(ValidateGroup(g, Limits()).status().message()),
                ::testing::HasSubstr(absl::StrCat("prompt_token_ids[", position, "]")));
    if (position > 0) {
      g = group();
      for (int t = 0; t < position; ++t) g.mutable_trajectories(3)->set_token_policy_versions(t, 4);
      EXPECT_EQ(ValidateGroup(g, Limits()).status().message(),
                absl::StrCat("trajectories[3].token_policy_versions: must be non-decreasing; "
                             "entry ", position, " is 3 after 4"));
    }
    // Negative and tiny log-probs, the largest id and version jumps are fine.
    g = group();
    g.mutable_trajectories(0)->set_behaviour_logprobs(position, -1e30f);
    g.mutable_trajectories(0)->set_completion_token_ids(position, 999);
    for (int t = position; t < 50; ++t) g.mutable_trajectories(0)->set_token_policy_versions(t, 9);
    EXPECT_TRUE(ValidateGroup(g, Limits()).ok());
  }
}

TEST(GroupValidationTest, AnAbortedEmptyCompletionIsAllowed) {
  v1::Group group = ValidGroup();
  v1::Trajectory* t = group.mutable_trajectories(1);
  t->clear_completion_token_ids();
  t->clear_behaviour_logprobs();
  t->clear_token_policy_versions();
  t->set_finish_reason(v1::FINISH_REASON_ABORTED);
  EXPECT_TRUE(ValidateGroup(group, Limits()).ok());
}

TEST(GroupValidationTest, LogProbsRoundedAHairAboveZeroPass) {
  v1::Group group = ValidGroup();
  group.mutable_trajectories(0)->set_behaviour_logprobs(0, 0.0f);
  group.mutable_trajectories(0)->set_behaviour_logprobs(1, 1e-7f);
  EXPECT_TRUE(ValidateGroup(group, Limits()).ok());
  group.mutable_trajectories(0)->set_behaviour_logprobs(1, 1e-3f);
  EXPECT_FALSE(ValidateGroup(group, Limits()).ok());
}

TEST(GroupValidationTest, UnsetLimitsCheckOnlyWhatAlwaysHolds) {
  GroupLimits limits = Limits();
  limits.vocab_size = 0;
  limits.min_reward.reset();
  limits.max_reward.reset();
  v1::Group group = ValidGroup();
  group.mutable_trajectories(0)->set_completion_token_ids(0, 1000000000);
  group.mutable_trajectories(0)->set_reward(-7.5);
  EXPECT_TRUE(ValidateGroup(group, limits).ok());
  group.mutable_trajectories(0)->set_completion_token_ids(0, -1);
  EXPECT_EQ(ValidateGroup(group, limits).status().message(),
            "trajectories[0].completion_token_ids[0]: must be >= 0, got -1");
  group = ValidGroup();
  group.mutable_trajectories(0)->set_reward(std::numeric_limits<double>::infinity());
  EXPECT_EQ(ValidateGroup(group, limits).status().message(),
            "trajectories[0].reward: must be finite, got inf");
}

TEST(GroupValidationTest, VersionsAheadOfThePolicyNameTheFirstSuchToken) {
  v1::Group group = ValidGroup();  // every token at version 3
  EXPECT_TRUE(CheckVersionsNotAhead(group, 3).ok());
  EXPECT_TRUE(CheckVersionsNotAhead(group, 10).ok());
  for (int t = 6; t < 10; ++t) {
    group.mutable_trajectories(2)->set_token_policy_versions(t, 1'000'000'000'000);
  }
  const absl::Status ahead = CheckVersionsNotAhead(group, 3);
  EXPECT_EQ(ahead.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ahead.message(),
            "trajectories[2].token_policy_versions[6]: must not be ahead of policy version 3 "
            "(the newest the trainer can have published), got 1000000000000");
}

}  // namespace
}  // namespace sluice::replay_buffer
