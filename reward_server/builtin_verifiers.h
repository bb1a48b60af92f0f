#ifndef SLUICE_REWARD_SERVER_BUILTIN_VERIFIERS_H_
#define SLUICE_REWARD_SERVER_BUILTIN_VERIFIERS_H_

#include "absl/status/statusor.h"
#include "reward_server/code_verifier.h"
#include "reward_server/math_verifier.h"
#include "reward_server/verifier.h"

namespace sluice::reward_server {

struct BuiltinVerifierOptions {
  MathVerifierOptions math;
  CodeVerifierOptions code;
};

// A registry holding every verifier this build offers: "math", "code",
// "format", "length" and "exact_match". INVALID_ARGUMENT when an option is
// invalid. The code verifier's sandbox is not tried here (see
// CheckSandboxAvailable): without it, "code" answers kSandbox.
absl::StatusOr<VerifierRegistry> MakeBuiltinVerifierRegistry(
    const BuiltinVerifierOptions& options = {});

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_BUILTIN_VERIFIERS_H_
