#include "reward_server/reward_server_service.h"

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/scorer.h"

namespace sluice::reward_server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The real service on an in-process channel.
class RewardServiceTest : public ::testing::Test {
 protected:
  void Start(RewardServiceOptions options = {}) {
    absl::StatusOr<VerifierRegistry> registry = MakeBuiltinVerifierRegistry();
    ASSERT_TRUE(registry.ok());
    absl::StatusOr<std::unique_ptr<Scorer>> scorer = Scorer::Create(
        std::make_shared<const VerifierRegistry>(*std::move(registry)), ScorerOptions{});
    ASSERT_TRUE(scorer.ok());
    scorer_ = *std::move(scorer);
    service_ = std::make_unique<RewardServerServiceImpl>(scorer_, metrics_, options);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::RewardService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  grpc::Status Score(const v1::ScoreBatchRequest& request, v1::ScoreBatchResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->ScoreBatch(&context, request, response);
  }

  std::string Metrics() const { return prometheus::TextSerializer().Serialize(metrics_.Collect()); }

  static void AddItem(v1::ScoreBatchRequest* request, const std::string& id,
                      const std::string& verifier, const std::string& response,
                      const std::string& reference) {
    v1::ScoreItem* item = request->add_items();
    item->set_item_id(id);
    item->set_verifier(verifier);
    item->set_response(response);
    item->set_reference_answer(reference);
  }

  prometheus::Registry metrics_;
  std::shared_ptr<Scorer> scorer_;
  std::unique_ptr<RewardServerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::RewardService::Stub> stub_;
};

TEST_F(RewardServiceTest, ScoreBatchScoresArithmeticAnswers) {
  Start();
  v1::ScoreBatchRequest request;
  AddItem(&request, "g0/0", "math", "52", "52");
  AddItem(&request, "g0/1", "math", "53", "52");
  AddItem(&request, "g0/2", "math", "-5", "-5");
  AddItem(&request, "g0/3", "math", "", "-5");
  v1::ScoreBatchResponse response;
  const grpc::Status status = Score(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.results_size(), 4);
  const std::vector<double> rewards = {1, 0, 1, 0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(response.results(i).item_id(), request.items(i).item_id());
    EXPECT_EQ(response.results(i).result().reward(), rewards[i]) << i;
    EXPECT_EQ(response.results(i).result().verifier_name(), "math");
  }
  EXPECT_EQ(response.results(0).result().error_kind(), v1::VERIFIER_ERROR_NONE);
  EXPECT_EQ(response.results(0).result().extracted_answer(), "52");
  EXPECT_EQ(response.results(1).result().error_kind(), v1::VERIFIER_ERROR_NONE);
  EXPECT_EQ(response.results(1).result().extracted_answer(), "53");
  EXPECT_EQ(response.results(3).result().error_kind(), v1::VERIFIER_ERROR_PARSE);
  EXPECT_FALSE(response.results(3).result().retryable());
  EXPECT_GE(response.duration_ms(), 0);

  const std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_batches_total 1"));
  EXPECT_THAT(metrics,
              HasSubstr("sluice_reward_items_total{error_kind=\"none\",verifier=\"math\"} 3"));
  EXPECT_THAT(metrics,
              HasSubstr("sluice_reward_items_total{error_kind=\"parse\",verifier=\"math\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_item_seconds_count{verifier=\"math\"} 4"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_mean{verifier=\"math\"} 0.5"));
}

TEST_F(RewardServiceTest, ScorerGaugesReadTheScorerWhenUpdated) {
  Start();
  service_->UpdateScorerGauges();
  std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_queued_items 0"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_busy_workers 0"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_abandoned_workers 0"));
  RewardMetrics direct(metrics_);  // A second set on the same registry is the same families.
  direct.RecordScorerStats(Scorer::Stats{.workers = 4, .busy_workers = 3, .abandoned_workers = 1,
                                         .queued_jobs = 17});
  metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_queued_items 17"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_busy_workers 3"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_abandoned_workers 1"));
}

TEST_F(RewardServiceTest, EmptyBatchIsOk) {
  Start();
  v1::ScoreBatchResponse response;
  ASSERT_TRUE(Score(v1::ScoreBatchRequest(), &response).ok());
  EXPECT_EQ(response.results_size(), 0);
}

TEST_F(RewardServiceTest, UnknownVerifierIsAnItemResultNotAnRpcError) {
  Start();
  v1::ScoreBatchRequest request;
  AddItem(&request, "a", "astrology", "52", "52");
  AddItem(&request, "b", "exact_match", "yes", "yes");
  v1::ScoreBatchResponse response;
  ASSERT_TRUE(Score(request, &response).ok());
  const v1::VerifierResult& unknown = response.results(0).result();
  EXPECT_EQ(unknown.error_kind(), v1::VERIFIER_ERROR_UNKNOWN_VERIFIER);
  EXPECT_EQ(unknown.reward(), 0);
  EXPECT_THAT(unknown.detail(), HasSubstr("astrology"));
  EXPECT_EQ(response.results(1).result().reward(), 1);
  // A client-chosen name never becomes a metrics label.
  EXPECT_THAT(Metrics(), HasSubstr("error_kind=\"unknown_verifier\",verifier=\"unknown\"} 1"));
  EXPECT_THAT(Metrics(), ::testing::Not(HasSubstr("astrology")));
}

TEST_F(RewardServiceTest, MissingItemIdIsInvalidArgumentNamingTheIndex) {
  Start();
  v1::ScoreBatchRequest request;
  AddItem(&request, "a", "math", "1", "1");
  AddItem(&request, "", "math", "1", "1");
  v1::ScoreBatchResponse response;
  const grpc::Status status = Score(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "items[1].item_id: must not be empty");
}

TEST_F(RewardServiceTest, TooManyItemsIsInvalidArgument) {
  Start({.max_batch_items = 2});
  v1::ScoreBatchRequest request;
  for (int i = 0; i < 3; ++i) AddItem(&request, std::to_string(i), "math", "1", "1");
  v1::ScoreBatchResponse response;
  const grpc::Status status = Score(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("at most 2 items per batch, got 3"));
}

TEST_F(RewardServiceTest, CompositionIsAppliedAndReported) {
  Start();
  v1::ScoreBatchRequest request;
  AddItem(&request, "a", "", "The answer is 52.", "52");
  v1::WeightedVerifier* math = request.add_composition();
  math->set_name("math");
  math->set_weight(3);
  request.add_composition()->set_name("exact_match");  // weight 0 = 1.0
  v1::ScoreBatchResponse response;
  ASSERT_TRUE(Score(request, &response).ok());
  const v1::VerifierResult& result = response.results(0).result();
  EXPECT_EQ(result.verifier_name(), "composite");
  EXPECT_EQ(result.error_kind(), v1::VERIFIER_ERROR_NONE);
  EXPECT_DOUBLE_EQ(result.reward(), 0.75);
  ASSERT_EQ(result.components_size(), 2);
  EXPECT_EQ(result.components(0).verifier_name(), "math");
  EXPECT_EQ(result.components(0).weight(), 3);
  EXPECT_EQ(result.components(0).reward(), 1);
  EXPECT_EQ(result.components(1).verifier_name(), "exact_match");
  EXPECT_EQ(result.components(1).weight(), 1);
  EXPECT_EQ(result.components(1).reward(), 0);

  request.mutable_composition(0)->set_weight(-1);
  const grpc::Status status = Score(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("composition[0].weight"));
}

TEST_F(RewardServiceTest, ExtremeTimeoutsAreClampedOrRejectedPerItem) {
  Start();
  v1::ScoreBatchRequest request;
  AddItem(&request, "huge", "math", "1", "1");
  request.mutable_items(0)->set_timeout_ms(std::numeric_limits<int64_t>::max());
  AddItem(&request, "negative", "math", "1", "1");
  request.mutable_items(1)->set_timeout_ms(-5);
  v1::ScoreBatchResponse response;
  ASSERT_TRUE(Score(request, &response).ok());
  EXPECT_EQ(response.results(0).result().error_kind(), v1::VERIFIER_ERROR_NONE);
  EXPECT_EQ(response.results(0).result().reward(), 1);
  EXPECT_EQ(response.results(1).result().error_kind(), v1::VERIFIER_ERROR_INVALID_INPUT);
}

TEST_F(RewardServiceTest, ListVerifiersDescribesEachVerifierSortedByName) {
  Start();
  grpc::ClientContext context;
  v1::ListVerifiersResponse response;
  ASSERT_TRUE(stub_->ListVerifiers(&context, v1::ListVerifiersRequest(), &response).ok());
  std::vector<std::string> names;
  for (const v1::VerifierInfo& info : response.verifiers()) names.push_back(info.name());
  EXPECT_THAT(names, ElementsAre("code", "exact_match", "format", "length", "math"));
  const v1::VerifierInfo& math = response.verifiers(4);
  EXPECT_EQ(math.default_timeout_ms(), 5000);
  EXPECT_EQ(math.max_timeout_ms(), 60000);
  EXPECT_THAT(math.required_fields(), ElementsAre("reference_answer"));
  EXPECT_FALSE(math.description().empty());
  const v1::VerifierInfo& code = response.verifiers(0);
  EXPECT_EQ(code.default_timeout_ms(), 10000);
  EXPECT_THAT(code.required_fields(), ElementsAre("test", "entry_point"));
}

// The controller counts reward server restarts by this: the start time of
// the serving process, the same in every answer.
TEST_F(RewardServiceTest, ListVerifiersAnswersTheIncarnationOfThisStart) {
  const int64_t before = absl::ToUnixNanos(absl::Now());
  Start();
  const int64_t after = absl::ToUnixNanos(absl::Now());
  std::vector<uint64_t> incarnations;
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    v1::ListVerifiersResponse response;
    ASSERT_TRUE(stub_->ListVerifiers(&context, v1::ListVerifiersRequest(), &response).ok());
    incarnations.push_back(response.incarnation());
  }
  EXPECT_GE(incarnations[0], static_cast<uint64_t>(before));
  EXPECT_LE(incarnations[0], static_cast<uint64_t>(after));
  EXPECT_EQ(incarnations[1], incarnations[0]);
}

// Math, code (passing, hanging, exiting early) and a composition with run
// params in one batch through the real service: the hanging program is a
// timeout at its own deadline and the others are unaffected.
TEST_F(RewardServiceTest, OneBatchOfEveryVerifierKind) {
  Start();
  v1::ScoreBatchRequest request;
  AddItem(&request, "latex", "math", "so the answer is $\\boxed{\\dfrac{2}{4}}$", "0.5");
  AddItem(&request, "symbolic", "math", "\\boxed{(x+1)^2}", "x^2+2x+1");
  const auto code = [&request](const std::string& id, const std::string& body,
                               int64_t timeout_ms) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id(id);
    item->set_verifier("code");
    item->set_prompt("def add(a, b):\n");
    item->set_response(body);
    item->set_test("def check(candidate):\n    assert candidate(2, 3) == 5\n");
    item->set_entry_point("add");
    item->set_timeout_ms(timeout_ms);
  };
  code("pass", "    return a + b\n", 0);
  code("hang", "    while True:\n        pass\n", 1500);
  code("early_exit", "    import sys\n    sys.exit(0)\n", 0);
  v1::ScoreItem* composed = request.add_items();
  composed->set_item_id("composed");
  composed->set_response("<think>3+4</think> \\boxed{7}");
  composed->set_reference_answer("7");
  v1::WeightedVerifier* math = request.add_composition();
  math->set_name("math");
  math->set_weight(1);
  v1::WeightedVerifier* format = request.add_composition();
  format->set_name("format");
  format->set_weight(1);
  (*format->mutable_params())["format"] = "think_answer";

