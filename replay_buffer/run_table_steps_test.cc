// Trainer steps (SampleRequest.step): a step's batch is recorded, handed
// out again unchanged for as long as it is not committed, and kept (in the
// memory account, safe from eviction) until then.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/run_table.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testing::MakeGroup;

constexpr char kRun[] = "run-steps";

RunConfig Config(int32_t batch_size = 2, int32_t max_staleness = 1) {
  RunConfig config;
  config.run_id = kRun;
  config.batch_size_groups = batch_size;
  config.max_staleness = max_staleness;
  config.group_size = 2;
  return config;
}

struct Table {
  std::shared_ptr<MemoryAccount> memory = std::make_shared<MemoryAccount>(0);
  std::unique_ptr<RunTable> table;
};

Table MakeTable(const RunConfig& config) {
  Table made;
  RunTableOptions options;
  options.memory = made.memory;
  absl::StatusOr<std::unique_ptr<RunTable>> table = RunTable::Create(config, options);
  EXPECT_TRUE(table.ok()) << table.status();
  made.table = std::move(table).value();
  return made;
}

void InsertGroups(RunTable& table, int first, int count, int64_t version) {
  for (int i = first; i < first + count; ++i) {
    ASSERT_EQ(table.Insert(MakeGroup(kRun, absl::StrCat("g", i), 2, version)).status,
              InsertStatus::kStored);
  }
}

SampleRequest Step(int64_t step, int64_t trainer_version,
                   absl::Duration timeout = absl::ZeroDuration()) {
  SampleRequest request;
  request.step = step;
  request.trainer_policy_version = trainer_version;
  request.timeout = timeout;
  return request;
}

std::vector<std::string> GroupIds(const SampleResult& result) {
  std::vector<std::string> ids;
  for (const SampledGroup& sampled : result.groups) ids.push_back(sampled.group->group_id());
  return ids;
}

TEST(RunTableStepsTest, ARecordedStepIsHandedOutAgainUnchangedAndCountedOnce) {
  Table t = MakeTable(Config(2, 2));
  InsertGroups(*t.table, 0, 6, 0);
  absl::StatusOr<SampleResult> first = t.table->Sample(Step(1, 1));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->replayed);
  ASSERT_THAT(GroupIds(*first), ElementsAre("g0", "g1"));
  ASSERT_TRUE(t.table->Sample(Step(2, 2)).ok());
  ASSERT_TRUE(t.table->UpdatePolicyVersion(2).ok());
  const RunStats before = t.table->Stats();

  // A trainer resumed from step 0 asks for step 1 again, at its version 0.
  absl::StatusOr<SampleResult> again = t.table->Sample(Step(1, 0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replayed);
  EXPECT_EQ(GroupIds(*again), GroupIds(*first));
  EXPECT_EQ(again->policy_version, 1);  // as first handed out
  EXPECT_EQ(again->buffer_version, first->buffer_version);
  for (size_t i = 0; i < first->groups.size(); ++i) {
    EXPECT_EQ(again->groups[i].group, first->groups[i].group);  // the same stored group
    EXPECT_EQ(again->groups[i].staleness, first->groups[i].staleness);
    EXPECT_EQ(again->groups[i].times_sampled, first->groups[i].times_sampled);
  }
  // Nothing was sampled, evicted or counted again.
  const RunStats after = t.table->Stats();
  EXPECT_EQ(after.sampled_groups, before.sampled_groups);
  EXPECT_EQ(after.rate_limiter_samples, before.rate_limiter_samples);
  EXPECT_EQ(after.sampled_group_staleness.total_count(),
            before.sampled_group_staleness.total_count());
  EXPECT_EQ(after.size_groups, 2);
  EXPECT_EQ(after.buffer_version, before.buffer_version);
  EXPECT_EQ(after.replayed_batches, 1);
  EXPECT_EQ(after.last_recorded_step, 2);
  EXPECT_EQ(after.retained_groups, 4);

  // Step 3 is new: the next groups.
  absl::StatusOr<SampleResult> third = t.table->Sample(Step(3, 2));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->replayed);
  EXPECT_THAT(GroupIds(*third), ElementsAre("g4", "g5"));
}

