// ExtractAnswer (answer_extraction.h): the final answer a response marks, by
// a cascade of rules and no parsing, and the number scan it shares with
// NormalizeNumber (math_verifier.h). The ranked, parsed extraction that
// CompareMathAnswers compares is answer_extraction.cc.

#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "reward_server/math/answer_extraction.h"

namespace sluice::reward_server {
namespace {

constexpr absl::string_view kUnicodeMinus = "\xE2\x88\x92";  // U+2212

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsDigitAt(absl::string_view s, size_t i) { return i < s.size() && IsDigit(s[i]); }

}  // namespace

size_t internal::SignLength(absl::string_view s, size_t i) {
  if (i >= s.size()) return 0;
  if (s[i] == '-' || s[i] == '+') return 1;
  if (s.substr(i, kUnicodeMinus.size()) == kUnicodeMinus) return kUnicodeMinus.size();
  return 0;
}

size_t internal::ScanNumber(absl::string_view s, size_t i, bool allow_sign) {
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

absl::string_view internal::TrimAnswer(absl::string_view text) {
  while (true) {
    text = absl::StripAsciiWhitespace(text);
    if (!text.empty() && text.back() == '.') {
      text.remove_suffix(1);
      continue;
    }
    return text;
  }
}

namespace {

using internal::ScanNumber;
using internal::TrimAnswer;

// Content of the last (by opening position) balanced \boxed{...} whose
// content is not blank.
std::optional<absl::string_view> LastBoxed(absl::string_view s) {
  std::optional<absl::string_view> best;
  size_t best_start = 0;
  internal::ScanBoxes(s, /*space_before_brace=*/false, [&](const internal::BoxMatch& box) {
    const absl::string_view content = s.substr(box.content_start, box.end - 1 - box.content_start);
    if (!TrimAnswer(content).empty() && (!best.has_value() || box.content_start > best_start)) {
      best = content;
      best_start = box.content_start;
    }
  });
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
// (Unlike the ranked extraction's spans, "$..$" may cross lines: this is
// the rule the verifier has always reported by.)
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

ExtractedAnswer Found(absl::string_view text, AnswerSource source) {
  ExtractedAnswer answer;
  answer.text = std::string(text);
  answer.source = source;
  return answer;
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
    case AnswerSource::kWholeText:
      return "whole text";
  }
  return "unknown";
}

std::optional<ExtractedAnswer> ExtractAnswer(absl::string_view text) {
  if (std::optional<absl::string_view> boxed = LastBoxed(text)) {
    return Found(TrimAnswer(*boxed), AnswerSource::kBoxed);
  }
  if (const size_t hashes = text.rfind("####"); hashes != absl::string_view::npos) {
    absl::string_view line = RestOfLine(text, hashes + 4);
    while (absl::ConsumePrefix(&line, "#")) {
    }
    const absl::string_view answer = AnswerAfterMarker(line);
    if (!answer.empty()) return Found(answer, AnswerSource::kHashes);
  }
  if (const size_t at = RFindMarker(text, "answer is", /*needs_end_boundary=*/true);
      at != absl::string_view::npos) {
    const absl::string_view answer = AnswerAfterMarker(RestOfLine(text, at + 9));
    if (!answer.empty()) return Found(answer, AnswerSource::kAnswerIs);
  }
  if (const size_t at = RFindMarker(text, "answer:", /*needs_end_boundary=*/false);
      at != absl::string_view::npos) {
    const absl::string_view answer = AnswerAfterMarker(RestOfLine(text, at + 7));
    if (!answer.empty()) return Found(answer, AnswerSource::kAnswerColon);
  }
  if (std::optional<absl::string_view> span = LastMathSpan(text)) {
    return Found(TrimAnswer(*span), AnswerSource::kMathSpan);
  }
  if (std::optional<absl::string_view> number = LastNumber(text)) {
    return Found(*number, AnswerSource::kLastNumber);
  }
  return std::nullopt;
}

}  // namespace sluice::reward_server
