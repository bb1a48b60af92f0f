#include "services/clients/retrying_clients.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/reward_server_service.h"
#include "reward_server/scorer.h"
#include "services/clients/grpc_clients.h"
#include "services/clients/retry_metrics.h"
#include "services/runtime/grpc_status.h"
#include "sluice/v1/reward_server.grpc.pb.h"

namespace sluice::clients {
namespace {

using ::testing::HasSubstr;

// What the fakes answer: the next `failures` calls (of any method) fail with
// `code`, later ones succeed. Counts calls per method.
class Script {
 public:
  void FailNext(absl::StatusCode code, int failures) {
    absl::MutexLock lock(&mu_);
    code_ = code;
    failures_ = failures;
  }
  absl::Status Next(const std::string& method) {
    absl::MutexLock lock(&mu_);
    ++calls_[method];
    if (failures_ > 0) {
      --failures_;
      return absl::Status(code_, absl::StrCat(method, " failed as scripted"));
    }
    return absl::OkStatus();
  }
  int calls(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  absl::StatusCode code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
};

// Each method answers per the script: the scripted error, or an empty OK
// response.
template <typename Response>
absl::StatusOr<Response> Answer(Script& script, const std::string& method) {
  if (absl::Status status = script.Next(method); !status.ok()) return status;
  return Response();
}

class ScriptedReward : public RewardClient {
 public:
  explicit ScriptedReward(Script& script) : script_(script) {}
  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest&,
                                                    absl::Duration) override {
    return Answer<v1::ScoreBatchResponse>(script_, "ScoreBatch");
  }

 private:
  Script& script_;
};

class ScriptedBuffer : public ReplayBufferClient {
 public:
  explicit ScriptedBuffer(Script& script) : script_(script) {}
  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest&) override {
    return Answer<v1::AcquireGenerationSlotsResponse>(script_, "AcquireGenerationSlots");
  }
  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest&) override {
    return Answer<v1::ReleaseGenerationSlotsResponse>(script_, "ReleaseGenerationSlots");
  }
  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(const v1::InsertGroupsRequest&) override {
    return Answer<v1::InsertGroupsResponse>(script_, "InsertGroups");
  }
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest&) override {
    if (cancelled.load()) {
      script_.Next("Sample").IgnoreError();  // counted; cancelled either way
      return absl::CancelledError("sampling cancelled");
    }
    return Answer<v1::SampleResponse>(script_, "Sample");
  }
  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest&) override {
    return Answer<v1::UpdatePolicyVersionResponse>(script_, "UpdatePolicyVersion");
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest&) override {
    return Answer<v1::GetStatsResponse>(script_, "GetStats");
  }
  absl::StatusOr<v1::CommitTrainedStepsResponse> CommitTrainedSteps(
      const v1::CommitTrainedStepsRequest&) override {
    return Answer<v1::CommitTrainedStepsResponse>(script_, "CommitTrainedSteps");
  }
  void CancelSample() override { cancelled.store(true); }

  std::atomic<bool> cancelled{false};

 private:
  Script& script_;
};

class ScriptedController : public ControllerClient {
 public:
  explicit ScriptedController(Script& script) : script_(script) {}
  absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(const v1::LeasePromptsRequest&) override {
    return Answer<v1::LeasePromptsResponse>(script_, "LeasePrompts");
  }
  absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest&) override {
    return Answer<v1::ReportRolloutProgressResponse>(script_, "ReportRolloutProgress");
  }
  absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest&) override {
    return Answer<v1::ReportTrainerProgressResponse>(script_, "ReportTrainerProgress");
  }

 private:
  Script& script_;
};

class ScriptedTrainer : public TrainerClient {
 public:
  explicit ScriptedTrainer(Script& script) : script_(script) {}
  absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string&) override {
    return Answer<v1::PolicyVersionInfo>(script_, "GetLatestVersion");
  }
  absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string&, int64_t,
                                                            absl::Duration) override {
    return Answer<v1::PolicyVersionInfo>(script_, "WaitForVersionAfter");
  }
  absl::StatusOr<FetchedWeights> FetchWeights(const std::string&, int64_t) override {
    return Answer<FetchedWeights>(script_, "FetchWeights");
  }

 private:
  Script& script_;
};

RetryOptions FastOptions() {
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(4);
  options.deadline = absl::Minutes(1);
  return options;
}

