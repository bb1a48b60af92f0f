#ifndef SLUICE_REWARD_SERVER_BUILTIN_VERIFIERS_H_
#define SLUICE_REWARD_SERVER_BUILTIN_VERIFIERS_H_

#include "absl/status/statusor.h"
#include "reward_server/math_verifier.h"
#include "reward_server/verifier.h"

namespace sluice::reward_server {

struct BuiltinVerifierOptions {
  MathVerifierOptions math;
};

// A registry holding every verifier this build offers: "exact_match" and
// "math" (issue #5 adds "code" and "format" here). INVALID_ARGUMENT when an
// option is invalid.
absl::StatusOr<VerifierRegistry> MakeBuiltinVerifierRegistry(
    const BuiltinVerifierOptions& options = {});

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_BUILTIN_VERIFIERS_H_
