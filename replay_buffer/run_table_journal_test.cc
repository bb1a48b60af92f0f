// The run table's journal contract, with an in-memory journal: replaying
// the records a table wrote rebuilds exactly its state, from the beginning
// or from any snapshot; a failing journal changes nothing.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "replay_buffer/run_table.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::FakeClock;
using testing::MakeGroup;

constexpr char kRun[] = "run-j";

class MemoryJournal : public Journal {
 public:
  absl::StatusOr<uint64_t> Append(std::string prefix,
                                  const v1::storage::WalRecord& record) override {
    if (fail) return absl::InternalError("disk full (test)");
    records.emplace_back(++last_lsn, prefix + record.SerializeAsString());
    return last_lsn;
  }
  absl::Status Sync(uint64_t) override { return absl::OkStatus(); }

  bool fail = false;
  uint64_t last_lsn = 0;
  std::vector<std::pair<uint64_t, std::string>> records;
};

RunConfig Config(v1::SamplerKind sampler) {
  RunConfig config;
  config.run_id = kRun;
  config.batch_size_groups = 3;
  config.max_staleness = 2;
  config.group_size = 2;
  config.seed = 7;
  config.buffer.set_sampler(sampler);
  config.buffer.set_max_times_sampled(2);
  config.buffer.set_capacity_groups(12);
  return config;
}

// Rebuilds a table from `journal` records after `from_lsn`, starting from
// `snapshot` (or from the first record, a `configured`).
std::unique_ptr<RunTable> Replay(const MemoryJournal& journal, const RunTableOptions& options,
                                 const RunTable::SnapshotData* snapshot = nullptr) {
  std::unique_ptr<RunTable> table;
  size_t next = 0;
  if (snapshot != nullptr) {
    std::vector<v1::storage::SnapshotItem> items;
    for (const auto& item : snapshot->items) {
      v1::storage::SnapshotItem& entry = items.emplace_back();
      *entry.mutable_group() = *item.group;
      entry.set_times_sampled(item.times_sampled);
      entry.set_priority(item.priority);
      entry.set_retained_only(item.retained_only);
    }
    absl::StatusOr<std::unique_ptr<RunTable>> restored =
        RunTable::Restore(snapshot->table, std::move(items), options);
    EXPECT_TRUE(restored.ok()) << restored.status();
    table = std::move(restored).value();
  } else {
    v1::storage::WalRecord first;
    EXPECT_TRUE(first.ParseFromString(journal.records.at(0).second));
    EXPECT_TRUE(first.has_configured());
    absl::StatusOr<std::unique_ptr<RunTable>> created = RunTable::Create(
        RunConfigFromProto(first.configured()), options, journal.records[0].first);
    EXPECT_TRUE(created.ok()) << created.status();
    table = std::move(created).value();
    next = 1;
  }
  for (; next < journal.records.size(); ++next) {
    v1::storage::WalRecord record;
    EXPECT_TRUE(record.ParseFromString(journal.records[next].second));
    EXPECT_EQ(record.run_id(), kRun);
    const absl::Status applied = table->ApplyRecord(journal.records[next].first, record);
    EXPECT_TRUE(applied.ok()) << applied;
  }
  return table;
}

