#include "replay_buffer/run_table.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using testing::FakeClock;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using testing::MakeGroup;
using ::testing::SizeIs;

constexpr char kRun[] = "run-1";
// Long enough that a call which should block has visibly not returned.
constexpr absl::Duration kStillBlocked = absl::Milliseconds(150);
// Generous bound for a call that should return once unblocked.
constexpr absl::Duration kReturns = absl::Seconds(10);

RunConfig Config(int32_t batch_size = 4, int32_t max_staleness = 1, int32_t group_size = 2) {
  RunConfig config;
  config.run_id = kRun;
  config.batch_size_groups = batch_size;
  config.max_staleness = max_staleness;
  config.group_size = group_size;
  return config;
}

std::unique_ptr<RunTable> MakeTable(const RunConfig& config, FakeClock* clock = nullptr,
                                    absl::Duration lease_ttl = absl::Seconds(60)) {
  RunTableOptions options;
  options.lease_ttl = lease_ttl;
  if (clock != nullptr) options.clock = [clock] { return clock->Now(); };
  absl::StatusOr<std::unique_ptr<RunTable>> table = RunTable::Create(config, options);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(table).value();
}

AcquireResult Acquire(RunTable& table, int32_t num_groups,
                      absl::Duration wait = absl::ZeroDuration(), const std::string& worker = "w1",
                      uint64_t incarnation = 1) {
  AcquireRequest request;
  request.worker_id = worker;
  request.worker_incarnation = incarnation;
  request.num_groups = num_groups;
  request.wait_timeout = wait;
  absl::StatusOr<AcquireResult> result = table.AcquireSlots(request);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *std::move(result) : AcquireResult{};
}

v1::Group Group(int index, int64_t version, const std::string& lease = "", int group_size = 2) {
  return MakeGroup(kRun, absl::StrCat("g", index), group_size, version, 10, lease);
}

SampleRequest Request(int64_t trainer_version, absl::Duration timeout = absl::ZeroDuration(),
                      int32_t batch = 0) {
  SampleRequest request;
  request.trainer_policy_version = trainer_version;
  request.timeout = timeout;
  request.batch_size_groups = batch;
  return request;
}

std::vector<std::string> GroupIds(const SampleResult& result) {
  std::vector<std::string> ids;
  for (const SampledGroup& sampled : result.groups) ids.push_back(sampled.group->group_id());
  return ids;
}

// ---------------------------------------------------------------------------
// The admission gate
// ---------------------------------------------------------------------------

TEST(RunTableTest, AdmissionGrantsExactlyUpToTheLimit) {
  // B = 4, eta = 1, v = 0: limit (1 + 0 + 1) * 4 = 8.
  auto table = MakeTable(Config());
  AcquireResult first = Acquire(*table, 5);
  EXPECT_THAT(first.lease_ids, SizeIs(5));
  EXPECT_EQ(first.gate.admission_limit, 8);
  EXPECT_EQ(first.gate.running, 5);
  // 5 running: 3 left; asking for 10 grants exactly 3.
  AcquireResult second = Acquire(*table, 10);
  EXPECT_THAT(second.lease_ids, SizeIs(3));
  EXPECT_EQ(second.gate.running, 8);
  EXPECT_THAT(Acquire(*table, 1).lease_ids, IsEmpty());

  // Inserting converts running to accepted: still at the limit.
  ASSERT_EQ(table->Insert(Group(0, 0, first.lease_ids[0])).status, InsertStatus::kStored);
  AcquireResult full = Acquire(*table, 1);
  EXPECT_THAT(full.lease_ids, IsEmpty());
  EXPECT_EQ(full.gate.accepted, 1);
  EXPECT_EQ(full.gate.running, 7);

  // accepted + running = 7 = limit - 1: exactly one more slot.
  ReleaseResult released =
      table->ReleaseSlots({.worker_id = "w1", .lease_ids = {first.lease_ids[1]}});
  EXPECT_EQ(released.released, 1);
  EXPECT_EQ(released.running, 6);
  AcquireResult one = Acquire(*table, 3);
  EXPECT_THAT(one.lease_ids, SizeIs(1));
  EXPECT_EQ(one.gate.accepted + one.gate.running, one.gate.admission_limit);
}

TEST(RunTableTest, ZeroSlotsOnlyRenews) {
  auto table = MakeTable(Config());
  AcquireResult renew_only = Acquire(*table, 0);
  EXPECT_THAT(renew_only.lease_ids, IsEmpty());
  EXPECT_EQ(renew_only.gate.running, 0);
}

TEST(RunTableTest, AcquireBlocksUntilPolicyVersionAdvances) {
  auto table = MakeTable(Config());
  ASSERT_THAT(Acquire(*table, 8).lease_ids, SizeIs(8));
  absl::Notification returned;
  AcquireResult blocked;
  std::thread waiter([&] {
    blocked = Acquire(*table, 2, absl::Seconds(30), "w2");
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));
  absl::StatusOr<UpdateVersionResult> update = table->UpdatePolicyVersion(1);
  ASSERT_TRUE(update.ok());
  EXPECT_EQ(update->admission_limit, 12);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  waiter.join();
  EXPECT_THAT(blocked.lease_ids, SizeIs(2));
  EXPECT_EQ(blocked.gate.policy_version, 1);
  EXPECT_GT(blocked.waited, absl::ZeroDuration());
  EXPECT_EQ(table->Stats().admission_blocked, blocked.waited);
}

