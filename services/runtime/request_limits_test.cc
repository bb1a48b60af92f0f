#include "services/runtime/request_limits.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "services/runtime/auth.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

StreamClient Anonymous(const std::string& connection) {
  return {.connection = connection, .description = connection};
}

StreamClient Service(const std::string& connection) {
  return {.connection = connection, .description = "worker:w on " + connection, .service = true};
}

TEST(StreamGateTest, RefusesTheConnectionOverItsLimitButNotAnotherOfTheSameHost) {
  StreamGate gate(/*max_per_peer=*/2, /*max_total=*/10);
  absl::StatusOr<StreamGate::Slot> a = gate.Acquire(Anonymous("ipv4:10.0.0.1:4000"), "Sample");
  absl::StatusOr<StreamGate::Slot> b = gate.Acquire(Anonymous("ipv4:10.0.0.1:4000"), "Sample");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<StreamGate::Slot> c = gate.Acquire(Anonymous("ipv4:10.0.0.1:4000"), "Sample");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("--max-streams-per-peer 2"));
  EXPECT_THAT(c.status().message(),
              HasSubstr("the connection of ipv4:10.0.0.1:4000 already has 2 streams open"));
  EXPECT_TRUE(gate.Acquire(Anonymous("ipv4:10.0.0.1:4001"), "Sample").ok());
  EXPECT_EQ(gate.open_from("ipv4:10.0.0.1:4000"), 2);
}

TEST(StreamGateTest, ASlotReleasedOnDestructionFreesItsPlace) {
  StreamGate gate(/*max_per_peer=*/1, /*max_total=*/10);
  {
    absl::StatusOr<StreamGate::Slot> held = gate.Acquire(Anonymous("p"), "WatchRun");
    ASSERT_TRUE(held.ok());
    StreamGate::Slot moved = std::move(*held);  // the move keeps one slot, not two
    EXPECT_EQ(gate.open(), 1);
    EXPECT_FALSE(gate.Acquire(Anonymous("p"), "WatchRun").ok());
  }
  EXPECT_EQ(gate.open(), 0);
  EXPECT_EQ(gate.open_from("p"), 0);
  EXPECT_TRUE(gate.Acquire(Anonymous("p"), "WatchRun").ok());
}

TEST(StreamGateTest, RefusesEveryClientOverThePoolsTotalAndCountsIt) {
  prometheus::Registry registry;
  RefusalCounter refusals(&registry);
  StreamGate gate(/*max_per_peer=*/5, /*max_total=*/3, &refusals);
  std::vector<StreamGate::Slot> slots;
  for (const char* connection : {"a", "b", "c"}) {
    absl::StatusOr<StreamGate::Slot> slot = gate.Acquire(Anonymous(connection), "WatchVersions");
    ASSERT_TRUE(slot.ok());
    slots.push_back(std::move(*slot));
  }
  absl::StatusOr<StreamGate::Slot> refused = gate.Acquire(Anonymous("d"), "WatchVersions");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-streams 3"));
  EXPECT_THAT(refused.status().message(), HasSubstr("from users and anonymous callers"));
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("sluice_requests_refused_total{reason=\"streams_total\"} 1"));
  EXPECT_THAT(text, HasSubstr("sluice_requests_refused_total{reason=\"streams_per_peer\"} 0"));
}

TEST(StreamGateTest, ServicesHaveAPoolOfTheirOwn) {
  StreamGate gate(/*max_per_peer=*/5, /*max_total=*/2);
  std::vector<StreamGate::Slot> slots;
  for (const char* connection : {"user-1", "user-2"}) {
    slots.push_back(*gate.Acquire(Anonymous(connection), "WatchRun"));
  }
  EXPECT_FALSE(gate.Acquire(Anonymous("user-3"), "WatchRun").ok());
  // The users' pool is full; the services' is not.
  absl::StatusOr<StreamGate::Slot> worker = gate.Acquire(Service("worker"), "InsertGroups");
  ASSERT_TRUE(worker.ok()) << worker.status();
  slots.push_back(std::move(*worker));
  slots.push_back(*gate.Acquire(Service("trainer"), "Sample"));
  absl::StatusOr<StreamGate::Slot> refused = gate.Acquire(Service("worker-2"), "InsertGroups");
  EXPECT_THAT(refused.status().message(), HasSubstr("2 streams open from services"));
  EXPECT_EQ(gate.open(), 4);
}

