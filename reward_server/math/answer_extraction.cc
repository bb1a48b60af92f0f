#include "reward_server/math/answer_extraction.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "reward_server/math/latex_parser.h"
#include "reward_server/math/latex_words.h"

namespace sluice::reward_server::internal {
namespace {

using math::LatexExpr;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsSpace(char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); }
bool IsLetter(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)); }

// Percent marker right after `at` ("%", "\%", " percent", " pct").
bool PercentAfter(absl::string_view s, size_t at) {
  size_t i = at;
  // Bounded: a run of "$$$..." must not make the scan quadratic.
  while (i < s.size() && i < at + 8 && (s[i] == ' ' || s[i] == '$')) ++i;
  absl::string_view rest = s.substr(std::min(i, s.size()), 12);
  if (absl::StartsWith(rest, "%") || absl::StartsWith(rest, "\\%")) return true;
  return absl::StartsWithIgnoreCase(rest, "percent") || absl::StartsWithIgnoreCase(rest, "pct");
}

// Math spans: $$..$$, \[..\], $..$ (one line), \(..\) (one line), left to
// right, non-overlapping. Linear: a delimiter kind that fails to close once
// is never searched for again.
std::vector<Span> FindMathSpans(absl::string_view s) {
  std::vector<Span> spans;
  bool dead[4] = {false, false, false, false};
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    const bool escaped = i > 0 && s[i - 1] == '\\';
    size_t open = 0, close = absl::string_view::npos;
    int kind = -1;
    if (c == '$' && !escaped && i + 1 < s.size() && s[i + 1] == '$' && !dead[0]) {
      kind = 0;
      open = 2;
      close = s.find("$$", i + 2);
    } else if (c == '\\' && i + 1 < s.size() && s[i + 1] == '[' && !escaped && !dead[1]) {
      kind = 1;
      open = 2;
      close = s.find("\\]", i + 2);
    } else if (c == '$' && !escaped && !(i > 0 && IsDigit(s[i - 1])) && !dead[2]) {
      kind = 2;
      open = 1;
      size_t j = i + 1;
      while (j < s.size() && s[j] != '\n' && !(s[j] == '$' && s[j - 1] != '\\')) ++j;
      close = j < s.size() && s[j] == '$' && j > i + 1 ? j : absl::string_view::npos;
      if (close == absl::string_view::npos) {
        ++i;  // An unclosed inline "$" ("$5 each"): look on.
        continue;
      }
    } else if (c == '\\' && i + 1 < s.size() && s[i + 1] == '(' && !escaped && !dead[3]) {
      kind = 3;
      open = 2;
      close = s.find("\\)", i + 2);
      if (close != absl::string_view::npos &&
          s.substr(i, close - i).find('\n') != absl::string_view::npos) {
        i += 2;
        continue;
      }
    }
    if (kind < 0) {
      ++i;
      continue;
    }
    if (close == absl::string_view::npos) {
      dead[kind] = true;
      i += open;
      continue;
    }
    const size_t close_length = kind == 2 ? 1 : 2;
    Span span{i, close + close_length, s.substr(i + open, close - i - open)};
    span.percent = PercentAfter(s, span.end);
    if (!absl::StripAsciiWhitespace(span.content).empty()) spans.push_back(span);
    i = close + close_length;
  }
  return spans;
}

