#include "common/run/run_verification.h"

#include <algorithm>

namespace sluice::run {
namespace {

double Clamp(double fraction) {
  if (!(fraction >= 0)) return 0;  // NaN too.
  return std::min(fraction, 1.0);
}

}  // namespace

double RolloutVerificationPolicy::FractionFor(const std::vector<std::string>& worker_ids) const {
  if (worker_ids.empty()) return fraction;
  for (const std::string& id : worker_ids) {
    if (trusted_worker_ids.count(id) == 0) return fraction;
  }
  return trusted_fraction;
}

RolloutVerificationPolicy ResolveRolloutVerification(const v1::RolloutVerificationConfig& config) {
  RolloutVerificationPolicy policy;
  policy.fraction = config.has_fraction() ? Clamp(config.fraction()) : 1.0;
  policy.trusted_fraction = config.has_trusted_fraction() ? Clamp(config.trusted_fraction())
                            : config.has_fraction()       ? policy.fraction
                                                          : kDefaultTrustedVerificationFraction;
  policy.trusted_worker_ids.insert(config.trusted_worker_ids().begin(),
                                   config.trusted_worker_ids().end());
  return policy;
}

void ResolveRolloutVerificationDefaults(
    const std::vector<std::string>& deployment_trusted_worker_ids,
    v1::RolloutVerificationConfig* config) {
  // From the config as submitted: trusted_fraction follows fraction only
  // when the spec set fraction itself.
  const RolloutVerificationPolicy policy = ResolveRolloutVerification(*config);
  if (!config->has_fraction()) config->set_fraction(policy.fraction);
  if (!config->has_trusted_fraction()) config->set_trusted_fraction(policy.trusted_fraction);
  if (config->trusted_worker_ids().empty()) {
    for (const std::string& id : deployment_trusted_worker_ids) config->add_trusted_worker_ids(id);
  }
}

}  // namespace sluice::run
