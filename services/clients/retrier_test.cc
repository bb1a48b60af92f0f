#include "services/clients/retrier.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::clients {
namespace {

using ::testing::HasSubstr;

// Options whose backoffs are a few milliseconds, without jitter, recording
// every event.
struct Recorded {
  absl::Mutex mu;
  std::vector<RetryEvent::Kind> kinds ABSL_GUARDED_BY(mu);
  std::vector<absl::Duration> backoffs ABSL_GUARDED_BY(mu);
  std::vector<std::string> services ABSL_GUARDED_BY(mu);
};

RetryOptions FastOptions(Recorded* recorded) {
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(8);
  options.jitter = 0;
  options.deadline = absl::Minutes(1);
  options.observer = [recorded](const RetryEvent& event) {
    absl::MutexLock lock(&recorded->mu);
    recorded->kinds.push_back(event.kind);
    recorded->backoffs.push_back(event.backoff);
    recorded->services.emplace_back(event.service);
  };
  return options;
}

// Fails with `code` for the first `failures` attempts, then succeeds.
struct Flaky {
  absl::StatusCode code;
  int failures;
  int attempts = 0;
  absl::StatusOr<int> operator()() {
    ++attempts;
    if (attempts <= failures) return absl::Status(code, "flaky");
    return 42;
  }
};

TEST(RetrierTest, UnavailableIsRetriedUntilTheCallSucceeds) {
  Recorded recorded;
  Retrier retrier("reward_server", FastOptions(&recorded));
  Flaky flaky{absl::StatusCode::kUnavailable, 3};
  absl::StatusOr<int> result =
      retrier.Call<int>("ScoreBatch", RetryOn::kUnavailable, [&] { return flaky(); });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 42);
  EXPECT_EQ(flaky.attempts, 4);
  absl::MutexLock lock(&recorded.mu);
  EXPECT_EQ(recorded.kinds, std::vector<RetryEvent::Kind>(3, RetryEvent::Kind::kRetry));
  EXPECT_EQ(recorded.services, std::vector<std::string>(3, "reward_server"));
}

TEST(RetrierTest, BackoffDoublesUpToItsCap) {
  Recorded recorded;
  Retrier retrier("replay_buffer", FastOptions(&recorded));
  Flaky flaky{absl::StatusCode::kUnavailable, 6};
  ASSERT_TRUE(retrier.Call<int>("GetStats", RetryOn::kTransient, [&] { return flaky(); }).ok());
  absl::MutexLock lock(&recorded.mu);
  EXPECT_EQ(recorded.backoffs,
            std::vector<absl::Duration>({absl::Milliseconds(1), absl::Milliseconds(2),
                                         absl::Milliseconds(4), absl::Milliseconds(8),
                                         absl::Milliseconds(8), absl::Milliseconds(8)}));
}

TEST(RetrierTest, JitterOnlyShortensTheBackoffAndDependsOnTheSeed) {
  const auto backoffs = [](uint64_t seed) {
    Recorded recorded;
    RetryOptions options = FastOptions(&recorded);
    options.jitter = 0.5;
    options.seed = seed;
    Retrier retrier("controller", options);
    Flaky flaky{absl::StatusCode::kUnavailable, 8};
    EXPECT_TRUE(retrier.Call<int>("LeasePrompts", RetryOn::kUnavailable, [&] {
                         return flaky();
                       }).ok());
    absl::MutexLock lock(&recorded.mu);
    return recorded.backoffs;
  };
  const std::vector<absl::Duration> one = backoffs(1);
  const std::vector<absl::Duration> two = backoffs(2);
  ASSERT_EQ(one.size(), 8u);
  absl::Duration cap = absl::Milliseconds(1);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_LE(one[i], cap) << i;
    EXPECT_GE(one[i], cap / 2) << i;
    cap = std::min(cap * 2, absl::Milliseconds(8));
  }
  EXPECT_NE(one, two);
  EXPECT_EQ(one, backoffs(1));
}

class NotRetriedTest : public ::testing::TestWithParam<absl::StatusCode> {};