TEST(RunTableTest, AcquireWaitTimesOutWithNothingGranted) {
  auto table = MakeTable(Config());
  ASSERT_THAT(Acquire(*table, 8).lease_ids, SizeIs(8));
  const absl::Time start = absl::Now();
  AcquireResult result = Acquire(*table, 1, absl::Milliseconds(50));
  EXPECT_THAT(result.lease_ids, IsEmpty());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
}

TEST(RunTableTest, BlockedAcquireWakesWhenALeaseIsReleased) {
  auto table = MakeTable(Config());
  AcquireResult held = Acquire(*table, 8);
  absl::Notification returned;
  AcquireResult blocked;
  std::thread waiter([&] {
    blocked = Acquire(*table, 4, absl::Seconds(30), "w2");
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));
  EXPECT_EQ(table->ReleaseSlots({.worker_id = "w1", .release_all = true}).released, 8);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  waiter.join();
  EXPECT_THAT(blocked.lease_ids, SizeIs(4));
}

TEST(RunTableTest, BlockedAcquireWakesWhenALeaseExpires) {
  // Real clock: the wake-up at the next expiry is what is under test.
  auto table = MakeTable(Config(), nullptr, absl::Milliseconds(600));
  ASSERT_THAT(Acquire(*table, 8).lease_ids, SizeIs(8));
  absl::Notification returned;
  AcquireResult blocked;
  std::thread waiter([&] {
    blocked = Acquire(*table, 1, absl::Seconds(30), "w2");
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  waiter.join();
  EXPECT_THAT(blocked.lease_ids, SizeIs(1));
}

TEST(RunTableTest, ExpiredLeasesStopCountingAsRunning) {
  FakeClock clock;
  auto table = MakeTable(Config(), &clock, absl::Seconds(10));
  AcquireResult held = Acquire(*table, 8);
  EXPECT_EQ(held.lease_ttl, absl::Seconds(10));
  EXPECT_EQ(held.lease_expires_at, clock.Now() + absl::Seconds(10));
  clock.Advance(absl::Seconds(9));
  EXPECT_THAT(Acquire(*table, 1).lease_ids, IsEmpty());
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(table->Stats().gate.running, 0);
  EXPECT_THAT(Acquire(*table, 8).lease_ids, SizeIs(8));
  // A group whose lease expired is still stored, and does not touch running.
  ASSERT_EQ(table->Insert(Group(0, 0, held.lease_ids[0])).status, InsertStatus::kStored);
  const GateState gate = table->Stats().gate;
  EXPECT_EQ(gate.accepted, 1);
  EXPECT_EQ(gate.running, 8);
}

TEST(RunTableTest, RenewedLeaseOutlivesItsFirstTtl) {
  FakeClock clock;
  auto table = MakeTable(Config(), &clock, absl::Seconds(10));
  AcquireResult held = Acquire(*table, 2);
  clock.Advance(absl::Seconds(8));
  AcquireRequest renew;
  renew.worker_id = "w1";
  renew.worker_incarnation = 1;
  renew.renew_lease_ids = {held.lease_ids[0], "no-such-lease"};
  absl::StatusOr<AcquireResult> renewed = table->AcquireSlots(renew);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_THAT(renewed->expired_lease_ids, ElementsAre("no-such-lease"));
  EXPECT_EQ(renewed->lease_expires_at, clock.Now() + absl::Seconds(10));
  clock.Advance(absl::Seconds(8));  // 16 s after the grant: only the renewed one lives
  EXPECT_EQ(table->Stats().gate.running, 1);
  // Another worker cannot renew it.
  renew.worker_id = "w2";
  renew.renew_lease_ids = {held.lease_ids[0]};
  EXPECT_THAT(table->AcquireSlots(renew)->expired_lease_ids, ElementsAre(held.lease_ids[0]));
}

TEST(RunTableTest, NewIncarnationDropsTheOlderIncarnationsLeases) {
  auto table = MakeTable(Config());
  ASSERT_THAT(Acquire(*table, 3, absl::ZeroDuration(), "w1", 1).lease_ids, SizeIs(3));
  ASSERT_THAT(Acquire(*table, 2, absl::ZeroDuration(), "w2", 1).lease_ids, SizeIs(2));
  AcquireResult restarted = Acquire(*table, 1, absl::ZeroDuration(), "w1", 2);
  EXPECT_THAT(restarted.lease_ids, SizeIs(1));
  EXPECT_EQ(restarted.gate.running, 3);  // w2's 2 + the new one

  AcquireRequest zombie;
  zombie.worker_id = "w1";
  zombie.worker_incarnation = 1;
  zombie.num_groups = 1;
  absl::StatusOr<AcquireResult> refused = table->AcquireSlots(zombie);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("worker_incarnation: worker w1 incarnation 1 is older than incarnation 2"));
}

TEST(RunTableTest, ReleaseIgnoresUnknownAndOtherWorkersLeases) {
  auto table = MakeTable(Config());
  AcquireResult mine = Acquire(*table, 2, absl::ZeroDuration(), "w1");
  AcquireResult theirs = Acquire(*table, 2, absl::ZeroDuration(), "w2");
  ReleaseResult result = table->ReleaseSlots(
      {.worker_id = "w1", .lease_ids = {mine.lease_ids[0], theirs.lease_ids[0], "unknown"}});
  EXPECT_EQ(result.released, 1);
  EXPECT_EQ(result.running, 3);
}

TEST(RunTableTest, AcquireValidationNamesTheField) {
  auto table = MakeTable(Config());
  AcquireRequest request;
  EXPECT_EQ(table->AcquireSlots(request).status().message(), "worker_id: required");
  request.worker_id = "w1";
  request.num_groups = -2;
  EXPECT_EQ(table->AcquireSlots(request).status().message(), "num_groups: must be >= 0, got -2");
  request.num_groups = 1;
  request.wait_timeout = absl::Milliseconds(-5);
  EXPECT_EQ(table->AcquireSlots(request).status().message(),
            "wait_timeout_ms: must be >= 0, got -5");
}

TEST(RunTableTest, ResumedRunCountsTheBatchesBeforeItAsAccepted) {
  RunConfig config = Config();
  config.initial_policy_version = 10;
  auto table = MakeTable(config);
  const GateState gate = table->Stats().gate;
  EXPECT_EQ(gate.policy_version, 10);
  EXPECT_EQ(gate.accepted, 40);
  EXPECT_EQ(gate.admission_limit, 48);
  EXPECT_THAT(Acquire(*table, 100).lease_ids, SizeIs(8));
}

// ---------------------------------------------------------------------------
// Inserts
// ---------------------------------------------------------------------------

TEST(RunTableTest, DuplicateInsertIsAcknowledgedAndStoredOnce) {
  auto table = MakeTable(Config());
  AcquireResult slot = Acquire(*table, 1);
  InsertResult first = table->Insert(Group(7, 0, slot.lease_ids[0]));
  ASSERT_EQ(first.status, InsertStatus::kStored);
  EXPECT_EQ(first.idempotency_key, "run-1/g7");
  InsertResult retry = table->Insert(Group(7, 0, slot.lease_ids[0]));
  EXPECT_EQ(retry.status, InsertStatus::kDuplicate);
  EXPECT_EQ(retry.buffer_sequence, first.buffer_sequence);
  EXPECT_TRUE(retry.message.empty());
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.size_groups, 1);
  EXPECT_EQ(stats.inserted_groups, 1);
  EXPECT_EQ(stats.duplicate_inserts, 1);
  EXPECT_EQ(stats.gate.accepted, 1);
  EXPECT_EQ(stats.gate.running, 0);

  // Still a duplicate after the group was trained and left the table.
  ASSERT_TRUE(table->Sample(Request(0, absl::ZeroDuration(), 1)).ok());
  EXPECT_EQ(table->Insert(Group(7, 0)).status, InsertStatus::kDuplicate);
}

