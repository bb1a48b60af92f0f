#ifndef SLUICE_CLI_STACK_SECURITY_H_
#define SLUICE_CLI_STACK_SECURITY_H_

// The TLS material of `sluice up --tls`: a local CA, one certificate per
// service naming its role, and bearer tokens for the stack's users.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/stack_options.h"

namespace sluice::cli {

// Writes into `dir` (StackLayout::tls_dir: <state_dir>/tls, absolute) the
// CA (kept across restarts of the stack), one certificate per service in
// `services` (rollout workers as worker:<worker id>, the trainer and the
// controller as themselves, the reward server and the replay buffer, which
// call no one, as viewers), and fresh operator and viewer tokens (0600) with
// their hashes in tokens.yaml.
absl::StatusOr<StackSecurity> WriteStackSecurity(const std::string& dir,
                                                 const std::vector<ServiceEndpoint>& services);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_STACK_SECURITY_H_
