#ifndef SLUICE_REWARD_SERVER_MATH_VERIFIER_H_
#define SLUICE_REWARD_SERVER_MATH_VERIFIER_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "reward_server/math/math_equivalence.h"
#include "reward_server/verifier.h"

namespace sluice::reward_server {

// The "math" verifier. Two pure functions for the common numeric case
// (NormalizeNumber, NumbersEqual: linear time, no recursion, integers of any
// length compared digit by digit) over the final answer that ExtractAnswer
// (math/answer_extraction.h) finds and, for everything else,
// CompareMathAnswers (math/math_equivalence.h): Math-Verify-style extraction
// and LaTeX/symbolic equivalence with GiNaC, bounded so it cannot hang.

// The canonical decimal form of `text` when it is a number, else nullopt:
// surrounding whitespace, "$", "\$" and a trailing period dropped; thousands
// separators removed; unicode minus (U+2212) read as "-"; a leading "+"
// dropped; leading zeros of the integer part and trailing zeros of the
// decimals removed ("-0" -> "0", "003.50" -> "3.5", "1,234.0" -> "1234");
// fractions "a/b" and "\frac{a}{b}" (also \dfrac, \tfrac) kept as "a/b" with
// normalised parts ("4/1" -> "4"); a zero denominator is not a number.
std::optional<std::string> NormalizeNumber(absl::string_view text);

// Relative tolerance used by NumbersEqual unless told otherwise.
inline constexpr double kDefaultRelativeTolerance = 1e-9;

// Whether `a` and `b` are both numbers (NormalizeNumber) of equal value.
// Integers compare exactly, whatever their length. When either has decimals
// or is a fraction the values compare as doubles within `relative_tolerance`
// of the larger magnitude ("0.5" == "1/2", "0.333" != "1/3"); values beyond
// double's range are equal only when their canonical forms are.
bool NumbersEqual(absl::string_view a, absl::string_view b,
                  double relative_tolerance = kDefaultRelativeTolerance);

struct MathVerifierOptions {
  double relative_tolerance = kDefaultRelativeTolerance;
  absl::Duration default_timeout = absl::Milliseconds(5000);
  absl::Duration max_timeout = absl::Seconds(60);

  // INVALID_ARGUMENT naming the field: tolerance in [0, 1), timeouts > 0 and
  // default <= max.
  absl::Status Validate() const;
};

// MathCompareOptions from a request's metadata: "precision" (an integer in
// [0, 15], decimal places compared when a side has a decimal literal; default
// 6) and "strict" ("true"/"false"; default true). INVALID_ARGUMENT naming the
// key when malformed.
absl::StatusOr<MathCompareOptions> MathCompareOptionsFromMetadata(
    const std::map<std::string, std::string>& metadata);

// Reward 1 when the response's final answer is equivalent to the reference
// (CompareMathAnswers, math/math_equivalence.h, options from metadata), else
// 0. The reference is an answer unless the request marks it as a solution
// (reference_is_solution):
//   - an answer ("3\sqrt{13}", "6 - 5i", "1,-2", "\text{Evelyn}") is parsed
//     as a whole (MathCompareOptions::gold_is_answer); only when it does not
//     parse as one, or reads as prose, is an answer extracted from it as from
//     a response, so "#### 72" and "so \boxed{72}" still work;
//   - a solution (a GSM8K rationale ending in "#### N", a MATH solution with
//     \boxed{N}) has its final answer extracted like a response's.
// Integer answers on both sides (ExtractAnswer / NormalizeNumber; for an
// unmarked reference, the whole of it) compare exactly without the symbolic
// path. kParse when ExtractAnswer finds no answer in the response;
// kInvalidInput for malformed metadata. An answer too large to compare
// safely (e.g. 2^{2^{30}}) gets reward 0 with a "too_large" detail. Requires
// reference_answer. Thread-safe.
class MathVerifier final : public Verifier {
 public:
  // `options` must be valid (Validate()).
  explicit MathVerifier(MathVerifierOptions options = {});

  VerifyOutcome Verify(const VerifyRequest& request) const override;

 private:
  const MathVerifierOptions options_;
};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_MATH_VERIFIER_H_