TEST(RunTableTest, InsertRecomputesPolicyVersionsAndSetsBufferFields) {
  FakeClock clock;
  auto table = MakeTable(Config(), &clock);
  ASSERT_TRUE(table->UpdatePolicyVersion(4).ok());
  v1::Group group = Group(1, 3);
  group.mutable_trajectories(1)->set_token_policy_versions(9, 4);  // last token at v4
  group.set_min_policy_version(99);
  group.set_max_policy_version(-1);
  group.set_times_sampled(5);
  group.set_buffer_sequence(1234);
  ASSERT_EQ(table->Insert(group).status, InsertStatus::kStored);
  ASSERT_EQ(table->Insert(Group(2, 3)).status, InsertStatus::kStored);
  absl::StatusOr<SampleResult> sampled = table->Sample(Request(4, absl::ZeroDuration(), 2));
  ASSERT_TRUE(sampled.ok());
  ASSERT_THAT(sampled->groups, SizeIs(2));
  const v1::Group& stored = *sampled->groups[0].group;
  EXPECT_EQ(stored.min_policy_version(), 3);
  EXPECT_EQ(stored.max_policy_version(), 4);
  EXPECT_EQ(stored.times_sampled(), 0);  // the table's copy; SampledGroup carries the count
  EXPECT_EQ(sampled->groups[0].times_sampled, 1);
  EXPECT_EQ(stored.buffer_sequence(), 1);
  EXPECT_EQ(sampled->groups[1].group->buffer_sequence(), 2);
  EXPECT_EQ(stored.inserted_at().seconds(), absl::ToUnixSeconds(clock.Now()));
}

TEST(RunTableTest, InsertValidationNamesTheField) {
  auto table = MakeTable(Config());
  struct Case {
    std::function<void(v1::Group&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::Group& g) { g.clear_idempotency_key(); }, "idempotency_key: required"},
      {[](v1::Group& g) { g.set_run_id("run-2"); },
       "run_id: group is for run \"run-2\", this table is run \"run-1\""},
      {[](v1::Group& g) { g.mutable_trajectories()->RemoveLast(); },
       "trajectories: expected group_size = 2, got 1"},
      {[](v1::Group& g) { g.mutable_trajectories(1)->mutable_behaviour_logprobs()->RemoveLast(); },
       "trajectories[1]: completion_token_ids has 10 entries, behaviour_logprobs 9 and "
       "token_policy_versions 10; each needs one entry per completion token"},
      {[](v1::Group& g) { g.mutable_trajectories(0)->set_token_policy_versions(5, 0); },
       "trajectories[0].token_policy_versions: must be non-decreasing; entry 5 is 0 after 1"},
      {[](v1::Group& g) { g.mutable_trajectories(0)->set_token_policy_versions(0, -1); },
       "trajectories[0].token_policy_versions[0]: must be >= 0, got -1"},
      {[](v1::Group& g) {
         for (auto& t : *g.mutable_trajectories()) {
           t.clear_completion_token_ids();
           t.clear_behaviour_logprobs();
           t.clear_token_policy_versions();
           t.set_finish_reason(v1::FINISH_REASON_ABORTED);
         }
       },
       "trajectories: the group has no completion tokens, so its policy version is undefined"},
  };
  ASSERT_TRUE(table->UpdatePolicyVersion(1).ok());
  for (const Case& c : cases) {
    v1::Group group = Group(1, 1);
    c.mutate(group);
    const InsertResult result = table->Insert(group);
    EXPECT_EQ(result.status, InsertStatus::kInvalid) << c.message;
    EXPECT_EQ(result.message, c.message);
    EXPECT_EQ(result.buffer_sequence, 0);
  }
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.invalid_inserts, static_cast<int64_t>(cases.size()));
  EXPECT_EQ(stats.size_groups, 0);
  EXPECT_EQ(stats.gate.accepted, 0);
}

