#include "reward_server/math/math_equivalence.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::reward_server {
namespace {

bool Same(const std::string& gold, const std::string& prediction,
          const MathCompareOptions& options = {}) {
  return CompareMathAnswers(gold, prediction, options).equal;
}

TEST(CompareMathAnswersTest, EquivalentForms) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"$\\frac{1}{2}$", "0.5"},
      {"$\\frac{10}{9}$", "10/9"},
      {"$3\\sqrt{13}$", "\\boxed{\\sqrt{117}}"},
      {"$\\frac{9}{4}\\pi$", "\\boxed{\\frac94\\pi}"},
      {"$x^2-1$", "\\boxed{(x-1)(x+1)}"},
      {"$\\tan^2(y)+1$", "$\\sec^2(y)$"},
      {"$x = 5$", "\\boxed{5}"},
      {"$5$", "The answer is $x=5$."},
      {"$\\{1,2\\}$", "\\boxed{\\{2,1\\}}"},
      {"$(1,2]\\cup[3,\\infty)$", "\\boxed{(1,2] \\cup [3, \\infty)}"},
      {"$(7,6)$", "so $(x, y) = (7, 6)$"},
      {"$\\text{(B)}$", "\\boxed{B}"},
      {"$28\\%$", "28"},
      {"$28\\%$", "0.28"},
      {"#### 7425000", "The total is 7,425,000"},
      {"$1 \\pm \\sqrt{19}$", "\\boxed{1+\\sqrt{19}, 1-\\sqrt{19}}"},
      {"$x \\geq 5$", "$5 \\leq x$"},
      {"$2x+4y-3=0$", "$y=-\\frac{1}{2}x+\\frac{3}{4}$"},
      {"$\\ln(e^2)$", "2"},
      {"$\\log_2 8$", "3"},
      {"$-5$", "\xE2\x88\x92" "5"},
      {"$\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}$", "\\boxed{\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}}"},
      {"$12345678901234567890123$", "\\boxed{12345678901234567890123}"},
  };
  for (const auto& [gold, prediction] : cases) {
    EXPECT_TRUE(Same(gold, prediction)) << gold << " vs " << prediction;
  }
}

// False positives are reward hacking: each of these must not match.
TEST(CompareMathAnswersTest, DifferentAnswersDoNotMatch) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"5", "6"},
      {"$x+1$", "$x-1$"},
      {"$\\{1,2\\}$", "$\\{1,3\\}$"},
      {"$(1,2)$", "$[1,2]$"},
      {"$[1,2)$", "$[1,2]$"},
      {"$2\\pi$", "6.28"},
      {"$\\frac{1}{3}$", "0.33"},
      {"$(1,2)$", "$(2,1)$"},
      {"$\\{1,2\\}$", "$\\{1,2,3\\}$"},
      {"$x > 5$", "$x < 5$"},
      {"$x \\geq 5$", "$x > 5$"},
      {"$a+3z = 0$", "0"},
      {"$\\pm 2021$", "2021"},
      {"$12345678901234567890123$", "12345678901234567890124"},
      {"$f(x)$", "$f(y)$"},
      {"$\\sqrt{2}$", "1.414"},
      {"$2$", "\\boxed{1, 2, 3, 4, 5}"},  // Listing many answers is not a hedge.
      {"$2$", "\\boxed{1} or \\boxed{2}"},
      {"$3$", ""},
      {"$3$", "I do not know"},
  };
  for (const auto& [gold, prediction] : cases) {
    EXPECT_FALSE(Same(gold, prediction)) << gold << " vs " << prediction;
  }
}

TEST(CompareMathAnswersTest, GoldIsAnswerParsesTheWholeGoldFirst) {
  MathCompareOptions answer;
  answer.gold_is_answer = true;
  // Extracted from, these read as their first or last number.
  EXPECT_FALSE(Same("3\\sqrt{13}", "\\boxed{\\sqrt{117}}"));
  EXPECT_TRUE(Same("3\\sqrt{13}", "\\boxed{\\sqrt{117}}", answer));
  EXPECT_FALSE(Same("3\\sqrt{13}", "\\boxed{3}", answer));
  EXPECT_TRUE(Same("1,-2", "\\boxed{-2, 1}", answer));
  EXPECT_FALSE(Same("1,-2", "\\boxed{1}", answer));
  EXPECT_TRUE(Same("\\text{Evelyn}", "\\boxed{Evelyn}", answer));
  EXPECT_EQ(CompareMathAnswers("\\text{Evelyn}", "\\boxed{Evelyn}", answer).gold_answer,
            "\\text{Evelyn}");
  // What is not one answer is still extracted from.
  EXPECT_TRUE(Same("The answer is 5", "\\boxed{5}", answer));
  EXPECT_TRUE(Same("#### 18", "\\boxed{18}", answer));
  EXPECT_TRUE(Same("\\boxed{1}\\boxed{2}", "\\boxed{1,2}", answer));
}

