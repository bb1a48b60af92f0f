#ifndef SLUICE_REWARD_SERVER_MATH_MATH_VERIFY_CASES_H_
#define SLUICE_REWARD_SERVER_MATH_MATH_VERIFY_CASES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "reward_server/math/math_equivalence.h"

namespace sluice::reward_server {

// One labelled case of Math-Verify's test suite (testdata/math_verify/
// cases.jsonl; testdata/README.md), with its recorded options turned into
// ours. Shared by math_verify_cases_test, the math_agreement tool and
// bench_reward, so that all three read the cases the same way.
struct MathVerifyCase {
  int line = 0;          // 1-based line in the file.
  std::string gold;
  std::string prediction;
  bool expected = false;
  std::string category;  // The upstream test function ("test_sets_handling").
  MathCompareOptions options;
  // Run with Math-Verify's default options: match_types latex + expr,
  // precision 6, strict, no set/relation comparison, or a
  // `verify(parse(gold), parse(pred))` line (library defaults).
  bool default_options = true;
};

// Every case of `path`. NOT_FOUND when it cannot be opened, INVALID_ARGUMENT
// "<path>:<line>: ..." for a line that is not a case.
absl::StatusOr<std::vector<MathVerifyCase>> LoadMathVerifyCases(const std::string& path);

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_MATH_MATH_VERIFY_CASES_H_
