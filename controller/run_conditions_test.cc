#include "controller/run_conditions.h"

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::controller {
namespace {

using ::testing::HasSubstr;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

TEST(RunConditionsTest, SetAddsOnceAndKeepsItsSinceWhenTheMessageChanges) {
  v1::Run run;
  EXPECT_TRUE(
      RunConditions::Set(&run, "service_unresponsive", "trainer", "no answer for 3 s", kT0));
  EXPECT_FALSE(RunConditions::Set(&run, "service_unresponsive", "trainer", "no answer for 3 s",
                                  kT0 + absl::Seconds(1)));
  EXPECT_TRUE(RunConditions::Set(&run, "service_unresponsive", "trainer", "no answer for 9 s",
                                 kT0 + absl::Seconds(6)));
  ASSERT_EQ(run.conditions_size(), 1);
  EXPECT_EQ(run.conditions(0).message(), "no answer for 9 s");
  EXPECT_EQ(run.conditions(0).since().seconds(), absl::ToUnixSeconds(kT0));
}

TEST(RunConditionsTest, ConditionsAreKeyedByKindAndService) {
  v1::Run run;
  RunConditions::Set(&run, "service_unresponsive", "trainer", "a", kT0);
  RunConditions::Set(&run, "service_unresponsive", "replay_buffer", "b", kT0);
  RunConditions::Set(&run, "no_worker", "rollout_worker", "c", kT0);
  EXPECT_EQ(run.conditions_size(), 3);
  ASSERT_NE(RunConditions::Find(run, "service_unresponsive", "replay_buffer"), nullptr);
  EXPECT_EQ(RunConditions::Find(run, "service_unresponsive", "replay_buffer")->message(), "b");
  EXPECT_EQ(RunConditions::Find(run, "no_worker", "trainer"), nullptr);

  EXPECT_TRUE(RunConditions::Clear(&run, "service_unresponsive", "trainer"));
  EXPECT_FALSE(RunConditions::Clear(&run, "service_unresponsive", "trainer"));
  EXPECT_EQ(run.conditions_size(), 2);
  EXPECT_TRUE(RunConditions::ClearKind(&run, "service_unresponsive"));
  ASSERT_EQ(run.conditions_size(), 1);
  EXPECT_EQ(run.conditions(0).kind(), "no_worker");
  EXPECT_TRUE(RunConditions::ClearAll(&run));
  EXPECT_FALSE(RunConditions::ClearAll(&run));
}

TEST(RunConditionsTest, DescribeNamesTheServiceAndHowLongItHasHeld) {
  v1::Run run;
  EXPECT_EQ(RunConditions::Describe(run, kT0), "");
  RunConditions::Set(&run, "no_worker", "rollout_worker", "no rollout worker serves the run", kT0);
  const std::string text = RunConditions::Describe(run, kT0 + absl::Seconds(42));
  EXPECT_THAT(text, HasSubstr("rollout_worker: no rollout worker serves the run (since 42 s)"));
}

}  // namespace
}  // namespace sluice::controller