TEST_P(NotRetriedTest, ACodeThatNoRetryCuresReturnsAtOnce) {
  Recorded recorded;
  Retrier retrier("reward_server", FastOptions(&recorded));
  Flaky flaky{GetParam(), 1};
  absl::StatusOr<int> result =
      retrier.Call<int>("ScoreBatch", RetryOn::kTransient, [&] { return flaky(); });
  EXPECT_EQ(result.status().code(), GetParam());
  EXPECT_EQ(result.status().message(), "flaky");
  EXPECT_FALSE(IsRetriesExhausted(result.status()));
  EXPECT_EQ(flaky.attempts, 1);
  absl::MutexLock lock(&recorded.mu);
  EXPECT_TRUE(recorded.kinds.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Codes, NotRetriedTest,
    ::testing::Values(absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
                      absl::StatusCode::kAlreadyExists, absl::StatusCode::kFailedPrecondition,
                      absl::StatusCode::kPermissionDenied, absl::StatusCode::kUnauthenticated,
                      absl::StatusCode::kResourceExhausted, absl::StatusCode::kOutOfRange,
                      absl::StatusCode::kUnimplemented, absl::StatusCode::kDataLoss));

// The codes that may mean a server died mid-call, or is broken: retried for
// idempotent calls only, and at most max_ambiguous_retries times.
class AmbiguousTest : public ::testing::TestWithParam<absl::StatusCode> {};

TEST_P(AmbiguousTest, IsNotRetriedForACallThatMustNotRunTwice) {
  Recorded recorded;
  Retrier retrier("replay_buffer", FastOptions(&recorded));
  Flaky flaky{GetParam(), 1};
  absl::StatusOr<int> result =
      retrier.Call<int>("AcquireGenerationSlots", RetryOn::kUnavailable, [&] { return flaky(); });
  EXPECT_EQ(result.status().code(), GetParam());
  EXPECT_EQ(flaky.attempts, 1);
}

TEST_P(AmbiguousTest, IsRetriedForAnIdempotentCall) {
  Recorded recorded;
  Retrier retrier("reward_server", FastOptions(&recorded));
  Flaky flaky{GetParam(), 2};
  absl::StatusOr<int> result =
      retrier.Call<int>("ScoreBatch", RetryOn::kTransient, [&] { return flaky(); });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(flaky.attempts, 3);
}

TEST_P(AmbiguousTest, IsGivenUpAfterMaxAmbiguousRetries) {
  Recorded recorded;
  RetryOptions options = FastOptions(&recorded);
  options.max_ambiguous_retries = 3;
  Retrier retrier("reward_server", options);
  Flaky flaky{GetParam(), 1000};
  absl::StatusOr<int> result =
      retrier.Call<int>("ScoreBatch", RetryOn::kTransient, [&] { return flaky(); });
  EXPECT_EQ(result.status().code(), GetParam());
  EXPECT_TRUE(IsRetriesExhausted(result.status()));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("reward_server failing for"));
  EXPECT_EQ(flaky.attempts, 4);
  absl::MutexLock lock(&recorded.mu);
  ASSERT_EQ(recorded.kinds.size(), 4u);
  EXPECT_EQ(recorded.kinds.back(), RetryEvent::Kind::kGaveUp);
}

INSTANTIATE_TEST_SUITE_P(Codes, AmbiguousTest,
                         ::testing::Values(absl::StatusCode::kDeadlineExceeded,
                                           absl::StatusCode::kAborted,
                                           absl::StatusCode::kInternal,
                                           absl::StatusCode::kUnknown,
                                           absl::StatusCode::kCancelled));

// Time as the fakes make it pass: each failing attempt takes a second.
class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1'800'000'000);
};

TEST(RetrierTest, TheDeadlineEndsTheRetriesWithAFinalErrorNamingTheServiceAndHowLong) {
  Recorded recorded;
  RetryOptions options = FastOptions(&recorded);
  FakeClock clock;
  options.clock = [&] { return clock.Now(); };
  options.deadline = absl::Seconds(10);
  Retrier retrier("reward_server", options);
  int attempts = 0;
  absl::StatusOr<int> result = retrier.Call<int>("ScoreBatch", RetryOn::kTransient, [&] {
    ++attempts;
    clock.Advance(absl::Seconds(1));
    return absl::StatusOr<int>(absl::UnavailableError("connection refused"));
  });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsRetriesExhausted(result.status()));
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("reward_server unreachable for 10s (ScoreBatch: 10 attempts, retry "
                        "deadline 10s): connection refused"));
  // Attempts end at 1 s, 2 s, ..., 10 s: none starts at or past the deadline.
  EXPECT_EQ(attempts, 10);
  absl::MutexLock lock(&recorded.mu);
  EXPECT_EQ(std::count(recorded.kinds.begin(), recorded.kinds.end(), RetryEvent::Kind::kGaveUp),
            1);
}

