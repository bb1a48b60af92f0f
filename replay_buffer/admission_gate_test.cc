// The admission gate alone: its rule, its leases on a fake clock, release
// and quarantine. No table, no journal, no threads (run_table_test.cc tests
// the waiting and the journaling around it).
#include "replay_buffer/admission_gate.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using testing::FakeClock;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr char kRun[] = "run-1";
constexpr absl::Duration kTtl = absl::Seconds(10);

AdmissionGate::Options GateOptions(FakeClock* clock, int32_t batch_size = 4,
                                   int32_t max_staleness = 1) {
  return AdmissionGate::Options{.run_id = kRun,
                                .batch_size_groups = batch_size,
                                .max_staleness = max_staleness,
                                .lease_ttl = kTtl,
                                .clock = [clock] { return clock->Now(); }};
}

// Grants `count` leases to `worker` (incarnation 1) as the table does: the
// ids the gate names, expiring a TTL from now. Returns their ids.
std::vector<std::string> GrantTo(AdmissionGate& gate, const std::string& worker, int64_t count,
                                 uint64_t incarnation = 1) {
  v1::storage::LeasesGranted granted;
  granted.set_worker_id(worker);
  granted.set_worker_incarnation(incarnation);
  for (const std::string& id : gate.NextLeaseIds(count)) granted.add_lease_ids(id);
  gate.Grant(granted, gate.FreshExpiry());
  return {granted.lease_ids().begin(), granted.lease_ids().end()};
}

v1::storage::WorkersQuarantined Quarantined(std::vector<std::string> workers) {
  v1::storage::WorkersQuarantined quarantined;
  for (const std::string& worker : workers) quarantined.add_worker_ids(worker);
  return quarantined;
}

// ---------------------------------------------------------------------------
// The rule: accepted + running < (eta + v + 1) * B
// ---------------------------------------------------------------------------

struct RuleCase {
  int32_t batch_size;     // B
  int32_t max_staleness;  // eta
  int64_t version;        // v, the gate's initial version
};

class AdmissionGateRuleTest : public ::testing::TestWithParam<RuleCase> {};

TEST_P(AdmissionGateRuleTest, GrantsExactlyUpToTheLimitCountingAcceptedAndRunning) {
  const RuleCase c = GetParam();
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock, c.batch_size, c.max_staleness), c.version);
  const int64_t limit = (c.max_staleness + c.version + 1) * c.batch_size;
  // A run starting at v counts v batches as already accepted.
  EXPECT_EQ(gate.admission_limit(), limit);
  EXPECT_EQ(gate.accepted(), c.version * c.batch_size);
  EXPECT_EQ(gate.capacity(), limit - c.version * c.batch_size);

  // Half the free slots stored, the other half running: the gate is full.
  const int64_t free = gate.capacity();
  for (int64_t i = 0; i < free / 2; ++i) gate.OnAccepted();
  GrantTo(gate, "w", free - free / 2);
  EXPECT_EQ(gate.accepted() + gate.running(), limit);
  EXPECT_EQ(gate.capacity(), 0);
  const GateState state = gate.state();
  EXPECT_EQ(state.policy_version, c.version);
  EXPECT_EQ(state.accepted, c.version * c.batch_size + free / 2);
  EXPECT_EQ(state.running, free - free / 2);
  EXPECT_EQ(state.admission_limit, limit);

  // One version later there are exactly B free slots again.
  EXPECT_TRUE(gate.AdvanceVersion(c.version + 1));
  EXPECT_EQ(gate.admission_limit(), limit + c.batch_size);
  EXPECT_EQ(gate.capacity(), c.batch_size);
}

INSTANTIATE_TEST_SUITE_P(SeveralBatchSizesStalenessesAndVersions, AdmissionGateRuleTest,
                         ::testing::Values(RuleCase{1, 0, 0},   // synchronous, one group
                                           RuleCase{4, 0, 0},   // synchronous
                                           RuleCase{4, 1, 0},   // one version ahead
                                           RuleCase{4, 2, 3},   // resumed at v = 3
                                           RuleCase{16, 4, 7},  // wide window, resumed
                                           RuleCase{3, 5, 1}));

