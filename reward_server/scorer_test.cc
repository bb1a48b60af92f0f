#include "reward_server/scorer.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "reward_server/builtin_verifiers.h"

namespace sluice::reward_server {
namespace {

using ::testing::HasSubstr;

// Blocks in Verify until Release(); counts calls that started and finished.
class HangingVerifier final : public Verifier {
 public:
  explicit HangingVerifier(absl::Duration max_timeout = absl::Seconds(60))
      : Verifier({.name = "hang",
                  .description = "blocks until the test releases it",
                  .default_timeout = absl::Seconds(5),
                  .max_timeout = max_timeout}) {}

  VerifyOutcome Verify(const VerifyRequest& request) const override {
    {
      absl::MutexLock lock(&mu_);
      ++started_;
    }
    release_.WaitForNotification();
    absl::MutexLock lock(&mu_);
    ++finished_;
    VerifyOutcome outcome;
    outcome.reward = 1.0;
    return outcome;
  }

  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  bool AwaitStarted(int count) const { return AwaitCount(&started_, count); }
  bool AwaitFinished(int count) const { return AwaitCount(&finished_, count); }

 private:
  bool AwaitCount(const int* counter, int count) const {
    absl::MutexLock lock(&mu_);
    const auto reached = [this, counter, count]() {
      mu_.AssertReaderHeld();
      return *counter >= count;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(30));
  }

  mutable absl::Mutex mu_;
  mutable int started_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int finished_ ABSL_GUARDED_BY(mu_) = 0;
  mutable absl::Notification release_;
};

// Returns a fixed outcome, or throws.
class FixedVerifier final : public Verifier {
 public:
  FixedVerifier(std::string name, double reward, VerifierErrorKind error = VerifierErrorKind::kNone,
                bool throws = false)
      : Verifier({.name = std::move(name), .default_timeout = absl::Seconds(5)}),
        reward_(reward),
        error_(error),
        throws_(throws) {}

  VerifyOutcome Verify(const VerifyRequest& request) const override {
    if (throws_) throw std::runtime_error("boom");
    VerifyOutcome outcome;
    outcome.reward = reward_;
    outcome.error_kind = error_;
    outcome.extracted_answer = request.response;
    return outcome;
  }

 private:
  const double reward_;
  const VerifierErrorKind error_;
  const bool throws_;
};

// Finishes only once `parties` calls are inside Verify at the same time
// (reward 1), or gives up after 10 s (reward 0): proves parallelism.
class RendezvousVerifier final : public Verifier {
 public:
  explicit RendezvousVerifier(int parties)
      : Verifier({.name = "rendezvous", .default_timeout = absl::Seconds(20)}), parties_(parties) {}

  VerifyOutcome Verify(const VerifyRequest& request) const override {
    absl::MutexLock lock(&mu_);
    ++arrived_;
    const auto all_here = [this]() {
      mu_.AssertReaderHeld();
      return arrived_ >= parties_;
    };
    VerifyOutcome outcome;
    outcome.reward = mu_.AwaitWithTimeout(absl::Condition(&all_here), absl::Seconds(10)) ? 1 : 0;
    return outcome;
  }

