// The run table with the non-FIFO samplers, priorities and the rate limiter.
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
using ::testing::HasSubstr;
using testing::MakeGroup;

constexpr char kRun[] = "run-s";
// Long enough that a call which should block has visibly not returned.
constexpr absl::Duration kStillBlocked = absl::Milliseconds(150);
constexpr absl::Duration kReturns = absl::Seconds(10);

RunConfig Config(v1::SamplerKind sampler, int32_t batch = 1) {
  RunConfig config;
  config.run_id = kRun;
  config.batch_size_groups = batch;
  config.max_staleness = 4;
  config.group_size = 2;
  config.seed = 3;
  config.buffer.set_sampler(sampler);
  return config;
}

std::unique_ptr<RunTable> MakeTable(const RunConfig& config) {
  absl::StatusOr<std::unique_ptr<RunTable>> table = RunTable::Create(config);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(table).value();
}

// A group whose two trajectories have rewards r0 and r1.
v1::Group Rewarded(int id, float r0, float r1) {
  v1::Group group = MakeGroup(kRun, absl::StrCat("g", id), 2, 0);
  group.mutable_trajectories(0)->set_reward(r0);
  group.mutable_trajectories(1)->set_reward(r1);
  return group;
}

std::vector<std::string> Ids(const SampleResult& result) {
  std::vector<std::string> ids;
  for (const SampledGroup& sampled : result.groups) ids.push_back(sampled.group->group_id());
  return ids;
}

SampleRequest Now(int32_t batch = 0) {
  return SampleRequest{.batch_size_groups = batch, .timeout = absl::ZeroDuration()};
}

TEST(RunTableSamplingTest, LifoHandsOutTheNewestFirst) {
  auto table = MakeTable(Config(v1::SAMPLER_KIND_LIFO, 2));
  for (int i = 0; i < 5; ++i) ASSERT_EQ(table->Insert(Rewarded(i, 0, 0)).status, InsertStatus::kStored);
  EXPECT_THAT(Ids(*table->Sample(Now())), ElementsAre("g4", "g3"));
  EXPECT_THAT(Ids(*table->Sample(Now())), ElementsAre("g2", "g1"));
}

// Out-of-order completion: a long group leased at version 1 is inserted after
// two short ones from version 2; eta = 1. FIFO trains the short ones first and
// the long group goes stale when the trainer reaches version 3; oldest-policy
// trains it first and nothing is evicted.
std::vector<std::string> TrainThroughALateLongGroup(v1::SamplerKind sampler, int64_t* evicted) {
  RunConfig config = Config(sampler);
  config.max_staleness = 1;
  auto table = MakeTable(config);
  SampleRequest at2 = Now();
  at2.trainer_policy_version = 2;
  (void)table->Sample(at2);  // the trainer is at version 2; nothing held yet
  for (auto [id, version] : {std::pair{0, 2}, std::pair{1, 2}, std::pair{2, 1}}) {
    EXPECT_EQ(table->Insert(MakeGroup(kRun, absl::StrCat("g", id), 2, version)).status,
              InsertStatus::kStored);
  }
  std::vector<std::string> trained;
  *evicted = 0;
  for (int64_t version : {2, 3, 3}) {
    SampleRequest request = Now();
    request.trainer_policy_version = version;
    absl::StatusOr<SampleResult> result = table->Sample(request);
    if (!result.ok()) break;  // nothing left to sample
    *evicted += result->evicted_stale_groups;
    for (const std::string& id : Ids(*result)) trained.push_back(id);
  }
  return trained;
}

TEST(RunTableSamplingTest, OldestPolicyTrainsALateGroupThatFifoLetsGoStale) {
  int64_t evicted = 0;
  EXPECT_THAT(TrainThroughALateLongGroup(v1::SAMPLER_KIND_FIFO, &evicted),
              ElementsAre("g0", "g1"));
  EXPECT_EQ(evicted, 1);
  EXPECT_THAT(TrainThroughALateLongGroup(v1::SAMPLER_KIND_OLDEST_POLICY, &evicted),
              ElementsAre("g2", "g0", "g1"));
  EXPECT_EQ(evicted, 0);
}

