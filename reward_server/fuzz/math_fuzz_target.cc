// libFuzzer target for the math verifier's untrusted-text path: answer
// extraction, number normalisation, LaTeX parsing and conversion, and the
// comparison itself. Model outputs are arbitrary bytes; none may crash, hang,
// or read out of bounds.
//
// The input is split at its first NUL byte into a gold and a prediction (no
// NUL: the input is both), so the fuzzer explores pairs as well as single
// answers. The gold is compared as free text, as a bare answer, and through
// MathVerifier as a reference marked a solution and not.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "reward_server/math/answer_extraction.h"
#include "reward_server/math/math_equivalence.h"
#include "reward_server/math_verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace reward = sluice::reward_server;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  (void)reward::ExtractAnswer(input);
  (void)reward::NormalizeNumber(input);
  (void)reward::ParseMathAnswerForFuzzing(input);

  const size_t split = input.find('\0');
  const absl::string_view gold = split == absl::string_view::npos ? input : input.substr(0, split);
  const absl::string_view prediction =
      split == absl::string_view::npos ? input : input.substr(split + 1);
  reward::MathComparison comparison = reward::CompareMathAnswers(gold, prediction);
  // A text always equals itself unless it has no parseable answer or is over
  // a bound: anything else is a bug worth a crash report.
  if (split == absl::string_view::npos && comparison.error == reward::MathCompareError::kNone &&
      !comparison.equal && !comparison.gold_answer.empty() &&
      comparison.gold_answer == comparison.prediction_answer) {
    __builtin_trap();
  }
  // The gold as a bare reference (parsed whole first), as the verifier reads
  // an unmarked reference_answer.
  reward::MathCompareOptions bare;
  bare.gold_is_answer = true;
  (void)reward::CompareMathAnswers(gold, prediction, bare);
  // The verifier itself, the reference marked as a solution and not.
  static const reward::MathVerifier* const verifier = new reward::MathVerifier();
  reward::VerifyRequest request;
  request.response = std::string(prediction);
  request.reference_answer = std::string(gold);
  for (const bool solution : {false, true}) {
    request.reference_is_solution = solution;
    (void)verifier->Verify(request);
  }
  return 0;
}
