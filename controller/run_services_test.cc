#include "controller/run_services.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "controller/fake_service_clients.h"
#include "controller/worker_registry.h"
#include "gtest/gtest.h"

namespace sluice::controller {
namespace {

using testing::FakeBuffer;
using testing::FakeTrainer;

v1::RunSpec Spec() {
  v1::RunSpec spec;
  spec.set_name("small");
  spec.set_seed(7);
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_algorithm()->set_group_size(4);
  spec.mutable_algorithm()->set_batch_size_groups(2);
  spec.mutable_algorithm()->set_max_staleness(2);
  spec.mutable_algorithm()->set_staleness_bound(v1::STALENESS_BOUND_TOKEN);
  spec.mutable_buffer()->set_capacity_groups(64);
  spec.mutable_checkpoint()->set_dir("/tmp/checkpoints");
  spec.mutable_checkpoint()->set_every_n_steps(5);
  spec.mutable_rollout()->set_num_workers(2);
  return spec;
}

// Services set up and released through fakes of the clients
// (fake_service_clients.h) and a real worker registry, heartbeated by hand.
class RunServicesTest : public ::testing::Test {
 protected:
  RunServicesTest() {
    clients_.trainer = trainer_;
    clients_.replay_buffer = buffer_;
    clients_.workers = workers_;
    endpoints_.set_replay_buffer_address("buffer:1");
    endpoints_.set_reward_server_address("reward:1");
  }

  std::unique_ptr<RunServices> Make(const std::string& run_id = "run-1") {
    return std::make_unique<RunServices>(run_id, Spec(), RunSizes{100, 300}, clients_, endpoints_);
  }

  // A heartbeat of `worker_id` serving `serving` with groups in flight ("" =
  // nothing); the run ids it is assigned.
  std::vector<std::string> Heartbeat(const std::string& worker_id,
                                     const std::string& serving = "") {
    v1::WorkerHeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_incarnation(1);
    request.set_address("worker:1");
    request.mutable_status()->set_worker_id(worker_id);
    request.mutable_status()->set_incarnation(1);
    if (!serving.empty()) {
      v1::RolloutRunStatus* run = request.mutable_status()->add_runs();
      run->set_run_id(serving);
      run->set_groups_in_flight(2);
    }
    absl::StatusOr<v1::WorkerHeartbeatResponse> response = workers_->Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    std::vector<std::string> runs;
    if (response.ok()) {
      for (const v1::RolloutAssignment& a : response->assignments()) runs.push_back(a.run_id());
    }
    return runs;
  }