// Whether the text between two boxes is a short connective ("and", ", ",
// "\quad \text{and} \quad", "\) and \(", "papers and"): at most four words
// once LaTeX spacing and delimiters are dropped.
bool ShortConnective(absl::string_view gap) {
  if (gap.size() > 80) return false;
  std::string words;
  for (size_t i = 0; i < gap.size(); ++i) {
    const char c = gap[i];
    if (c == '\\') {
      size_t j = i + 1;
      while (j < gap.size() && IsLetter(gap[j])) ++j;
      absl::string_view name = gap.substr(i + 1, j - i - 1);
      if (name == "text" || name == "textbf" || name == "mbox" || name == "quad" ||
          name == "qquad" || name.empty()) {
        words.push_back(' ');
        i = name.empty() ? i + 1 : j - 1;
        continue;
      }
      absl::StrAppend(&words, gap.substr(i, j - i));
      i = j - 1;
      continue;
    }
    if (c == '$' || c == '{' || c == '}' || c == ',' || c == '.' || c == ';' || c == '(' ||
        c == ')' || c == '[' || c == ']') {
      words.push_back(' ');
      continue;
    }
    words.push_back(c);
  }
  int count = 0;
  bool in_word = false;
  for (const char c : words) {
    if (IsSpace(c)) {
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      ++count;
    }
  }
  return count <= 4;
}

// The last `needle` (any case) starting at or after `from` and ending at or
// before `before`. O(before - from): callers bound the window, so that
// ranking every candidate of a long text stays linear overall.
size_t RFindIgnoreCase(absl::string_view s, absl::string_view needle, size_t before, size_t from) {
  if (before > s.size()) before = s.size();
  if (needle.empty() || needle.size() > before) return absl::string_view::npos;
  // Rejecting on the first byte inline: a call to EqualsIgnoreCase at every
  // offset of every candidate's window was a tenth of all comparison time.
  const char first = absl::ascii_tolower(static_cast<unsigned char>(needle[0]));
  for (size_t i = before - needle.size() + 1; i-- > from;) {
    if (absl::ascii_tolower(static_cast<unsigned char>(s[i])) == first &&
        absl::EqualsIgnoreCase(s.substr(i, needle.size()), needle)) {
      return i;
    }
  }
  return absl::string_view::npos;
}

// Plain numbers and arithmetic expressions (Math-Verify's "expr" target):
// anchored by start, whitespace, "=" or a currency sign before them.
struct ExprMatch {
  size_t start;
  size_t end;
  std::string text;  // Normalised: separators removed, decimal comma -> ".".
  bool percent;
};

bool IsExprChar(char c) {
  return IsDigit(c) || c == '.' || c == ' ' || c == '+' || c == '-' || c == '*' || c == '/' ||
         c == '^' || c == '(' || c == ')';
}
bool IsOperatorChar(char c) { return c == '+' || c == '-' || c == '*' || c == '/' || c == '^'; }

// The number at s[i] (digits with "1,234" / "1 234" groups, decimals with
// "." or ","), its end in *end; empty when none.
std::string ScanExprNumber(absl::string_view s, size_t i, size_t* end) {
  size_t j = i;
  std::string text;
  if (j < s.size() && s[j] == '-') {
    text.push_back('-');
    ++j;
  }
  const size_t digits_start = j;
  while (j < s.size() && IsDigit(s[j])) text.push_back(s[j++]);
  const size_t int_length = j - digits_start;
  if (int_length > 0 && int_length <= 3 && s[digits_start] != '0') {
    // Thousands groups with one separator kind.
    for (const char separator : {',', ' '}) {
      size_t k = j;
      std::string groups;
      while (k + 3 < s.size() && s[k] == separator && IsDigit(s[k + 1]) && IsDigit(s[k + 2]) &&
             IsDigit(s[k + 3]) && (k + 4 >= s.size() || !IsDigit(s[k + 4]))) {
        absl::StrAppend(&groups, s.substr(k + 1, 3));
        k += 4;
      }
      if (!groups.empty()) {
        text += groups;
        j = k;
        break;
      }
    }
  }
  if (j + 1 < s.size() && (s[j] == '.' || s[j] == ',') && IsDigit(s[j + 1])) {
    text.push_back('.');
    ++j;
    while (j < s.size() && IsDigit(s[j])) text.push_back(s[j++]);
  } else if (int_length == 0) {
    return {};
  }
  *end = j;
  return text;
}

