#include "reward_server/math/latex_parser.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::reward_server::math {
namespace {

std::string Parsed(const std::string& latex) {
  absl::StatusOr<LatexExpr> parsed = ParseLatexAnswer(latex);
  return parsed.ok() ? parsed->DebugString() : "error: " + std::string(parsed.status().message());
}

TEST(LatexParserTest, ParsesCommonAnswerForms) {
  EXPECT_EQ(Parsed("\\frac{1}{2}"), "(/ 1 2)");
  EXPECT_EQ(Parsed("\\frac12"), "(/ 1 2)");
  EXPECT_EQ(Parsed("\\sqrt3"), "(fn:sqrt 3)");
  EXPECT_EQ(Parsed("14{,}916"), "14916");
  EXPECT_EQ(Parsed("7,425,000"), "7425000");
  EXPECT_EQ(Parsed("(1,2]"), "(interval(] 1 2)");
  EXPECT_EQ(Parsed("\\{1,2\\}"), "(set 1 2)");
  EXPECT_EQ(Parsed("(1,2)"), "(tuple 1 2)");
  EXPECT_EQ(Parsed("x \\geq 5"), "(rel x >= 5)");
  EXPECT_EQ(Parsed("28\\%"), "(% 28)");
  EXPECT_EQ(Parsed("90^\\circ"), "90");
  EXPECT_EQ(Parsed("15\\text{ cm}^2"), "15");
  EXPECT_EQ(Parsed("\\pm 2"), "(pm 2)");
  EXPECT_EQ(Parsed("\\begin{pmatrix}1 & 2\\\\3 & 4\\end{pmatrix}"), "(matrix 1 2 3 4)");
}

TEST(LatexParserTest, ReadsAnIntegerBeforeAFractionAsAMixedNumber) {
  EXPECT_EQ(Parsed("1\\frac{4}{5}"), "(+ 1 (/ 4 5))");
  EXPECT_EQ(Parsed("137 \\frac{1}{2}"), "(+ 137 (/ 1 2))");
  EXPECT_EQ(Parsed("-2\\dfrac12"), "(neg (+ 2 (/ 1 2)))");
  // Not mixed numbers: products.
  EXPECT_EQ(Parsed("2\\frac{\\pi}{3}"), "(* 2 (/ pi 3))");
  EXPECT_EQ(Parsed("1.5\\frac{1}{2}"), "(* 1.5 (/ 1 2))");
  EXPECT_EQ(Parsed("2(3/4)"), "(* 2 (/ 3 4))");
  EXPECT_EQ(Parsed("x\\frac{1}{2}"), "(* x (/ 1 2))");
}

std::vector<std::string> Units(const std::string& latex) {
  absl::StatusOr<LatexExpr> parsed = ParseLatexAnswer(latex);
  EXPECT_TRUE(parsed.ok()) << latex << ": " << parsed.status();
  return parsed.ok() ? parsed->units : std::vector<std::string>{};
}

TEST(LatexParserTest, RecordsTheUnitsItDrops) {
  using ::testing::ElementsAre;
  EXPECT_THAT(Units("30^\\circ"), ElementsAre("degree"));
  EXPECT_THAT(Units("30 degrees"), ElementsAre("degree"));
  EXPECT_THAT(Units("\\$36"), ElementsAre("dollar"));
  EXPECT_THAT(Units("36 dollars"), ElementsAre("dollar"));
  EXPECT_THAT(Units("15\\mbox{ cm}^2"), ElementsAre("cm^2"));
  EXPECT_THAT(Units("15 square cm"), ElementsAre("cm^2"));
  EXPECT_THAT(Units("864 \\mbox{ Inches}^2"), ElementsAre("inch^2"));
  EXPECT_THAT(Units("5.4 \\text{ cents}"), ElementsAre("cent"));
  EXPECT_THAT(Units("5 \\text{centimeters}"), ElementsAre("cm"));
  EXPECT_THAT(Units("5 cm"), ElementsAre("cm"));
  EXPECT_THAT(Units("3 feet"), ElementsAre("ft"));
  EXPECT_THAT(Units("2 hrs"), ElementsAre("h"));
  EXPECT_THAT(Units("x^2 + 1"), ElementsAre());
  EXPECT_THAT(Units("28\\%"), ElementsAre());
}

TEST(LatexParserTest, RejectsOrBoundsHostileInput) {
  // Deep nesting is a RESOURCE_EXHAUSTED error, not a stack overflow.
  std::string deep(5000, '(');
  deep += "1" + std::string(5000, ')');
  EXPECT_FALSE(ParseLatexAnswer(deep).ok());
  std::string minus(3000, '-');
  EXPECT_FALSE(ParseLatexAnswer(minus + "1").ok());
  std::string powers;
  for (int i = 0; i < 1000; ++i) powers += "x^{";
  EXPECT_FALSE(ParseLatexAnswer(powers).ok());
  EXPECT_FALSE(ParseLatexAnswer(std::string(1000, '9')).ok());  // > kMaxNumberDigits.
  EXPECT_FALSE(ParseLatexAnswer(std::string(kMaxLatexBytes + 1, 'x')).ok());
  for (const std::string bad : {"", "{", "}", "\\frac{1}{", "\\begin{pmatrix}1&2\\\\3",
                                "\xff\xfe", "\\", "((]", "|x", "\\sqrt[", "x^", "\\{1,2"}) {
    EXPECT_FALSE(ParseLatexAnswer(bad).ok()) << bad;
  }
}

TEST(LatexParserTest, AnyBytesReturn) {
  // Deterministic pseudo-random byte strings, biased towards LaTeX syntax.
  const std::string alphabet = "\\{}()[]^_$%&|,;:=<>+-*/0123456789xyz fracsqrtboxedleft \xe2\x88";
  uint64_t state = 12345;
  for (int n = 0; n < 3000; ++n) {
    std::string input;
    const int length = n % 200;
    for (int i = 0; i < length; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      input.push_back(alphabet[(state >> 33) % alphabet.size()]);
    }
    (void)ParseLatexAnswer(input);  // Returns: ok or an error, never a crash.
  }
}

}  // namespace
}  // namespace sluice::reward_server::math
