#include "services/clients/score_batches.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/reward_server_service.h"
#include "reward_server/scorer.h"
#include "services/clients/grpc_clients.h"
#include "services/clients/retrier.h"

namespace sluice::clients {
namespace {

using ::testing::HasSubstr;

// Answers like the reward server (INVALID_ARGUMENT past `limit` items),
// failing the calls listed in `fail_calls` with `failure`.
class FakeReward : public RewardClient {
 public:
  explicit FakeReward(int limit) : limit_(limit) {}
  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration) override {
    absl::MutexLock lock(&mu);
    const int call = static_cast<int>(batch_sizes.size());
    batch_sizes.push_back(request.items_size());
    compositions.push_back(request.composition_size());
    if (request.items_size() > limit_) {
      return absl::InvalidArgumentError(absl::StrCat("items: at most ", limit_,
                                                     " items per batch, got ",
                                                     request.items_size(), "; split the batch"));
    }
    for (int failing : fail_calls) {
      if (failing == call) return failure;
    }
    v1::ScoreBatchResponse response;
    for (const v1::ScoreItem& item : request.items()) {
      v1::ScoreResult* result = response.add_results();
      result->set_item_id(item.item_id());
      result->mutable_result()->set_reward(item.response() == item.reference_answer() ? 1 : 0);
    }
    return response;
  }

  absl::Mutex mu;
  std::vector<int> batch_sizes ABSL_GUARDED_BY(mu);
  std::vector<int> compositions ABSL_GUARDED_BY(mu);
  std::vector<int> fail_calls ABSL_GUARDED_BY(mu);
  absl::Status failure ABSL_GUARDED_BY(mu) = absl::UnavailableError("reward server restarting");

 private:
  const int limit_;
};

v1::ScoreBatchRequest Items(int n) {
  v1::ScoreBatchRequest request;
  request.add_composition()->set_name("exact_match");
  for (int i = 0; i < n; ++i) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id(absl::StrCat(i));
    item->set_verifier("exact_match");
    item->set_response(absl::StrCat(i % 3));
    item->set_reference_answer("0");
  }
  return request;
}

void ExpectResultsInOrder(const v1::ScoreBatchResponse& response, int n) {
  ASSERT_EQ(response.results_size(), n);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(response.results(i).item_id(), absl::StrCat(i));
    EXPECT_EQ(response.results(i).result().reward(), i % 3 == 0 ? 1 : 0) << i;
  }
}

// group_size 64 x batch_size_groups 256 = 16,384 items, four times the
// reward server's limit: they go in four calls, each within it.
TEST(ScoreInBatchesTest, SplitsWhatTheServerWouldRefuseAndKeepsTheOrder) {
  FakeReward reward(kDefaultMaxBatchItems);
  absl::StatusOr<v1::ScoreBatchResponse> scored = ScoreInBatches(reward, Items(16384));
  ASSERT_TRUE(scored.ok()) << scored.status();
  ExpectResultsInOrder(*scored, 16384);
  absl::MutexLock lock(&reward.mu);
  EXPECT_EQ(reward.batch_sizes, std::vector<int>({4096, 4096, 4096, 4096}));
  EXPECT_EQ(reward.compositions, std::vector<int>({1, 1, 1, 1}));
}

TEST(ScoreInBatchesTest, ABatchWithinTheLimitIsOneCall) {
  FakeReward reward(10);
  absl::StatusOr<v1::ScoreBatchResponse> scored =
      ScoreInBatches(reward, Items(10), {.max_items = 10});
  ASSERT_TRUE(scored.ok()) << scored.status();
  ExpectResultsInOrder(*scored, 10);
  absl::MutexLock lock(&reward.mu);
  EXPECT_EQ(reward.batch_sizes, std::vector<int>({10}));
}