// A run of expression characters, scanned once: every start inside it
// shares its end, so the checks of each start are table lookups (rescanning
// the run from every start was quadratic in its length).
class ExprRun {
 public:
  // The run from `begin` (an expression character) to its end.
  ExprRun(absl::string_view s, size_t begin) : begin_(begin) {
    end_ = begin;
    while (end_ < s.size() && IsExprChar(s[end_])) ++end_;
    stop_ = end_;
    while (stop_ > begin && (s[stop_ - 1] == ' ' || IsOperatorChar(s[stop_ - 1]) ||
                             s[stop_ - 1] == '.' || s[stop_ - 1] == '(')) {
      --stop_;
    }
    const size_t n = stop_ - begin;
    depth_.resize(n + 1);
    next_digit_.assign(n + 1, absl::string_view::npos);
    for (size_t t = 0; t < n; ++t) {
      const char c = s[begin + t];
      depth_[t + 1] = depth_[t] + (c == '(') - (c == ')');
      if (IsOperatorChar(c)) last_operator_ = begin + t;
    }
    min_depth_from_.resize(n + 1);
    min_depth_from_[n] = depth_[n];
    for (size_t t = n; t-- > 0;) {
      min_depth_from_[t] = std::min(depth_[t], min_depth_from_[t + 1]);
      next_digit_[t] = IsDigit(s[begin + t]) ? begin + t : next_digit_[t + 1];
    }
  }

  size_t end() const { return end_; }
  // Where a candidate starting at `i` (in the run) ends: the run without
  // trailing spaces, operators, "." and "(", never before `i`.
  size_t Stop(size_t i) const { return std::max(stop_, i); }
  // Whether s[i, Stop(i)) holds an operator after its first digit.
  bool HasOperatorAfterFirstDigit(size_t i) const {
    if (i >= stop_) return false;
    const size_t first_digit = next_digit_[i - begin_];
    return first_digit != absl::string_view::npos && last_operator_ != absl::string_view::npos &&
           last_operator_ > first_digit;
  }
  // Whether the parentheses of s[i, Stop(i)) balance, none closing early.
  bool Balanced(size_t i) const {
    if (i >= stop_) return true;
    const size_t t = i - begin_;
    return min_depth_from_[t + 1] >= depth_[t] && depth_.back() == depth_[t];
  }

 private:
  size_t begin_;
  size_t end_ = 0;
  size_t stop_ = 0;
  size_t last_operator_ = absl::string_view::npos;
  std::vector<int> depth_;           // Balance of s[begin, begin + t).
  std::vector<int> min_depth_from_;  // Least depth_ at t or later.
  std::vector<size_t> next_digit_;   // First digit at begin + t or later.
};

