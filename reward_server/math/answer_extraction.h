#ifndef SLUICE_REWARD_SERVER_MATH_ANSWER_EXTRACTION_H_
#define SLUICE_REWARD_SERVER_MATH_ANSWER_EXTRACTION_H_

// Which part of a free-text solution is its answer: the math verifier's one
// answer extractor. One result type (ExtractedAnswer), two ways to read a
// text, for two costs:
//
//  - ExtractAnswer(text): the answer the text marks, by a fixed cascade of
//    rules (AnswerSource, in order) and no parsing. Linear, no recursion,
//    whatever the input's length. MathVerifier's integer fast path compares
//    it and its details quote it; the "format" verifier's answer_marker
//    preset checks that it has a marker.
//  - internal::ExtractParsedAnswer(text, options): step 1 of
//    math_equivalence.h. Candidates (a GSM8K "#### N" line, \boxed{}
//    contents, math spans, plain numbers and arithmetic expressions), ranked
//    by the anchor before them ("final answer is", "answer:") and by
//    position; the first that latex_parser.h parses wins. CompareMathAnswers
//    compares it.
//
// Both find boxes with one scan (ScanBoxes); ExtractAnswer's numbers are
// ScanNumber's, which NormalizeNumber (math_verifier.h) reads too. Neither
// touches GiNaC, so extraction runs outside the GiNaC mutex (ginac_values.h)
// and in parallel on any number of threads.
//
// Bounds of the ranked extraction: the input is cut to kMaxCompareInputBytes
// (the tail is kept); every scan for candidates is linear in it (a delimiter
// that fails to close is never searched for again, runs of "$" are looked
// past a bounded distance); at most kMaxCandidatesTried candidates are
// parsed, each under latex_parser.h's bounds. Ranking looks back from each
// candidate for an "answer" / "final answer" anchor only within the short
// window where one counts (60 and 120 bytes), so it is linear too.

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "reward_server/math/latex_parser.h"
#include "reward_server/math/math_equivalence.h"

