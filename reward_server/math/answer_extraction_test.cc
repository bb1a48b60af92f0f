#include "reward_server/math/answer_extraction.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reward_server/math/math_equivalence.h"

namespace sluice::reward_server::internal {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> BoxContents(absl::string_view text) {
  std::vector<std::string> contents;
  for (const Span& box : FindBoxes(text)) contents.emplace_back(box.content);
  return contents;
}

std::vector<std::string> CandidateTexts(absl::string_view text,
                                        const MathCompareOptions& options = {}) {
  std::vector<std::string> texts;
  for (const RankedCandidate& ranked : RankedCandidates(text, options)) {
    texts.push_back(ranked.candidate.text);
  }
  return texts;
}

TEST(AnswerExtractionTest, ExtractsByPriority) {
  const std::vector<MathAnswerCandidate> candidates = ExtractMathAnswerCandidates(
      "We get $x = 3$ and then \\boxed{7}. Final answer: 9", MathCompareOptions());
  ASSERT_FALSE(candidates.empty());
  EXPECT_EQ(candidates[0].text, "7");
  EXPECT_TRUE(CompareMathAnswers("7", "\\boxed{1} no no no no no \\boxed{7}").equal);
  EXPECT_TRUE(CompareMathAnswers("$\\{1,2\\}$", "\\boxed{1} and \\boxed{2}").equal);
}

TEST(AnswerExtractionTest, FindBoxesKeepsOutermostClosedBoxes) {
  EXPECT_THAT(BoxContents("\\boxed{\\boxed{1}} and \\fbox {2}, \\\\boxed{3}"),
              ElementsAre("\\boxed{1}", "2", "3"));
  EXPECT_THAT(BoxContents("\\boxed{\\frac{1}{2}}"), ElementsAre("\\frac{1}{2}"));
  EXPECT_THAT(BoxContents("\\boxed{ } \\boxed{4"), ElementsAre());
}

TEST(AnswerExtractionTest, RanksAnchoredAndRightmostCandidatesFirst) {
  // The box first, then "answer: 9" (also again unanchored), then the rest
  // rightmost first.
  EXPECT_THAT(CandidateTexts("We get $x = 3$ and then \\boxed{7}. Final answer: 9"),
              ElementsAre("7", "9", "9", "x = 3", "3"));
  // Of equal priority ("####" and a box), the rightmost first; last, the
  // whole text, which has no prose.
  EXPECT_THAT(CandidateTexts("#### 18\n\\boxed{5}"),
              ElementsAre("5", "18", "18", "#### 18\n\\boxed{5}"));
  // The extractors follow the options.
  MathCompareOptions latex_only;
  latex_only.match_expr = false;
  EXPECT_THAT(CandidateTexts("It is $4$ or 5 apples", latex_only), ElementsAre("4"));
}

// An anchor counts only close before its candidate: "answer:" within 50
// bytes of it, "final answer is" within 120.
TEST(AnswerExtractionTest, AnchorsCountOnlyWithinTheirWindow) {
  const std::string gap(55, '.');
  EXPECT_THAT(CandidateTexts("Answer: 4 and" + gap + " later 5"), ElementsAre("4", "5", "4"));
  EXPECT_THAT(CandidateTexts("Answer:" + gap + " 4 and later 5"), ElementsAre("5", "4"));
  const std::string far(130, 'x');
  EXPECT_THAT(CandidateTexts("The final answer " + far + " is 4 and 5"), ElementsAre("5", "4"));
  EXPECT_THAT(CandidateTexts("The final answer " + far.substr(0, 90) + " is 4 and 5"),
              ElementsAre("4", "5", "4"));
}

// 256 KB of candidates with no anchor: ranking looks back only a bounded
// window from each, so this takes milliseconds (it took minutes when every
// candidate searched the whole text before it for "answer").
TEST(AnswerExtractionTest, ALongTextOfCandidatesIsRankedInLinearTime) {
  std::string text;
  while (text.size() < kMaxCompareInputBytes) text += "1 ";
  const MathComparison comparison = CompareMathAnswers("1", text);
  EXPECT_TRUE(comparison.equal);
  EXPECT_EQ(comparison.prediction_answer, "1");
}

TEST(AnswerExtractionTest, ExtractAnswerTakesTheFirstCandidateThatParses) {
  const MathCompareOptions options;
  const ExtractedAnswer boxed = ExtractAnswer("so \\boxed{\\frac{1}{2}}.", options);
  ASSERT_TRUE(boxed.parsed.has_value());
  EXPECT_EQ(boxed.answer, "\\frac{1}{2}");
  EXPECT_EQ(boxed.normalized, "(/ 1 2)");
  // A bare reference is read whole only when asked.
  EXPECT_EQ(ExtractAnswer("3\\sqrt{13}", options).answer, "3");
  EXPECT_EQ(ExtractAnswer("3\\sqrt{13}", options, /*whole_first=*/true).answer, "3\\sqrt{13}");
  // Nothing to parse: only a string to compare.
  const ExtractedAnswer prose = ExtractAnswer("no solution", options, /*whole_first=*/true);
  EXPECT_FALSE(prose.parsed.has_value());
  EXPECT_EQ(prose.fallback, "nosolution");
  EXPECT_FALSE(prose.too_large);
}

TEST(AnswerExtractionTest, ExtractAnswerReportsAnAnswerOverTheBounds) {
  const ExtractedAnswer side =
      ExtractAnswer("$" + std::string(3000, '9') + "$", MathCompareOptions());
  EXPECT_FALSE(side.parsed.has_value());
  EXPECT_TRUE(side.too_large);
  EXPECT_FALSE(side.error.empty());
}

TEST(AnswerExtractionTest, CutInputKeepsTheTail) {
  const std::string text = std::string(kMaxCompareInputBytes, 'x') + "\\boxed{5}";
  const absl::string_view cut = CutInput(text);
  EXPECT_EQ(cut.size(), kMaxCompareInputBytes);
  EXPECT_TRUE(absl::EndsWith(cut, "\\boxed{5}"));
  EXPECT_EQ(CutInput("short"), "short");
}

TEST(AnswerExtractionTest, NormalizeAnswerStringDropsWrappersAndSpacing) {
  EXPECT_EQ(NormalizeAnswerString("\\text{(B)}"), "B");
  EXPECT_EQ(NormalizeAnswerString("$\\dfrac{1}{2}$."), "\\frac12");
  EXPECT_EQ(NormalizeAnswerString("\\left( 1,\\, 2 \\right)"), "(1,2)");
}

}  // namespace
}  // namespace sluice::reward_server::internal