std::vector<ExprMatch> FindExprs(absl::string_view s) {
  std::vector<ExprMatch> out;
  size_t i = 0;
  constexpr absl::string_view kCurrency = "$\xE2\x82\xAC\xC2\xA3\xC2\xA5";  // $ € £ ¥
  std::optional<ExprRun> run;
  while (i < s.size()) {
    // `starts` first: it is false at most bytes and cheaper than `anchored`.
    const bool starts = IsDigit(s[i]) || (s[i] == '-' && i + 1 < s.size() && IsDigit(s[i + 1])) ||
                        (s[i] == '.' && i + 1 < s.size() && IsDigit(s[i + 1])) || s[i] == '(';
    if (!starts) {
      ++i;
      continue;
    }
    const bool anchored = i == 0 || IsSpace(s[i - 1]) || s[i - 1] == '=' || s[i - 1] == '*' ||
                          (kCurrency.find(s[i - 1]) != absl::string_view::npos &&
                           (i < 2 || IsSpace(s[i - 2]) || s[i - 2] == '=' ||
                            static_cast<unsigned char>(s[i - 2]) >= 0x80));
    if (!anchored || (i > 0 && IsDigit(s[i - 1]))) {
      ++i;
      continue;
    }
    // An arithmetic expression: the longest run of expression characters
    // that holds an operator after its first digit and ends in a digit or ")".
    if (!run.has_value() || i >= run->end()) run.emplace(s, i);
    const size_t stop = run->Stop(i);
    absl::string_view candidate = s.substr(i, stop - i);
    const bool is_expr = run->HasOperatorAfterFirstDigit(i);
    const bool suffix_ok = stop >= s.size() || IsSpace(s[stop]) ||
                           absl::string_view(".,:)$").find(s[stop]) != absl::string_view::npos;
    if (is_expr && suffix_ok && run->Balanced(i)) {
      std::string text;
      for (const char c : candidate) {
        if (c != ' ') text.push_back(c);
      }
      out.push_back({i, stop, std::move(text), false});
      i = stop;
      continue;
    }
    if (s[i] == '(') {
      ++i;
      continue;
    }
    size_t end = 0;
    std::string number = ScanExprNumber(s, i, &end);
    if (number.empty()) {
      ++i;
      continue;
    }
    size_t after = end;
    bool percent = false;
    while (after < s.size() && s[after] == ' ') ++after;
    absl::string_view rest = s.substr(after, 10);
    if (absl::StartsWith(rest, "%") || absl::StartsWithIgnoreCase(rest, "percent") ||
        absl::StartsWithIgnoreCase(rest, "pct")) {
      percent = true;
    }
    out.push_back({i, end, std::move(number), percent});
    i = end;
  }
  return out;
}

std::string JoinContents(const std::vector<Span>& spans, size_t first, size_t last) {
  std::string text;
  for (size_t k = first; k <= last; ++k) {
    if (k > first) text.append(", ");
    absl::StrAppend(&text, absl::StripAsciiWhitespace(spans[k].content));
  }
  return text;
}

// Priority of an anchor ("final answer is", "answer:") right before `start`.
int AnchorPriority(absl::string_view s, size_t start, size_t end, bool* anchored) {
  *anchored = true;
  // "final answer is[:] X", optionally followed by ". I hope".
  absl::string_view before = s.substr(0, start);
  absl::string_view trimmed = absl::StripTrailingAsciiWhitespace(before);
  absl::ConsumeSuffix(&trimmed, ":");
  trimmed = absl::StripTrailingAsciiWhitespace(trimmed);
  if (trimmed.size() >= 3 && absl::EndsWithIgnoreCase(trimmed, " is")) {
    // Only a match within 120 bytes counts: searching further back finds
    // nothing that could (and made ranking quadratic in the text's length).
    const size_t final_answer = RFindIgnoreCase(s, "final answer", trimmed.size(),
                                                trimmed.size() > 120 ? trimmed.size() - 120 : 0);
    if (final_answer != absl::string_view::npos && trimmed.size() - final_answer <= 120) {
      absl::string_view after = s.substr(end, 12);
      absl::ConsumePrefix(&after, ".");
      absl::ConsumePrefix(&after, " ");
      if (absl::EqualsIgnoreCase(trimmed.substr(final_answer),
                                 absl::string_view("final answer is")) &&
          absl::StartsWith(after, "I hope")) {
        return 0;
      }
      return 50;
    }
  }
  // "answer[:] ... X" within 50 bytes.
  const size_t window = start > 60 ? start - 60 : 0;
  const size_t answer = RFindIgnoreCase(s, "answer", start, window);
  if (answer != absl::string_view::npos && answer >= window && answer + 6 <= start &&
      start - (answer + 6) <= 50) {
    return s.substr(answer + 6, 1) == ":" ? 100 : 200;
  }
  *anchored = false;
  return 300;
}

// The source of a candidate AnchorPriority found anchored at `priority`.
AnswerSource AnchorSource(int priority) {
  return priority == 100 ? AnswerSource::kAnswerColon : AnswerSource::kAnswerIs;
}

