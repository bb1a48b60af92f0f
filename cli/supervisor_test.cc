#include "cli/supervisor.h"

#include <signal.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using Action = RestartDecision::Action;

class RestartPolicyTest : public ::testing::Test {
 protected:
  RestartPolicy MakePolicy(RestartPolicyOptions options) {
    EXPECT_TRUE(options.Validate().ok()) << options.Validate();
    return RestartPolicy(options, [this] { return now_; });
  }

  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

TEST_F(RestartPolicyTest, BackoffDoublesFromInitialUpToTheCap) {
  RestartPolicy policy = MakePolicy({.max_restarts = 8,
                                     .window = absl::Hours(1),
                                     .initial_backoff = absl::Seconds(1),
                                     .max_backoff = absl::Seconds(10)});
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 6; ++i) {
    const RestartDecision decision = policy.OnFailure("trainer", "killed");
    ASSERT_EQ(decision.action, Action::kRestart) << i;
    EXPECT_EQ(decision.restart_in_window, i + 1);
    delays.push_back(decision.delay);
    now_ += decision.delay + absl::Seconds(1);
  }
  EXPECT_THAT(delays, ElementsAre(absl::Seconds(1), absl::Seconds(2), absl::Seconds(4),
                                  absl::Seconds(8), absl::Seconds(10), absl::Seconds(10)));
}

TEST_F(RestartPolicyTest, MoreFailuresThanAllowedWithinTheWindowGivesUp) {
  RestartPolicy policy = MakePolicy({.max_restarts = 2, .window = absl::Minutes(2)});
  EXPECT_EQ(policy.OnFailure("reward_server", "first").action, Action::kRestart);
  now_ += absl::Seconds(10);
  EXPECT_EQ(policy.OnFailure("reward_server", "second").action, Action::kRestart);
  now_ += absl::Seconds(10);
  const RestartDecision decision = policy.OnFailure("reward_server", "third");
  EXPECT_EQ(decision.action, Action::kGiveUp);
  EXPECT_EQ(decision.give_up_reason,
            "it failed 3 times within 2m, more than the 2 restarts allowed");
  EXPECT_THAT(decision.recent_failures,
              ElementsAre(Field(&ServiceFailure::description, "first"),
                          Field(&ServiceFailure::description, "second"),
                          Field(&ServiceFailure::description, "third")));
  EXPECT_EQ(decision.recent_failures.front().at, now_ - absl::Seconds(20));
}

TEST_F(RestartPolicyTest, FailuresOlderThanTheWindowAreForgottenAndBackoffStartsOver) {
  RestartPolicy policy = MakePolicy({.max_restarts = 2,
                                     .window = absl::Minutes(2),
                                     .initial_backoff = absl::Seconds(1),
                                     .max_backoff = absl::Seconds(30)});
  EXPECT_EQ(policy.OnFailure("trainer", "a").delay, absl::Seconds(1));
  now_ += absl::Seconds(30);
  EXPECT_EQ(policy.OnFailure("trainer", "b").delay, absl::Seconds(2));
  // The first failure leaves the window: two failures in it, still allowed.
  now_ += absl::Seconds(91);
  RestartDecision decision = policy.OnFailure("trainer", "c");
  ASSERT_EQ(decision.action, Action::kRestart);
  EXPECT_EQ(decision.restart_in_window, 2);
  EXPECT_EQ(decision.delay, absl::Seconds(2));
  // Long after all of them: back to the first restart and the initial backoff.
  now_ += absl::Minutes(5);
  decision = policy.OnFailure("trainer", "d");
  ASSERT_EQ(decision.action, Action::kRestart);
  EXPECT_EQ(decision.restart_in_window, 1);
  EXPECT_EQ(decision.delay, absl::Seconds(1));
}

TEST_F(RestartPolicyTest, ServicesAreCountedApart) {
  RestartPolicy policy = MakePolicy({.max_restarts = 1});
  EXPECT_EQ(policy.OnFailure("rollout_worker-0", "x").action, Action::kRestart);
  EXPECT_EQ(policy.OnFailure("rollout_worker-1", "x").action, Action::kRestart);
  EXPECT_EQ(policy.OnFailure("rollout_worker-0", "x").action, Action::kGiveUp);
  policy.OnRestarted("rollout_worker-1");
  EXPECT_EQ(policy.restarts("rollout_worker-1"), 1);
  EXPECT_EQ(policy.restarts("rollout_worker-0"), 0);
  EXPECT_EQ(policy.restarts("trainer"), 0);
}