 private:
  const int parties_;
  mutable absl::Mutex mu_;
  mutable int arrived_ ABSL_GUARDED_BY(mu_) = 0;
};

std::shared_ptr<const VerifierRegistry> Registry(
    std::vector<std::shared_ptr<const Verifier>> extra = {}) {
  absl::StatusOr<VerifierRegistry> registry = MakeBuiltinVerifierRegistry();
  EXPECT_TRUE(registry.ok());
  for (auto& verifier : extra) EXPECT_TRUE(registry->Register(std::move(verifier)).ok());
  return std::make_shared<const VerifierRegistry>(*std::move(registry));
}

std::unique_ptr<Scorer> MakeScorer(std::shared_ptr<const VerifierRegistry> registry,
                                   ScorerOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Scorer>> scorer = Scorer::Create(std::move(registry), options);
  EXPECT_TRUE(scorer.ok()) << scorer.status();
  return *std::move(scorer);
}

ScoreItem Item(std::string id, std::string verifier, std::string response,
               std::string reference = "", absl::Duration timeout = absl::ZeroDuration()) {
  ScoreItem item;
  item.item_id = std::move(id);
  item.verifier = std::move(verifier);
  item.request.response = std::move(response);
  item.request.reference_answer = std::move(reference);
  item.timeout = timeout;
  return item;
}

std::vector<ScoreItem> MathItems(int count, const std::string& prefix = "m") {
  std::vector<ScoreItem> items;
  for (int i = 0; i < count; ++i) {
    const std::string answer = std::to_string(i - count / 2);
    // Every third response is wrong.
    items.push_back(
        Item(absl::StrCat(prefix, i), "math", i % 3 == 0 ? answer + "1" : answer, answer));
  }
  return items;
}

void ExpectMathResults(const BatchScores& scores, int count, const std::string& prefix = "m") {
  ASSERT_EQ(scores.items.size(), static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const ItemScore& item = scores.items[i];
    EXPECT_EQ(item.item_id, absl::StrCat(prefix, i));
    EXPECT_EQ(item.outcome.error_kind, VerifierErrorKind::kNone) << item.outcome.detail;
    EXPECT_EQ(item.outcome.reward, i % 3 == 0 ? 0.0 : 1.0) << item.item_id;
    EXPECT_EQ(item.outcome.verifier_name, "math");
  }
}

TEST(ScorerOptionsTest, ValidateNamesTheField) {
  ScorerOptions options;
  EXPECT_TRUE(options.Validate().ok());
  options.num_workers = 0;
  EXPECT_THAT(std::string(options.Validate().message()),
              HasSubstr("num_workers must be in [1, 1024], got 0"));
  options = {};
  options.max_abandoned_workers = -1;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("max_abandoned_workers"));
  EXPECT_EQ(Scorer::Create(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ScorerTest, ScoresABatchInRequestOrder) {
  auto scorer = MakeScorer(Registry());
  absl::StatusOr<BatchScores> scores = scorer->ScoreBatch(MathItems(300), {});
  ASSERT_TRUE(scores.ok()) << scores.status();
  ExpectMathResults(*scores, 300);
  EXPECT_GE(scores->duration, absl::ZeroDuration());
}

TEST(ScorerTest, EmptyBatchIsAnEmptyResult) {
  auto scorer = MakeScorer(Registry());
  absl::StatusOr<BatchScores> scores = scorer->ScoreBatch({}, {});
  ASSERT_TRUE(scores.ok());
  EXPECT_TRUE(scores->items.empty());
}

TEST(ScorerTest, ItemsRunInParallelOnTheWorkers) {
  auto scorer = MakeScorer(Registry({std::make_shared<RendezvousVerifier>(3)}), {.num_workers = 3});
  std::vector<ScoreItem> items;
  for (int i = 0; i < 3; ++i) items.push_back(Item(absl::StrCat("r", i), "rendezvous", "x"));
  absl::StatusOr<BatchScores> scores = scorer->ScoreBatch(std::move(items), {});
  ASSERT_TRUE(scores.ok());
  for (const ItemScore& item : scores->items) EXPECT_EQ(item.outcome.reward, 1.0) << item.item_id;
}

TEST(ScorerTest, HangingVerifierTimesOutWhileTheOthersSucceed) {
  auto hang = std::make_shared<HangingVerifier>();
  auto scorer = MakeScorer(Registry({hang}), {.num_workers = 2});
  std::vector<ScoreItem> items = MathItems(50);
  const absl::Duration kHangTimeout = absl::Milliseconds(300);
  items.insert(items.begin() + 10, Item("stuck", "hang", "x", "", kHangTimeout));

  const absl::Time start = absl::Now();
  absl::StatusOr<BatchScores> scores = scorer->ScoreBatch(std::move(items), {});
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_TRUE(scores.ok());
  ASSERT_EQ(scores->items.size(), 51u);

  const VerifyOutcome& stuck = scores->items[10].outcome;
  EXPECT_EQ(scores->items[10].item_id, "stuck");
  EXPECT_EQ(stuck.error_kind, VerifierErrorKind::kTimeout);
  EXPECT_EQ(stuck.reward, 0.0);
  EXPECT_FALSE(stuck.retryable);
  EXPECT_EQ(stuck.verifier_name, "hang");
  EXPECT_THAT(stuck.detail, HasSubstr("deadline"));
  scores->items.erase(scores->items.begin() + 10);
  ExpectMathResults(*scores, 50);
  // The batch waited for the hung item's deadline and not a moment for the
  // verifier itself, which is still blocked (nor for the math items' 5 s).
  EXPECT_GE(elapsed, kHangTimeout);
  EXPECT_LT(elapsed, absl::Seconds(4));

  hang->Release();
  EXPECT_TRUE(hang->AwaitFinished(1));
  EXPECT_TRUE(scorer->AwaitNoAbandonedWorkers(absl::Seconds(30)));
}

TEST(ScorerTest, StuckWorkersAreReplacedSoThePoolIsNotStarved) {
  auto hang = std::make_shared<HangingVerifier>();
  auto scorer = MakeScorer(Registry({hang}), {.num_workers = 2, .max_abandoned_workers = 4});
  // Both workers get stuck.
  std::vector<ScoreItem> stuck = {Item("a", "hang", "x", "", absl::Milliseconds(200)),
                                  Item("b", "hang", "x", "", absl::Milliseconds(200))};
  absl::StatusOr<BatchScores> first = scorer->ScoreBatch(std::move(stuck), {});
  ASSERT_TRUE(first.ok());
  for (const ItemScore& item : first->items) {
    EXPECT_EQ(item.outcome.error_kind, VerifierErrorKind::kTimeout) << item.item_id;
  }
  Scorer::Stats stats = scorer->GetStats();
  EXPECT_EQ(stats.workers, 2);
  EXPECT_EQ(stats.abandoned_workers, 2);

  // The replacements score the next batch while the stuck threads hang on.
  absl::StatusOr<BatchScores> second = scorer->ScoreBatch(MathItems(40), {});
  ASSERT_TRUE(second.ok());
  ExpectMathResults(*second, 40);

  hang->Release();
  EXPECT_TRUE(scorer->AwaitNoAbandonedWorkers(absl::Seconds(30)));
  stats = scorer->GetStats();
  EXPECT_EQ(stats.workers, 2);
  EXPECT_EQ(stats.abandoned_workers, 0);
}

TEST(ScorerTest, BeyondTheAbandonedBudgetQueuedItemsAreUnavailable) {
  auto hang = std::make_shared<HangingVerifier>();
  auto scorer = MakeScorer(Registry({hang}), {.num_workers = 1, .max_abandoned_workers = 0});
  absl::StatusOr<BatchScores> first =
      scorer->ScoreBatch({Item("a", "hang", "x", "", absl::Milliseconds(100))}, {});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->items[0].outcome.error_kind, VerifierErrorKind::kTimeout);
  EXPECT_EQ(scorer->GetStats().workers, 0);

  // No worker left: the item is never started and says why.
  absl::StatusOr<BatchScores> starved =
      scorer->ScoreBatch({Item("m", "math", "1", "1", absl::Milliseconds(100))}, {});
  ASSERT_TRUE(starved.ok());
  const VerifyOutcome& outcome = starved->items[0].outcome;
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kUnavailable);
  EXPECT_TRUE(outcome.retryable);
  EXPECT_THAT(outcome.detail, HasSubstr("not started before the deadline"));