TEST(RunTableTest, AGroupAheadOfThePolicyVersionIsInvalidUntilTheVersionArrives) {
  auto table = MakeTable(Config(4, 1));
  AcquireResult slot = Acquire(*table, 1);
  const InsertResult ahead = table->Insert(Group(1, 2, slot.lease_ids[0]));
  EXPECT_EQ(ahead.status, InsertStatus::kInvalid);
  EXPECT_EQ(ahead.message,
            "trajectories[0].token_policy_versions[0]: must not be ahead of policy version 1 "
            "(the newest the trainer can have published), got 2");
  EXPECT_EQ(table->Stats().gate.running, 0);  // its slot came back
  const InsertResult far_ahead = table->Insert(Group(2, 1'000'000'000'000));
  EXPECT_EQ(far_ahead.status, InsertStatus::kInvalid);
  // Version 1 may be published before the trainer tells the buffer of it.
  EXPECT_EQ(table->Insert(Group(3, 1)).status, InsertStatus::kStored);
  ASSERT_TRUE(table->UpdatePolicyVersion(1).ok());
  EXPECT_EQ(table->Insert(Group(4, 2)).status, InsertStatus::kStored);
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.invalid_inserts, 2);
  EXPECT_EQ(stats.size_groups, 2);
}

TEST(RunTableTest, ReconfigureChangesTheGroupLimits) {
  RunConfig config = Config();
  auto table = MakeTable(config);
  v1::Group big_ids = Group(1, 0);
  big_ids.mutable_trajectories(0)->set_completion_token_ids(0, 5000);
  big_ids.mutable_trajectories(1)->set_reward(3.0);
  config.vocab_size = 1000;
  ASSERT_TRUE(table->Reconfigure(config).ok());
  EXPECT_THAT(table->Insert(big_ids).message,
              HasSubstr("trajectories[0].completion_token_ids[0]: must be in [0, 1000)"));
  config.vocab_size = 10000;
  config.max_reward = 1.0;
  ASSERT_TRUE(table->Reconfigure(config).ok());
  EXPECT_THAT(table->Insert(big_ids).message, HasSubstr("trajectories[1].reward"));
  config.max_reward.reset();
  ASSERT_TRUE(table->Reconfigure(config).ok());
  EXPECT_EQ(table->Insert(big_ids).status, InsertStatus::kStored);
  EXPECT_EQ(table->Stats().config.vocab_size, 10000);
}

TEST(RunTableTest, InvalidInsertReleasesItsLease) {
  auto table = MakeTable(Config());
  AcquireResult slot = Acquire(*table, 1);
  v1::Group group = Group(1, 0, slot.lease_ids[0]);
  group.mutable_trajectories()->RemoveLast();
  ASSERT_EQ(table->Insert(group).status, InsertStatus::kInvalid);
  EXPECT_EQ(table->Stats().gate.running, 0);
}

TEST(RunTableTest, TooStaleInsertIsRejectedAndItsLeaseReleased) {
  auto table = MakeTable(Config(4, 1));
  AcquireResult slot = Acquire(*table, 1);
  ASSERT_TRUE(table->UpdatePolicyVersion(5).ok());
  const InsertResult result = table->Insert(Group(1, 3, slot.lease_ids[0]));
  EXPECT_EQ(result.status, InsertStatus::kRejectedStale);
  EXPECT_EQ(result.message,
            "group is 2 versions stale (policy version 5, min_policy_version 3) and "
            "max_staleness is 1; it can never be trained");
  EXPECT_EQ(table->Insert(Group(2, 4)).status, InsertStatus::kStored);  // exactly eta
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.rejected_stale_inserts, 1);
  EXPECT_EQ(stats.gate.running, 0);
  EXPECT_EQ(stats.gate.accepted, 1);
}

TEST(RunTableTest, CapacityEvictsTheOldestAndGivesItsSlotBack) {
  RunConfig config = Config(2, 4);
  config.buffer.set_capacity_groups(3);
  auto table = MakeTable(config);
  for (int i = 0; i < 5; ++i) ASSERT_EQ(table->Insert(Group(i, 0)).status, InsertStatus::kStored);
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.size_groups, 3);
  EXPECT_EQ(stats.evictions.capacity, 2);
  EXPECT_EQ(stats.gate.accepted, 3);
  EXPECT_THAT(GroupIds(*table->Sample(Request(0, absl::ZeroDuration(), 3))),
              ElementsAre("g2", "g3", "g4"));
}

// ---------------------------------------------------------------------------
// Versions and stale eviction
// ---------------------------------------------------------------------------

