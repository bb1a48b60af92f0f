// Dynamic sampling with refill (SampleRequest.drop_uniform_reward_groups):
// groups whose rewards are all equal are evicted when the trainer samples,
// their admission capacity goes back to the gate so that generation
// replaces them, and a step's recorded batch is its informative groups.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/run_table.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using testing::MakeGroup;

constexpr char kRun[] = "run-dynamic";

std::unique_ptr<RunTable> MakeTable() {
  RunConfig config;
  config.run_id = kRun;
  config.batch_size_groups = 2;
  config.max_staleness = 1;
  config.group_size = 2;
  absl::StatusOr<std::unique_ptr<RunTable>> table = RunTable::Create(config);
  EXPECT_TRUE(table.ok()) << table.status();
  return std::move(table).value();
}

// MakeGroup's rewards are 0, 1 (a signal); `uniform` makes them 1, 1.
void Insert(RunTable& table, int id, bool uniform) {
  v1::Group group = MakeGroup(kRun, absl::StrCat("g", id), 2, 0);
  if (uniform) group.mutable_trajectories(0)->set_reward(1);
  ASSERT_EQ(table.Insert(std::move(group)).status, InsertStatus::kStored);
}

SampleRequest Refill(int64_t step) {
  SampleRequest request;
  request.step = step;
  request.timeout = absl::ZeroDuration();
  request.drop_uniform_reward_groups = true;
  return request;
}

std::vector<std::string> GroupIds(const SampleResult& result) {
  std::vector<std::string> ids;
  for (const SampledGroup& sampled : result.groups) ids.push_back(sampled.group->group_id());
  return ids;
}

TEST(RunTableDynamicSamplingTest, UniformGroupsAreEvictedAndTheirCapacityGivenBack) {
  std::unique_ptr<RunTable> table = MakeTable();
  // B = 2, eta = 1 at version 0: the gate admits (1 + 0 + 1) * 2 = 4 groups.
  Insert(*table, 0, /*uniform=*/true);
  Insert(*table, 1, false);
  Insert(*table, 2, true);
  Insert(*table, 3, false);
  ASSERT_EQ(table->Stats().gate.accepted, 4);
  ASSERT_EQ(table->Stats().gate.admission_limit, 4);

  absl::StatusOr<SampleResult> batch = table->Sample(Refill(1));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(GroupIds(*batch), ElementsAre("g1", "g3"));
  EXPECT_EQ(batch->uniform_reward_groups_dropped, 2);
  const RunStats stats = table->Stats();
  EXPECT_EQ(stats.evictions.uniform_reward, 2);
  EXPECT_EQ(stats.size_groups, 0);
  // The two trained groups stay accepted, the two evicted ones do not: the
  // gate lets generation replace them, and the trainer has consumed B = 2
  // accepted groups for its version, as without refill.
  EXPECT_EQ(stats.gate.accepted, 2);

  // The step's batch is recorded: asked again, the same informative groups.
  absl::StatusOr<SampleResult> again = table->Sample(Refill(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replayed);
  EXPECT_THAT(GroupIds(*again), ElementsAre("g1", "g3"));
  EXPECT_EQ(again->uniform_reward_groups_dropped, 0);
}

TEST(RunTableDynamicSamplingTest, ABatchWaitsForEnoughInformativeGroups) {
  std::unique_ptr<RunTable> table = MakeTable();
  Insert(*table, 0, false);
  Insert(*table, 1, true);
  // Two groups held, one informative: not a batch of two.
  EXPECT_TRUE(absl::IsDeadlineExceeded(table->Sample(Refill(1)).status()));
  EXPECT_EQ(table->Stats().evictions.uniform_reward, 1);
  Insert(*table, 2, true);
  Insert(*table, 3, false);
  absl::StatusOr<SampleResult> batch = table->Sample(Refill(1));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(GroupIds(*batch), ElementsAre("g0", "g3"));
  EXPECT_EQ(batch->uniform_reward_groups_dropped, 1);
}

TEST(RunTableDynamicSamplingTest, WithoutTheFlagUniformGroupsAreSampledAsAnyOther) {
  std::unique_ptr<RunTable> table = MakeTable();
  Insert(*table, 0, true);
  Insert(*table, 1, false);
  SampleRequest request = Refill(1);
  request.drop_uniform_reward_groups = false;
  absl::StatusOr<SampleResult> batch = table->Sample(request);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(GroupIds(*batch), ElementsAre("g0", "g1"));
  EXPECT_EQ(table->Stats().evictions.uniform_reward, 0);
}

}  // namespace
}  // namespace sluice::replay_buffer
