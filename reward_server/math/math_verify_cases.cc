#include "reward_server/math/math_verify_cases.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sluice::reward_server {

absl::StatusOr<std::vector<MathVerifyCase>> LoadMathVerifyCases(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<MathVerifyCase> cases;
  std::string text;
  int line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.empty()) continue;
    const nlohmann::json c = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!c.is_object() || !c.contains("gold") || !c.contains("prediction") ||
        !c.contains("expected")) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ": not a case (want gold, prediction, expected)"));
    }
    MathVerifyCase one;
    one.line = line;
    one.gold = c.value("gold", "");
    one.prediction = c.value("prediction", "");
    one.expected = c.value("expected", false);
    one.category = c.value("test", "unknown");
    if (c.contains("match_types") && c["match_types"].is_array()) {
      MathCompareOptions& options = one.options;
      options.match_latex = options.match_expr = false;
      for (const nlohmann::json& type : c["match_types"]) {
        if (type == "latex") options.match_latex = true;
        if (type == "expr") options.match_expr = true;
      }
      options.precision = c.value("precision", 6);
      options.strict = c.value("strict", true);
      options.allow_set_relation_comp = c.value("allow_set_relation_comp", false);
      one.default_options = options.match_latex && options.match_expr &&
                            options.precision == 6 && options.strict &&
                            !options.allow_set_relation_comp;
    }
    cases.push_back(std::move(one));
  }
  return cases;
}

}  // namespace sluice::reward_server
