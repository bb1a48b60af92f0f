#include "reward_server/math_verifier.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/charconv.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "reward_server/math/answer_extraction.h"

namespace sluice::reward_server {
namespace {

using internal::ScanNumber;
using internal::SignLength;
using internal::TrimAnswer;

constexpr absl::string_view kBoxedOpen = "\\boxed{";
// Numbers quoted in details are cut to this many bytes.
constexpr size_t kDetailNumberBytes = 80;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// A number split into normalised parts (see NormalizeNumber).
struct ParsedNumber {
  bool negative = false;
  std::string integer;      // Digits, no leading zeros; "0" for zero.
  std::string decimals;     // Digits after the point, no trailing zeros.
  std::string denominator;  // Empty, or digits without leading zeros, not "0" or "1".

  bool IsInteger() const { return decimals.empty() && denominator.empty(); }

  std::string Canonical() const {
    std::string text;
    text.reserve(integer.size() + decimals.size() + denominator.size() + 3);
    if (negative) text.push_back('-');
    text.append(integer);
    if (!decimals.empty()) absl::StrAppend(&text, ".", decimals);
    if (!denominator.empty()) absl::StrAppend(&text, "/", denominator);
    return text;
  }
};

void StripLeadingZeros(std::string* digits) {
  size_t zeros = 0;
  while (zeros + 1 < digits->size() && (*digits)[zeros] == '0') ++zeros;
  digits->erase(0, zeros);
}

// Normalises the parts; false when the number is invalid (zero denominator).
bool Canonicalise(ParsedNumber* number) {
  if (number->integer.empty()) number->integer = "0";
  StripLeadingZeros(&number->integer);
  while (!number->decimals.empty() && number->decimals.back() == '0') number->decimals.pop_back();
  if (!number->denominator.empty()) {
    StripLeadingZeros(&number->denominator);
    if (number->denominator == "0") return false;
    if (number->denominator == "1") number->denominator.clear();
  }
  if (number->integer == "0" && number->decimals.empty()) number->negative = false;
  return true;
}

// Parses a whole token accepted by ScanNumber.
std::optional<ParsedNumber> ParseToken(absl::string_view token) {
  ParsedNumber number;
  size_t i = 0;
  const size_t sign = SignLength(token, 0);
  if (sign > 0) {
    number.negative = token[0] != '+';
    i = sign;
  }
  std::string* part = &number.integer;
  number.integer.reserve(token.size());
  for (; i < token.size(); ++i) {
    const char c = token[i];
    if (IsDigit(c)) {
      part->push_back(c);
    } else if (c == '.') {
      part = &number.decimals;
    } else if (c == '/') {
      part = &number.denominator;
    }  // ',' separators are dropped.
  }
  if (!Canonicalise(&number)) return std::nullopt;
  return number;
}

// Drops whitespace, "$", "\$" and a trailing period around a number.
absl::string_view StripNumberDecoration(absl::string_view text) {
  while (true) {
    const absl::string_view before = text;
    text = TrimAnswer(text);
    if (absl::ConsumePrefix(&text, "\\$")) continue;
    if (absl::ConsumePrefix(&text, "$")) continue;
    if (absl::ConsumeSuffix(&text, "\\$")) continue;
    if (absl::ConsumeSuffix(&text, "$")) continue;
    if (text == before) return text;
  }
}

// "{a}{b}" after \frac: the two brace groups, flat (no nested braces).
bool SplitFracArguments(absl::string_view text, absl::string_view* numerator,
                        absl::string_view* denominator) {
  absl::string_view rest = absl::StripLeadingAsciiWhitespace(text);
  absl::string_view* parts[2] = {numerator, denominator};
  for (absl::string_view* part : parts) {
    if (!absl::ConsumePrefix(&rest, "{")) return false;
    const size_t close = rest.find('}');
    if (close == absl::string_view::npos) return false;
    *part = rest.substr(0, close);
    if (part->find('{') != absl::string_view::npos) return false;
    rest.remove_prefix(close + 1);
    rest = absl::StripLeadingAsciiWhitespace(rest);
  }
  return rest.empty();
}

// An integer (with optional sign) making up all of `text`.
std::optional<ParsedNumber> ParseWholeInteger(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty() || ScanNumber(text, 0, /*allow_sign=*/true) != text.size()) return std::nullopt;
  std::optional<ParsedNumber> number = ParseToken(text);
  if (!number.has_value() || !number->IsInteger()) return std::nullopt;
  return number;
}

std::optional<ParsedNumber> ParseLatexFraction(absl::string_view text) {
  bool negative = false;
  if (const size_t sign = SignLength(text, 0); sign > 0) {
    negative = text[0] != '+';
    text.remove_prefix(sign);
    text = absl::StripLeadingAsciiWhitespace(text);
  }
  if (!absl::ConsumePrefix(&text, "\\frac") && !absl::ConsumePrefix(&text, "\\dfrac") &&
      !absl::ConsumePrefix(&text, "\\tfrac")) {
    return std::nullopt;
  }
  absl::string_view numerator_text, denominator_text;
  if (!SplitFracArguments(text, &numerator_text, &denominator_text)) return std::nullopt;
  std::optional<ParsedNumber> numerator = ParseWholeInteger(numerator_text);
  std::optional<ParsedNumber> denominator = ParseWholeInteger(denominator_text);
  if (!numerator.has_value() || !denominator.has_value()) return std::nullopt;
  ParsedNumber number;
  number.negative = negative != (numerator->negative != denominator->negative);
  number.integer = std::move(numerator->integer);
  number.denominator = std::move(denominator->integer);
  if (!Canonicalise(&number)) return std::nullopt;
  return number;
}

std::optional<ParsedNumber> ParseNumber(absl::string_view text) {
  text = StripNumberDecoration(text);
  if (text.empty()) return std::nullopt;
  if (absl::StrContains(text, "frac")) return ParseLatexFraction(text);
  if (ScanNumber(text, 0, /*allow_sign=*/true) != text.size()) return std::nullopt;
  return ParseToken(text);
}

std::optional<double> ParseDouble(absl::string_view digits) {
  double value = 0;
  const absl::from_chars_result result =
      absl::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (result.ec != std::errc() || result.ptr != digits.data() + digits.size() ||
      !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

// The value as a double; nullopt beyond double's range.
std::optional<double> ToDouble(const ParsedNumber& number) {
  std::string text = number.integer;
  if (!number.decimals.empty()) absl::StrAppend(&text, ".", number.decimals);
  std::optional<double> value = ParseDouble(text);
  if (!value.has_value()) return std::nullopt;
  if (!number.denominator.empty()) {
    std::optional<double> denominator = ParseDouble(number.denominator);
    if (!denominator.has_value() || *denominator == 0) return std::nullopt;
    *value /= *denominator;
    if (!std::isfinite(*value)) return std::nullopt;
  }
  return number.negative ? -*value : *value;
}

bool ParsedNumbersEqual(const ParsedNumber& a, const ParsedNumber& b, double relative_tolerance) {
  if (a.negative == b.negative && a.integer == b.integer && a.decimals == b.decimals &&
      a.denominator == b.denominator) {
    return true;
  }
  if (a.IsInteger() && b.IsInteger()) return false;  // Exact, any length.
  const std::optional<double> x = ToDouble(a);
  const std::optional<double> y = ToDouble(b);
  if (!x.has_value() || !y.has_value()) return false;
  return std::fabs(*x - *y) <= relative_tolerance * std::max(std::fabs(*x), std::fabs(*y));
}

std::string Quoted(absl::string_view text) {
  std::string shown(text);
  TruncateUtf8(&shown, kDetailNumberBytes);
  return shown;
}

}  // namespace

std::optional<std::string> NormalizeNumber(absl::string_view text) {
  std::optional<ParsedNumber> number = ParseNumber(text);
  if (!number.has_value()) return std::nullopt;
  return number->Canonical();
}

bool NumbersEqual(absl::string_view a, absl::string_view b, double relative_tolerance) {
  const std::optional<ParsedNumber> x = ParseNumber(a);
  if (!x.has_value()) return false;
  const std::optional<ParsedNumber> y = ParseNumber(b);
  if (!y.has_value()) return false;
  return ParsedNumbersEqual(*x, *y, relative_tolerance);
}

absl::Status MathVerifierOptions::Validate() const {
  if (!(relative_tolerance >= 0 && relative_tolerance < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("relative_tolerance must be in [0, 1), got ", relative_tolerance));
  }
  return ValidateVerifierTimeouts(default_timeout, max_timeout);
}

MathVerifier::MathVerifier(MathVerifierOptions options)
    : Verifier({
          .name = "math",
          .description = "Math answer equivalence in the manner of Math-Verify: extracts the "
                         "response's final answer (\\boxed{}, ####, 'final answer is', "
                         "'Answer:', math spans, numbers) and compares it with reference_answer "
                         "(one answer as a whole; extracted from only when reference_is_solution "
                         "or when it does not parse as one) numerically and symbolically "
                         "(fractions, radicals, pi, complex numbers, bases, expressions, "
                         "equations, tuples, sets, intervals, matrices, percent, units). "
                         "metadata: precision (decimal places, default 6), strict "
                         "(true/false, default true).",
          .default_timeout = options.default_timeout,
          .max_timeout = options.max_timeout,
          .required_fields = {"reference_answer"},
      }),
      options_(options) {}

absl::StatusOr<MathCompareOptions> MathCompareOptionsFromMetadata(
    const std::map<std::string, std::string>& metadata) {
  MathCompareOptions options;
  if (auto it = metadata.find("precision"); it != metadata.end()) {
    if (!absl::SimpleAtoi(it->second, &options.precision)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata precision must be an integer, got \"", it->second, "\""));
    }
  }
  if (auto it = metadata.find("strict"); it != metadata.end()) {
    if (!absl::SimpleAtob(it->second, &options.strict)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata strict must be true or false, got \"", it->second, "\""));
    }
  }
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  return options;
}