TEST(RunTableStepsTest, StepsAreRecordedInOrderAndACommittedOneIsGone) {
  Table t = MakeTable(Config());
  InsertGroups(*t.table, 0, 8, 0);
  absl::StatusOr<SampleResult> ahead = t.table->Sample(Step(2, 0));
  EXPECT_EQ(ahead.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(ahead.status().message()),
              HasSubstr("step 2 of run run-steps is ahead of the next step to sample, 1"));
  EXPECT_EQ(t.table->Stats().sampled_groups, 0);  // refused before anything was taken
  ASSERT_TRUE(t.table->Sample(Step(1, 0)).ok());
  ASSERT_TRUE(t.table->Sample(Step(2, 0)).ok());

  absl::StatusOr<CommitResult> committed = t.table->CommitTrainedSteps(1);
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->committed_step, 1);
  EXPECT_EQ(committed->released_groups, 2);
  absl::StatusOr<SampleResult> gone = t.table->Sample(Step(1, 0));
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gone.status().message()),
              HasSubstr("step 1 of run run-steps was committed"));
  EXPECT_TRUE(t.table->Sample(Step(2, 0))->replayed);
  // Committing again, or lower, changes nothing.
  EXPECT_EQ(t.table->CommitTrainedSteps(1)->released_groups, 0);
  EXPECT_EQ(t.table->CommitTrainedSteps(0)->committed_step, 1);
  EXPECT_EQ(t.table->CommitTrainedSteps(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.table->Sample(Step(-1, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  // Sampling without a step is untouched by all this.
  absl::StatusOr<SampleResult> plain = t.table->Sample(Step(0, 0));
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->replayed);
  EXPECT_THAT(GroupIds(*plain), ElementsAre("g4", "g5"));
  EXPECT_EQ(t.table->Stats().last_recorded_step, 2);
}

// A trainer resumed from its checkpoint on a buffer that lost its journal
// commits its checkpoint's step: recording goes on after it.
TEST(RunTableStepsTest, ACommitBeyondTheLastRecordedStepMovesTheNextStep) {
  Table t = MakeTable(Config());
  InsertGroups(*t.table, 0, 4, 0);
  ASSERT_TRUE(t.table->CommitTrainedSteps(5).ok());
  EXPECT_EQ(t.table->Sample(Step(5, 0)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.table->Sample(Step(7, 0)).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<SampleResult> sixth = t.table->Sample(Step(6, 0));
  ASSERT_TRUE(sixth.ok()) << sixth.status();
  EXPECT_THAT(GroupIds(*sixth), ElementsAre("g0", "g1"));
  const RunStats stats = t.table->Stats();
  EXPECT_EQ(stats.committed_step, 5);
  EXPECT_EQ(stats.last_recorded_step, 6);
}

// What a step took stays in memory (charged to the budget) after its last
// sample, and goes when the step is committed; a group sampled by two steps
// goes with the second.
TEST(RunTableStepsTest, RetainedGroupsStayChargedUntilTheirStepsAreCommitted) {
  RunConfig config = Config(2, 4);
  config.buffer.set_max_times_sampled(2);
  Table t = MakeTable(config);
  InsertGroups(*t.table, 0, 2, 0);
  const int64_t held = t.memory->used_bytes();
  ASSERT_GT(held, 0);
  ASSERT_THAT(GroupIds(*t.table->Sample(Step(1, 0))), ElementsAre("g0", "g1"));
  ASSERT_THAT(GroupIds(*t.table->Sample(Step(2, 0))), ElementsAre("g0", "g1"));  // their last
  RunStats stats = t.table->Stats();
  EXPECT_EQ(stats.size_groups, 0);
  EXPECT_EQ(stats.size_bytes, 0);
  EXPECT_EQ(stats.retained_groups, 2);
  EXPECT_EQ(stats.retained_bytes, held);
  EXPECT_EQ(t.memory->used_bytes(), held);

  EXPECT_EQ(t.table->CommitTrainedSteps(1)->released_groups, 0);  // step 2 still has them
  EXPECT_EQ(t.memory->used_bytes(), held);
  absl::StatusOr<SampleResult> second = t.table->Sample(Step(2, 0));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->groups[0].times_sampled, 2);
  EXPECT_TRUE(second->groups[0].removed);

  EXPECT_EQ(t.table->CommitTrainedSteps(2)->released_groups, 2);
  EXPECT_EQ(t.memory->used_bytes(), 0);
  stats = t.table->Stats();
  EXPECT_EQ(stats.retained_groups, 0);
  EXPECT_EQ(stats.retained_bytes, 0);
}

// A group a recorded step took can still become stale for sampling (it is
// evicted from the sampleable groups), but the step keeps it.
TEST(RunTableStepsTest, AStaleGroupARecordedStepTookIsEvictedButKept) {
  RunConfig config = Config(2, 1);
  config.buffer.set_max_times_sampled(3);
  Table t = MakeTable(config);
  InsertGroups(*t.table, 0, 2, 0);
  const int64_t held = t.memory->used_bytes();
  absl::StatusOr<SampleResult> first = t.table->Sample(Step(1, 0));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(t.table->UpdatePolicyVersion(5).ok());
  RunStats stats = t.table->Stats();
  EXPECT_EQ(stats.evictions.stale, 2);
  EXPECT_EQ(stats.size_groups, 0);
  EXPECT_EQ(stats.retained_groups, 2);
  EXPECT_EQ(t.memory->used_bytes(), held);
  absl::StatusOr<SampleResult> again = t.table->Sample(Step(1, 5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(GroupIds(*again), GroupIds(*first));
  EXPECT_EQ(again->groups[0].staleness, 0);  // as at sampling, not against version 5
  ASSERT_TRUE(t.table->CommitTrainedSteps(1).ok());
  EXPECT_EQ(t.memory->used_bytes(), 0);
}

// The service puts back a batch it could not write; a step's batch stays
// recorded instead, for the trainer's retry of the step.
TEST(RunTableStepsTest, AnUndeliveredStepBatchStaysRecorded) {
  Table t = MakeTable(Config());
  InsertGroups(*t.table, 0, 4, 0);
  absl::StatusOr<SampleResult> lost = t.table->Sample(Step(1, 0));
  ASSERT_TRUE(lost.ok());
  t.table->ReturnUndelivered(*lost);
  EXPECT_EQ(t.table->Stats().size_groups, 2);
  absl::StatusOr<SampleResult> retried = t.table->Sample(Step(1, 0));
  ASSERT_TRUE(retried.ok());
  EXPECT_TRUE(retried->replayed);
  EXPECT_EQ(GroupIds(*retried), GroupIds(*lost));
}

// Two Samples of the same step (the trainer retrying on a new stream while
// the old one still waits) get the same batch: the first to find groups
// records it, the other replays it.
TEST(RunTableStepsTest, TwoWaitingSamplesOfOneStepGetTheSameBatch) {
  Table t = MakeTable(Config());
  std::vector<absl::StatusOr<SampleResult>> results(2, absl::UnknownError("not run"));
  absl::Notification done[2];
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      results[i] = t.table->Sample(Step(1, 0, absl::Seconds(30)));
      done[i].Notify();
    });
  }
  EXPECT_FALSE(done[0].WaitForNotificationWithTimeout(absl::Milliseconds(150)));
  EXPECT_FALSE(done[1].HasBeenNotified());
  InsertGroups(*t.table, 0, 4, 0);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(done[i].WaitForNotificationWithTimeout(absl::Seconds(10)));
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  ASSERT_TRUE(results[1].ok()) << results[1].status();
  EXPECT_EQ(GroupIds(*results[0]), GroupIds(*results[1]));
  EXPECT_NE(results[0]->replayed, results[1]->replayed);
  EXPECT_EQ(t.table->Stats().sampled_groups, 2);
}

TEST(RunTableStepsTest, TheTableGivesItsRetainedBytesBackWhenDestroyed) {
  Table t = MakeTable(Config());
  InsertGroups(*t.table, 0, 4, 0);
  ASSERT_TRUE(t.table->Sample(Step(1, 0)).ok());
  ASSERT_GT(t.table->Stats().retained_bytes, 0);
  t.table.reset();
  EXPECT_EQ(t.memory->used_bytes(), 0);
}

}  // namespace
}  // namespace sluice::replay_buffer
