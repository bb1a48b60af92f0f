#ifndef SLUICE_COMMON_RUN_VERIFIER_PARAMS_H_
#define SLUICE_COMMON_RUN_VERIFIER_PARAMS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sluice::run {

// Checks the params a run gives a built-in verifier in its composition
// (reward.verifiers[i].params), so that a typo or a bad value is refused when
// the run is submitted rather than turning every item into invalid input.
// One home for these rules: the controller checks a spec with them at
// submit, the reward server's verifiers read the same params. A light
// library (RE2 and Abseil, no GiNaC, no sandbox). A new built-in verifier
// with params adds its rules here (docs/architecture.md).
//
//   format  format_regex (compiles with RE2, at most 4 KiB), format_full_match
//           (true/false), format (answer_marker | boxed | think_answer)
//   length  max_length (integer > 0, required), length_cache (integer in
//           [0, max_length]), length_unit (tokens | chars | auto)
//   math    precision (integer in [0, 15]), strict (true/false)
//   code    timeout-free: no params
//
// INVALID_ARGUMENT "<key>: <why>" (the caller prefixes where it is), also
// for a key the verifier does not read. A verifier not built in is not
// checked (another reward server may offer it): OK.
absl::Status ValidateVerifierParams(absl::string_view verifier,
                                    const std::map<std::string, std::string>& params);

// The names of the verifiers every reward server of this build offers
// (MakeBuiltinVerifierRegistry's), sorted: what `sluice submit
// --validate-only` checks reward.verifiers against without a server.
const std::vector<std::string>& BuiltinVerifierNames();

// "true"/"1"/"yes" and "false"/"0"/"no" (any case); nullopt-like false with
// *ok = false otherwise.
bool ParseBoolParam(absl::string_view value, bool* ok);

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_VERIFIER_PARAMS_H_