TEST(RetrierTest, ACallLimitReplacesTheDeadlineAndCanKeepTheGiveUpNonFinal) {
  Recorded recorded;
  RetryOptions options = FastOptions(&recorded);
  FakeClock clock;
  options.clock = [&] { return clock.Now(); };
  Retrier retrier("trainer", options);
  CallLimits limits;
  limits.deadline = absl::Seconds(2);
  limits.exhausted_is_final = false;
  int attempts = 0;
  absl::StatusOr<int> result = retrier.Call<int>(
      "WaitForVersionAfter", RetryOn::kUnavailable,
      [&] {
        ++attempts;
        clock.Advance(absl::Seconds(1));
        return absl::StatusOr<int>(absl::UnavailableError("down"));
      },
      limits);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(IsRetriesExhausted(result.status()));
  EXPECT_EQ(attempts, 2);
}

// Two-sided: the call sits in its backoff until the caller stops, then
// returns at once.
TEST(RetrierTest, CancellingEndsABackoffPromptly) {
  RetryOptions options;
  options.initial_backoff = absl::Minutes(5);
  options.max_backoff = absl::Minutes(5);
  options.cancellation = std::make_shared<RetryCancellation>();
  Retrier retrier("controller", options);
  std::atomic<int> attempts{0};
  absl::Notification returned;
  absl::Status status;
  std::thread caller([&] {
    status = retrier
                 .Call<int>("ReportRolloutProgress", RetryOn::kUnavailable,
                            [&] {
                              ++attempts;
                              return absl::StatusOr<int>(absl::UnavailableError("restarting"));
                            })
                 .status();
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  options.cancellation->Cancel();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  caller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(status.message()), HasSubstr("last error: restarting"));
  EXPECT_FALSE(IsRetriesExhausted(status));
  EXPECT_EQ(attempts.load(), 1);

  // Once cancelled, a call is attempted once and not retried.
  Flaky flaky{absl::StatusCode::kUnavailable, 1};
  EXPECT_EQ(retrier.Call<int>("LeasePrompts", RetryOn::kUnavailable, [&] { return flaky(); })
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(flaky.attempts, 1);
  Flaky healthy{absl::StatusCode::kUnavailable, 0};
  EXPECT_TRUE(retrier.Call<int>("LeasePrompts", RetryOn::kUnavailable, [&] {
                       return healthy();
                     }).ok());
}

TEST(RetrierTest, APerCallStopFlagEndsItsBackoffWhenWoken) {
  RetryOptions options;
  options.initial_backoff = absl::Minutes(5);
  options.max_backoff = absl::Minutes(5);
  Retrier retrier("replay_buffer", options);
  std::atomic<bool> stop{false};
  CallLimits limits;
  limits.stop = &stop;
  absl::Notification returned;
  absl::Status status;
  std::thread caller([&] {
    status = retrier
                 .Call<int>(
                     "Sample", RetryOn::kUnavailable,
                     [] { return absl::StatusOr<int>(absl::UnavailableError("down")); }, limits)
                 .status();
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  stop.store(true);
  retrier.cancellation().Wake();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  caller.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(retrier.cancellation().cancelled());  // only this call stopped
}

TEST(RetrierTest, InvalidOptionsFailEveryCallWithoutCallingNamingTheFields) {
  RetryOptions options;
  options.initial_backoff = absl::Seconds(2);
  options.max_backoff = absl::Seconds(1);
  options.jitter = 1.5;
  options.max_ambiguous_retries = -1;
  Retrier retrier("trainer", options);
  int attempts = 0;
  absl::StatusOr<int> result = retrier.Call<int>("FetchWeights", RetryOn::kTransient, [&] {
    ++attempts;
    return absl::StatusOr<int>(1);
  });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("max_backoff"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("jitter"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("max_ambiguous_retries"));
  EXPECT_EQ(attempts, 0);
}

TEST(RetrierTest, TheExhaustedMarkSurvivesAPrefix) {
  const absl::Status marked = MarkRetriesExhausted(absl::UnavailableError("down"));
  const absl::Status prefixed = PrefixMessage(marked, "scoring rollouts");
  EXPECT_TRUE(IsRetriesExhausted(prefixed));
  EXPECT_EQ(prefixed.message(), "scoring rollouts: down");
  EXPECT_FALSE(IsRetriesExhausted(PrefixMessage(absl::UnavailableError("down"), "x")));
  EXPECT_FALSE(IsRetriesExhausted(MarkRetriesExhausted(absl::OkStatus())));
}

}  // namespace
}  // namespace sluice::clients