TEST(RunTableTest, StaleEvictionIsCountedAndGivesCapacityBack) {
  // B = 2, eta = 1: limit 4 at v = 0.
  auto table = MakeTable(Config(2, 1));
  AcquireResult slots = Acquire(*table, 4);
  ASSERT_THAT(slots.lease_ids, SizeIs(4));
  EXPECT_THAT(Acquire(*table, 1).lease_ids, IsEmpty());  // running 4 = limit
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(table->Insert(Group(i, 0, slots.lease_ids[i])).status, InsertStatus::kStored);
  }
  // v = 1 (nothing stale yet): the other two slots' groups come from it.
  ASSERT_EQ(table->UpdatePolicyVersion(1)->evicted_stale_groups, 0);
  for (int i = 2; i < 4; ++i) {
    ASSERT_EQ(table->Insert(Group(i, 1, slots.lease_ids[i])).status, InsertStatus::kStored);
  }
  EXPECT_EQ(table->Stats().gate.accepted, 4);

  // v = 2: the two version-0 groups are 2 > eta stale.
  absl::StatusOr<UpdateVersionResult> update = table->UpdatePolicyVersion(2);
  ASSERT_TRUE(update.ok());
  EXPECT_EQ(update->policy_version, 2);
  EXPECT_EQ(update->evicted_stale_groups, 2);
  EXPECT_EQ(update->admission_limit, 8);
  RunStats stats = table->Stats();
  EXPECT_EQ(stats.evictions.stale, 2);
  EXPECT_EQ(stats.size_groups, 2);
  EXPECT_EQ(stats.gate.accepted, 2);
  // limit 8 - accepted 2: six slots, two of them given back by the eviction.
  EXPECT_THAT(Acquire(*table, 10).lease_ids, SizeIs(6));

  // Versions never go back.
  update = table->UpdatePolicyVersion(1);
  EXPECT_EQ(update->policy_version, 2);
  EXPECT_EQ(update->evicted_stale_groups, 0);
  EXPECT_EQ(table->UpdatePolicyVersion(-1).status().message(),
            "policy_version: must be >= 0, got -1");
}

// A group whose samples span versions 1..3 (a long sample that kept
// decoding across two swaps) and one generated wholly at version 1.
v1::Group SpanningGroup(int index) {
  v1::Group group = Group(index, 1);
  for (int i = 0; i < group.trajectories_size(); ++i) {
    auto* versions = group.mutable_trajectories(i)->mutable_token_policy_versions();
    for (int t = 5; t < versions->size(); ++t) versions->Set(t, t < 8 ? 2 : 3);
  }
  return group;
}

TEST(RunTableTest, TokenStalenessBoundKeepsGroupsWhoseNewestTokenIsFresh) {
  // eta = 1. Under the group bound a group is stale from its oldest token
  // (version 1) at v = 3; under the token bound only from its newest: the
  // spanning group (newest 3) stays until v = 5, the flat one goes at v = 3.
  RunConfig config = Config(2, 1);
  config.staleness_bound = v1::STALENESS_BOUND_TOKEN;
  auto table = MakeTable(config);
  ASSERT_TRUE(table->UpdatePolicyVersion(2).ok());
  ASSERT_EQ(table->Insert(SpanningGroup(0)).status, InsertStatus::kStored);
  ASSERT_EQ(table->Insert(Group(1, 1)).status, InsertStatus::kStored);
  absl::StatusOr<UpdateVersionResult> update = table->UpdatePolicyVersion(3);
  ASSERT_TRUE(update.ok());
  EXPECT_EQ(update->evicted_stale_groups, 1);  // g1: newest token 1, 2 > eta old
  // At v = 3 a group whose newest token is version 1 is refused at insert,
  // naming the bound it broke; the spanning one is stored.
  const InsertResult refused = table->Insert(Group(2, 1));
  EXPECT_EQ(refused.status, InsertStatus::kRejectedStale);
  EXPECT_THAT(refused.message, HasSubstr("max_policy_version 1"));
  ASSERT_EQ(table->Insert(SpanningGroup(3)).status, InsertStatus::kStored);
  absl::StatusOr<SampleResult> batch = table->Sample(Request(4, absl::ZeroDuration(), 2));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(GroupIds(*batch), ElementsAre("g0", "g3"));
  EXPECT_EQ(batch->evicted_stale_groups, 0);
  // The reported staleness is still the group's oldest token's: the
  // trainer masks the tokens past eta.
  EXPECT_EQ(batch->groups[0].staleness, 3);
  EXPECT_EQ(table->Stats().evictions.stale, 1);

  // The same inserts under the group bound: both spanning groups are stale
  // (oldest token 1) at v = 3.
  auto grouped = MakeTable(Config(2, 1));
  ASSERT_TRUE(grouped->UpdatePolicyVersion(2).ok());
  ASSERT_EQ(grouped->Insert(SpanningGroup(0)).status, InsertStatus::kStored);
  EXPECT_EQ(grouped->UpdatePolicyVersion(3)->evicted_stale_groups, 1);
  EXPECT_EQ(grouped->Insert(SpanningGroup(3)).status, InsertStatus::kRejectedStale);
}

