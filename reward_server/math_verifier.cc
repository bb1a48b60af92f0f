#include "reward_server/math_verifier.h"

#include <cmath>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/charconv.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace sluice::reward_server {
namespace {

constexpr absl::string_view kUnicodeMinus = "\xE2\x88\x92";  // U+2212
constexpr absl::string_view kBoxedOpen = "\\boxed{";
constexpr absl::string_view kFboxOpen = "\\fbox{";
// Numbers quoted in details are cut to this many bytes.
constexpr size_t kDetailNumberBytes = 80;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsDigitAt(absl::string_view s, size_t i) { return i < s.size() && IsDigit(s[i]); }

// Length of a sign ("-", "+", U+2212) at s[i], 0 when there is none.
size_t SignLength(absl::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  if (s[i] == '-' || s[i] == '+') return 1;
  if (s.substr(i, kUnicodeMinus.size()) == kUnicodeMinus) return kUnicodeMinus.size();
  return 0;
}

// Length of the number starting at s[i] (0 when none starts there):
//   [sign] int [. digits] | [sign] int / digits | [sign] . digits
// where int is plain digits or 1-3 digits followed by ",ddd" groups (a group
// must be exactly three digits). Linear in the length consumed.
size_t ScanNumber(absl::string_view s, size_t i, bool allow_sign) {
  const size_t n = s.size();
  size_t j = i;
  if (allow_sign) j += SignLength(s, j);
  const size_t int_start = j;
  while (IsDigitAt(s, j)) ++j;
  const size_t int_length = j - int_start;
  if (int_length > 0 && int_length <= 3) {
    while (j + 3 < n && s[j] == ',' && IsDigit(s[j + 1]) && IsDigit(s[j + 2]) &&
           IsDigit(s[j + 3]) && !IsDigitAt(s, j + 4)) {
      j += 4;
    }
  }
  bool has_decimals = false;
  if (j < n && s[j] == '.' && IsDigitAt(s, j + 1)) {
    ++j;
    while (IsDigitAt(s, j)) ++j;
    has_decimals = true;
  }
  if (int_length == 0 && !has_decimals) return 0;
  if (int_length > 0 && !has_decimals && j < n && s[j] == '/' && IsDigitAt(s, j + 1)) {
    ++j;
    while (IsDigitAt(s, j)) ++j;
  }
  return j - i;
}

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

absl::string_view TrimAnswer(absl::string_view text) {
  while (true) {
    text = absl::StripAsciiWhitespace(text);
    if (!text.empty() && text.back() == '.') {
      text.remove_suffix(1);
      continue;
    }
    return text;
  }
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

// ---------------------------------------------------------------------------
// Extraction

// Content of the last (by opening position) balanced \boxed{...} whose
// content is not blank. One pass; braces escaped as \{ \} do not count.
std::optional<absl::string_view> LastBoxed(absl::string_view s) {
  struct Open {
    size_t content_start;
    size_t depth;  // Brace depth outside this box.
  };
  std::vector<Open> open_boxes;
  size_t depth = 0;
  std::optional<absl::string_view> best;
  size_t best_start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\') {
      const size_t open_length = s.compare(i, kBoxedOpen.size(), kBoxedOpen) == 0 ? kBoxedOpen.size()
                                 : s.compare(i, kFboxOpen.size(), kFboxOpen) == 0  ? kFboxOpen.size()
                                                                                   : 0;
      if (open_length > 0) {
        open_boxes.push_back({i + open_length, depth});
        ++depth;
        i += open_length - 1;
      } else if (i + 1 < s.size() && (s[i + 1] == '{' || s[i + 1] == '}')) {
        ++i;
      }
    } else if (c == '{') {
      ++depth;
    } else if (c == '}' && depth > 0) {
      --depth;
      if (!open_boxes.empty() && open_boxes.back().depth == depth) {
        const Open box = open_boxes.back();
        open_boxes.pop_back();
        const absl::string_view content = s.substr(box.content_start, i - box.content_start);
        if (!TrimAnswer(content).empty() && (!best.has_value() || box.content_start > best_start)) {
          best = content;
          best_start = box.content_start;
        }
      }
    }
  }
  return best;
}

absl::string_view RestOfLine(absl::string_view s, size_t from) {
  absl::string_view rest = s.substr(from);
  const size_t end = rest.find_first_of("\r\n");
  return end == absl::string_view::npos ? rest : rest.substr(0, end);
}

bool IsAsciiAlpha(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)); }

// Position of the last occurrence of `lower_needle` (lowercase ASCII) in `s`,
// ignoring ASCII case, not preceded by a letter and, when
// `needs_end_boundary`, not followed by one; npos when none.
size_t RFindMarker(absl::string_view s, absl::string_view lower_needle, bool needs_end_boundary) {
  if (s.size() < lower_needle.size()) return absl::string_view::npos;
  for (size_t i = s.size() - lower_needle.size() + 1; i-- > 0;) {
    if (!absl::EqualsIgnoreCase(s.substr(i, lower_needle.size()), lower_needle)) continue;
    if (i > 0 && IsAsciiAlpha(s[i - 1])) continue;
    const size_t end = i + lower_needle.size();
    if (needs_end_boundary && end < s.size() && IsAsciiAlpha(s[end])) continue;
    return i;
  }
  return absl::string_view::npos;
}

bool EndsStandaloneNumber(absl::string_view line, size_t end) {
  if (end >= line.size()) return true;
  const char c = line[end];
  return absl::ascii_isspace(static_cast<unsigned char>(c)) ||
         absl::string_view(".,;:!?)]}*$%\\").find(c) != absl::string_view::npos;
}

