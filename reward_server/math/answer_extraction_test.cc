#include "reward_server/math/answer_extraction.h"

#include <chrono>
#include <cstdio>
#include <optional>
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

// ExtractAnswer: the answer a response marks, by the cascade of rules.

struct ExtractCase {
  std::string response;
  std::optional<std::string> answer;  // nullopt = nothing extracted.
  AnswerSource source = AnswerSource::kLastNumber;
};

TEST(ExtractAnswerTest, FollowsThePriorityOrder) {
  const std::vector<ExtractCase> cases = {
      // The arithmetic task's completions.
      {"52", "52", AnswerSource::kLastNumber},
      {"-5", "-5", AnswerSource::kLastNumber},
      {" 52 ", "52", AnswerSource::kLastNumber},
      {"52.", "52", AnswerSource::kLastNumber},
      {"5252", "5252", AnswerSource::kLastNumber},
      {"07+45=52", "52", AnswerSource::kLastNumber},
      {"07-45=-38", "-38", AnswerSource::kLastNumber},
      {"5-3", "3", AnswerSource::kLastNumber},
      {"x = -3", "-3", AnswerSource::kLastNumber},
      {"\xE2\x88\x92"
       "7",
       "\xE2\x88\x92"
       "7",
       AnswerSource::kLastNumber},
      {"1, 2, 3", "3", AnswerSource::kLastNumber},
      {"It costs 1,234 dollars", "1,234", AnswerSource::kLastNumber},
      {"half is 1/2", "1/2", AnswerSource::kLastNumber},
      {"pi is about 3.14.", "3.14", AnswerSource::kLastNumber},
      // \boxed{} wins over everything, the last one, with nested braces.
      {"so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}", AnswerSource::kBoxed},
      {"\\boxed{1} then \\boxed{2} #### 3", "2", AnswerSource::kBoxed},
      {"\\boxed{ 42. }", "42", AnswerSource::kBoxed},
      {"\\boxed{\\boxed{7}}", "7", AnswerSource::kBoxed},
      {"\\boxed{a\\{b} 9", "a\\{b", AnswerSource::kBoxed},
      {"\\boxed{} 9", "9", AnswerSource::kLastNumber},
      {"\\boxed{5", "5", AnswerSource::kLastNumber},  // Unbalanced: not a box.
      {"\\boxed{5}}}}", "5", AnswerSource::kBoxed},
      {"so \\fbox{x+1} 2", "x+1", AnswerSource::kBoxed},
      // The last math span, before the last number.
      {"we get $x^2$ then \\[ y + 1 \\] 7", "y + 1", AnswerSource::kMathSpan},
      {"cost $5 and $6", "6", AnswerSource::kLastNumber},
      // GSM8K hashes.
      {"3 + 4 = 7\n#### 7", "7", AnswerSource::kHashes},
      {"#### 1,234\nmore 9", "1,234", AnswerSource::kHashes},
      {"#### $18.50.", "18.50", AnswerSource::kHashes},
      {"#### \n 12", "12", AnswerSource::kLastNumber},
      // "answer is", then "Answer:".
      {"The answer is 72.", "72", AnswerSource::kAnswerIs},
      {"the answer is $52 apples, not 3", "52", AnswerSource::kAnswerIs},
      {"The final answer is: -5", "-5", AnswerSource::kAnswerIs},
      {"THE ANSWER IS 8 and 9", "8", AnswerSource::kAnswerIs},
      {"the answer is x^2+1.", "x^2+1", AnswerSource::kAnswerIs},
      {"the answer is 5/2+1", "5/2+1", AnswerSource::kAnswerIs},
      {"Answer: 12\nAnswer: 13", "13", AnswerSource::kAnswerColon},
      {"Final Answer: **40**", "40", AnswerSource::kAnswerColon},
      {"Answer: 12 and the answer is 14", "14", AnswerSource::kAnswerIs},
      {"Answer:", std::nullopt},
      {"Answer: 12\nAnswer:", "12", AnswerSource::kLastNumber},
      {"the answer isn't 5 but 6", "6", AnswerSource::kLastNumber},
      // Nothing to extract.
      {"", std::nullopt},
      {"   \n\t", std::nullopt},
      {"no digits here", std::nullopt},
      {"=+-*", std::nullopt},
  };
  for (const ExtractCase& c : cases) {
    SCOPED_TRACE("response: \"" + c.response + "\"");
    std::optional<ExtractedAnswer> got = ExtractAnswer(c.response);
    if (!c.answer.has_value()) {
      EXPECT_FALSE(got.has_value()) << "extracted \"" << got->text << "\"";
      continue;
    }
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->text, *c.answer);
    EXPECT_EQ(AnswerSourceName(got->source), AnswerSourceName(c.source));
  }
}