  std::shared_ptr<FakeTrainer> trainer_ = std::make_shared<FakeTrainer>();
  std::shared_ptr<FakeBuffer> buffer_ = std::make_shared<FakeBuffer>();
  std::shared_ptr<WorkerRegistry> workers_ = std::make_shared<WorkerRegistry>();
  ServiceClients clients_;
  v1::ServiceEndpoints endpoints_;
};

TEST_F(RunServicesTest, ConfigureRunCarriesTheSpecAndTheSizes) {
  std::unique_ptr<RunServices> services = Make();
  ASSERT_TRUE(services->ConfigureBuffer().ok());
  const v1::ConfigureRunRequest configure = buffer_->configure_request();
  EXPECT_EQ(configure.run_id(), "run-1");
  EXPECT_EQ(configure.config().capacity_groups(), 64);
  EXPECT_EQ(configure.batch_size_groups(), 2);
  EXPECT_EQ(configure.max_staleness(), 2);
  EXPECT_EQ(configure.staleness_bound(), v1::STALENESS_BOUND_TOKEN);
  EXPECT_EQ(configure.group_size(), 4);
  EXPECT_EQ(configure.initial_policy_version(), 0);
  EXPECT_EQ(configure.seed(), 7u);
  EXPECT_GT(configure.vocab_size(), 0);  // The builtin model's.
  EXPECT_DOUBLE_EQ(configure.min_reward(), 0.0);
  EXPECT_DOUBLE_EQ(configure.max_reward(), 1.0);
  EXPECT_EQ(configure.max_sequence_tokens(), 300);
  EXPECT_EQ(configure.retained_step_batches(), 5);  // Until a checkpoint covers them.
}

TEST_F(RunServicesTest, StartTrainingCarriesTheRunAndIsResentAsIs) {
  std::unique_ptr<RunServices> services = Make();
  ASSERT_TRUE(services->StartTraining().ok());
  v1::StartTrainingRequest start = trainer_->start_request();
  EXPECT_EQ(start.run_id(), "run-1");
  EXPECT_EQ(start.spec().seed(), 7u);
  EXPECT_EQ(start.endpoints().replay_buffer_address(), "buffer:1");
  EXPECT_EQ(start.max_prompt_tokens(), 100);
  // A trainer that restarted gets the same request again.
  trainer_->Restart(2, 3, 0);
  ASSERT_TRUE(services->ResumeTraining().ok());
  EXPECT_EQ(trainer_->starts(), 2);
  EXPECT_EQ(trainer_->start_request().SerializeAsString(), start.SerializeAsString());
}

TEST_F(RunServicesTest, ServiceErrorsComeBackAsTheyAre) {
  std::unique_ptr<RunServices> services = Make();
  trainer_->FailStart(absl::ResourceExhaustedError("not enough memory"));
  const absl::Status status = services->StartTraining();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CallFailure("trainer", services->trainer_address(), "StartTraining", status),
            "trainer (trainer:1) refused StartTraining: RESOURCE_EXHAUSTED: not enough memory");
  EXPECT_EQ(CallFailure("replay_buffer", services->buffer_address(), "ConfigureRun",
                        absl::UnavailableError("connection refused")),
            "replay_buffer (buffer:1) is unreachable: connection refused");
}

TEST_F(RunServicesTest, ReleaseStopsOnlyWhatWasStarted) {
  std::unique_ptr<RunServices> services = Make();
  services->Release();
  EXPECT_EQ(trainer_->stops(), 0);  // Never started.

  // Even a start that failed may have started it.
  trainer_->FailStart(absl::DeadlineExceededError("slow"));
  EXPECT_FALSE(services->StartTraining().ok());
  services->Release();
  EXPECT_EQ(trainer_->stops(), 1);
  EXPECT_EQ(trainer_->stop_request().run_id(), "run-1");
  EXPECT_TRUE(trainer_->stop_request().checkpoint());  // The spec has a checkpoint dir.
}

TEST_F(RunServicesTest, ReadoptedRunsTrainerIsStoppedOnRelease) {
  std::unique_ptr<RunServices> services = Make();
  services->MarkTrainerStarted();
  services->Release();
  EXPECT_EQ(trainer_->stops(), 1);
  EXPECT_EQ(trainer_->starts(), 0);
}

TEST_F(RunServicesTest, WorkersPullTheOfferedRunUntilItIsWithdrawn) {
  std::unique_ptr<RunServices> services = Make();
  EXPECT_TRUE(Heartbeat("w1").empty());
  EXPECT_FALSE(services->offered_to_workers());
  services->OfferToWorkers();
  services->OfferToWorkers();  // Once.
  EXPECT_TRUE(services->offered_to_workers());
  EXPECT_EQ(Heartbeat("w1"), std::vector<std::string>{"run-1"});
  services->WithdrawFromWorkers();
  EXPECT_TRUE(Heartbeat("w1").empty());
}

TEST_F(RunServicesTest, ReleaseWithdrawsFromTheWorkers) {
  std::unique_ptr<RunServices> services = Make();
  services->OfferToWorkers();
  EXPECT_EQ(Heartbeat("w1"), std::vector<std::string>{"run-1"});
  services->Release();
  EXPECT_TRUE(Heartbeat("w1").empty());
  EXPECT_EQ(trainer_->stops(), 0);
}

TEST_F(RunServicesTest, NoWorkerRegistryOffersNothing) {
  clients_.workers = nullptr;
  std::unique_ptr<RunServices> services = Make();
  services->OfferToWorkers();
  EXPECT_FALSE(services->offered_to_workers());
  services->WithdrawFromWorkers();
  services->Release();
}

TEST_F(RunServicesTest, OtherRunHolderNamesTheTrainerOrWorkerStillBusy) {
  std::unique_ptr<RunServices> services = Make("run-2");
  EXPECT_EQ(services->OtherRunHolder(), "");

  // The trainer trains run-1.
  std::unique_ptr<RunServices> first = Make("run-1");
  ASSERT_TRUE(first->StartTraining().ok());
  EXPECT_EQ(services->OtherRunHolder(),
            "trainer (trainer:1) with run run-1 (TRAINER_STATE_LOADING)");
  trainer_->SetRunState("run-1", v1::TRAINER_STATE_FINISHED);
  EXPECT_EQ(services->OtherRunHolder(), "");
  // Its own run is no other run.
  trainer_->SetRunState("run-1", v1::TRAINER_STATE_TRAINING);
  EXPECT_EQ(first->OtherRunHolder(), "");
  first->Release();

  // A worker still generating for run-1.
  Heartbeat("w1", "run-1");
  EXPECT_EQ(services->OtherRunHolder(), "rollout worker w1 (worker:1) with run run-1");
  Heartbeat("w1");
  EXPECT_EQ(services->OtherRunHolder(), "");
  // An unreachable trainer is left to StartTraining to name.
  trainer_->FailStatus(absl::UnavailableError("down"));
  EXPECT_EQ(services->OtherRunHolder(), "");
}

TEST_F(RunServicesTest, LostWorkersSlotsAreReleasedInTheBuffer) {
  std::unique_ptr<RunServices> services = Make();
  ASSERT_TRUE(services->ReleaseWorkerSlots("w1").ok());
  EXPECT_EQ(buffer_->released(), std::vector<std::string>{"run-1/w1"});
  absl::StatusOr<v1::GetStatsResponse> stats = services->BufferStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->stats().run_id(), "run-1");
}

}  // namespace
}  // namespace sluice::controller
