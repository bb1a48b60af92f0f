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

namespace {

using ::nlohmann::json;
using ::sluice::reward_server::CompareMathAnswers;
using ::sluice::reward_server::MathCompareErrorName;
using ::sluice::reward_server::MathCompareOptions;
using ::sluice::reward_server::MathComparison;

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
  std::ifstream in(cases_path);
  if (!in) {
    std::cerr << "cannot open " << cases_path << "\n";
    return 1;
  }
  Tally overall, defaults;
  std::map<std::string, Tally> by_category;
  json disagreements = json::array();
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    json c = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (c.is_discarded()) {
      std::cerr << cases_path << ":" << line_number << ": bad JSON\n";
      return 1;
    }
    MathCompareOptions options;
    bool is_default = true;
    if (c.contains("match_types") && c["match_types"].is_array()) {
      options.match_latex = options.match_expr = false;
      for (const json& type : c["match_types"]) {
        if (type == "latex") options.match_latex = true;
        if (type == "expr") options.match_expr = true;
      }
      options.precision = c.value("precision", 6);
      options.strict = c.value("strict", true);
      options.allow_set_relation_comp = c.value("allow_set_relation_comp", false);
      is_default = options.match_latex && options.match_expr && options.precision == 6 &&
                   options.strict && !options.allow_set_relation_comp;
    }
    const std::string gold = c.value("gold", "");
    const std::string prediction = c.value("prediction", "");
    const bool expected = c.value("expected", false);
    const MathComparison result = CompareMathAnswers(gold, prediction, options);
    const bool agree = result.equal == expected;
    const std::string category = c.value("test", "unknown");
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
