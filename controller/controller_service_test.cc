// ControllerService served in process (grpc::ServerBuilder + InProcessChannel)
// over a RunRegistry whose services are fakes.
#include "controller/controller_service.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "controller/fake_service_clients.h"
#include "controller/worker_registry.h"

namespace sluice::controller {
namespace {

using ::testing::HasSubstr;

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10);
}

std::vector<v1::Prompt> Pool(int n) {
  std::vector<v1::Prompt> prompts;
  for (int i = 0; i < n; ++i) {
    v1::Prompt& prompt = prompts.emplace_back();
    prompt.set_prompt_id(absl::StrCat("arith-", i));
    prompt.set_text(absl::StrCat(i, "+1="));
    prompt.set_reference_answer(absl::StrCat(i + 1));
  }
  return prompts;
}

v1::RunSpec ValidSpec() {
  v1::RunSpec spec;
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->mutable_arithmetic();
  spec.mutable_algorithm()->set_total_steps(2);
  return spec;
}

class ControllerServiceTest : public ::testing::Test {
 protected:
  explicit ControllerServiceTest(PathPolicy allowed_paths = PathPolicy::Unrestricted()) {
    runs_dir_ = ::testing::TempDir() + "/service-runs-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(runs_dir_);
    RunRegistryOptions options;
    options.runs_dir = runs_dir_;
    options.allowed_paths = std::move(allowed_paths);
    options.driver.health_check_interval = absl::Milliseconds(5);
    options.driver.prompt_source = [](const v1::RunSpec&) { return Pool(10); };
    ServiceClients clients;
    clients.trainer = trainer_;
    clients.replay_buffer = std::make_shared<testing::FakeBuffer>();
    clients.workers = workers_;
    clients.reward_server_address = "reward:1";
    clients.health = std::make_shared<testing::FakeHealth>();
    registry_ = std::make_unique<RunRegistry>(options, clients);
    service_ = std::make_unique<ControllerServiceImpl>(registry_.get(), absl::Milliseconds(20));
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    stub_ = v1::ControllerService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
    worker_->Attach(workers_);
  }

  ~ControllerServiceTest() override {
    server_->Shutdown(Deadline());
    registry_->Shutdown();
  }

  grpc::Status Submit(const v1::RunSpec& spec, v1::SubmitRunResponse* response,
                      bool validate_only = false) {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    v1::SubmitRunRequest request;
    *request.mutable_spec() = spec;
    request.set_validate_only(validate_only);
    return stub_->SubmitRun(&context, request, response);
  }

