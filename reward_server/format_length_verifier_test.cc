// The "format" and "length" verifiers, and run parameters reaching them
// through a composition.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/format_verifier.h"
#include "reward_server/length_verifier.h"
#include "reward_server/scorer.h"
#include "common/run/verifier_params.h"

namespace sluice::reward_server {
namespace {

using ::testing::HasSubstr;

VerifyRequest Request(std::string response, std::map<std::string, std::string> metadata = {}) {
  VerifyRequest request;
  request.response = std::move(response);
  request.metadata = std::move(metadata);
  return request;
}

TEST(FormatVerifierTest, DefaultPresetWantsAnExplicitAnswerMarker) {
  FormatVerifier format;
  EXPECT_EQ(format.Verify(Request("so \\boxed{12}")).reward, 1.0);
  EXPECT_EQ(format.Verify(Request("#### 12")).reward, 1.0);
  EXPECT_EQ(format.Verify(Request("The answer is 12.")).reward, 1.0);
  const VerifyOutcome bare = format.Verify(Request("I think 3 and then 12"));
  EXPECT_EQ(bare.reward, 0.0);
  EXPECT_EQ(bare.error_kind, VerifierErrorKind::kNone);
  EXPECT_THAT(bare.detail, HasSubstr("not marked"));
  EXPECT_EQ(format.Verify(Request("no answer at all")).reward, 0.0);
}

TEST(FormatVerifierTest, BoxedPresetWantsExactlyOneNonEmptyBox) {
  FormatVerifier format;
  const std::map<std::string, std::string> boxed = {{"format", "boxed"}};
  const VerifyOutcome one = format.Verify(Request("x = \\boxed{\\frac{1}{2}}", boxed));
  EXPECT_EQ(one.reward, 1.0);
  EXPECT_EQ(one.extracted_answer, "\\frac{1}{2}");
  EXPECT_EQ(format.Verify(Request("\\boxed{1} or \\boxed{2}", boxed)).reward, 0.0);
  EXPECT_EQ(format.Verify(Request("\\boxed{ }", boxed)).reward, 0.0);
  EXPECT_EQ(format.Verify(Request("\\boxed{1", boxed)).reward, 0.0);
  EXPECT_EQ(format.Verify(Request("12", boxed)).reward, 0.0);
}

TEST(FormatVerifierTest, ThinkAnswerPreset) {
  FormatVerifier format;
  const std::map<std::string, std::string> think = {{"format", "think_answer"}};
  EXPECT_EQ(format.Verify(Request("  <think>add them</think> 12", think)).reward, 1.0);
  EXPECT_EQ(format.Verify(Request("<think>add them</think>   ", think)).reward, 0.0);
  EXPECT_EQ(format.Verify(Request("12 <think>x</think> 12", think)).reward, 0.0);
  EXPECT_EQ(format.Verify(Request("<think>a</think><think>b</think> 1", think)).reward, 0.0);
  EXPECT_EQ(format.Verify(Request("<think>never closed 12", think)).reward, 0.0);
}

TEST(FormatVerifierTest, RegexSearchesOrMatchesTheWholeResponse) {
  FormatVerifier format;
  const VerifyOutcome found =
      format.Verify(Request("Final: [42] done", {{"format_regex", R"(\[\d+\])"}}));
  EXPECT_EQ(found.reward, 1.0);
  EXPECT_EQ(found.extracted_answer, "[42]");
  EXPECT_EQ(format.Verify(Request("Final: [42] done", {{"format_regex", R"(\[\d+\])"},
                                                       {"format_full_match", "true"}}))
                .reward,
            0.0);
  EXPECT_EQ(format.Verify(Request("[42]", {{"format_regex", R"(\[\d+\])"},
                                           {"format_full_match", "true"}}))
                .reward,
            1.0);
  EXPECT_EQ(format.Verify(Request("nothing", {{"format_regex", R"(\[\d+\])"}})).reward, 0.0);
}

TEST(FormatVerifierTest, BadPatternsAndPresetsAreInvalidInput) {
  FormatVerifier format;
  const VerifyOutcome unbalanced = format.Verify(Request("x", {{"format_regex", "(a"}}));
  EXPECT_EQ(unbalanced.error_kind, VerifierErrorKind::kInvalidInput);
  EXPECT_THAT(unbalanced.detail, HasSubstr("format_regex"));
  // Backreferences would need backtracking: RE2 refuses them.
  EXPECT_EQ(format.Verify(Request("aa", {{"format_regex", R"((a)\1)"}})).error_kind,
            VerifierErrorKind::kInvalidInput);
  EXPECT_EQ(format.Verify(Request("x", {{"format_regex", std::string(5000, 'a')}})).error_kind,
            VerifierErrorKind::kInvalidInput);
  const VerifyOutcome preset = format.Verify(Request("x", {{"format", "xml"}}));
  EXPECT_EQ(preset.error_kind, VerifierErrorKind::kInvalidInput);
  EXPECT_THAT(preset.detail, HasSubstr("think_answer"));
}

TEST(FormatVerifierTest, CatastrophicBacktrackingPatternsRunInLinearTime) {
  // (a+)+$ on "aaaa...b" takes exponential time in a backtracking engine; RE2
  // answers it at once. The test asserts only the answer: it would not finish
  // within ctest's timeout if the engine backtracked.
  FormatVerifier format;
  const VerifyOutcome outcome =
      format.Verify(Request(std::string(100000, 'a') + "b", {{"format_regex", "(a+)+$"}}));
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone);
}

TEST(LengthVerifierTest, SoftOverlongRampInCharsAndTokens) {
  LengthVerifier length;
  const std::map<std::string, std::string> params = {{"max_length", "10"},
                                                     {"length_cache", "4"}};
  const auto reward = [&](std::string response, std::map<std::string, std::string> extra = {}) {
    std::map<std::string, std::string> metadata = params;
    metadata.insert(extra.begin(), extra.end());
    const VerifyOutcome outcome = length.Verify(Request(std::move(response), metadata));
    EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone) << outcome.detail;
    return outcome.reward;
  };
  EXPECT_DOUBLE_EQ(reward("123456"), 1.0);     // 6 <= 10 - 4
  EXPECT_DOUBLE_EQ(reward("1234567"), 0.75);   // (10 - 7) / 4
  EXPECT_DOUBLE_EQ(reward("1234567890"), 0.0);
  EXPECT_DOUBLE_EQ(reward("12345678901"), 0.0);
  // Code points, not bytes: six Greek letters are 12 bytes.
  EXPECT_DOUBLE_EQ(reward("αβγδεζ"), 1.0);
  // Tokens win over characters when the rollout worker counted them.
  EXPECT_DOUBLE_EQ(reward("x", {{"completion_tokens", "8"}}), 0.5);
  EXPECT_DOUBLE_EQ(reward(std::string(100, 'x'), {{"completion_tokens", "3"}}), 1.0);
  EXPECT_DOUBLE_EQ(reward("x", {{"completion_tokens", "8"}, {"length_unit", "chars"}}), 1.0);
  // A hard cut without a cache.
  EXPECT_EQ(length.Verify(Request("12345", {{"max_length", "5"}})).reward, 1.0);
  EXPECT_EQ(length.Verify(Request("123456", {{"max_length", "5"}})).reward, 0.0);
}

