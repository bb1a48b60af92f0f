#ifndef SLUICE_COMMON_RUN_RUN_VERIFICATION_H_
#define SLUICE_COMMON_RUN_RUN_VERIFICATION_H_

#include <set>
#include <string>
#include <vector>

#include "sluice/v1/common.pb.h"

// How much of a run's rollouts the trainer verifies (docs/rollout-verification.md),
// by how far it trusts the worker that generated them.
//
// Verification recomputes a group's behaviour log-probs: about one more
// forward pass of the batch when every group is checked, half of a small
// model's training step. It earns that where workers are not trusted. The
// workers that the deployment started itself (`sluice up` supervises them,
// from the same binaries, on the same machine) are not adversaries: what can
// go wrong there is an engine that drifted from the trainer, which shows in
// every group and so in a small sample as well. So:
//
//   untrusted workers (any other id)     fraction          default 1
//   trusted workers (trusted_worker_ids) trusted_fraction  default 1/16, or
//                                                           fraction when the
//                                                           spec sets it
//
// The controller resolves the spec with it (filling in the trusted workers
// it was told of), the trainer chooses the groups to verify with it, so that
// the spec a user reads back says what the trainer does.
namespace sluice::run {

// trusted_fraction when neither it nor fraction is set: two groups of a
// 32-group batch on average.
inline constexpr double kDefaultTrustedVerificationFraction = 1.0 / 16;

struct RolloutVerificationPolicy {
  double fraction = 1;  // Groups of untrusted workers.
  double trusted_fraction = kDefaultTrustedVerificationFraction;
  std::set<std::string> trusted_worker_ids;

  // The fraction for a group whose trajectories carry `worker_ids`: trusted
  // only when every one of them is.
  double FractionFor(const std::vector<std::string>& worker_ids) const;
};

// The policy a spec's rollout_verification resolves to (a spec whose
// fractions lie outside [0, 1] should not be run; they are clamped).
RolloutVerificationPolicy ResolveRolloutVerification(const v1::RolloutVerificationConfig& config);

// Spells the policy out in `config`: fraction and trusted_fraction set, and
// trusted_worker_ids = `deployment_trusted_worker_ids` when the spec lists
// none. Idempotent.
void ResolveRolloutVerificationDefaults(
    const std::vector<std::string>& deployment_trusted_worker_ids,
    v1::RolloutVerificationConfig* config);

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_VERIFICATION_H_