TEST(AdmissionGateTest, AdvanceVersionIgnoresALowerOrEqualVersion) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock, /*batch_size=*/4, /*max_staleness=*/1), 2);
  EXPECT_FALSE(gate.AdvanceVersion(2));
  EXPECT_FALSE(gate.AdvanceVersion(1));
  EXPECT_EQ(gate.policy_version(), 2);
  EXPECT_EQ(gate.admission_limit(), 16);
  EXPECT_TRUE(gate.AdvanceVersion(5));  // a jump frees B slots per version
  EXPECT_EQ(gate.policy_version(), 5);
  EXPECT_EQ(gate.admission_limit(), 28);
}

TEST(AdmissionGateTest, AGroupStoredWithoutALiveLeaseCanTakeCapacityBelowZero) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock, /*batch_size=*/2, /*max_staleness=*/0), 0);
  const std::vector<std::string> ids = GrantTo(gate, "w", 2);
  EXPECT_EQ(gate.capacity(), 0);
  // A stored group consumes its live lease: accepted + 1, running - 1.
  EXPECT_TRUE(gate.Release(ids[0]));
  gate.OnAccepted();
  EXPECT_EQ(gate.capacity(), 0);
  // A slow worker's group whose lease expired is stored all the same.
  clock.Advance(kTtl);
  gate.ExpireLeases();
  EXPECT_EQ(gate.running(), 0);
  gate.OnAccepted();
  gate.OnAccepted();
  EXPECT_EQ(gate.capacity(), -1);
  // Groups dropped untrained (stale, capacity) give their slots back.
  gate.OnDroppedUntrained();
  gate.OnDroppedUntrained();
  EXPECT_EQ(gate.accepted(), 1);
  EXPECT_EQ(gate.capacity(), 1);
}

// ---------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------

TEST(AdmissionGateTest, LeasesExpireOneTtlAfterTheirGrantOnTheGateClock) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  EXPECT_EQ(gate.FreshExpiry(), clock.Now() + kTtl);
  GrantTo(gate, "w", 3);
  EXPECT_EQ(gate.running(), 3);
  clock.Advance(kTtl - absl::Seconds(1));
  gate.ExpireLeases();
  EXPECT_EQ(gate.running(), 3);
  // Not dropped until ExpireLeases runs: running() counts them meanwhile.
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(gate.running(), 3);
  gate.ExpireLeases();
  EXPECT_EQ(gate.running(), 0);
  EXPECT_EQ(gate.capacity(), gate.admission_limit());
}

TEST(AdmissionGateTest, RenewExtendsOnlyTheWorkersLiveLeases) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  const std::vector<std::string> mine = GrantTo(gate, "w1", 2);
  const std::vector<std::string> theirs = GrantTo(gate, "w2", 1);
  clock.Advance(absl::Seconds(8));
  std::vector<std::string> not_renewed;
  gate.Renew("w1", {mine[0], theirs[0], "lease-unknown"}, &not_renewed);
  EXPECT_THAT(not_renewed, ElementsAre(theirs[0], "lease-unknown"));
  clock.Advance(absl::Seconds(8));  // 16 s after the grant, 8 s after the renewal
  gate.ExpireLeases();
  EXPECT_EQ(gate.running(), 1);
  EXPECT_TRUE(gate.HasLease(mine[0]));
  EXPECT_FALSE(gate.HasLease(mine[1]));
  EXPECT_FALSE(gate.HasLease(theirs[0]));
  // An expired lease is not renewed back to life.
  not_renewed.clear();
  gate.Renew("w1", {mine[1]}, &not_renewed);
  EXPECT_THAT(not_renewed, ElementsAre(mine[1]));
  gate.Renew("w1", {mine[1]}, nullptr);  // a null list is allowed
}

