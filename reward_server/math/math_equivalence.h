#ifndef SLUICE_REWARD_SERVER_MATH_MATH_EQUIVALENCE_H_
#define SLUICE_REWARD_SERVER_MATH_MATH_EQUIVALENCE_H_

// Math answer equivalence in the manner of HuggingFace's Math-Verify
// (`verify(parse(gold), parse(prediction))`), in C++ with GiNaC:
//
//  1. Extraction (the prediction, and the gold unless it is a bare answer:
//     MathCompareOptions::gold_is_answer): candidate answers by priority: a
//     GSM8K "#### N" line and the last \boxed{}/\fbox{} (adjacent boxes
//     joined into one list: "\boxed{1} and \boxed{2}"); "final answer is $X$. I hope";
//     "final answer ... is X"; "answer: X"; "answer ... X"; then any math
//     span ($..$, $$..$$, \(..\), \[..\], a bare \frac{a}{b}) or plain number
//     or arithmetic expression, rightmost first; last, the whole text when it
//     looks like a bare expression. The first candidate that parses wins.
//  2. Parsing (latex_parser.h) and conversion to GiNaC expressions; "a ± b"
//     becomes the set {a+b, a-b}; "i" is the imaginary unit ("6 - 5i");
//     digits with a base from 2 to 10 are their value ("52_8" is 42).
//  3. Comparison: numbers exactly (integers of any length), or, when either
//     side has a decimal literal, after rounding both to `precision` decimal
//     places; expressions by exact cancellation in GiNaC, else by numeric
//     identity testing at deterministic pseudo-random points (so x^2-1 ==
//     (x-1)(x+1), \tan^2 y + 1 == \sec^2 y); tuples in order; sets and bare
//     lists ("1, 2") in any order; intervals with their open/closed ends;
//     unions part by part; matrices cell by cell; equations and inequalities
//     up to a (positive, for inequalities) constant factor; an assignment
//     "x = 5" against a bare "5"; "28\%" against 28 or 0.28; a relation chain
//     "1 < x < 2" (gold) against the interval (1, 2); units are dropped
//     ("30^\circ" is 30, "5\text{ cm}" is 5) but when both sides give units
//     they must be the same ("36^\circ" is not "\$36"). Finally the extracted
//     strings themselves, normalised (\text, spaces, $ removed), compare equal.
//
// Nothing here can hang: inputs are cut to kMaxCompareInputBytes (the tail is
// kept), each answer is parsed under latex_parser.h's bounds, and before any
// GiNaC arithmetic the sizes are checked: exponents at most kMaxExponent,
// exact numbers at most kMaxNumberBits bits, factorials of at most
// kMaxFactorial. No expand()/normal() is ever called; equivalence of
// non-trivial expressions is decided numerically. An input over a bound is a
// kTooLarge outcome (never equal), not an error thrown or a stall.
//
// GiNaC and CLN are not thread-safe (non-atomic reference counts on shared
// constants), so the GiNaC part of every comparison runs under one process-
// wide mutex; it is short and bounded. Exceptions from GiNaC/CLN are caught
// here and never escape.
//
// Inside: answer_extraction.h (step 1), latex_parser.h and ginac_values.h
// (step 2, and the bounds and the mutex), math_equivalence.cc (step 3).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "reward_server/math/latex_parser.h"

namespace sluice::reward_server {

inline constexpr size_t kMaxCompareInputBytes = 256 * 1024;
inline constexpr int kMaxExponent = 1000;
inline constexpr int kMaxNumberBits = 20000;
inline constexpr int kMaxFactorial = 1000;

struct MathCompareOptions {
  // Decimal places both sides are rounded to when either holds a decimal
  // literal (Math-Verify's float_rounding). In [0, 15].
  int precision = 6;
  // When false, an equation on one side also compares by its right-hand side
  // with a bare answer on the other even when its left side is not a plain
  // name ("2x = 4" vs "4"). Math-Verify's `strict`.
  bool strict = true;
  // Whether a relation in the prediction ("1 \le x \le 2") may match an
  // interval in the gold ("[1, 2]"); the reverse is always allowed.
  bool allow_set_relation_comp = false;
  // Which extractors run (Math-Verify's match_types "latex" and "expr").
  bool match_latex = true;
  bool match_expr = true;
  // Whether `gold` is the bare answer (a dataset's reference: "3\sqrt{13}",
  // "6 - 5i", "1,-2", "\text{Evelyn}") rather than free text. When true, the
  // whole gold is parsed as one answer first, and candidates are extracted
  // from it only when it does not parse as a whole or reads as prose (two
  // words in a row outside \text{}: "The answer is 5"). When false
  // (Math-Verify's behaviour), the gold is extracted from like the
  // prediction, so "3\sqrt{13}" reads as 3.
  bool gold_is_answer = false;

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

enum class MathCompareError {
  kNone,
  kParse,     // A side had no answer that parses (strings may still match).
  kTooLarge,  // A side's answer exceeds a bound (see above).
};

// "none", "parse", "too_large".
absl::string_view MathCompareErrorName(MathCompareError error);

struct MathComparison {
  bool equal = false;
  // The answers extracted from each side (raw text), empty when none.
  std::string gold_answer;
  std::string prediction_answer;
  // Their parsed forms (latex_parser.h's DebugString), or the normalised
  // string when unparsed.
  std::string gold_normalized;
  std::string prediction_normalized;
  MathCompareError error = MathCompareError::kNone;
  std::string error_detail;
};

// Whether `prediction` answers like `gold`; see the file comment. Both are
// free text (a full solution or a bare answer). Deterministic; thread-safe;
// never throws; bounded time on any input.
MathComparison CompareMathAnswers(absl::string_view gold, absl::string_view prediction,
                                  const MathCompareOptions& options = {});

// One extraction candidate (step 1 above), for tests and fuzzing.
struct MathAnswerCandidate {
  std::string text;      // The answer's text, several joined with ", ".
  bool percent = false;  // Followed by "%", "\%", "percent", "pct".
  int priority = 0;      // Lower is tried first.
  size_t end = 0;        // Byte offset of its end (rightmost tried first).
};

// Every candidate in `text`, in the order they are tried. Linear in the
// input (which is cut as in CompareMathAnswers).
std::vector<MathAnswerCandidate> ExtractMathAnswerCandidates(absl::string_view text,
                                                             const MathCompareOptions& options);

// The contents of the outermost \boxed{...} / \fbox{...} of `text` with a
// non-blank body, in order (balanced braces; "\boxed {x}" and the
// over-escaped "\\boxed{x}" count; an unclosed box does not). The scan the
// extraction above uses, for other verifiers ("format") to agree with it.
std::vector<absl::string_view> FindBoxedContents(absl::string_view text);

// Fuzzing entry point: extraction, parsing, and conversion to GiNaC of the
// first candidate of `text` (any bytes). The parsed form's DebugString, or
// INVALID_ARGUMENT / RESOURCE_EXHAUSTED / NOT_FOUND. Never crashes or throws.
absl::StatusOr<std::string> ParseMathAnswerForFuzzing(absl::string_view text);

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_MATH_MATH_EQUIVALENCE_H_
