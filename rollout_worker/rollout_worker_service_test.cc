#include "rollout_worker/rollout_worker_service.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace sluice::rollout_worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The real service on an in-process channel, with a memory budget.
class RolloutWorkerServiceTest : public ::testing::Test {
 protected:
  void Start(int64_t memory_budget_bytes, PathPolicy allowed_paths = PathPolicy::Unrestricted()) {
    service_ = std::make_unique<RolloutWorkerServiceImpl>(registry_, "w1", memory_budget_bytes,
                                                          std::move(allowed_paths));
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::RolloutWorkerService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    if (service_ != nullptr) service_->Shutdown();
    if (server_ != nullptr) server_->Shutdown();
  }

  static v1::StartRolloutsRequest Request(int group_size, int batch_size_groups) {
    v1::StartRolloutsRequest request;
    request.set_run_id("run-1");
    v1::RunSpec& spec = *request.mutable_spec();
    spec.mutable_model()->set_builtin("micro");
    spec.mutable_algorithm()->set_group_size(group_size);
    spec.mutable_algorithm()->set_batch_size_groups(batch_size_groups);
    spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(8);
    request.set_max_prompt_tokens(8);
    // Nothing listens there: the run retries until it is stopped.
    v1::ServiceEndpoints& endpoints = *request.mutable_endpoints();
    endpoints.set_trainer_address("127.0.0.1:1");
    endpoints.set_replay_buffer_address("127.0.0.1:1");
    endpoints.set_controller_address("127.0.0.1:1");
    endpoints.set_reward_server_address("127.0.0.1:1");
    return request;
  }

  grpc::Status StartRollouts(const v1::StartRolloutsRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::StartRolloutsResponse response;
    return stub_->StartRollouts(&context, request, &response);
  }

  v1::RolloutWorkerStatus Status() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GetWorkerStatusResponse response;
    EXPECT_TRUE(stub_->GetWorkerStatus(&context, {}, &response).ok());
    return response.status();
  }

  prometheus::Registry registry_;
  std::unique_ptr<RolloutWorkerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::RolloutWorkerService::Stub> stub_;
};

// The run (group_size 10^9, batch 2^31 - 1) and anything else over
// the budget is refused by the worker itself, whoever asks, before a thread
// or a byte of it exists.
TEST_F(RolloutWorkerServiceTest, StartRolloutsOverTheMemoryBudgetIsResourceExhausted) {
  Start(int64_t{64} << 20);
  EXPECT_EQ(Status().memory_budget_bytes(), int64_t{64} << 20);
  const grpc::Status status = StartRollouts(Request(1000000000, 2147483647));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("rollout worker: the run needs about"),
                    HasSubstr("64.0 MiB budget of --memory-budget of rollout worker w1"),
                    HasSubstr("algorithm.group_size")));
  EXPECT_EQ(Status().state(), v1::ROLLOUT_WORKER_STATE_IDLE);
  EXPECT_EQ(Status().runs_size(), 0);

  const grpc::Status fits = StartRollouts(Request(4, 2));
  EXPECT_TRUE(fits.ok()) << fits.error_message();
  EXPECT_EQ(Status().runs_size(), 1);
}

// The controller confines a spec's paths at submit; the worker confines them
// again for whoever calls it directly, before it reads the model.
TEST_F(RolloutWorkerServiceTest, StartRolloutsWithAModelOutsideTheRootsIsInvalidArgument) {
  const std::filesystem::path dir = std::filesystem::weakly_canonical(::testing::TempDir()) /
                                    ("worker-paths-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "root");
  std::filesystem::create_directories(dir / "outside" / "model");
  std::filesystem::create_directory_symlink(dir / "outside", dir / "root" / "escape");
  Start(0, *PathPolicy::Create({(dir / "root").string()}));
  for (const std::string& model_dir :
       {std::string("/etc"), (dir / "root" / ".." / "outside" / "model").string(),
        (dir / "root" / "escape" / "model").string(), (dir / "outside" / "missing").string()}) {
    v1::StartRolloutsRequest request = Request(4, 2);
    request.mutable_spec()->mutable_model()->set_hf_model_dir(model_dir);
    const grpc::Status status = StartRollouts(request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << model_dir;
    EXPECT_EQ(status.error_message(),
              "spec on this worker: model.hf_model_dir '" + model_dir +
                  "' is outside the allowed roots [" + (dir / "root").string() +
                  "]; add its parent to --allowed-path-roots");
  }
  EXPECT_EQ(Status().runs_size(), 0);
  // A builtin model names no path; where the trainer writes its
  // checkpoints is not the worker's to judge.
  v1::StartRolloutsRequest builtin_request = Request(4, 2);
  builtin_request.mutable_spec()->mutable_checkpoint()->set_dir("/on/the/trainers/host");
  const grpc::Status builtin = StartRollouts(builtin_request);
  EXPECT_TRUE(builtin.ok()) << builtin.error_message();
  std::filesystem::remove_all(dir);
}

TEST_F(RolloutWorkerServiceTest, ANegativeMaxPromptTokensIsInvalid) {
  Start(0);
  v1::StartRolloutsRequest request = Request(4, 2);
  request.set_max_prompt_tokens(-1);
  const grpc::Status status = StartRollouts(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("max_prompt_tokens: must be >= 0"));
}

}  // namespace
}  // namespace sluice::rollout_worker