// Every fake behind its decorator, sharing one script.
struct Decorated {
  explicit Decorated(RetryOptions options = FastOptions())
      : reward(std::make_unique<ScriptedReward>(script), options),
        buffer_fake(new ScriptedBuffer(script)),
        buffer(std::unique_ptr<ReplayBufferClient>(buffer_fake), options),
        controller(std::make_unique<ScriptedController>(script), options),
        trainer(std::make_unique<ScriptedTrainer>(script), options) {}
  Script script;
  RetryingRewardClient reward;
  ScriptedBuffer* buffer_fake;  // owned by `buffer`
  RetryingReplayBufferClient buffer;
  RetryingControllerClient controller;
  RetryingTrainerClient trainer;
};

// One row of the table in retrying_clients.h.
struct MethodCase {
  std::string name;  // the fake's method name
  std::string label;
  std::function<absl::Status(Decorated&)> call;
  bool retries_unavailable;
  bool retries_ambiguous;
};

void PrintTo(const MethodCase& c, std::ostream* os) { *os << c.label; }

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

std::vector<MethodCase> Table() {
  v1::SampleRequest with_step;
  with_step.set_step(3);
  return {
      {"ScoreBatch", "ScoreBatch",
       [](Decorated& d) { return StatusOf(d.reward.ScoreBatch({}, absl::Seconds(1))); }, true,
       true},
      {"AcquireGenerationSlots", "AcquireGenerationSlots",
       [](Decorated& d) { return StatusOf(d.buffer.AcquireGenerationSlots({})); }, true, false},
      {"ReleaseGenerationSlots", "ReleaseGenerationSlots",
       [](Decorated& d) { return StatusOf(d.buffer.ReleaseGenerationSlots({})); }, true, true},
      {"InsertGroups", "InsertGroups",
       [](Decorated& d) { return StatusOf(d.buffer.InsertGroups({})); }, false, false},
      {"Sample", "SampleWithoutStep", [](Decorated& d) { return StatusOf(d.buffer.Sample({})); },
       true, false},
      {"Sample", "SampleWithStep",
       [with_step](Decorated& d) { return StatusOf(d.buffer.Sample(with_step)); }, true, true},
      {"UpdatePolicyVersion", "UpdatePolicyVersion",
       [](Decorated& d) { return StatusOf(d.buffer.UpdatePolicyVersion({})); }, true, true},
      {"GetStats", "GetStats", [](Decorated& d) { return StatusOf(d.buffer.GetStats({})); }, true,
       true},
      {"CommitTrainedSteps", "CommitTrainedSteps",
       [](Decorated& d) { return StatusOf(d.buffer.CommitTrainedSteps({})); }, true, true},
      {"LeasePrompts", "LeasePrompts",
       [](Decorated& d) { return StatusOf(d.controller.LeasePrompts({})); }, true, false},
      {"ReportRolloutProgress", "ReportRolloutProgress",
       [](Decorated& d) { return StatusOf(d.controller.ReportRolloutProgress({})); }, true, false},
      {"ReportTrainerProgress", "ReportTrainerProgress",
       [](Decorated& d) { return StatusOf(d.controller.ReportTrainerProgress({})); }, true, false},
      {"GetLatestVersion", "GetLatestVersion",
       [](Decorated& d) { return StatusOf(d.trainer.GetLatestVersion("r")); }, true, true},
      {"WaitForVersionAfter", "WaitForVersionAfter",
       [](Decorated& d) {
         return StatusOf(d.trainer.WaitForVersionAfter("r", 0, absl::Seconds(30)));
       },
       true, false},
      {"FetchWeights", "FetchWeights",
       [](Decorated& d) { return StatusOf(d.trainer.FetchWeights("r", -1)); }, true, true},
  };
}

class RetryTableTest : public ::testing::TestWithParam<MethodCase> {};

TEST_P(RetryTableTest, UnavailableIsRetriedWhereTheTableSays) {
  Decorated d;
  d.script.FailNext(absl::StatusCode::kUnavailable, 2);
  const absl::Status status = GetParam().call(d);
  if (GetParam().retries_unavailable) {
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(d.script.calls(GetParam().name), 3);
  } else {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(d.script.calls(GetParam().name), 1);
  }
}