TEST(CompareMathAnswersTest, ComplexNumbersBasesAndUnits) {
  const std::vector<std::pair<std::string, std::string>> equal = {
      {"$6 - 5i$", "\\boxed{-5i+6}"},
      {"$i^2$", "\\boxed{-1}"},
      {"$\\frac{1}{1+i}$", "\\boxed{\\frac{1-i}{2}}"},
      {"$52_8$", "\\boxed{42}"},
      {"$4210_{5}$", "\\boxed{555}"},
      {"$1\\frac{4}{5}$", "\\boxed{1.8}"},
      {"$30^\\circ$", "\\boxed{30}"},
      {"$15\\mbox{ cm}^2$", "\\boxed{15 \\text{ cm}^2}"},
  };
  for (const auto& [gold, prediction] : equal) {
    EXPECT_TRUE(Same(gold, prediction)) << gold << " vs " << prediction;
  }
  const std::vector<std::pair<std::string, std::string>> different = {
      {"$6 - 5i$", "\\boxed{6 + 5i}"},
      {"$52_8$", "\\boxed{52}"},  // Fifty-two, not 52 in base 8.
      {"$19_8$", "\\boxed{17}"},  // 9 is no digit in base 8: not a number.
      {"$1\\frac{4}{5}$", "\\boxed{\\frac45}"},
      {"$36^\\circ$", "\\boxed{\\$36}"},
      {"$5\\text{ cm}$", "\\boxed{5\\text{ m}}"},
  };
  for (const auto& [gold, prediction] : different) {
    EXPECT_FALSE(Same(gold, prediction)) << gold << " vs " << prediction;
  }
}

TEST(CompareMathAnswersTest, PrecisionOptionRoundsDecimals) {
  MathCompareOptions options;
  options.precision = 2;
  EXPECT_TRUE(Same("$\\frac{1}{3}$", "0.33", options));
  options.precision = 6;
  EXPECT_FALSE(Same("$\\frac{1}{3}$", "0.33", options));
  options.precision = 99;
  EXPECT_FALSE(options.Validate().ok());
}

// Each returns, equal or not, usually as kTooLarge; none may hang or crash.
TEST(CompareMathAnswersTest, PathologicalInputsReturn) {
  const std::vector<std::string> inputs = {
      "$2^{2^{2^{30}}}$",
      "$(x+1)^{100000}$",
      "$100000!$",
      "$10^{10^{10}}$",
      "$x^{2^{30}}$",
      "$\\sin(10^{5000})$",
      "$((((((((((((((((((((((((((((((((((((((((x))))))))))))))))))))))))))))))))))))))))$",
      "$" + std::string(3000, '9') + "$",
      "$" + std::string(20000, '{') + "$",
      "\\boxed{" + std::string(100000, '(') + "}",
      "$\\frac{1}{0}$",
      "$0^{-1}$",
      "$\\log(0)$",
      "$(-8)^{1/3}$",
      "$e^{e^{e^{e^{100}}}}$",
      "$2^{1000} \\cdot 2^{1000} \\cdot 2^{1000} \\cdot 2^{1000} \\cdot 2^{1000}$",
      "$((10^{300}+i)^{999})^{999}$",  // Exact complex powers are bounded too.
      "$((7+i)^{999})^{999}$",
      "$1:0^0$",
      "$0^{-2}$",
      "$\\pm\\pm\\pm\\pm\\pm\\pm\\pm\\pm\\pm\\pm 1 \\pm 2 \\pm 3 \\pm 4 \\pm 5$",
      std::string(1 << 20, '$'),
      std::string(1 << 20, '1'),
  };
  for (const std::string& input : inputs) {
    SCOPED_TRACE(input.substr(0, 60));
    const MathComparison a = CompareMathAnswers(input, "$2$");
    const MathComparison b = CompareMathAnswers("$2$", input);
    EXPECT_FALSE(a.equal && b.equal && input.size() > 100);
    (void)ParseMathAnswerForFuzzing(input);
  }
  // Towers over a symbol parse (their exponents are not numbers) and blow
  // up only at the evaluation points, where x is a float: the evaluation
  // refuses values past 2^(10^5) instead of asking CLN for gigabytes
  // (found by the fuzzer: "2^{2^{2^{2^{30}$frac13 }}}" wanted 6 GB).
  for (const char* tower : {"$2^{2^{2^{2^{30}x}}}$", "$e^{e^{e^{2^{30}x}}}$",
                            "$\\exp(\\exp(2^{20}x))$"}) {
    SCOPED_TRACE(tower);
    const MathComparison c = CompareMathAnswers(tower, "$2^{2^{2^{2^{30}y}}}$");
    EXPECT_FALSE(c.equal);
  }
  EXPECT_EQ(CompareMathAnswers("$2$", "$2^{2^{2^{30}}}$").error, MathCompareError::kTooLarge);
  EXPECT_EQ(CompareMathAnswers("$2$", "$100000!$").error, MathCompareError::kTooLarge);
  EXPECT_EQ(CompareMathAnswers("$2$", "$(x+1)^{100000}$").error, MathCompareError::kTooLarge);
  EXPECT_EQ(CompareMathAnswers("$2$", "$((10^{300}+i)^{999})^{999}$").error,
            MathCompareError::kTooLarge);
}

}  // namespace
}  // namespace sluice::reward_server
