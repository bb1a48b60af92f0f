#ifndef SLUICE_REWARD_SERVER_MATH_ANSWER_EXTRACTION_H_
#define SLUICE_REWARD_SERVER_MATH_ANSWER_EXTRACTION_H_

// Step 1 of math_equivalence.h: which part of a free-text solution is its
// answer. Internal to the math verifier (CompareMathAnswers,
// ExtractMathAnswerCandidates and FindBoxedContents are the public API).
//
// Extraction works on text only: it finds candidates (a GSM8K "#### N" line,
// \boxed{} contents, math spans, plain numbers and arithmetic expressions),
// ranks them by the anchor before them ("final answer is", "answer:") and by
// position, and ExtractAnswer() takes the first that latex_parser.h parses.
// It never touches GiNaC, so it runs outside the GiNaC mutex
// (ginac_values.h) and in parallel on any number of threads.
//
// Bounds: the input is cut to kMaxCompareInputBytes (the tail is kept); every
// scan for candidates is linear in it (a delimiter that fails to close is
// never searched for again, runs of "$" are looked past a bounded distance);
// at most kMaxCandidatesTried candidates are parsed, each under
// latex_parser.h's bounds. Ranking looks back from each candidate for an
// "answer" / "final answer" anchor only within the short window where one
// counts (60 and 120 bytes), so it is linear too.

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "reward_server/math/latex_parser.h"
#include "reward_server/math/math_equivalence.h"

namespace sluice::reward_server::internal {

// Candidates parsed per side at most (each a bounded parse).
inline constexpr int kMaxCandidatesTried = 40;

// A delimited piece of the text: a math span or a box.
struct Span {
  size_t start;  // Of the whole match (delimiters included).
  size_t end;    // One past it.
  absl::string_view content;
  bool percent = false;
};

// \boxed{..} / \fbox{..} (also over-escaped "\\boxed{", and "\boxed {"),
// outermost only, in order, with a non-blank body; an unclosed box is not
// one. The contents view `s`. O(n), one pass with a stack. Thread-safe.
std::vector<Span> FindBoxes(absl::string_view s);

// A candidate with what ranks it.
struct RankedCandidate {
  MathAnswerCandidate candidate;
  size_t start = 0;    // Byte offset of its start in the text.
  bool latex = false;  // From a box, a math span, "####" or the whole text.
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

// The answer extracted from one side of a comparison.
struct ExtractedAnswer {
  std::string answer;      // Raw text of the chosen candidate.
  std::string normalized;  // Parsed form (DebugString) or normalised string.
  std::string fallback;    // Normalised string of the first candidate.
  std::optional<math::LatexExpr> parsed;  // Unset when nothing parsed.
  bool percent = false;    // The chosen candidate was followed by a percent sign.
  bool too_large = false;  // Nothing parsed, and a candidate was over a bound.
  std::string error;       // Why nothing parsed (the first parse error).
};

// The answer of `text`: with `whole_first`, the whole text when it is one
// answer (MathCompareOptions::gold_is_answer: it parses, is not prose and
// boxes nothing); otherwise (or when it is not) the first candidate of
// RankedCandidates that parses, skipping expression candidates inside a
// LaTeX candidate that failed. When none parses, `parsed` is unset and
// `fallback` holds the string to compare (with `whole_first` and no
// candidate at all, the whole text). Cuts `text` first (CutInput). Costs
// RankedCandidates plus at most kMaxCandidatesTried bounded parses; never
// throws; thread-safe (no GiNaC).
ExtractedAnswer ExtractAnswer(absl::string_view text, const MathCompareOptions& options,
                              bool whole_first = false);

}  // namespace sluice::reward_server::internal

#endif  // SLUICE_REWARD_SERVER_MATH_ANSWER_EXTRACTION_H_
