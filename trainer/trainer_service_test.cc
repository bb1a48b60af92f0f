#include "trainer/trainer_service.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "replay_buffer/replay_buffer_service.h"
#include "sluice/v1/reward_server.grpc.pb.h"

namespace sluice::trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The real service on an in-process channel, with a 256 MiB budget.
class TrainerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<TrainerServiceImpl>(registry_, int64_t{256} << 20);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::TrainerService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    service_->Shutdown();
    server_->Shutdown();
  }

  v1::TrainerStatus Status() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GetTrainerStatusResponse response;
    EXPECT_TRUE(stub_->GetTrainerStatus(&context, {}, &response).ok());
    return response.status();
  }

  prometheus::Registry registry_;
  std::unique_ptr<TrainerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
};

// What the controller checks at submit, the trainer checks itself: a client
// that asks it directly to train a run too big for its budget is refused,
// with the estimate, the budget and the fields to lower.
TEST_F(TrainerServiceTest, StartTrainingOverTheMemoryBudgetIsResourceExhausted) {
  EXPECT_EQ(Status().memory_budget_bytes(), int64_t{256} << 20);
  v1::StartTrainingRequest request;
  request.set_run_id("run-1");
  request.mutable_spec()->mutable_model()->set_builtin("tiny");
  request.mutable_spec()->mutable_algorithm()->set_group_size(64);
  request.mutable_spec()->mutable_algorithm()->set_batch_size_groups(4096);
  request.mutable_spec()->mutable_algorithm()->set_minibatches_per_batch(1);
  request.set_max_prompt_tokens(16);
  request.mutable_endpoints()->set_replay_buffer_address("127.0.0.1:1");
  request.mutable_endpoints()->set_reward_server_address("127.0.0.1:1");
  grpc::ClientContext context;
  v1::StartTrainingResponse response;
  const grpc::Status status = stub_->StartTraining(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("trainer: the run needs about"),
                    HasSubstr("256.0 MiB budget of this trainer's --memory-budget"),
                    HasSubstr("algorithm.batch_size_groups")));
  EXPECT_EQ(Status().state(), v1::TRAINER_STATE_IDLE);
  EXPECT_TRUE(Status().run_id().empty());
}