// The whole of `text` as one answer (MathCompareOptions::gold_is_answer);
// nullopt when it does not parse as one, reads as prose, or boxes its answer
// ("\boxed{1}\boxed{2}" is two boxed answers, not their product).
std::optional<ExtractedAnswer> WholeAnswer(absl::string_view text) {
  const absl::string_view whole = absl::StripAsciiWhitespace(text);
  if (whole.empty() || whole.size() > math::kMaxLatexBytes || math::LooksLikeProse(whole) ||
      !FindBoxes(whole).empty()) {
    return std::nullopt;
  }
  absl::StatusOr<LatexExpr> parsed = math::ParseLatexAnswer(whole);
  if (!parsed.ok()) return std::nullopt;
  ExtractedAnswer side;
  side.text = std::string(whole);
  side.source = AnswerSource::kWholeText;
  side.fallback = NormalizeAnswerString(whole);
  side.normalized = parsed->DebugString();
  side.parsed = std::move(*parsed);
  return side;
}

}  // namespace

void ScanBoxes(absl::string_view s, bool space_before_brace,
               absl::FunctionRef<void(const BoxMatch&)> visit) {
  struct Open {
    size_t start;
    size_t content_start;
    size_t depth;
  };
  std::vector<Open> open;
  size_t depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\') {
      size_t j = i + 1;
      if (j < s.size() && s[j] == '\\') ++j;
      absl::string_view rest = s.substr(j);
      size_t name = 0;
      if (absl::StartsWith(rest, "boxed")) name = 5;
      if (absl::StartsWith(rest, "fbox")) name = 4;
      if (name > 0) {
        size_t k = j + name;
        while (space_before_brace && k < s.size() && s[k] == ' ') ++k;
        if (k < s.size() && s[k] == '{') {
          open.push_back({i, k + 1, depth});
          ++depth;
          i = k;
          continue;
        }
      }
      if (j < s.size() && (s[j] == '{' || s[j] == '}')) i = j;
      continue;
    }
    if (c == '{') {
      ++depth;
    } else if (c == '}' && depth > 0) {
      --depth;
      if (!open.empty() && open.back().depth == depth) {
        const Open box = open.back();
        open.pop_back();
        visit({box.start, box.content_start, i + 1, !open.empty()});
      }
    }
  }
}

std::vector<Span> FindBoxes(absl::string_view s) {
  std::vector<Span> boxes;
  ScanBoxes(s, /*space_before_brace=*/true, [&](const BoxMatch& box) {
    if (box.nested) return;  // The outer box holds it.
    // Drop boxes inside this one (kept when closed first).
    while (!boxes.empty() && boxes.back().start > box.start) boxes.pop_back();
    Span span{box.start, box.end, s.substr(box.content_start, box.end - 1 - box.content_start)};
    if (!absl::StripAsciiWhitespace(span.content).empty()) boxes.push_back(span);
  });
  return boxes;
}