TEST(ExtractAnswerTest, HostileInputsStayLinearAndSafe) {
  const size_t kSize = 4 << 20;  // 4 MiB each.
  const auto start = std::chrono::steady_clock::now();
  // Many unbalanced boxes: no box, then the last number.
  std::string boxes;
  while (boxes.size() < kSize) boxes += "\\boxed{";
  boxes += "7";
  EXPECT_EQ(ExtractAnswer(boxes)->text, "7");
  // Deep nesting.
  std::string deep = "\\boxed{" + std::string(kSize, '{') + "9" + std::string(kSize, '}') + "}";
  std::optional<ExtractedAnswer> nested = ExtractAnswer(deep);
  ASSERT_TRUE(nested.has_value());
  EXPECT_EQ(nested->source, AnswerSource::kBoxed);
  EXPECT_EQ(nested->text.size(), 2 * kSize + 1);
  // Stray closing braces, markers everywhere, digits everywhere.
  EXPECT_EQ(ExtractAnswer(std::string(kSize, '}') + "3")->text, "3");
  std::string markers;
  while (markers.size() < kSize) markers += "answer is\nanswer:\n####\n";
  EXPECT_FALSE(ExtractAnswer(markers).has_value());
  std::string one_line;
  while (one_line.size() < kSize) one_line += "answer is ";
  EXPECT_EQ(ExtractAnswer(one_line + "5")->text, "5");
  std::string digits(kSize, '1');
  EXPECT_EQ(ExtractAnswer(digits)->text.size(), kSize);
  std::string commas;
  while (commas.size() < kSize) commas += "1,";
  EXPECT_EQ(ExtractAnswer(commas)->text, "1");
  EXPECT_FALSE(ExtractAnswer(std::string(kSize, '-')).has_value());
  EXPECT_FALSE(ExtractAnswer(std::string(kSize, '\0')).has_value());
  // Not a speed assertion: a quadratic scan of these inputs would take hours.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("hostile extraction inputs: %.3f s\n", seconds);
}

// ExtractParsedAnswer and its candidates.

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

TEST(AnswerExtractionTest, CandidatesSayWhereTheyWereFound) {
  std::vector<AnswerSource> sources;
  for (const RankedCandidate& ranked :
       RankedCandidates("We get $x = 3$ and then \\boxed{7}. Final answer: 9", {})) {
    sources.push_back(ranked.source);
  }
  EXPECT_THAT(sources, ElementsAre(AnswerSource::kBoxed, AnswerSource::kAnswerColon,
                                   AnswerSource::kLastNumber, AnswerSource::kMathSpan,
                                   AnswerSource::kLastNumber));
  const MathCompareOptions options;
  EXPECT_EQ(ExtractParsedAnswer("#### 18", options).source, AnswerSource::kHashes);
  EXPECT_EQ(ExtractParsedAnswer("The final answer is $5$.", options).source,
            AnswerSource::kAnswerIs);
  EXPECT_EQ(ExtractParsedAnswer("3\\sqrt{13}", options, /*whole_first=*/true).source,
            AnswerSource::kWholeText);
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

TEST(AnswerExtractionTest, ExtractParsedAnswerTakesTheFirstCandidateThatParses) {
  const MathCompareOptions options;
  const ExtractedAnswer boxed = ExtractParsedAnswer("so \\boxed{\\frac{1}{2}}.", options);
  ASSERT_TRUE(boxed.parsed.has_value());
  EXPECT_EQ(boxed.text, "\\frac{1}{2}");
  EXPECT_EQ(boxed.normalized, "(/ 1 2)");
  EXPECT_EQ(boxed.source, AnswerSource::kBoxed);
  // A bare reference is read whole only when asked.
  EXPECT_EQ(ExtractParsedAnswer("3\\sqrt{13}", options).text, "3");
  EXPECT_EQ(ExtractParsedAnswer("3\\sqrt{13}", options, /*whole_first=*/true).text, "3\\sqrt{13}");
  // Nothing to parse: only a string to compare.
  const ExtractedAnswer prose = ExtractParsedAnswer("no solution", options, /*whole_first=*/true);
  EXPECT_FALSE(prose.parsed.has_value());
  EXPECT_EQ(prose.fallback, "nosolution");
  EXPECT_EQ(prose.source, AnswerSource::kWholeText);
  EXPECT_FALSE(prose.too_large);
}

TEST(AnswerExtractionTest, ExtractParsedAnswerReportsAnAnswerOverTheBounds) {
  const ExtractedAnswer side =
      ExtractParsedAnswer("$" + std::string(3000, '9') + "$", MathCompareOptions());
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
