#include "trainer/trainer_service.h"

#include <chrono>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

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

}  // namespace
}  // namespace sluice::trainer
