// Agreement of CompareMathAnswers with HuggingFace Math-Verify on the 270
// labelled cases of its test suite (testdata/math_verify/cases.jsonl). Each
// case runs with its own options; agreement is printed per category, and the
// subset run with Math-Verify's default options must agree on >= 95%.

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "reward_server/math/math_equivalence.h"

namespace sluice::reward_server {
namespace {

struct Tally {
  int total = 0;
  int agree = 0;
  double Rate() const { return total == 0 ? 0.0 : static_cast<double>(agree) / total; }
};

TEST(MathVerifyCasesTest, AgreesWithMathVerifyOnItsTestCases) {
  const std::string path = std::string(SLUICE_TESTDATA_DIR) + "/math_verify/cases.jsonl";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  Tally overall, defaults;
  std::map<std::string, Tally> by_category;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json c = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(c.is_discarded()) << line;
    MathCompareOptions options;
    bool is_default = true;  // The verify(parse(gold), parse(pred)) lines.
    if (c.contains("match_types") && c["match_types"].is_array()) {
      options.match_latex = options.match_expr = false;
      for (const nlohmann::json& type : c["match_types"]) {
        if (type == "latex") options.match_latex = true;
        if (type == "expr") options.match_expr = true;
      }
      options.precision = c.value("precision", 6);
      options.strict = c.value("strict", true);
      options.allow_set_relation_comp = c.value("allow_set_relation_comp", false);
      is_default = options.match_latex && options.match_expr && options.precision == 6 &&
                   options.strict && !options.allow_set_relation_comp;
    }
    const MathComparison result =
        CompareMathAnswers(c.value("gold", ""), c.value("prediction", ""), options);
    const bool agree = result.equal == c.value("expected", false);
    for (Tally* tally : {&overall, &by_category[c.value("test", "unknown")]}) {
      ++tally->total;
      tally->agree += agree;
    }
    if (is_default) {
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