TEST_F(RestartPolicyTest, NeverGivesUpAtTheFirstFailure) {
  RestartPolicy policy = MakePolicy({.restart_on_failure = false});
  const RestartDecision decision = policy.OnFailure("controller", "was killed by signal 9");
  EXPECT_EQ(decision.action, Action::kGiveUp);
  EXPECT_EQ(decision.give_up_reason, "--restart never");
  EXPECT_EQ(decision.recent_failures.size(), 1u);
}

TEST_F(RestartPolicyTest, ZeroRestartsAllowedGivesUpAtTheFirstFailure) {
  RestartPolicy policy = MakePolicy({.max_restarts = 0});
  const RestartDecision decision = policy.OnFailure("trainer", "x");
  EXPECT_EQ(decision.action, Action::kGiveUp);
  EXPECT_THAT(decision.give_up_reason, HasSubstr("more than the 0 restarts allowed"));
}

TEST_F(RestartPolicyTest, DescribesTheRestartAsTheConsoleShowsIt) {
  RestartPolicy policy = MakePolicy({});
  const RestartDecision decision = policy.OnFailure("trainer", "x");
  EXPECT_EQ(policy.DescribeRestart(decision), "restart 1 of 5 allowed in 2m");
}

TEST(RestartPolicyOptionsTest, ValidateNamesTheBadOption) {
  EXPECT_THAT(std::string(RestartPolicyOptions{.max_restarts = -1}.Validate().message()),
              HasSubstr("max_restarts must be >= 0, got -1"));
  EXPECT_THAT(std::string(RestartPolicyOptions{.window = absl::ZeroDuration()}.Validate().message()),
              HasSubstr("restart window must be > 0"));
  EXPECT_THAT(std::string(RestartPolicyOptions{.initial_backoff = absl::Seconds(5),
                                               .max_backoff = absl::Seconds(1)}
                              .Validate()
                              .message()),
              HasSubstr("max_backoff (1s) must be >= initial_backoff (5s)"));
  EXPECT_TRUE(RestartPolicyOptions{}.Validate().ok());
}

// As Kubernetes' livenessProbe: the service is killed after `failures`
// probes in a row went unanswered; any answer starts the count again.
TEST(LivenessCountTest, KillsAfterTheFailuresInARowOnly) {
  LivenessCount count({.period = absl::Seconds(5), .timeout = absl::Seconds(2), .failures = 3});
  EXPECT_FALSE(count.OnProbe(false, "deadline exceeded"));
  EXPECT_FALSE(count.OnProbe(false, "deadline exceeded"));
  EXPECT_FALSE(count.OnProbe(true, ""));  // An answer (NOT_SERVING too) resets it.
  EXPECT_FALSE(count.OnProbe(false, "deadline exceeded"));
  EXPECT_FALSE(count.OnProbe(false, "deadline exceeded"));
  EXPECT_EQ(count.consecutive_failures(), 2);
  EXPECT_TRUE(count.OnProbe(false, "Deadline Exceeded"));
  EXPECT_EQ(count.Describe(),
            "did not answer its health check within 2s, 3 times in a row (last: Deadline "
            "Exceeded)");
  EXPECT_EQ(count.consecutive_failures(), 0);
}

TEST(LivenessOptionsTest, ValidateNamesTheFlag) {
  EXPECT_TRUE(LivenessOptions{}.Validate().ok());
  EXPECT_TRUE(LivenessOptions{.period = absl::ZeroDuration()}.Validate().ok());  // Off.
  EXPECT_FALSE(LivenessOptions{.period = absl::ZeroDuration()}.enabled());
  EXPECT_THAT(
      std::string(LivenessOptions{.period = absl::Seconds(1), .timeout = absl::Seconds(2)}
                      .Validate()
                      .message()),
      HasSubstr("--liveness-timeout must be > 0 and at most --liveness-period (1s), got 2s"));
  EXPECT_THAT(std::string(LivenessOptions{.failures = 0}.Validate().message()),
              HasSubstr("--liveness-failures must be >= 1, got 0"));
}

TEST(DescribeExitTest, SaysHowTheProcessEnded) {
  EXPECT_EQ(DescribeExit({.signaled = true, .signal = SIGKILL}),
            "was killed by signal 9 (SIGKILL)");
  EXPECT_EQ(DescribeExit({.signaled = true, .signal = SIGSEGV}),
            "was killed by signal 11 (SIGSEGV)");
  EXPECT_EQ(DescribeExit({.code = 3}), "exited with code 3");
  EXPECT_TRUE(IsFailure({.code = 3}));
  EXPECT_TRUE(IsFailure({.signaled = true, .signal = SIGTERM}));
  EXPECT_FALSE(IsFailure({.code = 0}));
}

}  // namespace
}  // namespace sluice::cli