namespace sluice::reward_server {

// Where an answer was found. ExtractAnswer tries the first six in this order
// and reports the one that yielded; ExtractParsedAnswer reports the kind of
// the candidate it chose.
enum class AnswerSource {
  kBoxed,        // The last balanced \boxed{...} or \fbox{...} (nested braces allowed).
                 // Ranked: with the boxes joined to it ("\boxed{1} and \boxed{2}").
  kHashes,       // "#### N" (GSM8K), the last one.
  kAnswerIs,     // "... answer is X" (any case), the last one. Ranked: after
                 // "final answer ... is" or "answer ..." close before it.
  kAnswerColon,  // "Answer: X" (any case), the last one.
  kMathSpan,     // The last $..$, $$..$$, \(..\) or \[..\] span.
  kLastNumber,   // Otherwise the last number in the text. Ranked: a plain
                 // number or arithmetic expression, rightmost first.
  kWholeText,    // Ranked only: the whole text, read as one answer.
};

// "boxed", "####", "answer is", "answer:", "math span", "last number",
// "whole text".
absl::string_view AnswerSourceName(AnswerSource source);

// An answer extracted from a text. ExtractAnswer sets `text` and `source`
// only; ExtractParsedAnswer sets every field.
struct ExtractedAnswer {
  // The answer as the text writes it. ExtractAnswer: trimmed, without a
  // trailing period. ExtractParsedAnswer: the chosen candidate (several
  // joined with ", "), or when none parses the first one; empty when there
  // was none.
  std::string text;
  // Where `text` was found (kWholeText when it is empty).
  AnswerSource source = AnswerSource::kWholeText;
  std::string normalized;                 // Parsed form (DebugString) or normalised string.
  std::string fallback;                   // Normalised string of the first candidate.
  std::optional<math::LatexExpr> parsed;  // Unset when nothing parsed.
  bool percent = false;                   // The chosen candidate was followed by a percent sign.
  bool too_large = false;                 // Nothing parsed, and a candidate was over a bound.
  std::string error;                      // Why nothing parsed (the first parse error).
};

// The final answer the text marks, by the first rule of AnswerSource that
// yields a non-empty answer; nullopt when none does (no marker and no
// number). After a marker ("####", "answer is", "Answer:") the answer is the
// number that starts the rest of the line ("The answer is $52 apples." ->
// "52"), or, when the line does not start with a standalone number, the rest
// of the line. A number is internal::ScanNumber's: [sign] digits (with
// "1,234"-style thousands separators) [.digits] or [/digits]; a "-" directly
// after a letter, digit or ")" is an operator, not a sign ("5-3" ends in "3",
// "x = -3" in "-3"). A box is ScanBoxes' with no space before its brace,
// and the box that opens last wins, so of nested boxes the innermost. Linear
// in the text, which is not cut. Thread-safe.
std::optional<ExtractedAnswer> ExtractAnswer(absl::string_view text);

namespace internal {

// Candidates parsed per side at most (each a bounded parse).
inline constexpr int kMaxCandidatesTried = 40;

// A delimited piece of the text: a math span or a box.
struct Span {
  size_t start;  // Of the whole match (delimiters included).
  size_t end;    // One past it.
  absl::string_view content;
  bool percent = false;
};

// A balanced box, as ScanBoxes reports it.
struct BoxMatch {
  size_t start;          // Its backslash (the first of an over-escaped "\\boxed").
  size_t content_start;  // Just after its "{".
  size_t end;            // Just after its "}".
  bool nested;           // Another box was still open when it closed.
};

// Every balanced \boxed{..} / \fbox{..} of `s` (also over-escaped
// "\\boxed{", and with `space_before_brace` "\boxed {"), each passed to
// `visit` when it closes, so an inner box before the box around it. Braces
// written "\{" and "\}" do not count. O(n) plus the visits: one pass with a
// stack of the boxes open. Thread-safe.
void ScanBoxes(absl::string_view s, bool space_before_brace,
               absl::FunctionRef<void(const BoxMatch&)> visit);

// \boxed{..} / \fbox{..} (also over-escaped "\\boxed{", and "\boxed {"),
// outermost only, in order, with a non-blank body; an unclosed box is not
// one. The contents view `s`. O(n): ScanBoxes. Thread-safe.
std::vector<Span> FindBoxes(absl::string_view s);

// Length of a sign ("-", "+", U+2212) at s[i], 0 when there is none.
size_t SignLength(absl::string_view s, size_t i);

// Length of the number starting at s[i] (0 when none starts there):
//   [sign] int [. digits] | [sign] int / digits | [sign] . digits
// where int is plain digits or 1-3 digits followed by ",ddd" groups (a group
// must be exactly three digits), and a sign is taken only when `allow_sign`.
// The numbers ExtractAnswer finds and NormalizeNumber (math_verifier.h)
// reads. Linear in the length consumed.
size_t ScanNumber(absl::string_view s, size_t i, bool allow_sign);

// `text` without surrounding whitespace and trailing periods.
absl::string_view TrimAnswer(absl::string_view text);

// A candidate with what ranks it.
struct RankedCandidate {
  MathAnswerCandidate candidate;
  size_t start = 0;    // Byte offset of its start in the text.
  bool latex = false;  // From a box, a math span, "####" or the whole text.
  AnswerSource source = AnswerSource::kWholeText;
};

// Every candidate in `s`, in the order they are tried: by priority, then
// rightmost end first, then leftmost start; last, the whole text when it
// looks like a bare expression. `options` selects the extractors
// (match_latex, match_expr). Does not cut `s` (see CutInput). Linear in
// the input apart from the anchor search (see the file comment).
// Thread-safe.
std::vector<RankedCandidate> RankedCandidates(absl::string_view s,
                                              const MathCompareOptions& options);

// `text`, or its last kMaxCompareInputBytes bytes when longer.
absl::string_view CutInput(absl::string_view text);

// The string form compared as a last resort: no spaces, "$", \text-like
// wrappers, \left/\right, spacing; \dfrac is \frac; "(C)" is "C". Linear.
std::string NormalizeAnswerString(absl::string_view text);

// The answer of `text` for comparison: with `whole_first`, the whole text
// when it is one answer (MathCompareOptions::gold_is_answer: it parses, is
// not prose and boxes nothing); otherwise (or when it is not) the first
// candidate of RankedCandidates that parses, skipping expression candidates
// inside a LaTeX candidate that failed. When none parses, `parsed` is unset
// and `fallback` holds the string to compare (with `whole_first` and no
// candidate at all, the whole text). Cuts `text` first (CutInput). Costs
// RankedCandidates plus at most kMaxCandidatesTried bounded parses; never
// throws; thread-safe (no GiNaC).
ExtractedAnswer ExtractParsedAnswer(absl::string_view text, const MathCompareOptions& options,
                                    bool whole_first = false);

}  // namespace internal
}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_MATH_ANSWER_EXTRACTION_H_