VerifyOutcome MathVerifier::Verify(const VerifyRequest& request) const {
  absl::StatusOr<MathCompareOptions> compare_options =
      MathCompareOptionsFromMetadata(request.metadata);
  if (!compare_options.ok()) {
    return VerifyOutcome::Error(VerifierErrorKind::kInvalidInput,
                                std::string(compare_options.status().message()));
  }
  // The answer the response marks (ExtractAnswer: no parsing) is what the
  // integer fast path compares and what the details quote; the symbolic path
  // below compares the ranked, parsed answer of the same extractor.
  std::optional<ExtractedAnswer> answer = ExtractAnswer(request.response);
  if (!answer.has_value()) {
    return VerifyOutcome::Error(VerifierErrorKind::kParse, "no answer found in the response");
  }
  VerifyOutcome outcome;
  const absl::string_view source = AnswerSourceName(answer->source);

  // Integers on both sides (the arithmetic task, GSM8K): exact and fast, no
  // symbolic machinery. A bare reference counts only when it is an integer
  // as a whole ("3\sqrt{13}" is not 3); a solution's final answer is taken
  // from its box or "####" line.
  std::string reference(TrimAnswer(request.reference_answer));
  if (request.reference_is_solution &&
      (absl::StrContains(reference, kBoxedOpen) || absl::StrContains(reference, "####"))) {
    if (std::optional<ExtractedAnswer> extracted = ExtractAnswer(reference)) {
      reference = std::move(extracted->text);
    }
  }
  const std::optional<ParsedNumber> expected = ParseNumber(reference);
  const std::optional<ParsedNumber> got = ParseNumber(answer->text);
  if (expected.has_value() && got.has_value() && expected->IsInteger() && got->IsInteger()) {
    outcome.extracted_answer = answer->text;
    const bool correct = ParsedNumbersEqual(*got, *expected, options_.relative_tolerance);
    outcome.reward = correct ? 1.0 : 0.0;
    outcome.detail = correct ? absl::StrCat("correct (", source, ")")
                             : absl::StrCat("expected ", Quoted(reference), ", got ",
                                            Quoted(answer->text), " (", source, ")");
    return outcome;
  }

  compare_options->gold_is_answer = !request.reference_is_solution;
  MathComparison comparison =
      CompareMathAnswers(request.reference_answer, request.response, *compare_options);
  outcome.extracted_answer =
      comparison.prediction_answer.empty() ? answer->text : comparison.prediction_answer;
  if (comparison.equal) {
    outcome.reward = 1.0;
    outcome.detail = absl::StrCat("correct: ", Quoted(comparison.prediction_normalized));
    return outcome;
  }
  if (comparison.prediction_answer.empty()) {
    outcome.detail =
        expected.has_value()
            ? absl::StrCat("answer (", source, ") is not a number; expected ", Quoted(reference))
            : absl::StrCat("expected ", Quoted(comparison.gold_answer), ", got ",
                           Quoted(answer->text), " (", source, ")");
    return outcome;
  }
  outcome.detail = absl::StrCat("expected ", Quoted(comparison.gold_answer), ", got ",
                                Quoted(comparison.prediction_answer));
  if (comparison.error != MathCompareError::kNone) {
    absl::StrAppend(&outcome.detail, " (", MathCompareErrorName(comparison.error), ": ",
                    Quoted(comparison.error_detail), ")");
  }
  return outcome;
}

}  // namespace sluice::reward_server
