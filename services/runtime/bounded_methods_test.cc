#include "services/runtime/bounded_methods.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/runtime/auth.h"
#include "services/runtime/server_options.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/reward_server.grpc.pb.h"
#include "sluice/v1/rollout_worker.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMessageLimit = 64 << 20;

// Counts the calls that reach the service's own code.
class CountingReward final : public v1::RewardService::Service {
 public:
  grpc::Status ScoreBatch(grpc::ServerContext*, const v1::ScoreBatchRequest* request,
                          v1::ScoreBatchResponse* response) override {
    ++calls;
    for (const v1::ScoreItem& item : request->items())
      response->add_results()->set_item_id(item.item_id());
    return grpc::Status::OK;
  }
  grpc::Status ListVerifiers(grpc::ServerContext*, const v1::ListVerifiersRequest*,
                             v1::ListVerifiersResponse* response) override {
    ++calls;
    response->add_verifiers()->set_name("exact_match");
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

class AnnouncingTrainer final : public v1::TrainerService::Service {
 public:
  grpc::Status WatchVersions(grpc::ServerContext*, const v1::WatchVersionsRequest* request,
                             grpc::ServerWriter<v1::VersionAnnouncement>* writer) override {
    for (int64_t v = request->after_version() + 1; v <= request->after_version() + 3; ++v) {
      v1::VersionAnnouncement announcement;
      announcement.mutable_version()->set_version(v);
      writer->Write(announcement);
    }
    return grpc::Status::OK;
  }
};

// A buffer whose InsertGroups answers each message with the groups it held.
class EchoingBuffer final : public v1::ReplayBufferService::Service, public BoundedService {
 public:
  grpc::Status InsertGroupsStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriterInterface<v1::InsertGroupsResponse, v1::InsertGroupsRequest>*
          stream) {
    v1::InsertGroupsRequest request;
    while (stream->Read(&request)) {
      ++messages;
      v1::InsertGroupsResponse response;
      for (int i = 0; i < request.groups_size(); ++i) response.add_results();
      stream->Write(response);
    }
    return grpc::Status::OK;
  }
  std::vector<BoundedStreamMethod> BoundedStreams() override {
    if (!bind_streams) return {};
    return {
        BoundedStream(this, "/sluice.v1.ReplayBufferService/InsertGroups",
                      &EchoingBuffer::InsertGroupsStream),
        BoundedStream(this, "/sluice.v1.ReplayBufferService/Sample", &EchoingBuffer::SampleStream)};
  }
  grpc::Status SampleStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriterInterface<v1::SampleResponse, v1::SampleRequest>*) {
    return grpc::Status::OK;
  }
  bool bind_streams = true;
  std::atomic<int> messages{0};
};