TEST_P(RetryTableTest, AnAnswerThatMayMeanTheWorkWasDoneIsRetriedOnlyWhereIdempotent) {
  for (absl::StatusCode code : {absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted,
                                absl::StatusCode::kInternal}) {
    Decorated d;
    d.script.FailNext(code, 1);
    const absl::Status status = GetParam().call(d);
    if (GetParam().retries_ambiguous) {
      EXPECT_TRUE(status.ok()) << status;
      EXPECT_EQ(d.script.calls(GetParam().name), 2) << code;
    } else {
      EXPECT_EQ(status.code(), code);
      EXPECT_EQ(d.script.calls(GetParam().name), 1) << code;
    }
  }
}

TEST_P(RetryTableTest, AnErrorNoRetryCuresIsReturnedAtOnce) {
  Decorated d;
  d.script.FailNext(absl::StatusCode::kInvalidArgument, 1);
  EXPECT_EQ(GetParam().call(d).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.script.calls(GetParam().name), 1);
}

INSTANTIATE_TEST_SUITE_P(Methods, RetryTableTest, ::testing::ValuesIn(Table()),
                         [](const auto& info) { return info.param.label; });

TEST(RetryingClientsTest, AGiveUpNamesTheServiceAndIsFinal) {
  RetryOptions options = FastOptions();
  options.deadline = absl::ZeroDuration();
  Decorated d(options);
  d.script.FailNext(absl::StatusCode::kUnavailable, 100);
  const std::map<std::string, absl::Status> errors = {
      {"reward_server", d.reward.ScoreBatch({}, absl::Seconds(1)).status()},
      {"replay_buffer", d.buffer.GetStats({}).status()},
      {"controller", d.controller.LeasePrompts({}).status()},
      {"trainer", d.trainer.FetchWeights("r", -1).status()},
  };
  for (const auto& [service, error] : errors) {
    EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable) << service;
    EXPECT_TRUE(IsRetriesExhausted(error)) << service;
    EXPECT_THAT(std::string(error.message()), HasSubstr(absl::StrCat(service, " unreachable for")));
  }
}

// The follower asks for new versions in short waits: an unreachable trainer
// is retried within the wait, and running out of it is not final.
TEST(RetryingClientsTest, WaitForVersionAfterRetriesOnlyWithinItsTimeout) {
  RetryOptions options = FastOptions();
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(20);
  Decorated d(options);
  d.script.FailNext(absl::StatusCode::kUnavailable, 1000);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::PolicyVersionInfo> version =
      d.trainer.WaitForVersionAfter("r", 0, absl::Milliseconds(200));
  EXPECT_EQ(version.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(IsRetriesExhausted(version.status()));
  EXPECT_GE(d.script.calls("WaitForVersionAfter"), 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));  // not the minute of the options
}

// Two-sided: a Sample in its backoff returns CANCELLED as soon as the trainer
// stops (CancelSample), and no Sample is retried after.
TEST(RetryingClientsTest, CancelSampleEndsASampleBackoffPromptly) {
  RetryOptions options;
  options.initial_backoff = absl::Minutes(5);
  options.max_backoff = absl::Minutes(5);
  Decorated d(options);
  d.script.FailNext(absl::StatusCode::kUnavailable, 1000);
  absl::Notification returned;
  absl::Status status;
  std::thread trainer([&] {
    status = d.buffer.Sample({}).status();
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  d.buffer.CancelSample();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(10)));
  trainer.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(d.buffer_fake->cancelled.load());  // forwarded
  EXPECT_EQ(d.buffer.Sample({}).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(d.script.calls("Sample"), 2);
  // The other methods still retry: only sampling was cancelled.
  d.script.FailNext(absl::StatusCode::kUnavailable, 0);
  EXPECT_TRUE(d.buffer.GetStats({}).ok());
}

TEST(RetryingClientsTest, RetriesAndGiveUpsAreCountedPerServiceInPrometheus) {
  prometheus::Registry registry;
  ClientRetryMetrics metrics(registry);
  RetryOptions options = FastOptions();
  options.observer = metrics.Observer();
  Decorated d(options);
  d.script.FailNext(absl::StatusCode::kUnavailable, 2);
  ASSERT_TRUE(d.reward.ScoreBatch({}, absl::Seconds(1)).ok());
  d.script.FailNext(absl::StatusCode::kUnavailable, 1);
  ASSERT_TRUE(d.controller.ReportRolloutProgress({}).ok());
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("sluice_client_retries_total{service=\"reward_server\"} 2"));
  EXPECT_THAT(text, HasSubstr("sluice_client_retries_total{service=\"controller\"} 1"));
}

