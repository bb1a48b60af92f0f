// math_agreement: how often CompareMathAnswers agrees with Math-Verify on
// the labelled cases of testdata/math_verify/cases.jsonl (testdata/README.md).
//
//   math_agreement [--cases FILE] [--json FILE] [--verbose]
//
// Prints agreement per category (the case's `test` field), for the subset
// run with Math-Verify's default options, and overall; --json writes
// {"overall", "default_options", "by_category", "disagreements"}.
// Exit status 0 (a report, not a gate: math_verify_cases_test asserts).

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "nlohmann/json.hpp"
#include "reward_server/math/math_equivalence.h"
#include "reward_server/math/math_verify_cases.h"

namespace {

using ::nlohmann::json;
using ::sluice::reward_server::CompareMathAnswers;
using ::sluice::reward_server::MathCompareErrorName;
using ::sluice::reward_server::MathCompareOptions;
using ::sluice::reward_server::MathComparison;
using ::sluice::reward_server::LoadMathVerifyCases;
using ::sluice::reward_server::MathVerifyCase;

struct Tally {
  int total = 0;
  int agree = 0;
  json ToJson() const {
    return {{"total", total},
            {"agree", agree},
            {"agreement", total == 0 ? 0.0 : static_cast<double>(agree) / total}};
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string cases_path = std::string(SLUICE_TESTDATA_DIR) + "/math_verify/cases.jsonl";
  std::string json_path;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cases" && i + 1 < argc) {
      cases_path = argv[++i];
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--verbose") {
      verbose = true;
    } else {
      std::cerr << "usage: math_agreement [--cases FILE] [--json FILE] [--verbose]\n";
      return 2;
    }
  }
  absl::StatusOr<std::vector<MathVerifyCase>> cases = LoadMathVerifyCases(cases_path);
  if (!cases.ok()) {
    std::cerr << cases.status().message() << "\n";
    return 1;
  }
  Tally overall, defaults;
  std::map<std::string, Tally> by_category;
  json disagreements = json::array();
  for (const MathVerifyCase& c : *cases) {
    const int line_number = c.line;
    const std::string& gold = c.gold;
    const std::string& prediction = c.prediction;
    const bool expected = c.expected;
    const bool is_default = c.default_options;
    const MathComparison result = CompareMathAnswers(gold, prediction, c.options);
    const bool agree = result.equal == expected;
    const std::string& category = c.category;
    for (Tally* tally : {&overall, &by_category[category]}) {
      ++tally->total;
      tally->agree += agree;
    }
    if (is_default) {
      ++defaults.total;
      defaults.agree += agree;
    }
    if (!agree) {
      disagreements.push_back({{"line", line_number},
                               {"test", category},
                               {"default_options", is_default},
                               {"expected", expected},
                               {"gold_answer", result.gold_answer},
                               {"prediction_answer", result.prediction_answer},
                               {"gold_normalized", result.gold_normalized},
                               {"prediction_normalized", result.prediction_normalized},
                               {"error", std::string(MathCompareErrorName(result.error))},
                               {"error_detail", result.error_detail}});
      if (verbose) {
        std::printf("line %d [%s] expected %d: gold %s | pred %s | %s\n", line_number,
                    category.c_str(), expected, result.gold_normalized.c_str(),
                    result.prediction_normalized.c_str(), result.error_detail.c_str());
      }
    }
  }
  std::printf("%-40s %6s %6s %8s\n", "category", "agree", "total", "rate");
  json categories = json::object();
  for (const auto& [name, tally] : by_category) {
    std::printf("%-40s %6d %6d %7.1f%%\n", name.c_str(), tally.agree, tally.total,
                100.0 * tally.agree / tally.total);
    categories[name] = tally.ToJson();
  }
  std::printf("%-40s %6d %6d %7.1f%%\n", "DEFAULT OPTIONS", defaults.agree, defaults.total,
              defaults.total ? 100.0 * defaults.agree / defaults.total : 0.0);
  std::printf("%-40s %6d %6d %7.1f%%\n", "OVERALL", overall.agree, overall.total,
              overall.total ? 100.0 * overall.agree / overall.total : 0.0);
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << json{{"overall", overall.ToJson()},
                {"default_options", defaults.ToJson()},
                {"by_category", categories},
                {"disagreements", disagreements}}
               .dump(2)
        << "\n";
    if (!out) {
      std::cerr << "cannot write " << json_path << "\n";
      return 1;
    }
  }
  return 0;
}