TEST(LengthVerifierTest, BadParametersAreInvalidInputNamingThem) {
  LengthVerifier length;
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{}, "max_length is required"},
      {{{"max_length", "ten"}}, "max_length must be an integer"},
      {{{"max_length", "0"}}, "max_length must be > 0"},
      {{{"max_length", "10"}, {"length_cache", "11"}}, "length_cache must be in [0"},
      {{{"max_length", "10"}, {"length_unit", "words"}}, "length_unit must be"},
      {{{"max_length", "10"}, {"length_unit", "tokens"}}, "no completion_tokens"},
      {{{"max_length", "10"}, {"completion_tokens", "-1"}}, "completion_tokens must be >= 0"},
  };
  for (const auto& [metadata, message] : cases) {
    const VerifyOutcome outcome = length.Verify(Request("abc", metadata));
    EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kInvalidInput) << message;
    EXPECT_THAT(outcome.detail, HasSubstr(message));
  }
}

// `sluice submit --validate-only` checks names against this list offline.
TEST(BuiltinVerifierNamesTest, AreTheBuiltinRegistrysNames) {
  absl::StatusOr<VerifierRegistry> registry = MakeBuiltinVerifierRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status();
  std::vector<std::string> names;
  for (const auto& verifier : registry->List()) names.push_back(verifier->info().name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, run::BuiltinVerifierNames());
}

TEST(CompositionParamsTest, RunParamsReachTheirVerifierAndItemMetadataWins) {
  absl::StatusOr<VerifierRegistry> registry = MakeBuiltinVerifierRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status();
  absl::StatusOr<std::unique_ptr<Scorer>> scorer =
      Scorer::Create(std::make_shared<VerifierRegistry>(*std::move(registry)));
  ASSERT_TRUE(scorer.ok()) << scorer.status();

  const std::vector<WeightedVerifier> composition = {
      {"math", 1.0, {}},
      {"format", 1.0, {{"format", "think_answer"}}},
      {"length", 2.0, {{"max_length", "40"}, {"length_cache", "20"}}},
  };
  ScoreItem plain;
  plain.item_id = "plain";
  plain.request.response = "<think>6 times 7</think> \\boxed{42}";  // 35 chars: length 0.25
  plain.request.reference_answer = "42";
  ScoreItem overridden = plain;
  overridden.item_id = "overridden";
  overridden.request.metadata["max_length"] = "1000";  // The item's own value wins.
  // A length verifier without its params would be invalid input.
  ScoreItem single = plain;
  single.item_id = "single";
  single.verifier = "length";

  absl::StatusOr<BatchScores> scores =
      (*scorer)->ScoreBatch({plain, overridden, single}, composition);
  ASSERT_TRUE(scores.ok()) << scores.status();
  const VerifyOutcome& a = scores->items[0].outcome;
  ASSERT_EQ(a.components.size(), 3u);
  EXPECT_EQ(a.components[0].reward, 1.0) << a.components[0].detail;
  EXPECT_EQ(a.components[1].reward, 1.0) << a.components[1].detail;
  EXPECT_DOUBLE_EQ(a.components[2].reward, 0.25) << a.components[2].detail;
  EXPECT_DOUBLE_EQ(a.reward, (1.0 + 1.0 + 2 * 0.25) / 4);
  const VerifyOutcome& b = scores->items[1].outcome;
  EXPECT_DOUBLE_EQ(b.reward, 1.0);
  const VerifyOutcome& c = scores->items[2].outcome;
  EXPECT_EQ(c.error_kind, VerifierErrorKind::kInvalidInput);
  EXPECT_THAT(c.detail, HasSubstr("max_length"));
}

}  // namespace
}  // namespace sluice::reward_server