// ---- the real reward server, stopped and started again at its address ------

// A reward server on loopback; `port` 0 picks one.
class RewardServer {
 public:
  explicit RewardServer(int port) {
    absl::StatusOr<reward_server::VerifierRegistry> registry =
        reward_server::MakeBuiltinVerifierRegistry();
    EXPECT_TRUE(registry.ok()) << registry.status();
    absl::StatusOr<std::unique_ptr<reward_server::Scorer>> scorer =
        reward_server::Scorer::Create(
            std::make_shared<const reward_server::VerifierRegistry>(*std::move(registry)),
            reward_server::ScorerOptions{});
    EXPECT_TRUE(scorer.ok()) << scorer.status();
    scorer_ = *std::move(scorer);
    service_ = std::make_unique<reward_server::RewardServerServiceImpl>(scorer_, metrics_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
  }
  ~RewardServer() {
    server_->Shutdown();
    scorer_->Shutdown();
  }
  int port() const { return port_; }

 private:
  prometheus::Registry metrics_;
  std::shared_ptr<reward_server::Scorer> scorer_;
  std::unique_ptr<reward_server::RewardServerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

v1::ScoreBatchRequest TwoItems() {
  v1::ScoreBatchRequest request;
  request.add_composition()->set_name("exact_match");
  for (int i = 0; i < 2; ++i) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id(absl::StrCat(i));
    item->set_verifier("exact_match");
    item->set_response(absl::StrCat(i));
    item->set_reference_answer("0");
  }
  return request;
}

// Two-sided: while the reward server is gone the call waits in its retries;
// once it is back at the same address (the gRPC channel reconnects by
// itself) the same call returns the scores.
TEST(RetryingClientsTest, ScoreBatchRidesOutARewardServerRestartAtTheSameAddress) {
  auto server = std::make_unique<RewardServer>(0);
  const int port = server->port();
  ASSERT_GT(port, 0);
  std::atomic<int> retries{0};
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  options.observer = [&](const RetryEvent& event) {
    if (event.kind == RetryEvent::Kind::kRetry) ++retries;
  };
  std::unique_ptr<RewardClient> reward =
      WithRetries(NewGrpcRewardClient(absl::StrCat("127.0.0.1:", port)), options);
  ASSERT_TRUE(reward->ScoreBatch(TwoItems(), absl::Seconds(10)).ok());

  server.reset();  // gone: connections refused
  absl::Notification returned;
  absl::StatusOr<v1::ScoreBatchResponse> scored;
  std::thread worker([&] {
    scored = reward->ScoreBatch(TwoItems(), absl::Seconds(10));
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  EXPECT_GT(retries.load(), 0);
  server = std::make_unique<RewardServer>(port);
  ASSERT_EQ(server->port(), port);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(60)));
  worker.join();
  ASSERT_TRUE(scored.ok()) << scored.status();
  ASSERT_EQ(scored->results_size(), 2);
  EXPECT_EQ(scored->results(0).result().reward(), 1.0);
  EXPECT_EQ(scored->results(1).result().reward(), 0.0);
}

// ---- backpressure: a reward server whose sandbox pool is full ---------------

// Refuses the first `refusals` ScoreBatch calls as the reward server does
// when its code-sandbox pool is full: RESOURCE_EXHAUSTED, with the
// grpc-retry-pushback-ms trailing metadata when `pushback_ms` is set; then
// scores every item 1. Served on loopback by the real gRPC server.
class BusyRewardServer {
 public:
  BusyRewardServer(int refusals, std::optional<std::string> pushback_ms)
      : service_(refusals, std::move(pushback_ms)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
  }
  ~BusyRewardServer() { server_->Shutdown(); }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // When each ScoreBatch call arrived.
  std::vector<absl::Time> calls() const { return service_.calls(); }

 private:
  class Service final : public v1::RewardService::Service {
   public:
    Service(int refusals, std::optional<std::string> pushback_ms)
        : refusals_(refusals), pushback_ms_(std::move(pushback_ms)) {}