  // Once the stuck thread returns, its slot is refilled.
  hang->Release();
  EXPECT_TRUE(scorer->AwaitNoAbandonedWorkers(absl::Seconds(30)));
  EXPECT_EQ(scorer->GetStats().workers, 1);
  absl::StatusOr<BatchScores> after = scorer->ScoreBatch(MathItems(5), {});
  ASSERT_TRUE(after.ok());
  ExpectMathResults(*after, 5);
}

TEST(ScorerTest, TimeoutIsClampedToTheVerifiersMaximum) {
  auto hang = std::make_shared<HangingVerifier>(/*max_timeout=*/absl::Milliseconds(200));
  auto scorer = MakeScorer(Registry({hang}));
  const absl::Time start = absl::Now();
  absl::StatusOr<BatchScores> scores =
      scorer->ScoreBatch({Item("a", "hang", "x", "", absl::Hours(1))}, {});
  ASSERT_TRUE(scores.ok());
  EXPECT_EQ(scores->items[0].outcome.error_kind, VerifierErrorKind::kTimeout);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  hang->Release();
}

TEST(ScorerTest, ThrowingOrMisbehavingVerifiersBecomeItemErrors) {
  auto scorer = MakeScorer(Registry(
      {std::make_shared<FixedVerifier>("throws", 1, VerifierErrorKind::kNone, true),
       std::make_shared<FixedVerifier>("too_big", 1.5),
       std::make_shared<FixedVerifier>("nan", std::nan("")),
       std::make_shared<FixedVerifier>("parse_with_reward", 1, VerifierErrorKind::kParse)}));
  absl::StatusOr<BatchScores> scores =
      scorer->ScoreBatch({Item("t", "throws", "x"), Item("b", "too_big", "x"),
                          Item("n", "nan", "x"), Item("p", "parse_with_reward", "x")},
                         {});
  ASSERT_TRUE(scores.ok());
  EXPECT_EQ(scores->items[0].outcome.error_kind, VerifierErrorKind::kCrash);
  EXPECT_THAT(scores->items[0].outcome.detail, HasSubstr("boom"));
  EXPECT_EQ(scores->items[1].outcome.error_kind, VerifierErrorKind::kInternal);
  EXPECT_TRUE(scores->items[1].outcome.retryable);
  EXPECT_EQ(scores->items[2].outcome.error_kind, VerifierErrorKind::kInternal);
  EXPECT_EQ(scores->items[3].outcome.error_kind, VerifierErrorKind::kParse);
  for (const ItemScore& item : scores->items) EXPECT_EQ(item.outcome.reward, 0.0) << item.item_id;
}

TEST(ScorerTest, BadItemsAreItemOutcomesNotBatchErrors) {
  auto scorer = MakeScorer(Registry());
  absl::StatusOr<BatchScores> scores =
      scorer->ScoreBatch({Item("unknown", "nope", "52", "52"), Item("no_reference", "math", "52"),
                          Item("no_verifier", "", "52", "52"),
                          Item("negative_timeout", "math", "52", "52", absl::Milliseconds(-1)),
                          Item("fine", "math", "52", "52")},
                         {});
  ASSERT_TRUE(scores.ok());
  const auto& items = scores->items;
  EXPECT_EQ(items[0].outcome.error_kind, VerifierErrorKind::kUnknownVerifier);
  EXPECT_EQ(items[0].outcome.verifier_name, "nope");
  EXPECT_EQ(items[1].outcome.error_kind, VerifierErrorKind::kInvalidInput);
  EXPECT_EQ(items[1].outcome.detail, "math needs reference_answer");
  EXPECT_EQ(items[2].outcome.error_kind, VerifierErrorKind::kInvalidInput);
  EXPECT_THAT(items[2].outcome.detail, HasSubstr("no composition"));
  EXPECT_EQ(items[3].outcome.error_kind, VerifierErrorKind::kInvalidInput);
  EXPECT_THAT(items[3].outcome.detail, HasSubstr("timeout"));
  EXPECT_EQ(items[4].outcome.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(items[4].outcome.reward, 1.0);
}

VerifyOutcome Component(std::string name, double weight, double reward,
                        VerifierErrorKind error = VerifierErrorKind::kNone) {
  VerifyOutcome outcome =
      error == VerifierErrorKind::kNone ? VerifyOutcome{} : VerifyOutcome::Error(error, "failed");
  outcome.verifier_name = std::move(name);
  outcome.weight = weight;
  outcome.reward = reward;
  outcome.duration = absl::Milliseconds(weight);
  return outcome;
}

TEST(ComposeOutcomesTest, WeightedMeanOfComponents) {
  VerifyOutcome composite = ComposeOutcomes({Component("math", 3, 1), Component("format", 1, 0)});
  EXPECT_EQ(composite.verifier_name, "composite");
  EXPECT_EQ(composite.error_kind, VerifierErrorKind::kNone);
  EXPECT_DOUBLE_EQ(composite.reward, 0.75);
  ASSERT_EQ(composite.components.size(), 2u);
  EXPECT_EQ(composite.components[0].verifier_name, "math");
  EXPECT_EQ(composite.components[0].weight, 3);
  EXPECT_EQ(composite.components[1].verifier_name, "format");
  EXPECT_EQ(composite.duration, absl::Milliseconds(3));
  EXPECT_THAT(composite.detail, HasSubstr("math(w=3)=1"));

  EXPECT_DOUBLE_EQ(
      ComposeOutcomes({Component("a", 1, 0.5), Component("b", 1, 1), Component("c", 2, 0.25)})
          .reward,
      (0.5 + 1 + 0.5) / 4);
}

TEST(ComposeOutcomesTest, ModelFaultsScoreZeroInfrastructureFaultsFailTheComposite) {
  // A parse failure is the model's: it earns 0 for that component only.
  VerifyOutcome partial = ComposeOutcomes(
      {Component("math", 1, 0, VerifierErrorKind::kParse), Component("format", 1, 1)});
  EXPECT_EQ(partial.error_kind, VerifierErrorKind::kNone);
  EXPECT_DOUBLE_EQ(partial.reward, 0.5);

  // Every component failing by the model's fault: the first error.
  VerifyOutcome all_failed =
      ComposeOutcomes({Component("math", 1, 0, VerifierErrorKind::kTimeout),
                       Component("format", 1, 0, VerifierErrorKind::kParse)});
  EXPECT_EQ(all_failed.error_kind, VerifierErrorKind::kTimeout);
  EXPECT_EQ(all_failed.reward, 0.0);

  // An unknown verifier or a retryable failure voids the whole composite.
  for (VerifierErrorKind kind :
       {VerifierErrorKind::kUnknownVerifier, VerifierErrorKind::kUnavailable,
        VerifierErrorKind::kInvalidInput}) {
    VerifyOutcome failed =
        ComposeOutcomes({Component("math", 1, 1), Component("other", 1, 0, kind)});
    EXPECT_EQ(failed.error_kind, kind);
    EXPECT_EQ(failed.reward, 0.0);
    EXPECT_EQ(failed.retryable, IsRetryable(kind));
    EXPECT_THAT(failed.detail, HasSubstr("other: failed"));
    EXPECT_EQ(failed.components.size(), 2u);
  }
}

TEST(ScorerTest, CompositionAppliesToItemsWithoutAVerifier) {
  auto scorer = MakeScorer(Registry(
      {std::make_shared<FixedVerifier>("one", 1), std::make_shared<FixedVerifier>("zero", 0)}));
  absl::StatusOr<BatchScores> scores =
      scorer->ScoreBatch({Item("composed", "", "x"), Item("single", "zero", "x")},
                         {{"one", 3}, {"zero", 0 /* = 1.0 */}});
  ASSERT_TRUE(scores.ok()) << scores.status();
  const VerifyOutcome& composed = scores->items[0].outcome;
  EXPECT_EQ(composed.verifier_name, "composite");
  EXPECT_DOUBLE_EQ(composed.reward, 0.75);
  ASSERT_EQ(composed.components.size(), 2u);
  EXPECT_EQ(composed.components[0].verifier_name, "one");
  EXPECT_EQ(composed.components[0].weight, 3);
  EXPECT_EQ(composed.components[1].verifier_name, "zero");
  EXPECT_EQ(composed.components[1].weight, 1);
  const VerifyOutcome& single = scores->items[1].outcome;
  EXPECT_EQ(single.verifier_name, "zero");
  EXPECT_TRUE(single.components.empty());

  absl::StatusOr<BatchScores> unknown =
      scorer->ScoreBatch({Item("composed", "", "x")}, {{"one", 1}, {"nope", 1}});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->items[0].outcome.error_kind, VerifierErrorKind::kUnknownVerifier);
}

TEST(ScorerTest, InvalidCompositionIsABatchError) {
  auto scorer = MakeScorer(Registry());
  const std::vector<std::pair<std::vector<WeightedVerifier>, std::string>> cases = {
      {{{"math", -1}}, "composition[0].weight: must be >= 0"},
      {{{"math", 1}, {"math", std::nan("")}}, "composition[1].weight"},
      {{{"math", std::numeric_limits<double>::infinity()}}, "composition[0].weight"},
      {{{"", 1}}, "composition[0].name: must not be empty"},
      {std::vector<WeightedVerifier>(kMaxCompositionSize + 1, {"math", 1}), "at most 32"},
  };
  for (const auto& [composition, message] : cases) {
    absl::StatusOr<BatchScores> scores = scorer->ScoreBatch(MathItems(1), composition);
    EXPECT_EQ(scores.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(std::string(scores.status().message()), HasSubstr(message));
  }
}

TEST(ScorerTest, ShutdownReturnsPendingBatchesWithUnavailableItems) {
  auto hang = std::make_shared<HangingVerifier>();
  auto scorer = MakeScorer(Registry({hang}), {.num_workers = 1});
  absl::Notification returned;
  absl::StatusOr<BatchScores> scores;
  std::thread caller([&] {
    std::vector<ScoreItem> items = {Item("stuck", "hang", "x", "", absl::Seconds(60))};
    for (ScoreItem& item : MathItems(3)) items.push_back(std::move(item));
    scores = scorer->ScoreBatch(std::move(items), {});
    returned.Notify();
  });
  ASSERT_TRUE(hang->AwaitStarted(1));
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(100)));