TEST(RunTableTest, StalenessBoundIsFixedForTheTablesLife) {
  RunConfig config = Config(2, 1);
  auto table = MakeTable(config);
  config.staleness_bound = v1::STALENESS_BOUND_TOKEN;
  const absl::Status changed = table->Reconfigure(config);
  EXPECT_EQ(changed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(changed.message(), HasSubstr("staleness_bound"));
  config.staleness_bound = v1::STALENESS_BOUND_GROUP;  // what unspecified means
  EXPECT_TRUE(table->Reconfigure(config).ok());
  config.staleness_bound = static_cast<v1::StalenessBound>(7);
  EXPECT_THAT(table->Reconfigure(config).message(), HasSubstr("staleness_bound: unknown value 7"));
}

TEST(RunTableTest, StaleEvictionWakesABlockedAcquire) {
  auto table = MakeTable(Config(2, 0));  // limit 2 at v = 0
  ASSERT_EQ(table->Insert(Group(0, 0)).status, InsertStatus::kStored);
  ASSERT_EQ(table->Insert(Group(1, 0)).status, InsertStatus::kStored);
  absl::Notification returned;
  AcquireResult blocked;
  std::thread waiter([&] {
    blocked = Acquire(*table, 4, absl::Seconds(30));
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));
  ASSERT_TRUE(table->UpdatePolicyVersion(1).ok());  // both groups stale, limit 4
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  waiter.join();
  EXPECT_THAT(blocked.lease_ids, SizeIs(4));
}

TEST(RunTableTest, SampleEvictsStaleGroupsBeforeChoosing) {
  auto table = MakeTable(Config(2, 1));
  for (int i = 0; i < 4; ++i) {
    if (i == 2) {
      ASSERT_TRUE(table->UpdatePolicyVersion(1).ok());
    }
    ASSERT_EQ(table->Insert(Group(i, i / 2)).status, InsertStatus::kStored);
  }
  // Trainer at v2: g0, g1 (v0) are stale; g2, g3 (v1) are 1 stale.
  absl::StatusOr<SampleResult> result = table->Sample(Request(2));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->evicted_stale_groups, 2);
  EXPECT_EQ(result->policy_version, 2);
  EXPECT_THAT(GroupIds(*result), ElementsAre("g2", "g3"));
  EXPECT_EQ(result->groups[0].staleness, 1);
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.gate.policy_version, 2);  // the trainer's version was applied
  EXPECT_EQ(stats.evictions.stale, 2);
  EXPECT_EQ(stats.gate.accepted, 2);
}

TEST(RunTableTest, SampleBoundIsNeverLooserThanTheRunsEta) {
  auto table = MakeTable(Config(1, 2));
  ASSERT_EQ(table->Insert(Group(0, 0)).status, InsertStatus::kStored);
  ASSERT_TRUE(table->UpdatePolicyVersion(1).ok());
  ASSERT_EQ(table->Insert(Group(1, 1)).status, InsertStatus::kStored);
  SampleRequest tight = Request(1);
  tight.max_staleness = 0;  // g0 is 1 stale: evicted for this batch
  EXPECT_THAT(GroupIds(*table->Sample(tight)), ElementsAre("g1"));
  ASSERT_EQ(table->Insert(Group(2, 0)).status, InsertStatus::kStored);
  SampleRequest loose = Request(3);
  loose.max_staleness = 10;  // tightened to eta = 2: g2 (3 stale) is evicted
  EXPECT_EQ(table->Sample(loose).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(table->Stats().evictions.stale, 2);
}

// ---------------------------------------------------------------------------
// Sampling
// ---------------------------------------------------------------------------

TEST(RunTableTest, SampleHandsOutTheOldestFirstAndUsesEachGroupOnce) {
  auto table = MakeTable(Config(2, 4));
  for (int i = 0; i < 5; ++i) ASSERT_EQ(table->Insert(Group(i, 0)).status, InsertStatus::kStored);
  EXPECT_THAT(GroupIds(*table->Sample(Request(0))), ElementsAre("g0", "g1"));
  EXPECT_THAT(GroupIds(*table->Sample(Request(0))), ElementsAre("g2", "g3"));
  EXPECT_EQ(table->Sample(Request(0)).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // one left, B = 2
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.size_groups, 1);
  EXPECT_EQ(stats.sampled_groups, 4);
  EXPECT_EQ(stats.evictions.max_times_sampled, 4);
  EXPECT_EQ(stats.gate.accepted, 5);  // trained groups stay accepted
}

TEST(RunTableTest, MaxTimesSampledKeepsAGroupUntilItsKthSample) {
  RunConfig config = Config(2, 4);
  config.buffer.set_max_times_sampled(2);
  auto table = MakeTable(config);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(table->Insert(Group(i, 0)).status, InsertStatus::kStored);
  absl::StatusOr<SampleResult> first = table->Sample(Request(0));
  EXPECT_THAT(GroupIds(*first), ElementsAre("g0", "g1"));
  EXPECT_EQ(first->groups[0].times_sampled, 1);
  EXPECT_FALSE(first->groups[0].removed);
  absl::StatusOr<SampleResult> second = table->Sample(Request(0));
  EXPECT_THAT(GroupIds(*second), ElementsAre("g0", "g1"));
  EXPECT_EQ(second->groups[1].times_sampled, 2);
  EXPECT_TRUE(second->groups[1].removed);
  EXPECT_EQ(table->Sample(Request(0)).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // only g2 left
  ASSERT_EQ(table->Insert(Group(3, 0)).status, InsertStatus::kStored);
  EXPECT_THAT(GroupIds(*table->Sample(Request(0))), ElementsAre("g2", "g3"));
  EXPECT_EQ(table->Stats().sampled_groups, 6);
}

TEST(RunTableTest, SampleBlocksUntilEnoughGroupsAreInserted) {
  auto table = MakeTable(Config(3, 4));
  ASSERT_EQ(table->Insert(Group(0, 0)).status, InsertStatus::kStored);
  absl::Notification returned;
  absl::StatusOr<SampleResult> result;
  std::thread sampler([&] {
    result = table->Sample(Request(0, absl::Seconds(30)));
    returned.Notify();
  });
  ASSERT_EQ(table->Insert(Group(1, 0)).status, InsertStatus::kStored);
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));
  ASSERT_EQ(table->Insert(Group(2, 0)).status, InsertStatus::kStored);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  sampler.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(GroupIds(*result), ElementsAre("g0", "g1", "g2"));
}