// A real server on loopback, and clients on connections of their own: what
// the stream limits count is a connection (and a pool), never a host or an
// identity that other clients share.
class HoldingControllerService final : public v1::ControllerService::Service {
 public:
  grpc::Status WatchRun(grpc::ServerContext* context, const v1::WatchRunRequest*,
                        grpc::ServerWriter<v1::RunUpdate>* writer) override {
    StreamGate::Slot slot;
    SLUICE_RETURN_IF_REFUSED(AcquireStreamSlot(context, "WatchRun", &slot));
    return Hold(context, [writer] { return writer->Write(v1::RunUpdate()); });
  }

  // Ends every held stream (the test's teardown).
  void ReleaseAll() { release_.Notify(); }

  // Tells the client it holds the stream (its first Read returns), then
  // holds the slot until the client cancels or ReleaseAll.
  grpc::Status Hold(grpc::ServerContext* context, const std::function<bool()>& first_write) {
    if (!first_write()) return grpc::Status::OK;
    while (!context->IsCancelled() &&
           !release_.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
    }
    return grpc::Status::OK;
  }

 private:
  absl::Notification release_;
};

class HoldingReplayBufferService final : public v1::ReplayBufferService::Service {
 public:
  explicit HoldingReplayBufferService(HoldingControllerService* holder) : holder_(holder) {}
  grpc::Status InsertGroups(grpc::ServerContext* context,
                            grpc::ServerReaderWriter<v1::InsertGroupsResponse,
                                                     v1::InsertGroupsRequest>* stream) override {
    StreamGate::Slot slot;
    SLUICE_RETURN_IF_REFUSED(AcquireStreamSlot(context, "InsertGroups", &slot));
    return holder_->Hold(context, [stream] { return stream->Write(v1::InsertGroupsResponse()); });
  }

 private:
  HoldingControllerService* const holder_;
};

class StreamLimitsServerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (Held& held : held_) held.context->TryCancel();
    controller_.ReleaseAll();
    for (Held& held : held_) held.finish();
    held_.clear();
    if (server_ != nullptr) server_->Shutdown();
    SetAuthEnforcedForProcess(false);
    InstallRequestLimits(RequestLimits{}, nullptr);
  }

  // Starts the server with these limits; with tokens (one line per
  // "identity role token") when `tokens` is not empty.
  void StartServer(int max_per_peer, int max_total,
                   const std::vector<std::array<std::string, 3>>& tokens = {}) {
    RequestLimits limits;
    limits.max_streams_per_peer = max_per_peer;
    limits.max_streams = max_total;
    InstallRequestLimits(limits, nullptr);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    if (!tokens.empty()) {
      const std::string path =
          absl::StrCat(::testing::TempDir(), "/stream-limits-", getpid(), "-tokens.yaml");
      std::string yaml = "tokens:\n";
      for (const auto& [identity, role, token] : tokens) {
        absl::StrAppend(&yaml, "  - identity: ", identity, "\n    role: ", role,
                        "\n    sha256: ", TokenHash(token), "\n");
      }
      std::ofstream(path, std::ios::trunc) << yaml;
      absl::StatusOr<std::unique_ptr<TokenStore>> store = TokenStore::Load(path);
      ASSERT_TRUE(store.ok()) << store.status();
      AuthPolicy policy;
      policy.tokens = std::move(*store);
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
          interceptors;
      interceptors.push_back(std::make_unique<AuthInterceptorFactory>(policy));
      builder.experimental().SetInterceptorCreators(std::move(interceptors));
      SetAuthEnforcedForProcess(true);
    }
    builder.RegisterService(&controller_);
    builder.RegisterService(&buffer_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  // A channel on a TCP connection of its own (no subchannel shared with the
  // test's other channels): another client process, as the server sees it.
  std::shared_ptr<grpc::Channel> NewConnection() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port_),
                                     grpc::InsecureChannelCredentials(), args);
  }

  // Opens a WatchRun (or, with `insert`, an InsertGroups) stream on
  // `channel` and keeps it open when the server holds it; returns the
  // server's answer: OK once held, else why it was refused.
  grpc::Status Open(const std::shared_ptr<grpc::Channel>& channel, const std::string& token = "",
                    bool insert = false) {
    Held held;
    held.context = std::make_unique<grpc::ClientContext>();
    held.context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (!token.empty()) held.context->AddMetadata("authorization", "Bearer " + token);
    bool established = false;
    if (insert) {
      auto stub = v1::ReplayBufferService::NewStub(channel);
      std::shared_ptr<grpc::ClientReaderWriter<v1::InsertGroupsRequest, v1::InsertGroupsResponse>>
          stream = stub->InsertGroups(held.context.get());
      v1::InsertGroupsResponse response;
      established = stream->Read(&response);
      held.finish = [stream] { return stream->Finish(); };
    } else {
      auto stub = v1::ControllerService::NewStub(channel);
      std::shared_ptr<grpc::ClientReader<v1::RunUpdate>> reader =
          stub->WatchRun(held.context.get(), v1::WatchRunRequest());
      v1::RunUpdate update;
      established = reader->Read(&update);
      held.finish = [reader] { return reader->Finish(); };
    }
    if (!established) return held.finish();
    held_.push_back(std::move(held));
    return grpc::Status::OK;
  }

  struct Held {
    std::unique_ptr<grpc::ClientContext> context;
    std::function<grpc::Status()> finish;
  };

  HoldingControllerService controller_;
  HoldingReplayBufferService buffer_{&controller_};
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::vector<Held> held_;
};