std::vector<RankedCandidate> RankedCandidates(absl::string_view s,
                                              const MathCompareOptions& options) {
  std::vector<RankedCandidate> out;
  auto add = [&](std::string text, bool percent, int priority, size_t start, size_t end, bool latex,
                 AnswerSource source) {
    RankedCandidate candidate;
    candidate.candidate = {std::move(text), percent, priority, end};
    candidate.start = start;
    candidate.latex = latex;
    candidate.source = source;
    out.push_back(std::move(candidate));
  };
  // GSM8K: the last "#### N".
  if (const size_t hashes = s.rfind("####"); hashes != absl::string_view::npos) {
    absl::string_view line = s.substr(hashes + 4);
    line = line.substr(0, line.find('\n'));
    line = absl::StripAsciiWhitespace(line);
    while (absl::ConsumePrefix(&line, "#")) {
    }
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line.size() <= math::kMaxLatexBytes) {
      add(std::string(line), false, 0, hashes, hashes + 4 + line.size(), true,
          AnswerSource::kHashes);
    }
  }
  if (options.match_latex) {
    // Boxes: the last, with the boxes joined to it by short connectives.
    const std::vector<Span> boxes = FindBoxes(s);
    if (!boxes.empty()) {
      size_t first = boxes.size() - 1;
      while (first > 0 && boxes.size() - first < 8 &&
             ShortConnective(
                 s.substr(boxes[first - 1].end, boxes[first].start - boxes[first - 1].end))) {
        --first;
      }
      const size_t last = boxes.size() - 1;
      size_t after = boxes[last].end;
      while (after < s.size() &&
             (s[after] == '}' || s[after] == ' ' || s[after] == '$' || s[after] == '.')) {
        ++after;
      }
      if (s.substr(after, 2) == "\\)" || s.substr(after, 2) == "\\]") after += 2;
      add(JoinContents(boxes, first, last),
          PercentAfter(s, after) || PercentAfter(s, boxes[last].end), 0, boxes[first].start,
          boxes[last].end, true, AnswerSource::kBoxed);
    }
    // Math spans, runs joined by ",", "and", "or" (up to six).
    const std::vector<Span> spans = FindMathSpans(s);
    size_t k = 0;
    while (k < spans.size()) {
      size_t last = k;
      while (last + 1 < spans.size() && last - k < 5) {
        absl::string_view gap = s.substr(spans[last].end, spans[last + 1].start - spans[last].end);
        gap = absl::StripAsciiWhitespace(gap);
        absl::ConsumePrefix(&gap, ",");
        gap = absl::StripAsciiWhitespace(gap);
        if (!(gap.empty() || absl::EqualsIgnoreCase(gap, "and") ||
              absl::EqualsIgnoreCase(gap, "or")) ||
            spans[last].percent) {
          break;
        }
        ++last;
      }
      bool anchored = false;
      const int priority = AnchorPriority(s, spans[k].start, spans[last].end, &anchored);
      add(JoinContents(spans, k, last), spans[last].percent, priority, spans[k].start,
          spans[last].end, true, anchored ? AnchorSource(priority) : AnswerSource::kMathSpan);
      if (anchored) {
        add(JoinContents(spans, k, last), spans[last].percent, 300, spans[k].start, spans[last].end,
            true, AnswerSource::kMathSpan);
      }
      k = last + 1;
    }
  }
  if (options.match_expr) {
    for (ExprMatch& match : FindExprs(s)) {
      bool anchored = false;
      const int priority = AnchorPriority(s, match.start, match.end, &anchored);
      if (anchored) {
        add(match.text, match.percent, priority, match.start, match.end, false,
            AnchorSource(priority));
      }
      add(std::move(match.text), match.percent, 300, match.start, match.end, false,
          AnswerSource::kLastNumber);
    }
  }
  // Sorts indices, then moves each candidate once: sorting the candidates
  // themselves moved their strings through the merge buffer at every pass.
  std::vector<uint32_t> order(out.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<uint32_t>(k);
  std::stable_sort(order.begin(), order.end(), [&out](uint32_t x, uint32_t y) {
    const RankedCandidate& a = out[x];
    const RankedCandidate& b = out[y];
    if (a.candidate.priority != b.candidate.priority) {
      return a.candidate.priority < b.candidate.priority;
    }
    if (a.candidate.end != b.candidate.end) return a.candidate.end > b.candidate.end;
    return a.start < b.start;
  });
  std::vector<RankedCandidate> sorted;
  sorted.reserve(out.size() + 1);
  for (const uint32_t k : order) sorted.push_back(std::move(out[k]));
  out = std::move(sorted);
  // Last resort: the whole text when it looks like a bare expression (no
  // prose: no run of three letters outside a command).
  absl::string_view whole = absl::StripAsciiWhitespace(s);
  if (!whole.empty() && whole.size() <= 512) {
    bool prose = false;
    size_t run = 0;
    for (size_t i = 0; i < whole.size(); ++i) {
      if (whole[i] == '\\') {
        while (i + 1 < whole.size() && IsLetter(whole[i + 1])) ++i;
        run = 0;
        continue;
      }
      run = IsLetter(whole[i]) ? run + 1 : 0;
      if (run >= 3) prose = true;
    }
    if (!prose) add(std::string(whole), false, 400, 0, s.size(), true, AnswerSource::kWholeText);
  }
  return out;
}