TEST(RunTableTest, SampleTimesOutWithNoGroups) {
  auto table = MakeTable(Config(2, 4));
  ASSERT_EQ(table->Insert(Group(0, 0)).status, InsertStatus::kStored);
  const absl::Time start = absl::Now();
  absl::StatusOr<SampleResult> result = table->Sample(Request(0, absl::Milliseconds(50)));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(result.status().message(),
            "no batch within 50ms: 1 groups held, a batch needs 2 (max of batch size and "
            "min_size_to_sample_groups)");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(table->Stats().size_groups, 1);
}

TEST(RunTableTest, SampleWaitsForMinSizeToSample) {
  RunConfig config = Config(2, 4);
  config.buffer.set_min_size_to_sample_groups(3);
  auto table = MakeTable(config);
  ASSERT_EQ(table->Insert(Group(0, 0)).status, InsertStatus::kStored);
  ASSERT_EQ(table->Insert(Group(1, 0)).status, InsertStatus::kStored);
  EXPECT_EQ(table->Sample(Request(0)).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_EQ(table->Insert(Group(2, 0)).status, InsertStatus::kStored);
  EXPECT_THAT(GroupIds(*table->Sample(Request(0))), ElementsAre("g0", "g1"));
}

TEST(RunTableTest, SampleRecordsGroupAndTokenStaleness) {
  auto table = MakeTable(Config(2, 4));
  ASSERT_TRUE(table->UpdatePolicyVersion(3).ok());
  v1::Group mixed = Group(0, 1);  // 2 trajectories x 10 tokens at v1...
  for (int t = 5; t < 10; ++t) mixed.mutable_trajectories(0)->set_token_policy_versions(t, 2);
  ASSERT_EQ(table->Insert(mixed).status, InsertStatus::kStored);  // ...5 of them at v2
  ASSERT_EQ(table->Insert(Group(1, 3)).status, InsertStatus::kStored);
  absl::StatusOr<SampleResult> result = table->Sample(Request(3));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->groups[0].staleness, 2);
  EXPECT_EQ(result->groups[1].staleness, 0);
  const RunStats stats = table->Stats();
  // Bounds 0, 1, 2, 3, ...: groups at staleness 0 and 2.
  EXPECT_EQ(stats.sampled_group_staleness.counts()[0], 1);
  EXPECT_EQ(stats.sampled_group_staleness.counts()[2], 1);
  EXPECT_EQ(stats.sampled_group_staleness.sum(), 2);
  // Tokens: 20 at staleness 0 (g1), 5 at 1, 15 at 2.
  EXPECT_EQ(stats.sampled_token_staleness.counts()[0], 20);
  EXPECT_EQ(stats.sampled_token_staleness.counts()[1], 5);
  EXPECT_EQ(stats.sampled_token_staleness.counts()[2], 15);
  EXPECT_EQ(stats.sampled_token_staleness.sum(), 35);
}

TEST(RunTableTest, SampleValidationNamesTheField) {
  auto table = MakeTable(Config());
  SampleRequest request = Request(0);
  request.batch_size_groups = -3;
  EXPECT_EQ(table->Sample(request).status().message(),
            "batch_size_groups: must be >= 0 (0 = the run's 4), got -3");
  request = Request(0);
  request.max_staleness = -1;
  EXPECT_EQ(table->Sample(request).status().message(), "max_staleness: must be >= 0, got -1");
  request = Request(-2);
  EXPECT_EQ(table->Sample(request).status().message(),
            "trainer_policy_version: must be >= 0, got -2");
  request = Request(0);
  request.sampler_override = v1::SAMPLER_KIND_UNIFORM;
  EXPECT_EQ(table->Sample(request).status().message(),
            "sampler_override: run run-1 samples with SAMPLER_KIND_FIFO; a per-request "
            "SAMPLER_KIND_UNIFORM is not supported (set buffer.sampler in the run's "
            "configuration)");
  request.sampler_override = static_cast<v1::SamplerKind>(42);
  EXPECT_EQ(table->Sample(request).status().message(),
            "sampler_override: unknown sampler kind 42");
  EXPECT_EQ(table->UpdatePriorities({{"g1", -1.0}}).status().message(),
            "priorities[g1]: must be finite and >= 0, got -1; nothing was updated");
}

TEST(RunTableTest, UndeliveredBatchGoesBackAsIfNeverSampled) {
  RunConfig config = Config(2, 4);
  auto table = MakeTable(config);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(table->Insert(Group(i, 0)).status, InsertStatus::kStored);
  absl::StatusOr<SampleResult> lost = table->Sample(Request(1));
  ASSERT_THAT(GroupIds(*lost), ElementsAre("g0", "g1"));
  table->ReturnUndelivered(*lost);
  RunStats stats = table->Stats();
  EXPECT_EQ(stats.size_groups, 3);
  EXPECT_EQ(stats.sampled_groups, 0);
  EXPECT_EQ(stats.evictions.max_times_sampled, 0);
  EXPECT_EQ(stats.sampled_group_staleness.total_count(), 0);
  EXPECT_EQ(stats.sampled_token_staleness.total_count(), 0);
  absl::StatusOr<SampleResult> again = table->Sample(Request(1));
  EXPECT_THAT(GroupIds(*again), ElementsAre("g0", "g1"));
  EXPECT_EQ(again->groups[0].times_sampled, 1);
}

