#include "reward_server/builtin_verifiers.h"

#include <memory>

#include "common/status_macros.h"
#include "reward_server/exact_match_verifier.h"
#include "reward_server/format_verifier.h"
#include "reward_server/length_verifier.h"

namespace sluice::reward_server {

absl::StatusOr<VerifierRegistry> MakeBuiltinVerifierRegistry(
    const BuiltinVerifierOptions& options) {
  RETURN_IF_ERROR(options.math.Validate());
  RETURN_IF_ERROR(options.code.Validate());
  VerifierRegistry registry;
  RETURN_IF_ERROR(registry.Register(std::make_shared<MathVerifier>(options.math)));
  RETURN_IF_ERROR(registry.Register(std::make_shared<ExactMatchVerifier>()));
  RETURN_IF_ERROR(registry.Register(std::make_shared<CodeVerifier>(options.code)));
  RETURN_IF_ERROR(registry.Register(std::make_shared<FormatVerifier>()));
  RETURN_IF_ERROR(registry.Register(std::make_shared<LengthVerifier>()));
  return registry;
}

}  // namespace sluice::reward_server