  v1::ScoreBatchResponse response;
  ASSERT_TRUE(Score(request, &response).ok());
  ASSERT_EQ(response.results_size(), 6);
  std::map<std::string, v1::VerifierResult> by_id;
  for (const auto& result : response.results()) by_id[result.item_id()] = result.result();
  EXPECT_EQ(by_id["latex"].reward(), 1.0) << by_id["latex"].detail();
  EXPECT_EQ(by_id["symbolic"].reward(), 1.0) << by_id["symbolic"].detail();
  EXPECT_EQ(by_id["pass"].reward(), 1.0) << by_id["pass"].detail();
  EXPECT_EQ(by_id["pass"].tests_passed(), 1);
  EXPECT_EQ(by_id["hang"].error_kind(), v1::VERIFIER_ERROR_TIMEOUT);
  EXPECT_EQ(by_id["hang"].reward(), 0.0);
  EXPECT_EQ(by_id["early_exit"].reward(), 0.0);
  EXPECT_EQ(by_id["early_exit"].error_kind(), v1::VERIFIER_ERROR_NONE);
  EXPECT_EQ(by_id["composed"].reward(), 1.0);
  ASSERT_EQ(by_id["composed"].components_size(), 2);
  EXPECT_EQ(by_id["composed"].components(1).verifier_name(), "format");
  EXPECT_THAT(Metrics(), HasSubstr("error_kind=\"timeout\",verifier=\"code\""));
}

TEST_F(RewardServiceTest, AfterScorerShutdownScoreBatchIsUnavailable) {
  Start();
  scorer_->Shutdown();
  v1::ScoreBatchRequest request;
  AddItem(&request, "a", "math", "1", "1");
  v1::ScoreBatchResponse response;
  EXPECT_EQ(Score(request, &response).error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace sluice::reward_server