TEST(AdmissionGateTest, NextExpiryRealTimeIsTheEarliestLeaseTranslatedToRealTime) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  EXPECT_EQ(gate.NextExpiryRealTime(), absl::InfiniteFuture());
  GrantTo(gate, "w", 1);
  clock.Advance(absl::Seconds(4));
  GrantTo(gate, "w", 1);  // expires 4 s later than the first
  // The first lease has 6 s left on the gate's clock, whatever its epoch.
  const absl::Time before = absl::Now();
  const absl::Time next = gate.NextExpiryRealTime();
  const absl::Time after = absl::Now();
  EXPECT_GE(next, before + absl::Seconds(6));
  EXPECT_LE(next, after + absl::Seconds(6));
  clock.Advance(absl::Seconds(6));
  gate.ExpireLeases();
  EXPECT_EQ(gate.running(), 1);
  const absl::Time second = gate.NextExpiryRealTime();
  EXPECT_LE(second, absl::Now() + absl::Seconds(4));
}

TEST(AdmissionGateTest, ReleaseDropsALiveLeaseOnce) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  const std::vector<std::string> ids = GrantTo(gate, "w", 2);
  const int64_t free = gate.capacity();
  EXPECT_TRUE(gate.Release(ids[0]));
  EXPECT_EQ(gate.capacity(), free + 1);
  EXPECT_FALSE(gate.Release(ids[0]));
  EXPECT_FALSE(gate.Release(""));
  EXPECT_FALSE(gate.Release("lease-unknown"));
  EXPECT_EQ(gate.running(), 1);
  // An expired lease is gone: releasing it changes nothing.
  clock.Advance(kTtl);
  gate.ExpireLeases();
  EXPECT_FALSE(gate.Release(ids[1]));
  EXPECT_EQ(gate.NextExpiryRealTime(), absl::InfiniteFuture());
}

TEST(AdmissionGateTest, LeasesToReleaseNamesOnlyTheWorkersLiveLeases) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  const std::vector<std::string> mine = GrantTo(gate, "w1", 3);
  const std::vector<std::string> theirs = GrantTo(gate, "w2", 1);
  ReleaseRequest request{.worker_id = "w1", .lease_ids = {mine[2], theirs[0], "nope", mine[0]}};
  EXPECT_THAT(gate.LeasesToRelease(request), ElementsAre(mine[2], mine[0]));
  request.release_all = true;  // ignores lease_ids
  EXPECT_THAT(gate.LeasesToRelease(request), UnorderedElementsAre(mine[0], mine[1], mine[2]));
  EXPECT_EQ(gate.running(), 4);  // only names them: the table journals, then releases
}

TEST(AdmissionGateTest, LeaseIdsAreUniqueAcrossGrantsAndGates) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  AdmissionGate other(GateOptions(&clock), 0);
  EXPECT_THAT(gate.NextLeaseIds(0), IsEmpty());
  const std::vector<std::string> named = gate.NextLeaseIds(2);
  EXPECT_EQ(gate.NextLeaseIds(2), named);  // naming reserves nothing
  absl::flat_hash_set<std::string> seen;
  for (const std::string& id : GrantTo(gate, "w", 2)) seen.insert(id);
  EXPECT_TRUE(seen.contains(named[0]) && seen.contains(named[1]));
  for (const std::string& id : GrantTo(gate, "w", 2)) EXPECT_TRUE(seen.insert(id).second) << id;
  for (const std::string& id : GrantTo(other, "w", 4)) EXPECT_TRUE(seen.insert(id).second) << id;
}