  std::string SubmitValid() {
    v1::SubmitRunResponse response;
    const grpc::Status status = Submit(ValidSpec(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.run().run_id();
  }

  v1::ReportTrainerProgressResponse Report(const std::string& run_id, v1::TrainerState state) {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    v1::ReportTrainerProgressRequest request;
    request.set_run_id(run_id);
    request.set_state(state);
    v1::ReportTrainerProgressResponse response;
    EXPECT_TRUE(stub_->ReportTrainerProgress(&context, request, &response).ok());
    return response;
  }

  std::string runs_dir_;
  std::shared_ptr<testing::FakeTrainer> trainer_ = std::make_shared<testing::FakeTrainer>();
  std::shared_ptr<WorkerRegistry> workers_ = std::make_shared<WorkerRegistry>(
      WorkerRegistryOptions{.heartbeat_interval = absl::Milliseconds(5)});
  std::shared_ptr<testing::FakeWorker> worker_ = std::make_shared<testing::FakeWorker>();
  std::unique_ptr<RunRegistry> registry_;
  std::unique_ptr<ControllerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::ControllerService::Stub> stub_;
};

TEST_F(ControllerServiceTest, InvalidSpecIsInvalidArgumentNamingTheField) {
  v1::RunSpec spec = ValidSpec();
  spec.mutable_algorithm()->set_group_size(1);
  v1::SubmitRunResponse response;
  const grpc::Status status = Submit(spec, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("algorithm.group_size: must be >= 2"));
  EXPECT_FALSE(std::filesystem::exists(runs_dir_));
}

TEST_F(ControllerServiceTest, ValidateOnlyResolvesDefaultsAndCreatesNothing) {
  v1::SubmitRunResponse response;
  const grpc::Status status = Submit(ValidSpec(), &response, /*validate_only=*/true);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.run().run_id(), "");
  EXPECT_EQ(response.run().spec().algorithm().group_size(), 8);
  EXPECT_EQ(response.run().spec().model().builtin(), "tiny");
  EXPECT_FALSE(std::filesystem::exists(runs_dir_));
  EXPECT_FALSE(trainer_->started.HasBeenNotified());
}

TEST_F(ControllerServiceTest, SubmitCreatesARunWithItsDirectory) {
  v1::SubmitRunResponse response;
  ASSERT_TRUE(Submit(ValidSpec(), &response).ok());
  EXPECT_THAT(response.run().run_id(), HasSubstr("run-"));
  EXPECT_EQ(response.run().state(), v1::RUN_STATE_PENDING);
  EXPECT_TRUE(response.run().has_created_at());
  EXPECT_TRUE(std::filesystem::exists(runs_dir_ + "/" + response.run().run_id() + "/spec.json"));

  grpc::ClientContext context;
  v1::GetRunRequest get;
  get.set_run_id(response.run().run_id());
  v1::GetRunResponse got;
  ASSERT_TRUE(stub_->GetRun(&context, get, &got).ok());
  EXPECT_EQ(got.run().run_id(), response.run().run_id());
  EXPECT_EQ(got.run().spec().algorithm().total_steps(), 2);
}

TEST_F(ControllerServiceTest, GetRunOfAnUnknownIdIsNotFound) {
  grpc::ClientContext context;
  v1::GetRunRequest request;
  request.set_run_id("run-nope");
  v1::GetRunResponse response;
  const grpc::Status status = stub_->GetRun(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("run-nope"));
}

TEST_F(ControllerServiceTest, WatchRunFollowsStatesAndEndsAfterTheTerminalSnapshot) {
  const std::string run_id = SubmitValid();
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  v1::WatchRunRequest request;
  request.set_run_id(run_id);
  request.set_min_interval_ms(10);
  std::unique_ptr<grpc::ClientReader<v1::RunUpdate>> reader = stub_->WatchRun(&context, request);
  v1::RunUpdate update;
  ASSERT_TRUE(reader->Read(&update));
  EXPECT_EQ(update.sequence(), 0);
  EXPECT_EQ(update.run().run_id(), run_id);

  ASSERT_TRUE(worker_->started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  int64_t last_sequence = 0;
  // Snapshots show the state of the moment: wait for TRAINING to be seen
  // before moving on, or it could be coalesced away.
  while (update.run().state() != v1::RUN_STATE_TRAINING) {
    ASSERT_TRUE(reader->Read(&update));
    EXPECT_EQ(update.sequence(), last_sequence + 1);
    last_sequence = update.sequence();
  }
  Report(run_id, v1::TRAINER_STATE_FINISHED);

  std::vector<v1::RunState> states = {v1::RUN_STATE_TRAINING};
  while (reader->Read(&update)) {
    EXPECT_EQ(update.sequence(), last_sequence + 1);
    last_sequence = update.sequence();
    if (states.empty() || states.back() != update.run().state()) {
      states.push_back(update.run().state());
    }
  }
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.back(), v1::RUN_STATE_SUCCEEDED);
}

TEST_F(ControllerServiceTest, WatchRunEndsWhenTheRunIsCancelled) {
  const std::string run_id = SubmitValid();
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  v1::WatchRunRequest request;
  request.set_run_id(run_id);
  std::unique_ptr<grpc::ClientReader<v1::RunUpdate>> reader = stub_->WatchRun(&context, request);
  v1::RunUpdate update;
  ASSERT_TRUE(reader->Read(&update));
  EXPECT_FALSE(IsTerminal(update.run().state()));

  grpc::ClientContext cancel_context;
  v1::CancelRunRequest cancel;
  cancel.set_run_id(run_id);
  v1::CancelRunResponse cancelled;
  ASSERT_TRUE(stub_->CancelRun(&cancel_context, cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.run().state(), v1::RUN_STATE_CANCELLED);
  EXPECT_FALSE(cancelled.already_ended());

  v1::RunUpdate last;
  while (reader->Read(&update)) last = update;
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.run().state(), v1::RUN_STATE_CANCELLED);
  EXPECT_EQ(last.run().error_message(), "cancelled by user");

  // Again: it had ended, and the answer says so.
  grpc::ClientContext again_context;
  v1::CancelRunResponse again;
  ASSERT_TRUE(stub_->CancelRun(&again_context, cancel, &again).ok());
  EXPECT_TRUE(again.already_ended());
  EXPECT_EQ(again.run().state(), v1::RUN_STATE_CANCELLED);
}

// The run outlives the controller (the next one re-adopts it): the watcher
// gets its last snapshot, still active, and UNAVAILABLE to reconnect on.
TEST_F(ControllerServiceTest, WatchRunWakesOnShutdown) {
  const std::string run_id = SubmitValid();
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  v1::WatchRunRequest request;
  request.set_run_id(run_id);
  request.set_min_interval_ms(60000);
  std::unique_ptr<grpc::ClientReader<v1::RunUpdate>> reader = stub_->WatchRun(&context, request);
  v1::RunUpdate update;
  ASSERT_TRUE(reader->Read(&update));
  const absl::Time start = absl::Now();
  service_->BeginShutdown();
  v1::RunUpdate last;
  while (reader->Read(&update)) last = update;
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_EQ(status.error_message(), "the controller is shutting down");
  EXPECT_FALSE(IsTerminal(last.run().state()));
  EXPECT_EQ(last.run().run_id(), run_id);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  v1::SubmitRunResponse response;
  EXPECT_EQ(Submit(ValidSpec(), &response).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(ControllerServiceTest, WatchRunOfAnUnknownIdIsNotFound) {
  grpc::ClientContext context;
  v1::WatchRunRequest request;
  request.set_run_id("run-nope");
  auto reader = stub_->WatchRun(&context, request);
  v1::RunUpdate update;
  EXPECT_FALSE(reader->Read(&update));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ControllerServiceTest, LeasePromptsBeforeTrainingSaysRetryAfter) {
  const std::string run_id = SubmitValid();
  grpc::ClientContext context;
  v1::LeasePromptsRequest request;
  request.set_run_id(run_id);
  request.set_worker_id("w");
  request.set_max_prompts(4);
  v1::LeasePromptsResponse response;
  ASSERT_TRUE(stub_->LeasePrompts(&context, request, &response).ok());
  EXPECT_EQ(response.prompts_size(), 0);
  EXPECT_EQ(response.retry_after_ms(), 200);
  EXPECT_FALSE(response.run_done());

  ASSERT_TRUE(worker_->started.WaitForNotificationWithTimeout(absl::Seconds(10)));
  Report(run_id, v1::TRAINER_STATE_WAITING_FOR_DATA);
  grpc::ClientContext again;
  ASSERT_TRUE(stub_->LeasePrompts(&again, request, &response).ok());
  EXPECT_EQ(response.prompts_size(), 4);
  EXPECT_GT(response.lease_ttl_ms(), 0);
  EXPECT_TRUE(response.has_lease_expires_at());
}

TEST_F(ControllerServiceTest, LeasePromptsValidatesItsArguments) {
  grpc::ClientContext context;
  v1::LeasePromptsRequest request;
  request.set_run_id("run-x");
  request.set_worker_id("w");
  v1::LeasePromptsResponse response;
  const grpc::Status status = stub_->LeasePrompts(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("max_prompts"));
}

TEST_F(ControllerServiceTest, UnknownRunTellsWorkersAndTrainerToStop) {
  grpc::ClientContext context;
  v1::LeasePromptsRequest request;
  request.set_run_id("run-gone");
  request.set_worker_id("w");
  request.set_max_prompts(1);
  v1::LeasePromptsResponse response;
  ASSERT_TRUE(stub_->LeasePrompts(&context, request, &response).ok());
  EXPECT_TRUE(response.run_done());
  EXPECT_TRUE(Report("run-gone", v1::TRAINER_STATE_TRAINING).stop());
}

TEST_F(ControllerServiceTest, ListRunsNewestFirst) {
  const std::string first = SubmitValid();
  const std::string second = SubmitValid();
  grpc::ClientContext context;
  v1::ListRunsRequest request;
  v1::ListRunsResponse response;
  ASSERT_TRUE(stub_->ListRuns(&context, request, &response).ok());
  ASSERT_EQ(response.runs_size(), 2);
  EXPECT_EQ(response.runs(0).run_id(), second);
  EXPECT_EQ(response.runs(1).run_id(), first);
}

// The paths a spec names are confined to --allowed-path-roots at SubmitRun,
// before any file is opened, in one message that tells nothing of what is
// outside: here the root is <tmp>/paths-root, beside it <tmp>/paths-outside
// holds a file, and root/escape is a symlink to it.
class ControllerServicePathTest : public ControllerServiceTest {
 protected:
  ControllerServicePathTest() : ControllerServiceTest(MakeRoots()) {}

  static std::string Dir() {
    return (std::filesystem::weakly_canonical(::testing::TempDir()) /
            absl::StrCat("paths-", ::testing::UnitTest::GetInstance()->current_test_info()->name()))
        .string();
  }
  static PathPolicy MakeRoots() {
    std::filesystem::remove_all(Dir());
    std::filesystem::create_directories(Dir() + "/root/models");
    std::filesystem::create_directories(Dir() + "/outside");
    std::ofstream(Dir() + "/outside/secret") << "x";
    std::filesystem::create_directory_symlink(Dir() + "/outside", Dir() + "/root/escape");
    return *PathPolicy::Create({Dir() + "/root"});
  }
  std::string Outside(const std::string& field, const std::string& path) {
    return absl::StrCat(field, " '", path, "' is outside the allowed roots [", Dir(),
                        "/root]; add its parent to --allowed-path-roots");
  }
  grpc::Status SubmitCheckpointDir(const std::string& dir) {
    v1::RunSpec spec = ValidSpec();
    spec.mutable_checkpoint()->set_dir(dir);
    v1::SubmitRunResponse response;
    return Submit(spec, &response);
  }
};

TEST_F(ControllerServicePathTest, CheckpointDirsOutsideTheRootsAreRefusedAlike) {
  for (const std::string& dir :
       {std::string("/etc/sluice-evil"), Dir() + "/root/../outside",
        Dir() + "/root/escape", Dir() + "/root/escape/new", Dir() + "/outside/secret",
        Dir() + "/outside/missing", Dir() + "/root/models/../../outside/secret"}) {
    const grpc::Status status = SubmitCheckpointDir(dir);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << dir;
    // The same words whether the path exists, is a file, or is missing.
    EXPECT_EQ(status.error_message(), Outside("checkpoint.dir", dir));
  }
  EXPECT_FALSE(std::filesystem::exists(runs_dir_));
  EXPECT_FALSE(std::filesystem::exists("/etc/sluice-evil"));
}

TEST_F(ControllerServicePathTest, ModelAndDatasetPathsOutsideAreRefusedBeforeTheyAreRead) {
  v1::RunSpec spec = ValidSpec();
  spec.mutable_model()->set_hf_model_dir("/etc");
  spec.mutable_task()->mutable_dataset()->set_path(Dir() + "/root/escape/secret");
  spec.mutable_task()->mutable_dataset()->set_format(v1::DATASET_FORMAT_GSM8K);
  v1::SubmitRunResponse response;
  const grpc::Status status = Submit(spec, &response, /*validate_only=*/true);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            absl::StrCat(Outside("model.hf_model_dir", "/etc"), "\n",
                         Outside("task.dataset.path", Dir() + "/root/escape/secret")));
}

TEST_F(ControllerServicePathTest, PathsInsideAreAcceptedAndRelativeOnesStoredResolved) {
  v1::RunSpec spec = ValidSpec();
  spec.mutable_checkpoint()->set_dir("checkpoints/run-a");
  v1::SubmitRunResponse response;
  const grpc::Status status = Submit(spec, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.run().spec().checkpoint().dir(), Dir() + "/root/checkpoints/run-a");
}

TEST_F(ControllerServicePathTest, AMissingModelInsideTheRootsIsStillNamed) {
  v1::RunSpec spec = ValidSpec();
  spec.mutable_model()->set_hf_model_dir(Dir() + "/root/models/qwen");
  v1::SubmitRunResponse response;
  const grpc::Status status = Submit(spec, &response, /*validate_only=*/true);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("model.hf_model_dir: \"" + Dir() +
                        "/root/models/qwen\" is not a directory readable by the controller"));
}

}  // namespace
}  // namespace sluice::controller