// PRIORITY_SOURCE_REWARD with epsilon 0.01 and alpha 1: a group of mean
// reward 1 is drawn (1.01 / 1.02) of the time against one of reward 0
// (0.01 / 1.02). 4000 draws of max_times_sampled = large keep both held; the
// 0-reward group's expected count is 39 with sd 6.2: below 80 is 6 sd out.
TEST(RunTableSamplingTest, PrioritizedDrawsByRewardAndFollowsPriorityUpdates) {
  RunConfig config = Config(v1::SAMPLER_KIND_PRIORITIZED);
  config.buffer.set_priority_alpha(1.0);
  config.buffer.set_max_times_sampled(1'000'000);
  auto table = MakeTable(config);
  ASSERT_EQ(table->Insert(Rewarded(0, 0, 0)).status, InsertStatus::kStored);
  ASSERT_EQ(table->Insert(Rewarded(1, 1, 1)).status, InsertStatus::kStored);
  int low = 0;
  for (int i = 0; i < 4000; ++i) low += Ids(*table->Sample(Now()))[0] == "g0";
  EXPECT_LT(low, 80);
  EXPECT_GT(low, 5);

  // The trainer raises g0 far above g1: now g1 is the rare one.
  absl::StatusOr<UpdatePrioritiesResult> updated =
      table->UpdatePriorities({{"g0", 100.0}, {"gone", 3.0}});
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->updated, 1);
  EXPECT_THAT(updated->not_found_group_ids, ElementsAre("gone"));
  int high = 0;
  for (int i = 0; i < 4000; ++i) high += Ids(*table->Sample(Now()))[0] == "g0";
  EXPECT_GT(high, 3900);  // expected 3960 (100 / 101.01), sd 6.3
}

TEST(RunTableSamplingTest, AbsAdvantagePrefersGroupsWithSignal) {
  RunConfig config = Config(v1::SAMPLER_KIND_PRIORITIZED);
  config.buffer.set_priority_alpha(1.0);
  config.buffer.set_priority_source(v1::PRIORITY_SOURCE_ABS_ADVANTAGE);
  config.buffer.set_priority_epsilon(1e-6);
  config.buffer.set_max_times_sampled(1'000'000);
  auto table = MakeTable(config);
  ASSERT_EQ(table->Insert(Rewarded(0, 1, 1)).status, InsertStatus::kStored);  // no signal
  ASSERT_EQ(table->Insert(Rewarded(1, 0, 1)).status, InsertStatus::kStored);  // |adv| 0.5
  for (int i = 0; i < 200; ++i) EXPECT_THAT(Ids(*table->Sample(Now())), ElementsAre("g1"));
}

TEST(RunTableSamplingTest, ClientPrioritiesAreValidatedAndDefaultToTheLargestSeen) {
  RunConfig config = Config(v1::SAMPLER_KIND_PRIORITIZED, 2);
  config.buffer.set_priority_source(v1::PRIORITY_SOURCE_CLIENT);
  auto table = MakeTable(config);
  v1::Group bad = Rewarded(0, 0, 0);
  bad.set_priority(-2);
  const InsertResult refused = table->Insert(bad);
  EXPECT_EQ(refused.status, InsertStatus::kInvalid);
  EXPECT_EQ(refused.message, "priority: must be finite and >= 0, got -2");
  v1::Group high = Rewarded(1, 0, 0);
  high.set_priority(7);
  ASSERT_EQ(table->Insert(high).status, InsertStatus::kStored);
  ASSERT_EQ(table->Insert(Rewarded(2, 0, 0)).status, InsertStatus::kStored);  // gets 7 too
  const RunTable::SnapshotData snapshot = table->Snapshot();
  ASSERT_EQ(snapshot.items.size(), 2u);
  EXPECT_EQ(snapshot.items[0].priority, 7);
  EXPECT_EQ(snapshot.items[1].priority, 7);
}

TEST(RunTableSamplingTest, RecencyWithProbabilityOneIsNewestFirst) {
  RunConfig config = Config(v1::SAMPLER_KIND_RECENCY, 2);
  config.buffer.set_recency_probability(1.0);
  auto table = MakeTable(config);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(table->Insert(Rewarded(i, 0, 0)).status, InsertStatus::kStored);
  EXPECT_THAT(Ids(*table->Sample(Now())), ElementsAre("g3", "g2"));
}

TEST(RunTableSamplingTest, SameSeedSameBatches) {
  RunConfig config = Config(v1::SAMPLER_KIND_UNIFORM, 3);
  config.buffer.set_max_times_sampled(1'000'000);
  auto a = MakeTable(config);
  auto b = MakeTable(config);
  config.seed = 4;
  auto c = MakeTable(config);
  for (int i = 0; i < 50; ++i) {
    for (RunTable* table : {a.get(), b.get(), c.get()}) {
      ASSERT_EQ(table->Insert(Rewarded(i, 0, 0)).status, InsertStatus::kStored);
    }
  }
  bool differs = false;
  for (int i = 0; i < 20; ++i) {
    const std::vector<std::string> batch = Ids(*a->Sample(Now()));
    EXPECT_EQ(batch, Ids(*b->Sample(Now())));
    differs |= batch != Ids(*c->Sample(Now()));
  }
  EXPECT_TRUE(differs);
}