TEST(AdmissionGateTest, IncarnationsOnlyGoUp) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  EXPECT_EQ(gate.IsNewIncarnation("w", 5).value(), true);  // never seen
  const std::vector<std::string> old_leases = GrantTo(gate, "w", 2, /*incarnation=*/5);
  const std::vector<std::string> other = GrantTo(gate, "x", 1, /*incarnation=*/1);
  EXPECT_EQ(gate.IsNewIncarnation("w", 5).value(), false);
  EXPECT_EQ(gate.IsNewIncarnation("w", 6).value(), true);
  const absl::StatusOr<bool> zombie = gate.IsNewIncarnation("w", 4);
  EXPECT_EQ(zombie.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(zombie.status().message(), HasSubstr("incarnation 4 is older than incarnation 5"));

  // A restart's grant (even of no lease) ends the older incarnation's slots
  // and leaves other workers' alone.
  v1::storage::LeasesGranted restart;
  restart.set_worker_id("w");
  restart.set_worker_incarnation(6);
  gate.Grant(restart, absl::InfinitePast());
  EXPECT_FALSE(gate.HasLease(old_leases[0]));
  EXPECT_FALSE(gate.HasLease(old_leases[1]));
  EXPECT_TRUE(gate.HasLease(other[0]));
  EXPECT_EQ(gate.running(), 1);
  EXPECT_EQ(gate.IsNewIncarnation("w", 5).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AdmissionGateTest, CheckRequestNamesTheBadField) {
  EXPECT_TRUE(AdmissionGate::CheckRequest({.worker_id = "w", .num_groups = 2}).ok());
  EXPECT_THAT(AdmissionGate::CheckRequest({.num_groups = 1}).message(), HasSubstr("worker_id"));
  EXPECT_THAT(AdmissionGate::CheckRequest({.worker_id = "w", .num_groups = -1}).message(),
              HasSubstr("num_groups: must be >= 0, got -1"));
  const absl::Status negative_wait =
      AdmissionGate::CheckRequest({.worker_id = "w", .wait_timeout = absl::Milliseconds(-5)});
  EXPECT_EQ(negative_wait.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative_wait.message(), HasSubstr("wait_timeout_ms: must be >= 0, got -5"));
}

// ---------------------------------------------------------------------------
// Quarantine
// ---------------------------------------------------------------------------

TEST(AdmissionGateTest, AQuarantinedWorkerIsRefusedAndItsSlotsComeBackAtOnce) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  GrantTo(gate, "bad", 3);
  const std::vector<std::string> good = GrantTo(gate, "good", 1);
  const int64_t free = gate.capacity();
  EXPECT_TRUE(gate.CheckNotQuarantined("bad", "").ok());

  gate.QuarantineWorkers(Quarantined({"bad"}));
  EXPECT_EQ(gate.running(), 1);
  EXPECT_TRUE(gate.HasLease(good[0]));
  EXPECT_EQ(gate.capacity(), free + 3);
  const absl::Status refused = gate.CheckNotQuarantined("bad", "peer:1.2.3.4:5");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(), QuarantineMessage(kRun, "bad"));
  EXPECT_TRUE(gate.CheckNotQuarantined("good", "").ok());
  EXPECT_THAT(gate.quarantined_workers(), ElementsAre("bad"));

  // Its groups too, whichever trajectory names it.
  v1::Group group = testing::MakeGroup(kRun, "g", 3, 0);
  group.mutable_trajectories(0)->set_rollout_worker_id("good");
  EXPECT_TRUE(gate.CheckGroupNotQuarantined(group).ok());
  group.mutable_trajectories(2)->set_rollout_worker_id("bad");
  EXPECT_EQ(gate.CheckGroupNotQuarantined(group).code(), absl::StatusCode::kPermissionDenied);

  // Applying a quarantine record drops every lease of every worker
  // quarantined so far, not only of those it names.
  GrantTo(gate, "bad", 1, /*incarnation=*/2);
  gate.QuarantineWorkers(Quarantined({}));
  EXPECT_EQ(gate.running(), 1);
}