    grpc::Status ScoreBatch(grpc::ServerContext* context, const v1::ScoreBatchRequest* request,
                            v1::ScoreBatchResponse* response) override {
      absl::MutexLock lock(&mu_);
      calls_.push_back(absl::Now());
      if (static_cast<int>(calls_.size()) <= refusals_) {
        if (pushback_ms_.has_value()) {
          context->AddTrailingMetadata(std::string(runtime::kRetryPushbackMetadataKey),
                                       *pushback_ms_);
        }
        return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("code sandbox pool full; retry after ",
                                         pushback_ms_.value_or("?"), " ms"));
      }
      for (const v1::ScoreItem& item : request->items()) {
        v1::ScoreResult* result = response->add_results();
        result->set_item_id(item.item_id());
        result->mutable_result()->set_reward(1.0);
      }
      return grpc::Status::OK;
    }

    std::vector<absl::Time> calls() const {
      absl::MutexLock lock(&mu_);
      return calls_;
    }

   private:
    const int refusals_;
    const std::optional<std::string> pushback_ms_;
    mutable absl::Mutex mu_;
    std::vector<absl::Time> calls_ ABSL_GUARDED_BY(mu_);
  };

  Service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

struct RecordedBackoffs {
  absl::Mutex mu;
  std::vector<absl::Duration> retries ABSL_GUARDED_BY(mu);
  int gave_up ABSL_GUARDED_BY(mu) = 0;
};

RetryOptions RecordingOptions(RecordedBackoffs& recorded) {
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(10);
  options.max_backoff = absl::Milliseconds(50);
  options.deadline = absl::Seconds(30);
  options.observer = [&recorded](const RetryEvent& event) {
    absl::MutexLock lock(&recorded.mu);
    if (event.kind == RetryEvent::Kind::kRetry) {
      recorded.retries.push_back(event.backoff);
    } else {
      ++recorded.gave_up;
    }
  };
  return options;
}

// The hint crosses the wire: the gRPC client reads grpc-retry-pushback-ms
// from the trailing metadata, and the retrying client comes back no sooner
// than told (its own schedule would have come back after 10 ms).
TEST(RetryingClientsTest, ScoreBatchComesBackWhenAFullRewardServerSays) {
  BusyRewardServer server(1, "150");
  RecordedBackoffs recorded;
  RetryingRewardClient reward(NewGrpcRewardClient(server.address()), RecordingOptions(recorded));
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ScoreBatchResponse> scored = reward.ScoreBatch(TwoItems(), absl::Seconds(10));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_EQ(scored->results_size(), 2);
  const std::vector<absl::Time> calls = server.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_GE(calls[1] - calls[0], absl::Milliseconds(150));
  EXPECT_GE(took, absl::Milliseconds(150));
  absl::MutexLock lock(&recorded.mu);
  ASSERT_EQ(recorded.retries.size(), 1u);
  EXPECT_GE(recorded.retries[0], absl::Milliseconds(150));
  EXPECT_EQ(recorded.gave_up, 0);
}

// Without the hint RESOURCE_EXHAUSTED is a quota no retry cures: returned at
// once, naming the call.
TEST(RetryingClientsTest, ResourceExhaustedWithoutAPushbackIsFinal) {
  BusyRewardServer server(1, std::nullopt);
  RecordedBackoffs recorded;
  RetryingRewardClient reward(NewGrpcRewardClient(server.address()), RecordingOptions(recorded));
  absl::StatusOr<v1::ScoreBatchResponse> scored = reward.ScoreBatch(TwoItems(), absl::Seconds(10));
  EXPECT_EQ(scored.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(scored.status().message()),
              HasSubstr("reward_server ScoreBatch on " + server.address()));
  EXPECT_EQ(RetryAfter(scored.status()), std::nullopt);
  EXPECT_EQ(server.calls().size(), 1u);
  absl::MutexLock lock(&recorded.mu);
  EXPECT_TRUE(recorded.retries.empty());
}

// The plain gRPC client hands the hint to whoever retries (and keeps the
// server's words after its own prefix).
TEST(RetryingClientsTest, TheGrpcRewardClientAttachesThePushbackToItsError) {
  BusyRewardServer server(1, "150");
  std::unique_ptr<RewardClient> reward = NewGrpcRewardClient(server.address());
  absl::StatusOr<v1::ScoreBatchResponse> scored = reward->ScoreBatch(TwoItems(), absl::Seconds(10));
  EXPECT_EQ(scored.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfter(scored.status()), absl::Milliseconds(150));
  EXPECT_THAT(std::string(scored.status().message()), HasSubstr("retry after 150 ms"));
}

}  // namespace
}  // namespace sluice::clients
