#include "reward_server/math/latex_words.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace sluice::reward_server::math {
namespace {

bool IsLetter(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)); }

bool OneOf(absl::string_view name, std::initializer_list<absl::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// One unit word in a canonical spelling: lower case, singular, and the
// usual abbreviation for a spelled-out unit ("Inches" -> "inch",
// "centimeters" -> "cm", "degrees" -> "degree", "dollars" -> "dollar").
std::string CanonicalUnitWord(absl::string_view word) {
  std::string lower = absl::AsciiStrToLower(word);
  if (OneOf(lower, {"feet", "foot"})) return "ft";
  if (OneOf(lower, {"deg", "degs"})) return "degree";
  if (lower.size() > 4 && (absl::EndsWith(lower, "ches") || absl::EndsWith(lower, "shes") ||
                           absl::EndsWith(lower, "xes"))) {
    lower.resize(lower.size() - 2);
  } else if (lower.size() > 2 && lower.back() == 's' && lower[lower.size() - 2] != 's') {
    lower.pop_back();
  }
  static constexpr std::pair<absl::string_view, absl::string_view> kAbbreviations[] = {
      {"centimeter", "cm"}, {"centimetre", "cm"}, {"millimeter", "mm"}, {"millimetre", "mm"},
      {"kilometer", "km"},  {"kilometre", "km"},  {"meter", "m"},       {"metre", "m"},
      {"kilogram", "kg"},   {"gram", "g"},        {"liter", "l"},       {"litre", "l"},
      {"milliliter", "ml"}, {"millilitre", "ml"}, {"second", "s"},      {"sec", "s"},
      {"minute", "min"},    {"hour", "h"},        {"hr", "h"},          {"pound", "lb"},
      {"mile", "mi"},       {"yard", "yd"},       {"ounce", "oz"},
  };
  for (const auto& [spelled, abbreviation] : kAbbreviations) {
    if (lower == spelled) return std::string(abbreviation);
  }
  return lower;
}

}  // namespace

bool IsGreek(absl::string_view name) {
  return OneOf(name, {"alpha", "beta",    "gamma",   "delta", "epsilon", "varepsilon", "zeta",
                      "eta",   "theta",   "vartheta", "iota", "kappa",   "lambda",     "mu",
                      "nu",    "xi",      "rho",     "sigma", "tau",     "upsilon",    "phi",
                      "varphi", "chi",    "psi",     "omega", "Gamma",   "Delta",      "Theta",
                      "Lambda", "Xi",     "Sigma",   "Phi",   "Psi",     "Omega"});
}

bool IsFunctionName(absl::string_view name) {
  return OneOf(name, {"sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan",
                      "sinh", "cosh", "tanh", "ln", "log", "exp", "lg"});
}

bool IsTextCommand(absl::string_view name) {
  return OneOf(name, {"text", "textbf", "textit", "textrm", "textnormal", "textsf", "texttt",
                      "mbox", "hbox", "mathrm", "mathbf", "mathit", "mathsf", "mathtt",
                      "operatorname", "emph", "textup", "mathnormal"});
}

bool IsDecorationCommand(absl::string_view name) {
  return OneOf(name, {"overline", "vec", "hat", "bar", "widehat", "overrightarrow", "tilde",
                      "widetilde", "dot", "underline", "mathcal", "mathbb"});
}

bool IsUnitWord(absl::string_view word) {
  std::string lower = absl::AsciiStrToLower(word);
  return OneOf(lower, {"cm",      "mm",     "km",      "m",       "meter",   "meters",
                       "metre",   "metres", "inch",    "inches",  "ft",      "feet",
                       "foot",    "yard",   "yards",   "mile",    "miles",   "kg",
                       "g",       "gram",   "grams",   "lb",      "lbs",     "pound",
                       "pounds",  "ounce",  "ounces",  "dollar",  "dollars", "cent",
                       "cents",   "yuan",   "euro",    "euros",   "degree",  "degrees",
                       "second",  "seconds", "sec",    "minute",  "minutes", "min",
                       "hour",    "hours",  "hr",      "hrs",     "day",     "days",
                       "week",    "weeks",  "month",   "months",  "year",    "years",
                       "unit",    "units",  "sq",      "square",  "cubic",   "liter",
                       "liters",  "ml",     "l",       "mph",     "kmh",     "people",
                       "students", "times", "ways",    "points",  "apples",  "rad",
                       "radians", "s"}) &&
         word.size() >= 2;
}

bool IsPercentWord(absl::string_view word) {
  std::string lower = absl::AsciiStrToLower(word);
  return lower == "percent" || lower == "percentage" || lower == "pct";
}

bool IsSeparatorWord(absl::string_view word) {
  std::string lower = absl::AsciiStrToLower(word);
  return lower == "and" || lower == "or";
}

std::string UnitKey(absl::string_view words, absl::string_view power) {
  std::string key;
  std::string word_power(power);
  std::string word;
  const auto flush = [&]() {
    if (word.empty()) return;
    const std::string canonical = CanonicalUnitWord(word);
    word.clear();
    if (canonical == "square" || canonical == "sq") {
      word_power = "2";
    } else if (canonical == "cubic") {
      word_power = "3";
    } else {
      absl::StrAppend(&key, key.empty() ? "" : " ", canonical);
    }
  };
  for (const char c : words) {
    if (IsLetter(c)) {
      word.push_back(c);
    } else {
      flush();
    }
  }
  flush();
  if (!word_power.empty() && word_power != "1") absl::StrAppend(&key, "^", word_power);
  return key;
}

bool LooksLikeProse(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (std::all_of(text.begin(), text.end(), IsLetter)) return false;  // One word: "Evelyn".
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\\') {
      // A command: its name, and for \text-like ones and environments the
      // braced argument, are not words.
      size_t end = i + 1;
      while (end < text.size() && IsLetter(text[end])) ++end;
      const absl::string_view name = text.substr(i + 1, end - i - 1);
      i = std::max(end, i + 2);
      if (IsTextCommand(name) || name == "begin" || name == "end") {
        while (i < text.size() && text[i] == ' ') ++i;
        if (i < text.size() && text[i] == '{') {
          size_t depth = 0;
          for (; i < text.size(); ++i) {
            if (text[i] == '{') ++depth;
            if (text[i] == '}' && --depth == 0) break;
          }
          ++i;
        }
      }
      continue;
    }
    if (!IsLetter(c)) {
      ++i;
      continue;
    }
    const bool starts_word = i == 0 || absl::ascii_isspace(static_cast<unsigned char>(text[i - 1]));
    size_t end = i;
    while (end < text.size() && IsLetter(text[end])) ++end;
    const absl::string_view word = text.substr(i, end - i);
    i = end;
    if (starts_word && word.size() >= 2 && !IsUnitWord(word) && !IsSeparatorWord(word) &&
        !IsPercentWord(word) && !IsFunctionName(word) &&
        !OneOf(word, {"pi", "sqrt", "infty", "inf", "infinity"})) {
      return true;
    }
  }
  return false;
}

}  // namespace sluice::reward_server::math
