#include "reward_server/math_verifier.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::reward_server {
namespace {

using ::testing::HasSubstr;

TEST(NormalizeNumberTest, CanonicalForms) {
  const std::vector<std::pair<std::string, std::optional<std::string>>> cases = {
      {"52", "52"},
      {"052", "52"},
      {"+52", "52"},
      {"-5", "-5"},
      {"\xE2\x88\x92"
       "5",
       "-5"},
      {"-0", "0"},
      {"-0.000", "0"},
      {"1,234", "1234"},
      {"1,234,567.890", "1234567.89"},
      {"3.50", "3.5"},
      {"3.0", "3"},
      {".5", "0.5"},
      {"$18.50", "18.5"},
      {"\\$5", "5"},
      {"$5$", "5"},
      {" 7. ", "7"},
      {"3/4", "3/4"},
      {"-06/08", "-6/8"},
      {"4/1", "4"},
      {"\\frac{1}{2}", "1/2"},
      {"-\\dfrac{3}{4}", "-3/4"},
      {"\\tfrac{-3}{-4}", "3/4"},
      {"1/0", std::nullopt},
      {"\\frac{1}{0}", std::nullopt},
      {"\\frac{1}{x}", std::nullopt},
      {"\\frac{1}{2", std::nullopt},
      {"1,23", std::nullopt},
      {"12,345,67", std::nullopt},
      {"1.2.3", std::nullopt},
      {"1e5", std::nullopt},
      {"x", std::nullopt},
      {"", std::nullopt},
      {"-", std::nullopt},
      {"$", std::nullopt},
      {"5 apples", std::nullopt},
  };
  for (const auto& [text, expected] : cases) {
    SCOPED_TRACE("text: \"" + text + "\"");
    EXPECT_EQ(NormalizeNumber(text), expected);
  }
}

TEST(NumbersEqualTest, IntegersExactDecimalsAndFractionsWithinTolerance) {
  EXPECT_TRUE(NumbersEqual("52", "52"));
  EXPECT_TRUE(NumbersEqual("52", "052"));
  EXPECT_TRUE(NumbersEqual("52", "52.000"));
  EXPECT_TRUE(NumbersEqual("-5",
                           "\xE2\x88\x92"
                           "5"));
  EXPECT_TRUE(NumbersEqual("1234", "1,234"));
  EXPECT_TRUE(NumbersEqual("0.5", "1/2"));
  EXPECT_TRUE(NumbersEqual("\\frac{1}{2}", "0.5"));
  EXPECT_TRUE(NumbersEqual("2/4", "1/2"));
  EXPECT_TRUE(NumbersEqual("0", "-0"));
  EXPECT_TRUE(NumbersEqual("0.1", "0.1000000000001"));
  EXPECT_FALSE(NumbersEqual("52", "53"));
  EXPECT_FALSE(NumbersEqual("52", "-52"));
  EXPECT_FALSE(NumbersEqual("0.333", "1/3"));
  EXPECT_FALSE(NumbersEqual("1000000", "1000000.5"));
  EXPECT_FALSE(NumbersEqual("52", "fifty-two"));
  EXPECT_FALSE(NumbersEqual("", ""));
  // Integers beyond 64 bits compare exactly, digit by digit.
  EXPECT_TRUE(
      NumbersEqual("123456789012345678901234567890", "123,456,789,012,345,678,901,234,567,890"));
  EXPECT_FALSE(NumbersEqual("123456789012345678901234567890", "123456789012345678901234567891"));
  EXPECT_FALSE(NumbersEqual("9223372036854775808", "9223372036854775807"));
}

TEST(NumbersEqualTest, TenThousandDigitNumbersCompareExactly) {
  const std::string big = "7" + std::string(9999, '3');
  std::string off_by_one = big;
  off_by_one.back() = '4';
  EXPECT_EQ(NormalizeNumber("000" + big), big);
  EXPECT_TRUE(NumbersEqual(big, "+" + big));
  EXPECT_FALSE(NumbersEqual(big, off_by_one));
  EXPECT_FALSE(NumbersEqual(big, "-" + big));
  // Beyond double's range decimals fall back to exact canonical equality
  // instead of comparing infinities.
  EXPECT_TRUE(NumbersEqual(big + ".5", big + ".50"));
  EXPECT_FALSE(NumbersEqual(big + ".5", off_by_one + ".5"));
  EXPECT_FALSE(NumbersEqual("0." + std::string(10000, '0') + "1", "0"));
}

VerifyRequest Request(std::string response, std::string reference) {
  VerifyRequest request;
  request.response = std::move(response);
  request.reference_answer = std::move(reference);
  return request;
}

TEST(MathVerifierTest, RewardsCorrectArithmeticAnswers) {
  const MathVerifier verifier;
  EXPECT_EQ(verifier.name(), "math");
  EXPECT_EQ(verifier.default_timeout(), absl::Milliseconds(5000));
  EXPECT_THAT(verifier.required_fields(), ::testing::ElementsAre("reference_answer"));

  VerifyOutcome right = verifier.Verify(Request("52", "52"));
  EXPECT_EQ(right.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(right.reward, 1.0);
  EXPECT_EQ(right.extracted_answer, "52");

  VerifyOutcome negative = verifier.Verify(Request("-5", "-5"));
  EXPECT_EQ(negative.reward, 1.0);

  VerifyOutcome wrong = verifier.Verify(Request("53", "52"));
  EXPECT_EQ(wrong.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(wrong.reward, 0.0);
  EXPECT_EQ(wrong.extracted_answer, "53");
  EXPECT_THAT(wrong.detail, HasSubstr("expected 52, got 53"));

  EXPECT_EQ(verifier.Verify(Request("The answer is 1,234.", "1234")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("so \\boxed{\\frac{1}{2}}", "0.5")).reward, 1.0);
}

TEST(MathVerifierTest, AcceptsWholeSolutionsAsReference) {
  const MathVerifier verifier;
  EXPECT_EQ(verifier.Verify(Request("72", "She sold 48 + 24 = 72.\n#### 72")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("The answer is 72", "so \\boxed{72}")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("71", "#### 72")).reward, 0.0);
}

VerifyRequest SolutionRequest(std::string response, std::string solution) {
  VerifyRequest request = Request(std::move(response), std::move(solution));
  request.reference_is_solution = true;
  return request;
}

std::string Boxed(const std::string& answer) {
  return "The answer is $\\boxed{" + answer + "}$.";
}

// The references the issue found read as their last number ("3\sqrt{13}" as
// 3), each with an equivalent answer written differently and the misreading.
struct BareReferenceCase {
  std::string reference;
  std::string equivalent;  // Scores 1.
  std::string misread;     // What the reference used to read as: scores 0.
};

class BareReferenceTest : public ::testing::TestWithParam<BareReferenceCase> {};

TEST_P(BareReferenceTest, IsComparedAsAWholeAnswer) {
  const BareReferenceCase& c = GetParam();
  const MathVerifier verifier;
  for (const std::string& answer : {c.reference, c.equivalent}) {
    const VerifyOutcome outcome = verifier.Verify(Request(Boxed(answer), c.reference));
    EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone) << outcome.detail;
    EXPECT_EQ(outcome.reward, 1.0) << answer << ": " << outcome.detail;
  }
  const VerifyOutcome misread = verifier.Verify(Request(Boxed(c.misread), c.reference));
  EXPECT_EQ(misread.reward, 0.0) << c.misread << ": " << misread.detail;
  // The bare misread number too, which the integer fast path sees.
  EXPECT_EQ(verifier.Verify(Request(c.misread, c.reference)).reward, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    IssueReferences, BareReferenceTest,
    ::testing::Values(
        BareReferenceCase{"3\\sqrt{13}", "\\sqrt{117}", "3"},
        BareReferenceCase{"11\\sqrt2", "11 \\sqrt{2}", "11"},
        BareReferenceCase{"6 - 5i", "-5i+6", "5"},
        BareReferenceCase{"-2 + 7i", "7i - 2", "7"},
        BareReferenceCase{"52_8", "42", "52"},
        BareReferenceCase{"1,-2", "-2, 1", "1"},
        BareReferenceCase{"3, 5, 7", "\\{7, 5, 3\\}", "7"},
        BareReferenceCase{"x^5 - x^4 + x^3 - x^2 + x - 1", "(x-1)(x^4+x^2+1)", "1"},
        BareReferenceCase{"1 \\pm \\sqrt{19}", "1-\\sqrt{19}, 1+\\sqrt{19}", "1"},
        BareReferenceCase{"\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)", "3"},
        BareReferenceCase{"\\text{Evelyn}", "Evelyn", "\\text{Briana}"}));

// What MATH answers hold besides numbers, each against an equivalent and a
// different answer.
TEST(MathVerifierTest, BareReferencesCompareByEquivalence) {
  const MathVerifier verifier;
  const std::vector<std::tuple<std::string, std::string, double>> cases = {
      // Complex numbers.
      {"6 - 5i", "\\frac{(6-5i)(1+i)}{1+i}", 1.0},
      {"1+2i", "(1+i)^2 - 2i + 1 + 2i", 1.0},  // i^2 = -1.
      {"6 - 5i", "6 + 5i", 0.0},
      // Numbers in a base: as written and by value.
      {"52_8", "52_{8}", 1.0},
      {"52_8", "101010_2", 1.0},
      {"52_8", "53_8", 0.0},
      {"2516_8", "1358", 1.0},
      // Mixed numbers.
      {"1\\frac{4}{5}", "\\frac{9}{5}", 1.0},
      {"1\\frac{4}{5}", "\\frac{4}{5}", 0.0},
      {"137 \\frac{1}{2}", "137.5", 1.0},
      // Text answers and choices.
      {"\\text{Evelyn}", "\\text{Evelyn}", 1.0},
      {"\\text{east}", "east", 1.0},
      {"\\text{east}", "\\text{west}", 0.0},
      {"\\text{(C)}", "(C)", 1.0},
      {"\\text{(C)}", "C", 1.0},
      {"\\text{(C)}", "\\text{(D)}", 0.0},
      // Tuples in order, lists in any order.
      {"(6,31,-1)", "(6, 31, -1)", 1.0},
      {"(6,31,-1)", "(31,6,-1)", 0.0},
      {"(3,4]", "(3,4)", 0.0},
      // Polynomials.
      {"x^3+3x-6", "3x + x^3 - 6", 1.0},
      {"x^3+3x-6", "x^3+3x+6", 0.0},
      // ± pairs.
      {"3 \\pm 2 \\sqrt{2}", "3+2\\sqrt2, 3-2\\sqrt2", 1.0},
      {"3 \\pm 2 \\sqrt{2}", "3+2\\sqrt2", 0.0},
      // Units and degrees.
      {"30^\\circ", "30", 1.0},
      {"30^\\circ", "30 degrees", 1.0},
      {"5\\text{ cm}", "5", 1.0},
      {"15\\mbox{ cm}^2", "15 square cm", 1.0},
      {"5\\text{ cm}", "5\\text{ m}", 0.0},
      {"36^\\circ", "\\$36", 0.0},
      {"\\$32,\\!348", "32348", 1.0},
  };
  for (const auto& [reference, answer, reward] : cases) {
    const VerifyOutcome outcome = verifier.Verify(Request(Boxed(answer), reference));
    EXPECT_EQ(outcome.reward, reward) << reference << " vs " << answer << ": " << outcome.detail;
  }
}

TEST(MathVerifierTest, SolutionReferencesHaveTheirFinalAnswerExtracted) {
  const MathVerifier verifier;
  EXPECT_EQ(verifier.Verify(SolutionRequest("72", "She sold 48 + 24 = 72.\n#### 72")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(SolutionRequest("71", "She sold 48 + 24 = 72.\n#### 72")).reward, 0.0);
  EXPECT_EQ(verifier.Verify(SolutionRequest(Boxed("\\sqrt{117}"),
                                            "so $AB = \\boxed{3\\sqrt{13}}$."))
                .reward,
            1.0);
  EXPECT_EQ(
      verifier.Verify(SolutionRequest("The answer is 12", "Adding, 5 + 7 = 12 apples.")).reward,
      1.0);
  // The marker decides: marked as a solution, "3\sqrt{13}" is extracted
  // from as a response would be, which finds the number 3 (the issue's
  // misreading, now only for a reference that says it is a solution).
  EXPECT_EQ(verifier.Verify(SolutionRequest("3", "3\\sqrt{13}")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("3", "3\\sqrt{13}")).reward, 0.0);
}

TEST(MathVerifierTest, UnmarkedReferencesThatAreNotOneAnswerAreExtractedFrom) {
  const MathVerifier verifier;
  // Prose and solutions do not parse as one answer.
  EXPECT_EQ(verifier.Verify(Request("5", "The answer is 5")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("5", "5 pears")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("72", "48 + 24 = 72.\n#### 72")).reward, 1.0);
  // Prose with nothing to extract is compared as a string.
  EXPECT_EQ(verifier.Verify(Request(Boxed("\\text{no solution}"), "no solution")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request(Boxed("\\text{one solution}"), "no solution")).reward, 0.0);
  // A boxed reference is extracted from, box by box.
  EXPECT_EQ(verifier.Verify(Request(Boxed("1, 2"), "\\boxed{1} and \\boxed{2}")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request(Boxed("2"), "\\boxed{1}\\boxed{2}")).reward, 0.0);
}

TEST(MathVerifierTest, NoAnswerIsAParseError) {
  const MathVerifier verifier;
  for (const std::string response : {"", "   ", "I don't know", "Answer:"}) {
    SCOPED_TRACE(response);
    VerifyOutcome outcome = verifier.Verify(Request(response, "52"));
    EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kParse);
    EXPECT_EQ(outcome.reward, 0.0);
    EXPECT_FALSE(outcome.retryable);
    EXPECT_EQ(outcome.extracted_answer, "");
  }
}

TEST(MathVerifierTest, NonNumericAnswerToNumericReferenceIsWrongNotAnError) {
  const MathVerifier verifier;
  VerifyOutcome outcome = verifier.Verify(Request("The answer is forty-two.", "42"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_EQ(outcome.extracted_answer, "forty-two");
  EXPECT_THAT(outcome.detail, HasSubstr("not a number"));
}

TEST(MathVerifierTest, NonNumericReferenceComparesIgnoringSpacesAndDollars) {
  const MathVerifier verifier;
  EXPECT_EQ(verifier.Verify(Request("the answer is $x^2 + 1$", "x^2+1")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("the answer is x^2 + 2", "x^2+1")).reward, 0.0);
}

TEST(MathVerifierTest, ComparesLatexAnswersSymbolically) {
  const MathVerifier verifier;
  EXPECT_EQ(verifier.Verify(Request("so $\\boxed{3\\sqrt{13}}$", "$\\sqrt{117}$")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("\\boxed{(1,2]}", "(1,2)")).reward, 0.0);
  EXPECT_EQ(verifier.Verify(Request("\\fbox{\\{2,1\\}}", "\\boxed{\\{1,2\\}}")).reward, 1.0);
  EXPECT_EQ(verifier.Verify(Request("Thus $x = \\frac{1}{2}$", "0.5")).reward, 1.0);
  VerifyOutcome huge = verifier.Verify(Request("\\boxed{2^{2^{2^{30}}}}", "4"));
  EXPECT_EQ(huge.reward, 0.0);
  EXPECT_THAT(huge.detail, HasSubstr("too_large"));
}

TEST(MathVerifierTest, ReadsPrecisionAndStrictFromMetadata) {
  const MathVerifier verifier;
  VerifyRequest request = Request("\\boxed{0.33}", "\\frac{1}{3}");
  EXPECT_EQ(verifier.Verify(request).reward, 0.0);
  request.metadata["precision"] = "2";
  EXPECT_EQ(verifier.Verify(request).reward, 1.0);
  request.metadata["precision"] = "lots";
  EXPECT_EQ(verifier.Verify(request).error_kind, VerifierErrorKind::kInvalidInput);
  request.metadata.erase("precision");
  request.metadata["strict"] = "maybe";
  EXPECT_EQ(verifier.Verify(request).error_kind, VerifierErrorKind::kInvalidInput);
}

TEST(MathVerifierOptionsTest, ValidateNamesTheField) {
  MathVerifierOptions options;
  EXPECT_TRUE(options.Validate().ok());
  options.relative_tolerance = -1;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("relative_tolerance"));
  options = {};
  options.max_timeout = absl::Milliseconds(10);
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("max_timeout"));
}

// Throughput on one thread for the arithmetic task's items; a figure for the
// log, not an assertion.
TEST(MathVerifierTest, ReportsSingleThreadThroughput) {
  const MathVerifier verifier;
  std::vector<VerifyRequest> requests;
  for (int i = 0; i < 1000; ++i) {
    const int a = i % 100, b = (i * 7) % 100;
    requests.push_back(
        Request(std::to_string(a + (i % 3 == 0 ? 1 : 0) + b), std::to_string(a + b)));
  }
  const int kRounds = 200;
  double rewards = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < kRounds; ++round) {
    for (const VerifyRequest& request : requests) rewards += verifier.Verify(request).reward;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double count = static_cast<double>(kRounds) * requests.size();
  std::printf("math verifier: %.0f verifications/s on 1 thread (%.0f items, %.3f s)\n",
              count / seconds, count, seconds);
  EXPECT_NEAR(rewards / count, 2.0 / 3.0, 0.01);
}

}  // namespace
}  // namespace sluice::reward_server
