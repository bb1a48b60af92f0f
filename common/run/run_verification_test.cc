#include "common/run/run_verification.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::run {
namespace {

using ::testing::ElementsAre;

TEST(RunVerificationTest, UnsetVerifiesUntrustedWorkersFullyAndSamplesTrustedOnes) {
  v1::RolloutVerificationConfig config;
  config.add_trusted_worker_ids("worker-0");
  const RolloutVerificationPolicy policy = ResolveRolloutVerification(config);
  EXPECT_EQ(policy.fraction, 1.0);
  EXPECT_EQ(policy.trusted_fraction, kDefaultTrustedVerificationFraction);
  EXPECT_EQ(policy.FractionFor({"worker-0", "worker-0"}), kDefaultTrustedVerificationFraction);
  // Another identity, or a group one of whose trajectories is another's.
  EXPECT_EQ(policy.FractionFor({"remote-7"}), 1.0);
  EXPECT_EQ(policy.FractionFor({"worker-0", "remote-7"}), 1.0);
  EXPECT_EQ(policy.FractionFor({}), 1.0);
}

TEST(RunVerificationTest, WithoutTrustedWorkersEveryGroupIsVerified) {
  const RolloutVerificationPolicy policy =
      ResolveRolloutVerification(v1::RolloutVerificationConfig());
  EXPECT_EQ(policy.FractionFor({"worker-0"}), 1.0);
}

// A spec that asks for a fraction gets it for every worker, trusted or not.
TEST(RunVerificationTest, AFractionTheSpecSetsAppliesToTrustedWorkersToo) {
  v1::RolloutVerificationConfig config;
  config.set_fraction(0);
  config.add_trusted_worker_ids("worker-0");
  EXPECT_EQ(ResolveRolloutVerification(config).FractionFor({"worker-0"}), 0.0);
  config.set_fraction(1);
  EXPECT_EQ(ResolveRolloutVerification(config).FractionFor({"worker-0"}), 1.0);
  config.set_trusted_fraction(0.25);
  EXPECT_EQ(ResolveRolloutVerification(config).FractionFor({"worker-0"}), 0.25);
  EXPECT_EQ(ResolveRolloutVerification(config).FractionFor({"worker-1"}), 1.0);
}

TEST(RunVerificationTest, ResolvingSpellsThePolicyOutAndIsIdempotent) {
  v1::RolloutVerificationConfig config;
  ResolveRolloutVerificationDefaults({"worker-0", "worker-1"}, &config);
  EXPECT_EQ(config.fraction(), 1.0);
  EXPECT_EQ(config.trusted_fraction(), kDefaultTrustedVerificationFraction);
  EXPECT_THAT(config.trusted_worker_ids(), ElementsAre("worker-0", "worker-1"));
  const std::string once = config.SerializeAsString();
  ResolveRolloutVerificationDefaults({"worker-0", "worker-1"}, &config);
  EXPECT_EQ(config.SerializeAsString(), once);
  // Resolved, the spec reads as the trainer will act.
  EXPECT_EQ(ResolveRolloutVerification(config).FractionFor({"worker-1"}),
            kDefaultTrustedVerificationFraction);

  // A spec's own list wins over the deployment's.
  v1::RolloutVerificationConfig own;
  own.add_trusted_worker_ids("gpu-node-3");
  own.set_fraction(0.5);
  ResolveRolloutVerificationDefaults({"worker-0"}, &own);
  EXPECT_THAT(own.trusted_worker_ids(), ElementsAre("gpu-node-3"));
  EXPECT_EQ(own.trusted_fraction(), 0.5);
}

}  // namespace
}  // namespace sluice::run