// ---------------------------------------------------------------------------
// Shutdown and concurrency
// ---------------------------------------------------------------------------

TEST(RunTableTest, ShutdownWakesBlockedCallsPromptly) {
  auto table = MakeTable(Config());
  ASSERT_THAT(Acquire(*table, 8).lease_ids, SizeIs(8));
  absl::Notification acquire_returned;
  absl::Notification sample_returned;
  absl::Status acquire_status;
  absl::Status sample_status;
  std::thread acquirer([&] {
    AcquireRequest request{.worker_id = "w2",
                           .worker_incarnation = 1,
                           .num_groups = 1,
                           .wait_timeout = absl::Seconds(60)};
    acquire_status = table->AcquireSlots(request).status();
    acquire_returned.Notify();
  });
  std::thread sampler([&] {
    sample_status = table->Sample(Request(0, absl::Seconds(60))).status();
    sample_returned.Notify();
  });
  EXPECT_FALSE(acquire_returned.WaitForNotificationWithTimeout(kStillBlocked));
  EXPECT_FALSE(sample_returned.HasBeenNotified());
  table->Shutdown();
  EXPECT_TRUE(acquire_returned.WaitForNotificationWithTimeout(kReturns));
  EXPECT_TRUE(sample_returned.WaitForNotificationWithTimeout(kReturns));
  acquirer.join();
  sampler.join();
  EXPECT_EQ(acquire_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sample_status.code(), absl::StatusCode::kUnavailable);
  const InsertResult late = table->Insert(Group(0, 0));
  EXPECT_EQ(late.status, InsertStatus::kRetryableError);
  EXPECT_THAT(late.message, HasSubstr("shutting down"));
}

// 8 inserters and 2 samplers (more threads than the machine has cores) run a
// whole loop through the gate: every group is accounted for exactly once,
// sampled or dropped as stale, and none is sampled twice.
TEST(RunTableTest, StressEveryGroupIsCountedExactlyOnce) {
  constexpr int kInserters = 8;
  constexpr int kGroupsPerInserter = 500;
  constexpr int kTotal = kInserters * kGroupsPerInserter;
  constexpr int kBatch = 4;
  auto table = MakeTable(Config(kBatch, 1));

  std::atomic<int64_t> version{0};
  std::atomic<int> inserters_done{0};
  std::atomic<int> acquire_errors{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < kInserters; ++w) {
    threads.emplace_back([&, w] {
      const std::string worker = absl::StrCat("w", w);
      for (int i = 0; i < kGroupsPerInserter;) {
        absl::StatusOr<AcquireResult> slots =
            table->AcquireSlots({.worker_id = worker,
                                 .worker_incarnation = 1,
                                 .num_groups = 2,
                                 .wait_timeout = absl::Milliseconds(100)});
        if (!slots.ok()) {
          ++acquire_errors;
          return;
        }
        // Unused slots beyond what this worker still needs go back.
        std::vector<std::string> unused;
        for (const std::string& lease : slots->lease_ids) {
          if (i == kGroupsPerInserter) {
            unused.push_back(lease);
            continue;
          }
          v1::Group group = MakeGroup(kRun, absl::StrCat(worker, "-", i), 2,
                                      slots->gate.policy_version, 10, lease);
          const InsertStatus status = table->Insert(std::move(group)).status;
          EXPECT_TRUE(status == InsertStatus::kStored || status == InsertStatus::kRejectedStale);
          ++i;
        }
        table->ReleaseSlots({.worker_id = worker, .lease_ids = unused});
      }
      ++inserters_done;
    });
  }
  absl::Mutex seen_mu;
  absl::flat_hash_set<std::string> seen;
  int duplicates = 0;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&] {
      while (true) {
        const int64_t trainer_version = version.load();
        absl::StatusOr<SampleResult> batch =
            table->Sample(Request(trainer_version, absl::Milliseconds(20)));
        if (batch.status().code() == absl::StatusCode::kDeadlineExceeded) {
          if (inserters_done.load() == kInserters) return;
          continue;
        }
        {
          absl::MutexLock lock(&seen_mu);
          for (const SampledGroup& sampled : batch->groups) {
            if (!seen.insert(sampled.group->group_id()).second) ++duplicates;
          }
        }
        const int64_t next = ++version;
        ASSERT_TRUE(table->UpdatePolicyVersion(next).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(acquire_errors.load(), 0);
  EXPECT_EQ(duplicates, 0);
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.sampled_groups, static_cast<int64_t>(seen.size()));
  EXPECT_EQ(stats.inserted_groups + stats.rejected_stale_inserts, kTotal);
  EXPECT_EQ(stats.sampled_groups + stats.evictions.stale + stats.size_groups,
            stats.inserted_groups);
  EXPECT_LT(stats.size_groups, kBatch);
  EXPECT_EQ(stats.gate.running, 0);
  EXPECT_EQ(stats.gate.accepted, stats.inserted_groups - stats.evictions.stale);
}

}  // namespace
}  // namespace sluice::replay_buffer