class BoundedMethodsTest : public ::testing::Test {
 protected:
  void Serve(
      std::vector<std::pair<grpc::Service*, std::string>> services,
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> auth = nullptr) {
    grpc::ServerBuilder builder;
    builder.SetMaxReceiveMessageSize(kMessageLimit);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    if (auth != nullptr) {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
      factories.push_back(std::move(auth));
      builder.experimental().SetInterceptorCreators(std::move(factories));
    }
    for (auto& [service, name] : services) {
      const absl::Status bounded = BoundEveryMethod(*service, name, kMessageLimit);
      ASSERT_TRUE(bounded.ok()) << bounded;
      builder.RegisterService(service);
    }
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    grpc::ChannelArguments arguments;
    arguments.SetMaxSendMessageSize(kMessageLimit);
    channel_ = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                         grpc::InsecureChannelCredentials(), arguments);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
    SetAuthEnforcedForProcess(false);
  }

  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(BoundedMethodsTest, ValidRequestsReachTheServiceAsBefore) {
  CountingReward reward;
  AnnouncingTrainer trainer;
  EchoingBuffer buffer;
  Serve({{&reward, "sluice.v1.RewardService"},
         {&trainer, "sluice.v1.TrainerService"},
         {&buffer, "sluice.v1.ReplayBufferService"}});

  auto reward_stub = v1::RewardService::NewStub(channel_);
  grpc::ClientContext score_context;
  v1::ScoreBatchRequest score;
  for (int i = 0; i < 3; ++i) score.add_items()->set_item_id(absl::StrCat("item-", i));
  v1::ScoreBatchResponse scored;
  ASSERT_TRUE(reward_stub->ScoreBatch(&score_context, score, &scored).ok());
  ASSERT_EQ(scored.results_size(), 3);
  EXPECT_EQ(scored.results(2).item_id(), "item-2");

  auto trainer_stub = v1::TrainerService::NewStub(channel_);
  grpc::ClientContext watch_context;
  v1::WatchVersionsRequest watch;
  watch.set_after_version(10);
  auto reader = trainer_stub->WatchVersions(&watch_context, watch);
  std::vector<int64_t> versions;
  v1::VersionAnnouncement announcement;
  while (reader->Read(&announcement)) versions.push_back(announcement.version().version());
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(versions, (std::vector<int64_t>{11, 12, 13}));

  auto buffer_stub = v1::ReplayBufferService::NewStub(channel_);
  grpc::ClientContext insert_context;
  auto stream = buffer_stub->InsertGroups(&insert_context);
  for (int n : {1, 2}) {
    v1::InsertGroupsRequest insert;
    for (int i = 0; i < n; ++i) insert.add_groups()->add_trajectories();
    ASSERT_TRUE(stream->Write(insert));
    v1::InsertGroupsResponse response;
    ASSERT_TRUE(stream->Read(&response));
    EXPECT_EQ(response.results_size(), n);
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(BoundedMethodsTest, TooManyItemsAreRefusedBeforeTheServiceSeesThem) {
  CountingReward reward;
  EchoingBuffer buffer;
  Serve({{&reward, "sluice.v1.RewardService"}, {&buffer, "sluice.v1.ReplayBufferService"}});

  auto reward_stub = v1::RewardService::NewStub(channel_);
  grpc::ClientContext context;
  v1::ScoreBatchRequest score;
  for (int i = 0; i < 100000; ++i) score.add_items();
  v1::ScoreBatchResponse scored;
  const grpc::Status status = reward_stub->ScoreBatch(&context, score, &scored);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "ScoreBatch: items: 100000 items, at most 4096 per request (--max-items-per-request)");
  EXPECT_EQ(reward.calls.load(), 0);

  // A stream: the first message is answered, the second ends the stream
  // with the refusal.
  auto buffer_stub = v1::ReplayBufferService::NewStub(channel_);
  grpc::ClientContext insert_context;
  auto stream = buffer_stub->InsertGroups(&insert_context);
  v1::InsertGroupsRequest fine;
  fine.add_groups();
  ASSERT_TRUE(stream->Write(fine));
  v1::InsertGroupsResponse response;
  ASSERT_TRUE(stream->Read(&response));
  v1::InsertGroupsRequest hostile;
  v1::Group* group = hostile.add_groups();
  for (int i = 0; i < 5000; ++i) group->add_trajectories();
  stream->Write(hostile);
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(ended.error_message(),
              HasSubstr("InsertGroups: groups[0].trajectories: 5000 items, at most 4096"));
  EXPECT_EQ(buffer.messages.load(), 1);
}

TEST_F(BoundedMethodsTest, ALargerRequestThanTheMethodTakesIsRefused) {
  CountingReward reward;
  Serve({{&reward, "sluice.v1.RewardService"}});
  auto stub = v1::RewardService::NewStub(channel_);
  grpc::ClientContext context;
  // An empty message type, padded with an unknown field.
  v1::ListVerifiersRequest request;
  request.GetReflection()->MutableUnknownFields(&request)->AddLengthDelimited(
      1000, std::string(kSmallRequestBytes, 'x'));
  v1::ListVerifiersResponse response;
  const grpc::Status status = stub->ListVerifiers(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("ListVerifiers: a ListVerifiersRequest of"));
  EXPECT_THAT(status.error_message(),
              HasSubstr("larger than the 262144 bytes this method accepts"));
  EXPECT_EQ(reward.calls.load(), 0);
}

TEST_F(BoundedMethodsTest, ARefusedCallerIsAnsweredWithoutItsMessage) {
  const std::string dir = ::testing::TempDir() + "/bounded-methods-tokens";
  std::filesystem::create_directories(dir);
  const std::string tokens = dir + "/tokens.yaml";
  std::ofstream(tokens) << "tokens:\n"
                        << TokenEntryYaml({TokenHash("slc_worker"), Role::kWorker, "w"});
  std::filesystem::permissions(
      tokens, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  absl::StatusOr<std::unique_ptr<TokenStore>> store = TokenStore::Load(tokens);
  ASSERT_TRUE(store.ok()) << store.status();
  AuthPolicy policy;
  policy.tokens = std::move(*store);
  SetAuthEnforcedForProcess(true);
  CountingReward reward;
  Serve({{&reward, "sluice.v1.RewardService"}}, std::make_unique<AuthInterceptorFactory>(policy));
  auto stub = v1::RewardService::NewStub(channel_);

  v1::ScoreBatchRequest score;
  for (int i = 0; i < 100000; ++i) score.add_items();
  grpc::ClientContext anonymous;
  v1::ScoreBatchResponse scored;
  const grpc::Status refused = stub->ScoreBatch(&anonymous, score, &scored);
  // Not INVALID_ARGUMENT about its items: the message was never looked at.
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  EXPECT_EQ(reward.calls.load(), 0);

  grpc::ClientContext worker;
  worker.AddMetadata("authorization", "Bearer slc_worker");
  v1::ScoreBatchRequest one;
  one.add_items()->set_item_id("a");
  ASSERT_TRUE(stub->ScoreBatch(&worker, one, &scored).ok());
  EXPECT_EQ(reward.calls.load(), 1);
}

TEST_F(BoundedMethodsTest, AServiceWhoseStreamsAreUnboundIsRefused) {
  EchoingBuffer buffer;
  buffer.bind_streams = false;
  const absl::Status status =
      BoundEveryMethod(buffer, "sluice.v1.ReplayBufferService", kMessageLimit);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(status.message(), HasSubstr("unbounded requests in InsertGroups, Sample"));

  CountingReward reward;
  EXPECT_EQ(BoundEveryMethod(reward, "sluice.v1.SomethingElse", kMessageLimit).code(),
            absl::StatusCode::kInternal);
}

TEST(MethodBoundsTest, EveryMethodOfEveryServiceHasItsBounds) {
  std::set<std::string> bounded;
  for (const auto& [method, bounds] : AllMethodBounds(kMessageLimit)) {
    bounded.insert(method);
    EXPECT_GT(bounds.max_bytes, 0) << method;
    EXPECT_LE(bounds.max_bytes, kMessageLimit) << method;
    EXPECT_GE(bounds.max_parsed_bytes, bounds.max_bytes) << method;
  }
  for (const char* name :
       {"sluice.v1.ControllerService", "sluice.v1.ReplayBufferService", "sluice.v1.RewardService",
        "sluice.v1.RolloutWorkerService", "sluice.v1.TrainerService", "sluice.v1.WeightRelay"}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string path = absl::StrCat("/", name, "/", service->method(i)->name());
      EXPECT_EQ(bounded.count(path), 1u) << path << " has no size class (bounded_methods.cc)";
      EXPECT_EQ(internal::MethodIndex(path), i);
    }
  }
  // Small requests are far below the message limit; data takes all of it.
  EXPECT_EQ(BoundsForMethod("/sluice.v1.ControllerService/GetRun", kMessageLimit).max_bytes,
            kSmallRequestBytes);
  EXPECT_EQ(BoundsForMethod("/sluice.v1.RewardService/ScoreBatch", kMessageLimit).max_bytes,
            kMessageLimit);
  EXPECT_EQ(BoundsForMethod("/sluice.v1.RewardService/ScoreBatch", 1 << 20).max_bytes, 1 << 20);
}

}  // namespace
}  // namespace sluice::runtime
