#include "reward_server/math/latex_words.h"

#include <string>

#include "gtest/gtest.h"

namespace sluice::reward_server::math {
namespace {

TEST(LatexWordsTest, ClassifiesCommandNames) {
  EXPECT_TRUE(IsGreek("alpha"));
  EXPECT_TRUE(IsGreek("Omega"));
  EXPECT_FALSE(IsGreek("pi"));  // A constant, not a symbol.
  EXPECT_TRUE(IsFunctionName("arctan"));
  EXPECT_FALSE(IsFunctionName("sqrt"));
  EXPECT_TRUE(IsTextCommand("operatorname"));
  EXPECT_TRUE(IsDecorationCommand("overline"));
  EXPECT_FALSE(IsDecorationCommand("text"));
}

TEST(LatexWordsTest, ClassifiesWordsInAnyCase) {
  EXPECT_TRUE(IsUnitWord("cm"));
  EXPECT_TRUE(IsUnitWord("Dollars"));
  EXPECT_FALSE(IsUnitWord("m"));  // A single letter is a variable.
  EXPECT_FALSE(IsUnitWord("cmx"));
  EXPECT_TRUE(IsPercentWord("Percent"));
  EXPECT_TRUE(IsSeparatorWord("AND"));
  EXPECT_FALSE(IsSeparatorWord("andor"));
}

TEST(LatexWordsTest, UnitKeysAreCanonical) {
  EXPECT_EQ(UnitKey(" cm", "2"), "cm^2");
  EXPECT_EQ(UnitKey("square cm", ""), "cm^2");
  EXPECT_EQ(UnitKey("cubic meters", ""), "m^3");
  EXPECT_EQ(UnitKey("Inches", "2"), "inch^2");
  EXPECT_EQ(UnitKey("centimeters", ""), "cm");
  EXPECT_EQ(UnitKey("feet", "1"), "ft");
  EXPECT_EQ(UnitKey("km per hour", ""), "km per h");
}

TEST(LatexWordsTest, TellsProseFromOneAnswer) {
  for (const std::string prose :
       {"The answer is 5", "5 pears", "She sold 48 + 24 = 72.\n#### 72", "Evelyn and Briana"}) {
    EXPECT_TRUE(LooksLikeProse(prose)) << prose;
  }
  for (const std::string answer :
       {"Evelyn", "\\text{Evelyn}", "\\text{The midpoints form a hexagon}", "5 cm",
        "10 square units", "\\sin x", "3 pi", "x^2 + 1", "1 or 2", "6 - 5i", "x \\in [-2,7]",
        "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", ""}) {
    EXPECT_FALSE(LooksLikeProse(answer)) << answer;
  }
}

}  // namespace
}  // namespace sluice::reward_server::math
