#include "services/clients/retrier.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/retry_after.h"

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

// ---- retry hints: a server that is full says when to come back -----------

// RESOURCE_EXHAUSTED with a hint of `hint` for the first `failures`
// attempts, then 42; records when each attempt started.
struct Busy {
  absl::Duration hint;
  int failures;
  std::vector<absl::Time> started;
  absl::StatusOr<int> operator()() {
    started.push_back(absl::Now());
    if (static_cast<int>(started.size()) <= failures) {
      return WithRetryAfter(absl::ResourceExhaustedError("sandbox pool full"), hint);
    }
    return 42;
  }
};

class HintedTest : public ::testing::TestWithParam<RetryOn> {};

TEST_P(HintedTest, AHintedRefusalIsRetriedAfterAtLeastTheHintUnderAnyRetryOn) {
  Recorded recorded;
  RetryOptions options = FastOptions(&recorded);
  options.jitter = 0.5;
  options.seed = 7;
  options.max_ambiguous_retries = 0;  // a hinted refusal is not ambiguous
  Retrier retrier("reward_server", options);
  const absl::Duration hint = absl::Milliseconds(30);
  Busy busy{hint, 2};
  absl::StatusOr<int> result = retrier.Call<int>("ScoreBatch", GetParam(), [&] { return busy(); });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(*result, 42);
  ASSERT_EQ(busy.started.size(), 3u);
  for (size_t i = 1; i < busy.started.size(); ++i) {
    EXPECT_GE(busy.started[i] - busy.started[i - 1], hint) << i;
  }
  absl::MutexLock lock(&recorded.mu);
  EXPECT_EQ(recorded.kinds, std::vector<RetryEvent::Kind>(2, RetryEvent::Kind::kRetry));
  ASSERT_EQ(recorded.backoffs.size(), 2u);
  for (const absl::Duration backoff : recorded.backoffs) {
    // The hint lengthened by up to `jitter` of it, never shortened; nothing
    // of the ordinary schedule (1 ms, 2 ms) shows.
    EXPECT_GE(backoff, hint);
    EXPECT_LE(backoff, hint * 1.5);
  }
}

INSTANTIATE_TEST_SUITE_P(RetryOn, HintedTest,
                         ::testing::Values(RetryOn::kUnavailable, RetryOn::kTransient),
                         [](const ::testing::TestParamInfo<RetryOn>& info) {
                           return info.param == RetryOn::kUnavailable ? "Unavailable"
                                                                      : "Transient";
                         });

TEST(RetrierTest, AHintOfZeroStillWaitsTheInitialBackoff) {
  Recorded recorded;
  RetryOptions options = FastOptions(&recorded);
  options.initial_backoff = absl::Milliseconds(5);
  Retrier retrier("reward_server", options);
  Busy busy{absl::ZeroDuration(), 1};
  ASSERT_TRUE(retrier.Call<int>("ScoreBatch", RetryOn::kTransient, [&] { return busy(); }).ok());
  absl::MutexLock lock(&recorded.mu);
  EXPECT_EQ(recorded.backoffs, std::vector<absl::Duration>({absl::Milliseconds(5)}));
}

// The hint runs past the deadline: the wait is cut at the deadline, one last
// attempt is made there, and the call gives up as final, without the hint (a
// caller that retries too must not take it as an invitation).
TEST(RetrierTest, AHintPastTheDeadlineGivesUpAtTheDeadline) {
  Recorded recorded;
  RetryOptions options = FastOptions(&recorded);
  FakeClock clock;
  options.clock = [&] { return clock.Now(); };
  options.deadline = absl::Seconds(10);
  Retrier retrier("reward_server", options);
  int attempts = 0;
  absl::StatusOr<int> result = retrier.Call<int>("ScoreBatch", RetryOn::kTransient, [&] {
    // The first attempt leaves 50 ms of the deadline.
    clock.Advance(++attempts == 1 ? absl::Milliseconds(9950) : absl::Seconds(1));
    return absl::StatusOr<int>(WithRetryAfter(
        absl::ResourceExhaustedError("sandbox pool full; retry after 5000 ms"),
        absl::Seconds(5)));
  });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsRetriesExhausted(result.status()));
  EXPECT_EQ(RetryAfter(result.status()), std::nullopt);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("reward_server busy for 10.95s (ScoreBatch: 2 attempts, retry deadline "
                        "10s): sandbox pool full"));
  EXPECT_EQ(attempts, 2);
  absl::MutexLock lock(&recorded.mu);
  EXPECT_EQ(recorded.kinds,
            std::vector<RetryEvent::Kind>({RetryEvent::Kind::kRetry, RetryEvent::Kind::kGaveUp}));
  EXPECT_EQ(recorded.backoffs[0], absl::Milliseconds(50));
}

TEST(RetrierTest, ResourceExhaustedWithoutAHintIsReturnedAtOnce) {
  for (const RetryOn on : {RetryOn::kUnavailable, RetryOn::kTransient}) {
    Recorded recorded;
    Retrier retrier("replay_buffer", FastOptions(&recorded));
    int attempts = 0;
    absl::StatusOr<int> result = retrier.Call<int>("GetStats", on, [&] {
      ++attempts;
      return absl::StatusOr<int>(absl::ResourceExhaustedError("quota"));
    });
    EXPECT_EQ(result.status(), absl::ResourceExhaustedError("quota"));
    EXPECT_EQ(attempts, 1);
    absl::MutexLock lock(&recorded.mu);
    EXPECT_TRUE(recorded.kinds.empty());
  }
}

// The ambiguous answers after a hinted refusal still have their own limit.
TEST(RetrierTest, HintedRefusalsDoNotUseUpTheAmbiguousRetries) {
  Recorded recorded;
  RetryOptions options = FastOptions(&recorded);
  options.max_ambiguous_retries = 1;
  Retrier retrier("reward_server", options);
  int attempts = 0;
  absl::StatusOr<int> result = retrier.Call<int>("ScoreBatch", RetryOn::kTransient, [&] {
    ++attempts;
    if (attempts <= 3) {
      return absl::StatusOr<int>(
          WithRetryAfter(absl::ResourceExhaustedError("full"), absl::Milliseconds(1)));
    }
    return absl::StatusOr<int>(absl::InternalError("broken"));
  });
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(IsRetriesExhausted(result.status()));
  EXPECT_EQ(attempts, 5);  // 3 hinted, 1 ambiguous retried, 1 given up
}

TEST(RetrierTest, TheRetryHintSurvivesAPrefix) {
  const absl::Status hinted =
      WithRetryAfter(absl::ResourceExhaustedError("full"), absl::Milliseconds(150));
  const absl::Status prefixed = PrefixMessage(hinted, "reward_server ScoreBatch on host:1");
  EXPECT_EQ(RetryAfter(prefixed), absl::Milliseconds(150));
  EXPECT_EQ(prefixed.message(), "reward_server ScoreBatch on host:1: full");
}

}  // namespace
}  // namespace sluice::clients
