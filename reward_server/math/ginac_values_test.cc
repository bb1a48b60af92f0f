#include "reward_server/math/ginac_values.h"

#include <sstream>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "reward_server/math/latex_parser.h"

namespace sluice::reward_server::internal {
namespace {

math::LatexExpr Parse(const std::string& latex) {
  absl::StatusOr<math::LatexExpr> parsed = math::ParseLatexAnswer(latex);
  EXPECT_TRUE(parsed.ok()) << latex << ": " << parsed.status();
  return parsed.ok() ? *std::move(parsed) : math::LatexExpr();
}

// What ConvertToValue makes of `latex`: its kind and, for a scalar, its
// printed expression; "too large" or "error" when it throws.
std::string Converted(const std::string& latex) {
  const math::LatexExpr expr = Parse(latex);
  absl::MutexLock lock(&GinacMutex());
  try {
    SymbolTable symbols;
    const Value value = ConvertToValue(expr, &symbols);
    if (value.kind != VKind::kScalar) {
      return "kind " + std::to_string(static_cast<int>(value.kind)) + " of " +
             std::to_string(value.items.size());
    }
    std::ostringstream out;
    out << value.ex;
    return out.str();
  } catch (const TooLargeError&) {
    return "too large";
  } catch (...) {
    return "error";
  }
}

TEST(GinacValuesTest, ConvertsScalarsExactly) {
  EXPECT_EQ(Converted("\\frac{6}{4}"), "3/2");
  EXPECT_EQ(Converted("52_8"), "42");
  EXPECT_EQ(Converted("i^2"), "-1");
  EXPECT_EQ(Converted("2^{10}"), "1024");
  EXPECT_EQ(Converted("x = 5+5+1 = 11"), "11");
}

TEST(GinacValuesTest, ConvertsStructures) {
  EXPECT_EQ(Converted("1 \\pm 2"), "kind 3 of 2");  // The set {3, -1}.
  EXPECT_EQ(Converted("(1, 2, 3)"), "kind 1 of 3");
  EXPECT_EQ(Converted("\\{1, 2\\}"), "kind 3 of 2");
  EXPECT_EQ(Converted("(1, 2]"), "kind 4 of 2");
  EXPECT_EQ(Converted("x \\le 5"), "kind 6 of 2");
  EXPECT_EQ(Converted("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"), "kind 7 of 4");
}

// Each bound is checked before GiNaC computes what it bounds.
TEST(GinacValuesTest, RefusesValuesOverTheBoundsBeforeComputingThem) {
  EXPECT_EQ(Converted("2^{2^{30}}"), "too large");
  EXPECT_EQ(Converted("(x+1)^{100000}"), "too large");
  EXPECT_EQ(Converted("100000!"), "too large");
  EXPECT_EQ(Converted("((7+i)^{999})^{999}"), "too large");
  EXPECT_EQ(Converted("\\pm 1 \\pm 2 \\pm 3 \\pm 4"), "too large");
  std::string many = "\\{1";
  for (int k = 2; k <= static_cast<int>(kMaxItems) + 1; ++k) many += "," + std::to_string(k);
  EXPECT_EQ(Converted(many + "\\}"), "too large");
}

TEST(GinacValuesTest, AnswersWithoutAValueThrow) {
  EXPECT_EQ(Converted("\\frac{1}{0}"), "error");
  EXPECT_EQ(Converted("0^{-1}"), "error");
  EXPECT_EQ(Converted("\\log(0)"), "error");
}

TEST(GinacValuesTest, IsNameTellsNamesFromValues) {
  const auto is_name = [](const std::string& latex) {
    const math::LatexExpr expr = Parse(latex);
    absl::MutexLock lock(&GinacMutex());
    SymbolTable symbols;
    return IsName(ConvertToValue(expr, &symbols));
  };
  EXPECT_TRUE(is_name("x"));
  EXPECT_TRUE(is_name("f(x)"));
  EXPECT_TRUE(is_name("(p, q)"));
  EXPECT_FALSE(is_name("5"));
  EXPECT_FALSE(is_name("x + 1"));
  EXPECT_FALSE(is_name("28\\%"));
}

}  // namespace
}  // namespace sluice::reward_server::internal
