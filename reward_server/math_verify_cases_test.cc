// Agreement of CompareMathAnswers with HuggingFace Math-Verify on the 270
// labelled cases of its test suite (testdata/math_verify/cases.jsonl). Each
// case runs with its own options; agreement is printed per category, and the
// subset run with Math-Verify's default options must agree on >= 95%.

#include <cstdio>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "reward_server/math/math_equivalence.h"
#include "reward_server/math/math_verify_cases.h"

namespace sluice::reward_server {
namespace {

struct Tally {
  int total = 0;
  int agree = 0;
  double Rate() const { return total == 0 ? 0.0 : static_cast<double>(agree) / total; }
};

TEST(MathVerifyCasesTest, AgreesWithMathVerifyOnItsTestCases) {
  absl::StatusOr<std::vector<MathVerifyCase>> cases =
      LoadMathVerifyCases(std::string(SLUICE_TESTDATA_DIR) + "/math_verify/cases.jsonl");
  ASSERT_TRUE(cases.ok()) << cases.status();
  Tally overall, defaults;
  std::map<std::string, Tally> by_category;
  for (const MathVerifyCase& c : *cases) {
    const bool agree = CompareMathAnswers(c.gold, c.prediction, c.options).equal == c.expected;
    for (Tally* tally : {&overall, &by_category[c.category]}) {
      ++tally->total;
      tally->agree += agree;
    }
    if (c.default_options) {
      ++defaults.total;
      defaults.agree += agree;
    }
  }
  for (const auto& [name, tally] : by_category) {
    std::printf("%-40s %4d/%-4d %6.1f%%\n", name.c_str(), tally.agree, tally.total,
                100 * tally.Rate());
  }
  std::printf("%-40s %4d/%-4d %6.1f%%\n", "default options", defaults.agree, defaults.total,
              100 * defaults.Rate());
  std::printf("%-40s %4d/%-4d %6.1f%%\n", "overall", overall.agree, overall.total,
              100 * overall.Rate());
  EXPECT_EQ(overall.total, 270);
  EXPECT_EQ(defaults.total, 149);
  EXPECT_GE(defaults.Rate(), 0.95);
}

}  // namespace
}  // namespace sluice::reward_server