absl::string_view CutInput(absl::string_view text) {
  if (text.size() > kMaxCompareInputBytes) {
    text = text.substr(text.size() - kMaxCompareInputBytes);
  }
  return text;
}

std::string NormalizeAnswerString(absl::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\\') {
      size_t j = i + 1;
      while (j < text.size() && IsLetter(text[j])) ++j;
      absl::string_view name = text.substr(i + 1, j - i - 1);
      if (name == "text" || name == "textbf" || name == "mathrm" || name == "mbox" ||
          name == "textnormal" || name == "left" || name == "right" || name == "displaystyle" ||
          name == "quad" || name == "qquad") {
        i = j - 1;
        continue;
      }
      if (name == "dfrac" || name == "tfrac") {
        out.append("\\frac");
        i = j - 1;
        continue;
      }
      if (name.empty() && j < text.size() &&
          (text[j] == ',' || text[j] == '!' || text[j] == ';' || text[j] == ' ')) {
        i = j;
        continue;
      }
    }
    if (IsSpace(c) || c == '$' || c == '{' || c == '}') continue;
    out.push_back(c);
  }
  while (!out.empty() && out.back() == '.') out.pop_back();
  if (out.size() == 3 && out[0] == '(' && out[2] == ')' && IsLetter(out[1])) out = out.substr(1, 1);
  return out;
}

ExtractedAnswer ExtractParsedAnswer(absl::string_view text, const MathCompareOptions& options,
                                    bool whole_first) {
  text = CutInput(text);
  if (whole_first) {
    if (std::optional<ExtractedAnswer> whole = WholeAnswer(text)) return *std::move(whole);
  }
  ExtractedAnswer side;
  std::vector<RankedCandidate> candidates = RankedCandidates(text, options);
  std::vector<std::pair<size_t, size_t>> failed_latex;
  int tried = 0;
  for (const RankedCandidate& ranked : candidates) {
    const MathAnswerCandidate& candidate = ranked.candidate;
    if (side.fallback.empty()) {
      side.fallback = NormalizeAnswerString(candidate.text);
      side.text = candidate.text;
      side.source = ranked.source;
    }
    if (!ranked.latex &&
        std::any_of(failed_latex.begin(), failed_latex.end(), [&](const auto& span) {
          return ranked.start < span.second && candidate.end > span.first;
        })) {
      continue;
    }
    if (++tried > kMaxCandidatesTried) break;
    absl::StatusOr<LatexExpr> parsed = math::ParseLatexAnswer(candidate.text);
    if (!parsed.ok()) {
      if (parsed.status().code() == absl::StatusCode::kResourceExhausted) side.too_large = true;
      if (side.error.empty()) side.error = std::string(parsed.status().message());
      if (ranked.latex) failed_latex.push_back({ranked.start, candidate.end});
      continue;
    }
    side.text = candidate.text;
    side.source = ranked.source;
    side.percent = candidate.percent;
    side.normalized = parsed->DebugString();
    side.parsed = std::move(*parsed);
    side.too_large = false;
    return side;
  }
  // A bare answer with nothing to extract ("no solution") is still compared
  // as a string.
  if (whole_first && side.fallback.empty()) {
    side.text = std::string(absl::StripAsciiWhitespace(text));
    side.source = AnswerSource::kWholeText;
    side.fallback = NormalizeAnswerString(side.text);
  }
  side.normalized = side.fallback;
  if (side.error.empty()) side.error = "no answer found";
  return side;
}

}  // namespace sluice::reward_server::internal