// The answer on `line`, the text after a marker: the number it starts with
// when that number stands alone, else the whole (trimmed) line.
absl::string_view AnswerAfterMarker(absl::string_view line) {
  while (true) {
    line = absl::StripLeadingAsciiWhitespace(line);
    if (absl::ConsumePrefix(&line, ":") || absl::ConsumePrefix(&line, "*") ||
        absl::ConsumePrefix(&line, "\\$") || absl::ConsumePrefix(&line, "$") ||
        absl::ConsumePrefix(&line, "=")) {
      continue;
    }
    break;
  }
  const size_t length = ScanNumber(line, 0, /*allow_sign=*/true);
  if (length > 0 && EndsStandaloneNumber(line, length)) return line.substr(0, length);
  return TrimAnswer(line);
}

bool SignAllowedAfter(absl::string_view s, size_t i) {
  if (i == 0) return true;
  const unsigned char previous = static_cast<unsigned char>(s[i - 1]);
  return !(absl::ascii_isalnum(previous) || previous == ')' || previous == ']' || previous == '}');
}

std::optional<absl::string_view> LastNumber(absl::string_view s) {
  std::optional<absl::string_view> last;
  size_t i = 0;
  while (i < s.size()) {
    const size_t length = ScanNumber(s, i, SignAllowedAfter(s, i));
    if (length > 0) {
      last = s.substr(i, length);
      i += length;
    } else {
      ++i;
    }
  }
  return last;
}

// Content of the last non-blank math span ($..$, $$..$$, \(..\), \[..\]).
// Linear: a delimiter that fails to close once is not searched for again.
std::optional<absl::string_view> LastMathSpan(absl::string_view s) {
  std::optional<absl::string_view> last;
  bool dead[3] = {false, false, false};
  size_t i = 0;
  while (i < s.size()) {
    int kind = -1;
    absl::string_view open, close;
    if (s.compare(i, 2, "$$") == 0) {
      kind = 0, open = "$$", close = "$$";
    } else if (s[i] == '$' && (i == 0 || s[i - 1] != '\\')) {
      kind = 0, open = "$", close = "$";
    } else if (s.compare(i, 2, "\\(") == 0) {
      kind = 1, open = "\\(", close = "\\)";
    } else if (s.compare(i, 2, "\\[") == 0) {
      kind = 2, open = "\\[", close = "\\]";
    }
    if (kind < 0 || dead[kind]) {
      ++i;
      continue;
    }
    const size_t end = s.find(close, i + open.size());
    if (end == absl::string_view::npos) {
      dead[kind] = true;
      i += open.size();
      continue;
    }
    // "$5 and $6" is money, not math: a closing "$" right before a digit.
    if (open == "$" && end + 1 < s.size() && IsDigit(s[end + 1])) {
      ++i;
      continue;
    }
    const absl::string_view content = s.substr(i + open.size(), end - i - open.size());
    if (!TrimAnswer(content).empty()) last = content;
    i = end + close.size();
  }
  return last;
}

std::string Quoted(absl::string_view text) {
  std::string shown(text);
  TruncateUtf8(&shown, kDetailNumberBytes);
  return shown;
}

}  // namespace

absl::string_view AnswerSourceName(AnswerSource source) {
  switch (source) {
    case AnswerSource::kBoxed:
      return "boxed";
    case AnswerSource::kHashes:
      return "####";
    case AnswerSource::kAnswerIs:
      return "answer is";
    case AnswerSource::kAnswerColon:
      return "answer:";
    case AnswerSource::kMathSpan:
      return "math span";
    case AnswerSource::kLastNumber:
      return "last number";
  }
  return "unknown";
}

std::optional<ExtractedAnswer> ExtractAnswer(absl::string_view response) {
  if (std::optional<absl::string_view> boxed = LastBoxed(response)) {
    return ExtractedAnswer{std::string(TrimAnswer(*boxed)), AnswerSource::kBoxed};
  }
  if (const size_t hashes = response.rfind("####"); hashes != absl::string_view::npos) {
    absl::string_view line = RestOfLine(response, hashes + 4);
    while (absl::ConsumePrefix(&line, "#")) {
    }
    const absl::string_view answer = AnswerAfterMarker(line);
    if (!answer.empty()) return ExtractedAnswer{std::string(answer), AnswerSource::kHashes};
  }
  if (const size_t at = RFindMarker(response, "answer is", /*needs_end_boundary=*/true);
      at != absl::string_view::npos) {
    const absl::string_view answer = AnswerAfterMarker(RestOfLine(response, at + 9));
    if (!answer.empty()) return ExtractedAnswer{std::string(answer), AnswerSource::kAnswerIs};
  }
  if (const size_t at = RFindMarker(response, "answer:", /*needs_end_boundary=*/false);
      at != absl::string_view::npos) {
    const absl::string_view answer = AnswerAfterMarker(RestOfLine(response, at + 7));
    if (!answer.empty()) return ExtractedAnswer{std::string(answer), AnswerSource::kAnswerColon};
  }
  if (std::optional<absl::string_view> span = LastMathSpan(response)) {
    return ExtractedAnswer{std::string(TrimAnswer(*span)), AnswerSource::kMathSpan};
  }
  if (std::optional<absl::string_view> number = LastNumber(response)) {
    return ExtractedAnswer{std::string(*number), AnswerSource::kLastNumber};
  }
  return std::nullopt;
}

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
    outcome.detail = expected.has_value()
                         ? absl::StrCat("answer (", source, ") is not a number; expected ",
                                        Quoted(reference))
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