TEST(AdmissionGateTest, NotQuarantinedSkipsEmptyKnownAndRepeatedIds) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  gate.QuarantineWorkers(Quarantined({"a"}));
  EXPECT_THAT(gate.NotQuarantined({"b", "", "a", "c", "b"}), ElementsAre("b", "c"));
  EXPECT_THAT(gate.NotQuarantined({"a", ""}), IsEmpty());
  EXPECT_THAT(gate.quarantined_workers(), ElementsAre("a"));  // only names them
}

TEST(AdmissionGateTest, AQuarantinedConnectionIsRefusedButTheWorkerItNamedIsNot) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  const std::vector<std::string> leases = GrantTo(gate, "w", 1);
  EXPECT_TRUE(gate.QuarantineConnection("peer:10.0.0.1:4000"));
  EXPECT_FALSE(gate.QuarantineConnection("peer:10.0.0.1:4000"));
  EXPECT_FALSE(gate.QuarantineConnection(""));
  EXPECT_TRUE(gate.HasLease(leases[0]));  // left to expire

  const absl::Status refused = gate.CheckNotQuarantined("w", "peer:10.0.0.1:4000");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.message(), ConnectionQuarantineMessage(kRun, "peer:10.0.0.1:4000"));
  EXPECT_TRUE(gate.CheckNotQuarantined("w", "peer:10.0.0.2:4000").ok());
  EXPECT_TRUE(gate.CheckNotQuarantined("w", "").ok());
  EXPECT_THAT(gate.quarantined_workers(), IsEmpty());

  v1::Group group = testing::MakeGroup(kRun, "g", 2, 0);
  group.mutable_trajectories(0)->set_rollout_worker_id("w");
  EXPECT_TRUE(gate.CheckGroupNotQuarantined(group).ok());
  group.set_inserted_by("peer:10.0.0.1:4000");
  EXPECT_EQ(gate.CheckGroupNotQuarantined(group).code(), absl::StatusCode::kPermissionDenied);
}

// ---------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------

TEST(AdmissionGateTest, ASnapshotRestoresTheGateWithFreshLeaseTtls) {
  FakeClock clock;
  AdmissionGate gate(GateOptions(&clock), 0);
  EXPECT_TRUE(gate.AdvanceVersion(3));
  gate.OnAccepted();
  const std::vector<std::string> leases = GrantTo(gate, "w", 2, /*incarnation=*/7);
  gate.QuarantineWorkers(Quarantined({"bad"}));
  gate.QuarantineConnection("peer:x");
  v1::storage::TableSnapshot snapshot;
  gate.ToSnapshot(&snapshot);

  clock.Advance(kTtl - absl::Seconds(1));  // the leases' old expiry is near
  AdmissionGate restored(GateOptions(&clock), 0);
  restored.RestoreFromSnapshot(snapshot);
  EXPECT_EQ(restored.policy_version(), 3);
  EXPECT_EQ(restored.accepted(), 1);
  EXPECT_EQ(restored.running(), 2);
  EXPECT_EQ(restored.admission_limit(), gate.admission_limit());
  EXPECT_THAT(restored.quarantined_workers(), ElementsAre("bad"));
  EXPECT_TRUE(restored.CheckNotQuarantined("w", "peer:x").ok());  // connections are not kept
  EXPECT_EQ(restored.IsNewIncarnation("w", 6).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // New ids continue after the snapshot's, and the leases live a full TTL
  // from the restore.
  EXPECT_THAT(restored.NextLeaseIds(1), ElementsAre(EndsWith("-3")));
  clock.Advance(kTtl - absl::Seconds(1));
  restored.ExpireLeases();
  EXPECT_TRUE(restored.HasLease(leases[0]) && restored.HasLease(leases[1]));
  clock.Advance(absl::Seconds(1));
  restored.ExpireLeases();
  EXPECT_EQ(restored.running(), 0);
}

}  // namespace
}  // namespace sluice::replay_buffer