// Everything a snapshot holds, compared field by field (maps unordered).
void ExpectSameState(RunTable& expected, RunTable& actual) {
  RunTable::SnapshotData want = expected.Snapshot();
  RunTable::SnapshotData got = actual.Snapshot();
  std::string diff;
  MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&diff);
  // Leases come from a hash map: the same set in any order.
  differencer.TreatAsSet(v1::storage::TableSnapshot::descriptor()->FindFieldByName("leases"));
  EXPECT_TRUE(differencer.Compare(want.table, got.table)) << diff;
  ASSERT_EQ(want.items.size(), got.items.size());
  for (size_t i = 0; i < want.items.size(); ++i) {
    EXPECT_TRUE(MessageDifferencer::Equals(*want.items[i].group, *got.items[i].group)) << i;
    EXPECT_EQ(want.items[i].times_sampled, got.items[i].times_sampled) << i;
    EXPECT_EQ(want.items[i].priority, got.items[i].priority) << i;
  }
  const RunStats a = expected.Stats();
  const RunStats b = actual.Stats();
  EXPECT_EQ(a.gate.accepted, b.gate.accepted);
  EXPECT_EQ(a.gate.running, b.gate.running);
  EXPECT_EQ(a.gate.admission_limit, b.gate.admission_limit);
  EXPECT_EQ(a.size_bytes, b.size_bytes);
  EXPECT_EQ(a.size_trajectories, b.size_trajectories);
  EXPECT_EQ(a.retained_groups, b.retained_groups);
  EXPECT_EQ(a.retained_bytes, b.retained_bytes);
  EXPECT_EQ(a.committed_step, b.committed_step);
  EXPECT_EQ(a.last_recorded_step, b.last_recorded_step);
}

class RunTableJournalTest : public ::testing::TestWithParam<v1::SamplerKind> {};

// Random traffic of every kind; snapshots along the way. Replaying the whole
// journal, and restoring each snapshot then replaying what followed it, both
// give the live table's state.
TEST_P(RunTableJournalTest, ReplayRebuildsTheStateFromTheStartOrAnySnapshot) {
  FakeClock clock;
  auto journal = std::make_shared<MemoryJournal>();
  RunTableOptions options;
  options.clock = [&clock] { return clock.Now(); };
  options.journal = journal;
  absl::StatusOr<std::unique_ptr<RunTable>> created = RunTable::Create(Config(GetParam()), options);
  ASSERT_TRUE(created.ok()) << created.status();
  RunTable& table = **created;

  std::mt19937_64 random(42);
  int64_t version = 0;
  int next_group = 0;
  std::vector<std::string> leases;
  // Trainer steps: the last recorded and the last committed.
  int64_t last_step = 0;
  int64_t committed = 0;
  std::vector<std::pair<RunTable::SnapshotData, size_t>> snapshots;
  for (int step = 0; step < 600; ++step) {
    switch (random() % 10) {
      case 0:
      case 1: {
        AcquireRequest acquire{.worker_id = absl::StrCat("w", random() % 3),
                               .worker_incarnation = 1 + random() % 2,
                               .num_groups = static_cast<int32_t>(1 + random() % 3)};
        absl::StatusOr<AcquireResult> granted = table.AcquireSlots(acquire);
        if (granted.ok()) leases.insert(leases.end(), granted->lease_ids.begin(), granted->lease_ids.end());
        break;
      }
      case 2:
      case 3:
      case 4: {
        const int id = (random() % 8 == 0 && next_group > 0) ? next_group - 1 : next_group++;
        const int64_t group_version = std::max<int64_t>(0, version - static_cast<int64_t>(random() % 4));
        v1::Group group = MakeGroup(kRun, absl::StrCat("g", id), random() % 15 == 0 ? 3 : 2,
                                    group_version, 3);
        group.mutable_trajectories(0)->set_reward(static_cast<float>(random() % 3));
        if (!leases.empty()) {
          group.set_slot_lease_id(leases.back());
          leases.pop_back();
        }
        table.Insert(std::move(group));
        break;
      }
      case 5:
      case 6: {
        SampleRequest sample{.batch_size_groups = static_cast<int32_t>(1 + random() % 3),
                             .trainer_policy_version = version,
                             .timeout = absl::ZeroDuration()};
        if (random() % 4 == 0) sample.max_staleness = 1;
        // Dynamic sampling with refill: groups of equal rewards evicted.
        if (random() % 3 == 0) sample.drop_uniform_reward_groups = true;
        if (random() % 2 == 0) {
          // A trainer step: the next one, or one recorded and not committed.
          sample.step = std::max(last_step, committed) + 1;
          if (random() % 3 == 0 && last_step > committed) {
            sample.step = committed + 1 + static_cast<int64_t>(random() % (last_step - committed));
          }
        }
        absl::StatusOr<SampleResult> batch = table.Sample(sample);
        if (batch.ok()) last_step = std::max(last_step, sample.step);
        if (batch.ok() && random() % 5 == 0) table.ReturnUndelivered(*batch);
        break;
      }
      case 7:
        if (random() % 3 == 0) {
          ASSERT_TRUE(table.UpdatePolicyVersion(++version).ok());
        }
        break;
      case 8: {
        ReleaseRequest release{.worker_id = absl::StrCat("w", random() % 3),
                               .release_all = random() % 4 == 0};
        if (!leases.empty()) release.lease_ids.push_back(leases.front());
        table.ReleaseSlots(release);
        const int id = static_cast<int>(random() % std::max(1, next_group));
        ASSERT_TRUE(table.UpdatePriorities({{absl::StrCat("g", id), 0.5 + random() % 4}}).ok());
        if (random() % 2 == 0 && last_step > committed) {
          committed += 1 + static_cast<int64_t>(random() % (last_step - committed));
          ASSERT_TRUE(table.CommitTrainedSteps(committed).ok());
        }
        break;
      }
      case 9:
        snapshots.emplace_back(table.Snapshot(), journal->records.size());
        break;
    }
  }
  const RunStats stats = table.Stats();
  ASSERT_GT(stats.inserted_groups, 50);
  ASSERT_GT(stats.sampled_groups, 50);
  ASSERT_GT(stats.duplicate_inserts + stats.invalid_inserts + stats.rejected_stale_inserts, 5);
  ASSERT_GT(stats.evictions.stale + stats.evictions.capacity, 0);
  ASSERT_GT(stats.evictions.uniform_reward, 0);
  ASSERT_GT(stats.last_recorded_step, 20);
  ASSERT_GT(stats.committed_step, 10);
  ASSERT_GT(stats.replayed_batches, 5);

  RunTableOptions replay_options;
  replay_options.clock = options.clock;
  std::unique_ptr<RunTable> replayed = Replay(*journal, replay_options);
  ExpectSameState(table, *replayed);

  ASSERT_GT(snapshots.size(), 10u);
  for (size_t i = 0; i < snapshots.size(); i += 7) {
    SCOPED_TRACE(absl::StrCat("snapshot ", i));
    std::unique_ptr<RunTable> restored = Replay(*journal, replay_options, &snapshots[i].first);
    ExpectSameState(table, *restored);
  }
}

