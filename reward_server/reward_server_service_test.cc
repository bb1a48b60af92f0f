#include "reward_server/reward_server_service.h"

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/code_verifier.h"
#include "reward_server/sandbox_admission.h"
#include "reward_server/scorer.h"
#include "services/runtime/grpc_status.h"

namespace sluice::reward_server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The real service on an in-process channel.
class RewardServiceTest : public ::testing::Test {
 protected:
  void Start(RewardServiceOptions options = {}, BuiltinVerifierOptions verifiers = {}) {
    absl::StatusOr<VerifierRegistry> registry = MakeBuiltinVerifierRegistry(verifiers);
    ASSERT_TRUE(registry.ok());
    absl::StatusOr<std::unique_ptr<Scorer>> scorer = Scorer::Create(
        std::make_shared<const VerifierRegistry>(*std::move(registry)), ScorerOptions{});
    ASSERT_TRUE(scorer.ok());
    scorer_ = *std::move(scorer);
    service_ = std::make_unique<RewardServerServiceImpl>(scorer_, metrics_, options,
                                                         FindSandboxPool(scorer_->registry()));
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::RewardService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  grpc::Status Score(const v1::ScoreBatchRequest& request, v1::ScoreBatchResponse* response,
                     std::string* retry_pushback = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status status = stub_->ScoreBatch(&context, request, response);
    if (retry_pushback != nullptr) {
      const auto& trailers = context.GetServerTrailingMetadata();
      auto it = trailers.find(std::string(runtime::kRetryPushbackMetadataKey));
      *retry_pushback = it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
    }
    return status;
  }

  static void AddCodeItem(v1::ScoreBatchRequest* request, const std::string& id,
                          const std::string& body) {
    v1::ScoreItem* item = request->add_items();
    item->set_item_id(id);
    item->set_verifier("code");
    item->set_response(absl::StrCat("def f():\n", body));
    item->set_test("def check(candidate):\n    candidate()\n");
    item->set_entry_point("f");
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

TEST(SandboxAdmissionTest, AdmitsUpToCapacityThenRefusesWithAHint) {
  SandboxAdmissionOptions options;
  options.slots = 2;
  options.max_queued = 3;
  SandboxAdmission admission(options, [] { return absl::Milliseconds(400); });
  EXPECT_TRUE(admission.TryAdmit(4).ok());
  EXPECT_TRUE(admission.TryAdmit(1).ok());  // 5 = slots + max_queued.
  const absl::Status refused = admission.TryAdmit(1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  // 5 admitted over 2 slots at 400 ms each: about 1 s of waiting.
  ASSERT_TRUE(RetryAfter(refused).has_value());
  EXPECT_EQ(*RetryAfter(refused), absl::Milliseconds(1000));
  EXPECT_THAT(refused.message(), HasSubstr("retry after 1000 ms"));
  EXPECT_EQ(admission.refused(), 1u);
  admission.Release(5);
  EXPECT_EQ(admission.admitted(), 0);
  // An idle server takes a batch of any size; nothing else fits beside it.
  EXPECT_TRUE(admission.TryAdmit(50).ok());
  EXPECT_FALSE(admission.TryAdmit(1).ok());
  EXPECT_TRUE(admission.TryAdmit(0).ok());
}

TEST(SandboxAdmissionTest, HintStaysWithinItsBounds) {
  SandboxAdmissionOptions options;
  options.slots = 1;
  options.max_queued = 0;
  options.max_retry_after = absl::Seconds(2);
  SandboxAdmission slow(options, [] { return absl::Seconds(10); });
  ASSERT_TRUE(slow.TryAdmit(1).ok());
  EXPECT_EQ(*RetryAfter(slow.TryAdmit(1)), absl::Seconds(2));
  SandboxAdmission unknown(options);  // No run yet: 100 ms per program.
  ASSERT_TRUE(unknown.TryAdmit(1).ok());
  EXPECT_EQ(*RetryAfter(unknown.TryAdmit(1)), absl::Milliseconds(100));
}

TEST(SandboxAdmissionTest, CountsTheProgramsABatchRuns) {
  std::vector<ScoreItem> items(4);
  items[0].verifier = "code";
  items[1].verifier = "math";
  items[2].verifier = "";
  items[3].verifier = "";
  EXPECT_EQ(CountSandboxedPrograms(items, {}), 1);
  EXPECT_EQ(CountSandboxedPrograms(items, {{"math", 1.0, {}}, {"code", 1.0, {}}}), 3);
}

// A full sandbox backlog refuses the next batch at once, with when to come
// back, instead of leaving it to time out; the pool shows in /metrics.
TEST_F(RewardServiceTest, FullSandboxAnswersResourceExhaustedWithARetryHint) {
  RewardServiceOptions options;
  options.sandbox_max_queued = 0;
  BuiltinVerifierOptions verifiers;
  verifiers.code.sandbox_slots = 1;
  Start(options, verifiers);
  v1::ScoreBatchRequest slow;
  AddCodeItem(&slow, "slow", "    import time\n    time.sleep(3)\n");
  std::thread busy([&] {
    v1::ScoreBatchResponse response;
    const grpc::Status status = Score(slow, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.results_size(), 1);
    EXPECT_EQ(response.results(0).result().reward(), 1.0);
  });
  // Its program holds the only slot (however long that took here), and for
  // seconds after: the next batch is refused while it does.
  const auto pool = FindSandboxPool(scorer_->registry());
  EXPECT_NE(pool, nullptr);
  if (pool != nullptr) {
    EXPECT_TRUE(pool->AwaitBusy(1, absl::Seconds(60)));
  }
  v1::ScoreBatchRequest next;
  AddCodeItem(&next, "next", "    pass\n");
  AddItem(&next, "math", "math", "1", "1");
  v1::ScoreBatchResponse response;
  std::string pushback;
  const grpc::Status refused = Score(next, &response, &pushback);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("retry after"));
  int64_t pushback_ms = 0;
  EXPECT_TRUE(absl::SimpleAtoi(pushback, &pushback_ms)) << pushback;
  EXPECT_GE(pushback_ms, 100);
  // A batch without code passes meanwhile.
  v1::ScoreBatchRequest math_only;
  AddItem(&math_only, "m", "math", "2", "2");
  EXPECT_TRUE(Score(math_only, &response).ok());
  busy.join();
  // Once the slow batch is done, the same batch is admitted.
  const grpc::Status later = Score(next, &response);
  EXPECT_TRUE(later.ok()) << later.error_message();
  service_->UpdateScorerGauges();
  const std::string metrics = Metrics();
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_refused_batches_total{reason=\"sandbox_full\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_sandbox_slots{state=\"idle\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_sandbox_runs_total 2"));
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_sandbox_admitted_programs 0"));
}

TEST_F(RewardServiceTest, KilledAndRecycledSlotsAreCounted) {
  BuiltinVerifierOptions verifiers;
  verifiers.code.sandbox_slots = 1;
  Start({}, verifiers);
  v1::ScoreBatchRequest request;
  AddCodeItem(&request, "loop", "    while True:\n        pass\n");
  request.mutable_items(0)->set_timeout_ms(1000);
  AddCodeItem(&request, "ipc",
              "    import ctypes\n    ctypes.CDLL(None).shmget(0, 4096, 0o1600)\n");
  v1::ScoreBatchResponse response;
  ASSERT_TRUE(Score(request, &response).ok());
  service_->UpdateScorerGauges();
  const std::string metrics = Metrics();
  EXPECT_THAT(metrics,
              HasSubstr("sluice_reward_sandbox_slots_recycled_total{reason=\"dirty\"} 1"));
  // The loop dies by the deadline (slot killed) or, first, by SIGXCPU.
  EXPECT_THAT(metrics, HasSubstr("sluice_reward_sandbox_slots_started_total"));
}

}  // namespace
}  // namespace sluice::reward_server