// Scores every item 0 and counts the calls (each evaluation makes some).
class CountingReward final : public v1::RewardService::Service {
 public:
  grpc::Status ScoreBatch(grpc::ServerContext*, const v1::ScoreBatchRequest* request,
                          v1::ScoreBatchResponse* response) override {
    calls.fetch_add(1);
    for (const auto& item : request->items()) {
      v1::ScoreResult* result = response->add_results();
      result->set_item_id(item.item_id());
      result->mutable_result()->set_error_kind(v1::VERIFIER_ERROR_NONE);
    }
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

// The trainer service with a real replay buffer service and a reward
// service beside it, on loopback ports, as a controller would address them.
class TrainerServiceRestartTest : public TrainerServiceTest {
 protected:
  void SetUp() override {
    TrainerServiceTest::SetUp();
    absl::StatusOr<std::unique_ptr<replay_buffer::ReplayBuffer>> buffer =
        replay_buffer::ReplayBuffer::Create();
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    buffer_service_ = std::make_shared<replay_buffer::ReplayBufferServiceImpl>(
        std::move(buffer).value(), buffer_registry_);
    grpc::ServerBuilder builder;
    builder.RegisterService(buffer_service_.get());
    builder.RegisterService(&reward_);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    services_ = builder.BuildAndStart();
    ASSERT_NE(services_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    buffer_stub_ = v1::ReplayBufferService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    TrainerServiceTest::TearDown();  // the run first: it talks to the services
    buffer_service_->Shutdown();
    services_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // The run's table, at `version` (> 0: the run trained that far before).
  void ConfigureBuffer(int64_t version) {
    grpc::ClientContext context;
    v1::ConfigureRunRequest configure;
    configure.set_run_id("run-r");
    configure.set_batch_size_groups(2);
    configure.set_max_staleness(1);
    configure.set_group_size(4);
    v1::ConfigureRunResponse configured;
    ASSERT_TRUE(buffer_stub_->ConfigureRun(&context, configure, &configured).ok());
    if (version == 0) return;
    grpc::ClientContext update_context;
    v1::UpdatePolicyVersionRequest update;
    update.set_run_id("run-r");
    update.set_policy_version(version);
    v1::UpdatePolicyVersionResponse updated;
    ASSERT_TRUE(buffer_stub_->UpdatePolicyVersion(&update_context, update, &updated).ok());
  }

  v1::StartTrainingRequest Request(const std::string& checkpoint_dir) {
    v1::StartTrainingRequest request;
    request.set_run_id("run-r");
    v1::RunSpec& spec = *request.mutable_spec();
    spec.set_seed(3);
    spec.mutable_model()->set_builtin("micro");
    auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
    arithmetic->set_max_operand(9);
    arithmetic->add_operators("+");
    arithmetic->set_num_prompts(20);
    arithmetic->set_num_operands(2);
    spec.mutable_task()->set_eval_split_size(4);
    spec.mutable_algorithm()->set_group_size(4);
    spec.mutable_algorithm()->set_batch_size_groups(2);
    spec.mutable_algorithm()->set_max_staleness(1);
    spec.mutable_algorithm()->set_total_steps(5);
    spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(3);
    spec.mutable_checkpoint()->set_dir(checkpoint_dir);
    spec.mutable_checkpoint()->set_every_n_steps(2);
    request.set_max_prompt_tokens(8);
    request.mutable_endpoints()->set_replay_buffer_address(address_);
    request.mutable_endpoints()->set_reward_server_address(address_);
    return request;
  }

  grpc::Status StartTraining(const v1::StartTrainingRequest& request,
                             v1::StartTrainingResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->StartTraining(&context, request, response);
  }

  static std::string ScratchDir(const std::string& name) {
    const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                      (name + "." + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir.string();
  }

  prometheus::Registry buffer_registry_;
  std::shared_ptr<replay_buffer::ReplayBufferServiceImpl> buffer_service_;
  CountingReward reward_;
  std::unique_ptr<grpc::Server> services_;
  std::string address_;
  std::unique_ptr<v1::ReplayBufferService::Stub> buffer_stub_;
};

// A trainer restarted with no checkpoint of a run the buffer says was
// trained to version 3 refuses it at once, to the caller, saying why.
TEST_F(TrainerServiceRestartTest, StartTrainingARunThatCannotResumeIsFailedPrecondition) {
  ConfigureBuffer(3);
  const std::string dir = ScratchDir("no_checkpoint");
  v1::StartTrainingResponse response;
  const grpc::Status status = StartTraining(Request(dir), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("cannot resume losslessly: no checkpoint of run run-r in " + dir),
                    HasSubstr("the replay buffer is at version 3")));
  EXPECT_EQ(Status().state(), v1::TRAINER_STATE_IDLE);
  EXPECT_TRUE(Status().run_id().empty());
}

// A controller that restarted sends StartTraining again for the run the
// trainer is training: the answer is its status, and nothing restarts (no
// second "before" evaluation, the same incarnation).
TEST_F(TrainerServiceRestartTest, StartTrainingTheRunInProgressIsIdempotent) {
  ConfigureBuffer(0);
  const v1::StartTrainingRequest request = Request(ScratchDir("idempotent"));
  v1::StartTrainingResponse first;
  ASSERT_TRUE(StartTraining(request, &first).ok());
  EXPECT_EQ(first.status().resumed_from_step(), -1);
  EXPECT_NE(first.status().incarnation(), 0u);
  // Published version 0 and waits for data the buffer will not have.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Status().state() != v1::TRAINER_STATE_WAITING_FOR_DATA && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Status().state(), v1::TRAINER_STATE_WAITING_FOR_DATA);
  const int evaluation_calls = reward_.calls.load();
  ASSERT_GT(evaluation_calls, 0);

  v1::StartTrainingResponse again;
  ASSERT_TRUE(StartTraining(request, &again).ok());
  EXPECT_EQ(again.status().run_id(), "run-r");
  EXPECT_EQ(again.status().state(), v1::TRAINER_STATE_WAITING_FOR_DATA);
  EXPECT_EQ(again.status().policy_version(), 0);
  EXPECT_EQ(again.status().incarnation(), first.status().incarnation());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(reward_.calls.load(), evaluation_calls);  // no second "before" evaluation
  EXPECT_EQ(Status().state(), v1::TRAINER_STATE_WAITING_FOR_DATA);
}

// The controller confines a spec's paths at submit; the trainer confines
// them again for whoever calls it directly, before it opens anything.
TEST(TrainerServicePathTest, StartTrainingWithPathsOutsideTheRootsIsInvalidArgument) {
  const std::filesystem::path dir =
      std::filesystem::weakly_canonical(::testing::TempDir()) /
      ("trainer-paths-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "root");
  std::filesystem::create_directories(dir / "outside");
  std::filesystem::create_directory_symlink(dir / "outside", dir / "root" / "escape");
  prometheus::Registry registry;
  TrainerServiceImpl service(registry, 0, {}, *PathPolicy::Create({(dir / "root").string()}));
  for (const std::string& checkpoint_dir :
       {std::string("/etc/sluice-evil"), (dir / "root" / ".." / "outside").string(),
        (dir / "root" / "escape" / "ckpt").string()}) {
    v1::StartTrainingRequest request;
    request.set_run_id("run-1");
    request.mutable_spec()->mutable_model()->set_builtin("tiny");
    request.mutable_spec()->mutable_checkpoint()->set_dir(checkpoint_dir);
    request.mutable_endpoints()->set_replay_buffer_address("127.0.0.1:1");
    request.mutable_endpoints()->set_reward_server_address("127.0.0.1:1");
    grpc::ServerContext context;
    v1::StartTrainingResponse response;
    const grpc::Status status = service.StartTraining(&context, &request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << checkpoint_dir;
    EXPECT_EQ(status.error_message(),
              "spec on this trainer: checkpoint.dir '" + checkpoint_dir +
                  "' is outside the allowed roots [" + (dir / "root").string() +
                  "]; add its parent to --allowed-path-roots");
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir / "outside"));
  std::filesystem::remove_all(dir);
}

TEST(TrainerServiceIncarnationTest, EachServiceHasItsOwnIncarnation) {
  prometheus::Registry registry;
  TrainerServiceImpl first(registry);
  prometheus::Registry other;
  absl::SleepFor(absl::Microseconds(10));
  TrainerServiceImpl second(other);
  grpc::ServerContext context;
  v1::GetTrainerStatusResponse a;
  v1::GetTrainerStatusResponse b;
  ASSERT_TRUE(first.GetTrainerStatus(&context, nullptr, &a).ok());
  ASSERT_TRUE(second.GetTrainerStatus(&context, nullptr, &b).ok());
  EXPECT_NE(a.status().incarnation(), 0u);
  EXPECT_LT(a.status().incarnation(), b.status().incarnation());
}

}  // namespace
}  // namespace sluice::trainer