// samples_per_insert 1 around B = 2 with tolerance 2: inserts stop once the
// trainer is 4 groups behind; samples stop once it is ahead.
RunConfig Limited() {
  RunConfig config = Config(v1::SAMPLER_KIND_FIFO, 2);
  config.buffer.set_samples_per_insert(1);
  config.buffer.set_samples_per_insert_tolerance(2);
  return config;
}

TEST(RunTableSamplingTest, RateLimitedInsertBlocksUntilASampleThenProceeds) {
  auto table = MakeTable(Limited());
  // Filling (size < 2) then diff up to 2 + 2 = 4: four inserts pass.
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(table->Insert(Rewarded(i, 0, 0), absl::ZeroDuration()).status, InsertStatus::kStored);
  }
  const InsertResult refused = table->Insert(Rewarded(9, 0, 0), absl::ZeroDuration());
  EXPECT_EQ(refused.status, InsertStatus::kRetryableError);
  EXPECT_THAT(refused.message, HasSubstr("rate limited"));

  absl::Notification returned;
  InsertResult result;
  std::thread inserter([&] {
    result = table->Insert(Rewarded(4, 0, 0), absl::Seconds(30));
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));
  ASSERT_TRUE(table->Sample(Now()).ok());  // the trainer catches up by 2
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  inserter.join();
  EXPECT_EQ(result.status, InsertStatus::kStored);
  EXPECT_GT(table->Stats().rate_limiter_insert_blocked, absl::ZeroDuration());
}

TEST(RunTableSamplingTest, RateLimitedSampleBlocksUntilAnInsertThenProceeds) {
  RunConfig config = Limited();
  config.buffer.set_max_times_sampled(100);  // groups stay: only the ratio can block
  auto table = MakeTable(config);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(table->Insert(Rewarded(i, 0, 0)).status, InsertStatus::kStored);
  // diff 4: batches of 2 while diff - 2 >= 2 - 2 = 0, i.e. two batches.
  ASSERT_TRUE(table->Sample(Now()).ok());
  ASSERT_TRUE(table->Sample(Now()).ok());
  absl::StatusOr<SampleResult> refused = table->Sample(Now());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(refused.status().message(), HasSubstr("the rate limiter"));

  absl::Notification returned;
  absl::StatusOr<SampleResult> result;
  std::thread sampler([&] {
    result = table->Sample({.timeout = absl::Seconds(30)});
    returned.Notify();
  });
  ASSERT_EQ(table->Insert(Rewarded(4, 0, 0)).status, InsertStatus::kStored);
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));  // one is not enough
  ASSERT_EQ(table->Insert(Rewarded(5, 0, 0)).status, InsertStatus::kStored);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  sampler.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->groups.size(), 2u);
  EXPECT_GT(table->Stats().rate_limiter_sample_blocked, absl::ZeroDuration());
}

TEST(RunTableSamplingTest, ShutdownWakesARateLimitedInsert) {
  auto table = MakeTable(Limited());
  for (int i = 0; i < 4; ++i) ASSERT_EQ(table->Insert(Rewarded(i, 0, 0)).status, InsertStatus::kStored);
  absl::Notification returned;
  InsertResult result;
  std::thread inserter([&] {
    result = table->Insert(Rewarded(4, 0, 0), absl::InfiniteDuration());
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked));
  table->Shutdown();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  inserter.join();
  EXPECT_EQ(result.status, InsertStatus::kRetryableError);
}

TEST(RunTableSamplingTest, ReconfiguringTheSamplerKeepsTheGroups) {
  auto table = MakeTable(Config(v1::SAMPLER_KIND_FIFO, 2));
  for (int i = 0; i < 3; ++i) ASSERT_EQ(table->Insert(Rewarded(i, 0, 0)).status, InsertStatus::kStored);
  ASSERT_TRUE(table->Reconfigure(Config(v1::SAMPLER_KIND_LIFO, 2)).ok());
  EXPECT_THAT(Ids(*table->Sample(Now())), ElementsAre("g2", "g1"));
}

}  // namespace
}  // namespace sluice::replay_buffer