TEST(ScoreInBatchesTest, AFailedBatchIsRepeatedThenNamedInTheError) {
  FakeReward reward(4);
  {
    absl::MutexLock lock(&reward.mu);
    reward.fail_calls = {1};  // the second batch's first call
  }
  std::vector<int> retries;
  ScoreBatchesOptions options{.max_items = 4, .attempts = 2};
  options.before_call = [&](int retry) {
    retries.push_back(retry);
    return true;
  };
  absl::StatusOr<v1::ScoreBatchResponse> scored = ScoreInBatches(reward, Items(10), options);
  ASSERT_TRUE(scored.ok()) << scored.status();
  ExpectResultsInOrder(*scored, 10);
  EXPECT_EQ(retries, std::vector<int>({0, 1, 0}));  // batch 2, its repeat, batch 3

  {
    absl::MutexLock lock(&reward.mu);
    reward.batch_sizes.clear();
    reward.fail_calls = {1, 2};
  }
  scored = ScoreInBatches(reward, Items(10), options);
  EXPECT_EQ(scored.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(scored.status().message()), HasSubstr("items [4, 8) of 10"));
}

// A rollout worker ends its run on a give-up of the retrying client
// (IsRetriesExhausted) but not on an ordinary failure: naming the batch must
// not drop the mark.
TEST(ScoreInBatchesTest, AFailedLaterBatchKeepsTheRetriesExhaustedMark) {
  FakeReward reward(4);
  {
    absl::MutexLock lock(&reward.mu);
    reward.fail_calls = {1};
    reward.failure = MarkRetriesExhausted(absl::UnavailableError("reward_server unreachable"));
  }
  absl::StatusOr<v1::ScoreBatchResponse> scored =
      ScoreInBatches(reward, Items(10), {.max_items = 4});
  EXPECT_EQ(scored.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsRetriesExhausted(scored.status()));
  EXPECT_EQ(scored.status().message(), "items [4, 8) of 10: reward_server unreachable");
}

TEST(ScoreInBatchesTest, AStopIsSeenBetweenBatches) {
  FakeReward reward(4);
  int calls = 0;
  ScoreBatchesOptions options{.max_items = 4};
  options.before_call = [&](int) { return ++calls < 2; };  // stop before the third batch
  absl::StatusOr<v1::ScoreBatchResponse> scored = ScoreInBatches(reward, Items(12), options);
  EXPECT_EQ(scored.status().code(), absl::StatusCode::kCancelled);
  absl::MutexLock lock(&reward.mu);
  EXPECT_EQ(reward.batch_sizes, std::vector<int>({4, 4}));
}

// The bug as found: the real reward service refuses 16,384 items in one
// ScoreBatch; ScoreInBatches over a gRPC client scores them all.
TEST(ScoreInBatchesTest, TheRealRewardServerScoresSixteenThousandItemsInBatches) {
  absl::StatusOr<reward_server::VerifierRegistry> registry =
      reward_server::MakeBuiltinVerifierRegistry();
  ASSERT_TRUE(registry.ok());
  absl::StatusOr<std::unique_ptr<reward_server::Scorer>> scorer = reward_server::Scorer::Create(
      std::make_shared<const reward_server::VerifierRegistry>(*std::move(registry)),
      reward_server::ScorerOptions{});
  ASSERT_TRUE(scorer.ok());
  std::shared_ptr<reward_server::Scorer> shared = *std::move(scorer);
  prometheus::Registry metrics;
  reward_server::RewardServerServiceImpl service(shared, metrics);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<RewardClient> reward = NewGrpcRewardClient(absl::StrCat("127.0.0.1:", port));

  const v1::ScoreBatchRequest request = Items(16384);
  absl::StatusOr<v1::ScoreBatchResponse> whole = reward->ScoreBatch(request, absl::Seconds(60));
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(whole.status().message()), HasSubstr("at most 4096 items per batch"));

  absl::StatusOr<v1::ScoreBatchResponse> scored = ScoreInBatches(*reward, request);
  ASSERT_TRUE(scored.ok()) << scored.status();
  ExpectResultsInOrder(*scored, 16384);
  server->Shutdown();
  shared->Shutdown();
}

}  // namespace
}  // namespace sluice::clients