INSTANTIATE_TEST_SUITE_P(Samplers, RunTableJournalTest,
                         ::testing::Values(v1::SAMPLER_KIND_FIFO, v1::SAMPLER_KIND_UNIFORM,
                                           v1::SAMPLER_KIND_PRIORITIZED,
                                           v1::SAMPLER_KIND_RECENCY),
                         [](const auto& info) { return v1::SamplerKind_Name(info.param); });

// A trainer step's batch survives a restart between its Sample and its
// commit, whether the restart replays the whole journal or a snapshot taken
// in between plus what followed: the resumed trainer gets the same groups,
// still charged to the memory budget, until it commits.
TEST(RunTableJournalTest, ARecordedStepSurvivesARestartBetweenSampleAndCommit) {
  FakeClock clock;  // whole seconds: the journal keeps insert times in microseconds
  auto journal = std::make_shared<MemoryJournal>();
  RunTableOptions options;
  options.clock = [&clock] { return clock.Now(); };
  options.journal = journal;
  options.memory = std::make_shared<MemoryAccount>(0);
  RunConfig config = Config(v1::SAMPLER_KIND_UNIFORM);
  config.buffer.set_max_times_sampled(1);
  std::unique_ptr<RunTable> table = std::move(RunTable::Create(config, options)).value();
  for (int i = 0; i < 9; ++i) {
    ASSERT_EQ(table->Insert(MakeGroup(kRun, absl::StrCat("g", i), 2, 0)).status,
              InsertStatus::kStored);
  }
  const auto sample = [](RunTable& t, int64_t step) {
    absl::StatusOr<SampleResult> batch =
        t.Sample({.trainer_policy_version = 0, .timeout = absl::ZeroDuration(), .step = step});
    EXPECT_TRUE(batch.ok()) << batch.status();
    std::vector<std::string> ids;
    if (batch.ok()) {
      for (const SampledGroup& sampled : batch->groups) ids.push_back(sampled.group->group_id());
    }
    return ids;
  };
  const std::vector<std::string> step1 = sample(*table, 1);
  const RunTable::SnapshotData snapshot = table->Snapshot();  // step 1 recorded
  const std::vector<std::string> step2 = sample(*table, 2);
  ASSERT_TRUE(table->CommitTrainedSteps(1).ok());
  const std::vector<std::string> step3 = sample(*table, 3);
  ASSERT_EQ(step1.size(), 3u);
  const int64_t charged = options.memory->used_bytes();

  for (const bool from_snapshot : {false, true}) {
    SCOPED_TRACE(from_snapshot ? "from a snapshot" : "from the journal");
    RunTableOptions restart = options;
    restart.journal = nullptr;
    restart.memory = std::make_shared<MemoryAccount>(0);
    std::unique_ptr<RunTable> restored = Replay(*journal, restart, from_snapshot ? &snapshot : nullptr);
    ExpectSameState(*table, *restored);
    EXPECT_EQ(restart.memory->used_bytes(), charged);
    EXPECT_EQ(sample(*restored, 2), step2);
    EXPECT_EQ(sample(*restored, 3), step3);
    EXPECT_EQ(restored->Sample({.timeout = absl::ZeroDuration(), .step = 1}).status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(restored->Stats().retained_groups, 6);
    absl::StatusOr<CommitResult> committed = restored->CommitTrainedSteps(3);
    ASSERT_TRUE(committed.ok());
    EXPECT_EQ(committed->released_groups, 6);
    EXPECT_EQ(restart.memory->used_bytes(), restored->Stats().size_bytes);
  }
}

// AReaL#1388: after a restart the gate must have the capacity it had, not
// start from zero and let generation run far ahead.
TEST(RunTableJournalTest, RestoredGateHasTheSameCapacity) {
  FakeClock clock;  // whole seconds: the journal keeps insert times in microseconds
  auto journal = std::make_shared<MemoryJournal>();
  RunTableOptions options;
  options.clock = [&clock] { return clock.Now(); };
  options.journal = journal;
  RunConfig config = Config(v1::SAMPLER_KIND_FIFO);
  config.buffer.clear_capacity_groups();
  std::unique_ptr<RunTable> table = std::move(RunTable::Create(config, options)).value();
  // Version 4: limit (2 + 4 + 1) * 3 = 21; fill it with leases and groups.
  ASSERT_TRUE(table->UpdatePolicyVersion(4).ok());
  absl::StatusOr<AcquireResult> granted =
      table->AcquireSlots({.worker_id = "w", .worker_incarnation = 1, .num_groups = 21});
  ASSERT_EQ(granted->lease_ids.size(), 21u);
  for (int i = 0; i < 15; ++i) {
    v1::Group group = MakeGroup(kRun, absl::StrCat("g", i), 2, 4);
    group.set_slot_lease_id(granted->lease_ids[i]);
    ASSERT_EQ(table->Insert(std::move(group)).status, InsertStatus::kStored);
  }
  ASSERT_TRUE(table->Sample({.batch_size_groups = 3, .trainer_policy_version = 4,
                             .timeout = absl::ZeroDuration()})
                  .ok());
  const GateState before = table->Stats().gate;
  EXPECT_EQ(before.accepted, 15);
  EXPECT_EQ(before.running, 6);

  std::unique_ptr<RunTable> restored = Replay(*journal, RunTableOptions{});
  const GateState after = restored->Stats().gate;
  EXPECT_EQ(after.policy_version, 4);
  EXPECT_EQ(after.accepted, 15);
  EXPECT_EQ(after.running, 6);
  EXPECT_EQ(after.admission_limit, 21);
  // No slot is free until the trainer moves on, as before the restart.
  EXPECT_TRUE(restored->AcquireSlots({.worker_id = "w", .worker_incarnation = 1, .num_groups = 1})
                  ->lease_ids.empty());
}

// A worker the trainer's rollout verification quarantined (issue 19): its
// slots are dropped and refused, its groups refused, other workers are not
// touched; the quarantine is journaled and in snapshots, so a restarted
// buffer refuses the worker as before.
TEST(RunTableJournalTest, AQuarantinedWorkerIsRefusedBeforeAndAfterARestart) {
  FakeClock clock;  // whole seconds: the journal keeps insert times in microseconds
  auto journal = std::make_shared<MemoryJournal>();
  RunTableOptions options;
  options.clock = [&clock] { return clock.Now(); };
  options.journal = journal;
  std::unique_ptr<RunTable> table =
      std::move(RunTable::Create(Config(v1::SAMPLER_KIND_FIFO), options)).value();
  absl::StatusOr<AcquireResult> rogue_slots =
      table->AcquireSlots({.worker_id = "rogue", .worker_incarnation = 1, .num_groups = 2});
  ASSERT_EQ(rogue_slots->lease_ids.size(), 2u);
  ASSERT_TRUE(
      table->AcquireSlots({.worker_id = "honest", .worker_incarnation = 1, .num_groups = 2}).ok());
  EXPECT_EQ(table->Stats().gate.running, 4);

  absl::StatusOr<std::vector<std::string>> added = table->QuarantineWorkers({"rogue", "rogue"});
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_THAT(*added, ::testing::ElementsAre("rogue"));
  EXPECT_TRUE(table->QuarantineWorkers({"rogue"})->empty());  // already
  EXPECT_EQ(table->Stats().gate.running, 2);  // its slots are given back

  const auto expect_refused = [](RunTable& t) {
    absl::StatusOr<AcquireResult> acquired =
        t.AcquireSlots({.worker_id = "rogue", .worker_incarnation = 2, .num_groups = 1});
    EXPECT_EQ(acquired.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(acquired.status().message()),
                ::testing::HasSubstr("rollout worker rogue is quarantined for run run-j"));
    v1::Group group = MakeGroup(kRun, absl::StrCat("forged-", t.Stats().size_groups), 2, 0);
    for (v1::Trajectory& trajectory : *group.mutable_trajectories()) {
      trajectory.set_rollout_worker_id("rogue");
    }
    const InsertResult inserted = t.Insert(std::move(group));
    EXPECT_EQ(inserted.status, InsertStatus::kQuarantined);
    EXPECT_THAT(inserted.message, ::testing::HasSubstr("quarantined"));
    v1::Group honest = MakeGroup(kRun, absl::StrCat("honest-", t.Stats().size_groups), 2, 0);
    for (v1::Trajectory& trajectory : *honest.mutable_trajectories()) {
      trajectory.set_rollout_worker_id("honest");
    }
    EXPECT_EQ(t.Insert(std::move(honest)).status, InsertStatus::kStored);
    EXPECT_TRUE(
        t.AcquireSlots({.worker_id = "honest", .worker_incarnation = 1, .num_groups = 0}).ok());
  };
  expect_refused(*table);

  RunTableOptions replay_options;
  replay_options.clock = options.clock;
  std::unique_ptr<RunTable> replayed = Replay(*journal, replay_options);
  EXPECT_THAT(replayed->QuarantinedWorkers(), ::testing::ElementsAre("rogue"));
  ExpectSameState(*table, *replayed);
  expect_refused(*replayed);

  const RunTable::SnapshotData snapshot = table->Snapshot();
  EXPECT_THAT(snapshot.table.quarantined_workers(), ::testing::ElementsAre("rogue"));
  std::vector<v1::storage::SnapshotItem> items;
  for (const auto& item : snapshot.items) *items.emplace_back().mutable_group() = *item.group;
  std::unique_ptr<RunTable> restored =
      std::move(RunTable::Restore(snapshot.table, std::move(items), RunTableOptions{})).value();
  expect_refused(*restored);
}

// A poisoned group is refused before any of it reaches the journal: the
// only record its insert leaves is the refusal (which gives its slot back),
// so no restart can bring it back, and the table holds nothing of it.
TEST(RunTableJournalTest, PoisonedGroupsAreRefusedBeforeAnythingOfThemIsJournaled) {
  FakeClock clock;  // whole seconds: the journal keeps insert times in microseconds
  auto journal = std::make_shared<MemoryJournal>();
  RunTableOptions options;
  options.clock = [&clock] { return clock.Now(); };
  options.journal = journal;
  RunConfig config = Config(v1::SAMPLER_KIND_FIFO);
  config.vocab_size = 1000;
  config.min_reward = 0.0;
  config.max_reward = 1.0;
  absl::StatusOr<std::unique_ptr<RunTable>> created = RunTable::Create(config, options);
  ASSERT_TRUE(created.ok()) << created.status();
  RunTable& table = **created;
  ASSERT_TRUE(table.UpdatePolicyVersion(2).ok());

  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  struct Poison {
    std::function<void(v1::Group&)> apply;
    std::string field;
  };
  const std::vector<Poison> poisons = {
      {[&](v1::Group& g) { g.mutable_trajectories(0)->set_behaviour_logprobs(3, nan); },
       "trajectories[0].behaviour_logprobs[3]"},
      {[&](v1::Group& g) { g.mutable_trajectories(1)->set_behaviour_logprobs(0, inf); },
       "trajectories[1].behaviour_logprobs[0]"},
      {[&](v1::Group& g) { g.mutable_trajectories(1)->set_behaviour_logprobs(9, 2.0f); },
       "trajectories[1].behaviour_logprobs[9]"},
      {[&](v1::Group& g) { g.mutable_trajectories(0)->set_reward(std::nan("")); },
       "trajectories[0].reward"},
      {[&](v1::Group& g) { g.mutable_trajectories(1)->set_reward(1e300); },
       "trajectories[1].reward"},
      {[&](v1::Group& g) { g.mutable_trajectories(0)->set_completion_token_ids(1, -1); },
       "trajectories[0].completion_token_ids[1]"},
      {[&](v1::Group& g) { g.mutable_trajectories(1)->set_prompt_token_ids(2, 1000000000); },
       "trajectories[1].prompt_token_ids[2]"},
      {[&](v1::Group& g) {
         for (int t = 0; t < 10; ++t) {
           g.mutable_trajectories(1)->set_token_policy_versions(t, 1'000'000'000'002);
         }
       },
       "trajectories[1].token_policy_versions[0]"},
      {[&](v1::Group& g) {
         v1::Trajectory* t = g.mutable_trajectories(0);
         t->clear_completion_token_ids();
         t->clear_behaviour_logprobs();
         t->clear_token_policy_versions();
       },
       "trajectories[0].completion_token_ids"},
      {[&](v1::Group& g) { g.mutable_trajectories(0)->add_behaviour_logprobs(-1.0f); },
       "trajectories[0]: completion_token_ids has 10 entries, behaviour_logprobs 11"},
  };
  int index = 0;
  for (const Poison& poison : poisons) {
    SCOPED_TRACE(poison.field);
    absl::StatusOr<AcquireResult> slot =
        table.AcquireSlots({.worker_id = "w", .worker_incarnation = 1, .num_groups = 1});
    ASSERT_TRUE(slot.ok());
    ASSERT_EQ(slot->lease_ids.size(), 1u);
    v1::Group group = MakeGroup(kRun, absl::StrCat("poison-", index++), 2, 2, 10,
                                slot->lease_ids[0]);
    poison.apply(group);
    const size_t records_before = journal->records.size();
    const InsertResult result = table.Insert(group);
    EXPECT_EQ(result.status, InsertStatus::kInvalid);
    EXPECT_TRUE(absl::StartsWith(result.message, poison.field)) << result.message;
    EXPECT_EQ(result.lsn, 0u);
    ASSERT_EQ(journal->records.size(), records_before + 1);
    v1::storage::WalRecord record;
    ASSERT_TRUE(record.ParseFromString(journal->records.back().second));
    EXPECT_TRUE(record.has_refused());
    EXPECT_EQ(record.refused().released_lease_id(), slot->lease_ids[0]);
  }
  for (const auto& [lsn, bytes] : journal->records) {
    v1::storage::WalRecord record;
    ASSERT_TRUE(record.ParseFromString(bytes));
    EXPECT_FALSE(record.has_stored()) << "record " << lsn;
  }
  RunStats stats = table.Stats();
  EXPECT_EQ(stats.size_groups, 0);
  EXPECT_EQ(stats.invalid_inserts, static_cast<int64_t>(poisons.size()));
  EXPECT_EQ(stats.gate.accepted, 0);
  EXPECT_EQ(stats.gate.running, 0);  // every poisoned group's slot came back
  // The table is none the worse: a valid group is stored, and a replay of
  // the journal gives the same state.
  EXPECT_EQ(table.Insert(MakeGroup(kRun, "fine", 2, 2)).status, InsertStatus::kStored);
  std::unique_ptr<RunTable> replayed = Replay(*journal, options);
  ExpectSameState(table, *replayed);
}

TEST(RunTableJournalTest, AFailingJournalChangesNothing) {
  auto journal = std::make_shared<MemoryJournal>();
  RunTableOptions options;
  options.journal = journal;
  std::unique_ptr<RunTable> table =
      std::move(RunTable::Create(Config(v1::SAMPLER_KIND_FIFO), options)).value();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(table->Insert(MakeGroup(kRun, absl::StrCat("g", i), 2, 0)).status,
              InsertStatus::kStored);
  }
  const RunTable::SnapshotData before = table->Snapshot();
  journal->fail = true;
  const InsertResult insert = table->Insert(MakeGroup(kRun, "g9", 2, 0));
  EXPECT_EQ(insert.status, InsertStatus::kRetryableError);
  EXPECT_THAT(insert.message, ::testing::HasSubstr("write-ahead log failed (disk full (test))"));
  absl::StatusOr<SampleResult> sample =
      table->Sample({.trainer_policy_version = 0, .timeout = absl::ZeroDuration()});
  EXPECT_EQ(sample.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(table->UpdatePolicyVersion(3).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(
      table->AcquireSlots({.worker_id = "w", .worker_incarnation = 1, .num_groups = 1}).status().code() ==
      absl::StatusCode::kUnavailable);
  RunTable::SnapshotData after = table->Snapshot();
  after.table.set_retryable_insert_errors(before.table.retryable_insert_errors());
  EXPECT_TRUE(MessageDifferencer::Equals(before.table, after.table));
  EXPECT_EQ(after.items.size(), 3u);
  journal->fail = false;
  EXPECT_EQ(table->Insert(MakeGroup(kRun, "g9", 2, 0)).status, InsertStatus::kStored);
}

}  // namespace
}  // namespace sluice::replay_buffer