TEST_F(StreamLimitsServerTest, ALocalClientAtItsLimitLeavesTheStackWorkerItsOwnStreams) {
  StartServer(/*max_per_peer=*/3, /*max_total=*/100);
  // A local process holding idle streams, up to its limit and past it.
  std::shared_ptr<grpc::Channel> hog = NewConnection();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Open(hog, "", /*insert=*/true).ok());
  const grpc::Status refused = Open(hog, "", /*insert=*/true);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("(--max-streams-per-peer 3)"));
  // The stack's own worker, on the same host, still inserts.
  const grpc::Status worker = Open(NewConnection(), "", /*insert=*/true);
  EXPECT_TRUE(worker.ok()) << worker.error_message();
}

TEST_F(StreamLimitsServerTest, OneHolderOfASharedViewerTokenCannotTakeAnotherViewersSlots) {
  StartServer(/*max_per_peer=*/2, /*max_total=*/100,
              {{{"viewers", "viewer", "shared-viewer-token"}}});
  std::shared_ptr<grpc::Channel> hog = NewConnection();
  ASSERT_TRUE(Open(hog, "shared-viewer-token").ok());
  ASSERT_TRUE(Open(hog, "shared-viewer-token").ok());
  const grpc::Status refused = Open(hog, "shared-viewer-token");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("viewer:viewers on ipv4:127.0.0.1:"));
  const grpc::Status other = Open(NewConnection(), "shared-viewer-token");
  EXPECT_TRUE(other.ok()) << other.error_message();
}

TEST_F(StreamLimitsServerTest, UsersWhoFillTheServiceCannotCrowdOutItsWorkers) {
  StartServer(/*max_per_peer=*/10, /*max_total=*/3,
              {{{"alice", "viewer", "alice-token"}, {"worker-0", "worker", "worker-token"}}});
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Open(NewConnection(), "alice-token").ok());
  const grpc::Status refused = Open(NewConnection(), "alice-token");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("(--max-streams 3)"));
  const grpc::Status worker = Open(NewConnection(), "worker-token", /*insert=*/true);
  EXPECT_TRUE(worker.ok()) << worker.error_message();
}

TEST(CheckIdLengthTest, NamesTheFieldTheLengthAndTheLimit) {
  EXPECT_TRUE(CheckIdLength("run_id", "run-1", 8).ok());
  EXPECT_TRUE(CheckIdLength("run_id", std::string(8, 'x'), 8).ok());
  absl::Status status = CheckIdLength("run_id", std::string(9, 'x'), 8);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("run_id: 9 bytes, at most 8"));
  EXPECT_THAT(status.message(), HasSubstr("--max-id-bytes"));
}

TEST(CheckItemCountTest, NamesTheFieldTheCountAndTheLimit) {
  EXPECT_TRUE(CheckItemCount("max_prompts", 4096, 4096).ok());
  absl::Status status = CheckItemCount("max_prompts", 1000000000, 4096);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("max_prompts: 1000000000 items, at most 4096"));
  EXPECT_THAT(status.message(), HasSubstr("--max-items-per-request"));
}

TEST(RequestLimitsTest, DefaultsAreValidAndNonsenseIsNamed) {
  EXPECT_TRUE(RequestLimits{}.Validate().ok());
  RequestLimits bad;
  bad.max_streams = 0;
  bad.max_wait_ms = 10;
  absl::Status status = bad.Validate();
  EXPECT_THAT(status.message(), HasSubstr("max_streams must be >= 1; got 0"));
  EXPECT_THAT(status.message(), HasSubstr("max_wait_ms must be >= 1000; got 10"));
}

}  // namespace
}  // namespace sluice::runtime