  scorer->Shutdown();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  caller.join();
  ASSERT_TRUE(scores.ok());
  ASSERT_EQ(scores->items.size(), 4u);
  for (const ItemScore& item : scores->items) {
    EXPECT_EQ(item.outcome.error_kind, VerifierErrorKind::kUnavailable) << item.item_id;
    EXPECT_TRUE(item.outcome.retryable);
    EXPECT_EQ(item.outcome.reward, 0.0);
  }
  EXPECT_THAT(scores->items[0].outcome.detail, HasSubstr("shut down while verifying"));
  EXPECT_THAT(scores->items[1].outcome.detail, HasSubstr("shutting down"));

  absl::StatusOr<BatchScores> later = scorer->ScoreBatch(MathItems(1), {});
  EXPECT_EQ(later.status().code(), absl::StatusCode::kUnavailable);

  // Destroying the scorer with a worker still inside a verifier returns at
  // once; the thread finishes on its own.
  scorer.reset();
  hang->Release();
  EXPECT_TRUE(hang->AwaitFinished(1));
}

TEST(ScorerTest, ConcurrentBatchesFromManyThreadsAllComplete) {
  auto scorer = MakeScorer(Registry(), {.num_workers = 2});
  constexpr int kThreads = 8;
  constexpr int kBatches = 25;
  constexpr int kItems = 40;
  std::atomic<int> correct{0};
  std::atomic<int> results{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int b = 0; b < kBatches; ++b) {
        const std::string prefix = absl::StrCat("t", t, "b", b, "-");
        absl::StatusOr<BatchScores> scores = scorer->ScoreBatch(MathItems(kItems, prefix), {});
        if (!scores.ok()) continue;
        for (int i = 0; i < static_cast<int>(scores->items.size()); ++i) {
          const ItemScore& item = scores->items[i];
          ++results;
          if (item.item_id == absl::StrCat(prefix, i) &&
              item.outcome.error_kind == VerifierErrorKind::kNone &&
              item.outcome.reward == (i % 3 == 0 ? 0.0 : 1.0)) {
            ++correct;
          }
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(results.load(), kThreads * kBatches * kItems);
  EXPECT_EQ(correct.load(), kThreads * kBatches * kItems);
}

// Throughput of whole batches through the pool (queue, locks, threads
// included); a figure for the log, not an assertion.
TEST(ScorerTest, ReportsBatchThroughput) {
  for (int workers : {1, 2}) {
    auto scorer = MakeScorer(Registry(), {.num_workers = workers});
    constexpr int kBatches = 20;
    constexpr int kItems = 4096;
    int scored = 0;
    const absl::Time start = absl::Now();
    for (int b = 0; b < kBatches; ++b) {
      absl::StatusOr<BatchScores> scores = scorer->ScoreBatch(MathItems(kItems), {});
      ASSERT_TRUE(scores.ok());
      scored += static_cast<int>(scores->items.size());
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("scorer: %.0f items/s with %d worker(s) (%d batches of %d math items, %.3f s)\n",
                scored / seconds, workers, kBatches, kItems, seconds);
    EXPECT_EQ(scored, kBatches * kItems);
  }
}

}  // namespace
}  // namespace sluice::reward_server
