// The trainer's promise, on the real binaries: `kill -9` in the middle of a
// run, a new trainer process (at another address) given the same
// StartTraining, and the run resumes from its newest checkpoint, redoes the
// steps after it on the batches the buffer kept for them, and finishes.
//
// The test plays the controller (ConfigureRun, StartTraining) and a rollout
// worker (a feeder thread: slots from the admission gate, groups inserted at
// the buffer's version), so that it can hold the run still at a known step
// before the kill. Prints (and records as test properties) the seconds from
// the kill to the run's next step and the checkpoint's size.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
constexpr char kRun[] = "resume-process";
constexpr int kTotalSteps = 12;

absl::Time Soon() { return absl::Now() + absl::Seconds(120); }

struct Service {
  std::unique_ptr<Subprocess> process;
  std::string grpc;
  std::string log_path;
};

Service Start(const std::string& binary, const std::string& log_path,
              const std::vector<std::string>& flags = {}) {
  Service service;
  service.log_path = log_path;
  SubprocessOptions options;
  options.argv = {testing::BinDir() + "/" + binary, "--listen=127.0.0.1:0", "--metrics-port=0",
                  "--ready-fd=3"};
  options.argv.insert(options.argv.end(), flags.begin(), flags.end());
  options.log_path = log_path;
  options.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return service;
  service.process = std::move(*process);
  absl::StatusOr<std::string> ready = service.process->WaitReady(Soon());
  EXPECT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(log_path);
  if (!ready.ok()) return service;
  service.grpc = nlohmann::json::parse(*ready)["grpc"];
  return service;
}

template <typename GrpcService>
std::unique_ptr<typename GrpcService::Stub> Connect(const std::string& target) {
  return GrpcService::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
}

void SetDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
}

// Group `n` at `version`: a prompt of digit tokens, four completions of which
// one or two are rewarded.
v1::Group MakeGroup(int n, int64_t version, const std::string& lease) {
  v1::Group group;
  group.set_run_id(kRun);
  group.set_group_id(absl::StrCat("g", n));
  group.set_idempotency_key(absl::StrCat(kRun, "/g", n));
  group.set_slot_lease_id(lease);
  for (int i = 0; i < 4; ++i) {
    v1::Trajectory* t = group.add_trajectories();
    for (int token : {5 + n % 10, 16, 5 + (n / 10) % 10, 17}) t->add_prompt_token_ids(token);
    for (int token : {5 + (n + i) % 10, 2}) {
      t->add_completion_token_ids(token);
      t->add_behaviour_logprobs(-2.0f);
      t->add_token_policy_versions(version);
    }
    t->set_reward((n + i) % 3 == 0 ? 1.0 : 0.0);
    t->set_finish_reason(v1::FINISH_REASON_STOP);
  }
  return group;
}

// A rollout worker's part: while running, takes slots from the gate and
// fills them with groups at the buffer's version.
class Feeder {
 public:
  explicit Feeder(const std::string& buffer) : stub_(Connect<v1::ReplayBufferService>(buffer)) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Feeder() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  // Pausing returns once no insert is in flight: nothing reaches the buffer
  // after it (slots already taken are left to expire).
  void set_paused(bool paused) {
    absl::MutexLock lock(&mu_);
    paused_ = paused;
    if (paused) mu_.Await(absl::Condition(this, &Feeder::IdleLocked));
  }

 private:
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !inserting_; }
  bool RunnableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !paused_; }

  void Loop() {
    int next = 0;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Feeder::RunnableLocked));
        if (stop_) return;
      }
      v1::AcquireGenerationSlotsRequest acquire;
      acquire.set_run_id(kRun);
      acquire.set_worker_id("feeder");
      acquire.set_worker_incarnation(1);
      acquire.set_num_groups(2);
      acquire.set_wait_timeout_ms(200);
      v1::AcquireGenerationSlotsResponse slots;
      {
        grpc::ClientContext context;
        SetDeadline(context);
        if (!stub_->AcquireGenerationSlots(&context, acquire, &slots).ok()) continue;
      }
      {
        absl::MutexLock lock(&mu_);
        // Paused meanwhile: the slots are left to expire on their own.
        if (slots.lease_ids().empty() || paused_ || stop_) continue;
        inserting_ = true;
      }
      v1::InsertGroupsRequest insert;
      for (const std::string& lease : slots.lease_ids()) {
        *insert.add_groups() = MakeGroup(next++, slots.policy_version(), lease);
      }
      grpc::ClientContext context;
      SetDeadline(context);
      auto stream = stub_->InsertGroups(&context);
      v1::InsertGroupsResponse acked;
      if (stream->Write(insert)) stream->Read(&acked);
      stream->WritesDone();
      (void)stream->Finish();
      absl::MutexLock lock(&mu_);
      inserting_ = false;
    }
  }

  std::unique_ptr<v1::ReplayBufferService::Stub> stub_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool inserting_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

v1::TrainerStatus Status(v1::TrainerService::Stub& trainer) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetTrainerStatusResponse response;
  EXPECT_TRUE(trainer.GetTrainerStatus(&context, {}, &response).ok());
  return response.status();
}

v1::BufferStats BufferStats(v1::ReplayBufferService::Stub& buffer) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetStatsRequest request;
  request.set_run_id(kRun);
  v1::GetStatsResponse response;
  EXPECT_TRUE(buffer.GetStats(&context, request, &response).ok());
  return response.stats();
}

// Polls `trainer` until `done` holds of its status or `timeout` passes.
v1::TrainerStatus WaitFor(v1::TrainerService::Stub& trainer,
                          const std::function<bool(const v1::TrainerStatus&)>& done,
                          absl::Duration timeout = absl::Seconds(120)) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::TrainerStatus status = Status(trainer);
  while (!done(status) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    status = Status(trainer);
  }
  return status;
}

TEST(TrainerResumeProcessTest, AKilledTrainerProcessResumesTheRunFromItsCheckpoint) {
  const std::string dir = testing::MakeTempDir("trainer-resume");
  Service buffer = Start("sluice-replay-buffer", dir + "/buffer.log");
  Service reward = Start("sluice-reward-server", dir + "/reward.log");
  Service trainer =
      Start("sluice-trainer", dir + "/trainer1.log", {"--allowed-path-roots=" + dir});
  ASSERT_TRUE(buffer.process && reward.process && trainer.process);
  auto buffer_stub = Connect<v1::ReplayBufferService>(buffer.grpc);
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::ConfigureRunRequest configure;
    configure.set_run_id(kRun);
    configure.set_batch_size_groups(2);
    configure.set_max_staleness(1);
    configure.set_group_size(4);
    v1::ConfigureRunResponse configured;
    ASSERT_TRUE(buffer_stub->ConfigureRun(&context, configure, &configured).ok());
  }
  v1::StartTrainingRequest start;
  start.set_run_id(kRun);
  v1::RunSpec& spec = *start.mutable_spec();
  spec.set_seed(5);
  spec.mutable_model()->set_builtin("tiny");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(40);
  arithmetic->set_num_operands(2);
  spec.mutable_task()->set_eval_split_size(4);
  spec.mutable_algorithm()->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  spec.mutable_algorithm()->set_group_size(4);
  spec.mutable_algorithm()->set_batch_size_groups(2);
  spec.mutable_algorithm()->set_max_staleness(1);
  spec.mutable_algorithm()->set_learning_rate(1e-3);
  spec.mutable_algorithm()->set_total_steps(kTotalSteps);
  // The feeder makes its groups up (log-probs of -2): verified, every one
  // would be left out and the feeder quarantined. This test is about resuming.
  spec.mutable_algorithm()->mutable_rollout_verification()->set_fraction(0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(3);
  spec.mutable_reward()->add_verifiers()->set_name("math");
  spec.mutable_checkpoint()->set_dir(dir + "/checkpoints");
  spec.mutable_checkpoint()->set_every_n_steps(4);
  start.mutable_endpoints()->set_replay_buffer_address(buffer.grpc);
  start.mutable_endpoints()->set_reward_server_address(reward.grpc);

  auto trainer_stub = Connect<v1::TrainerService>(trainer.grpc);
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::StartTrainingResponse started;
    const grpc::Status status = trainer_stub->StartTraining(&context, start, &started);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  Feeder feeder(buffer.grpc);
  // Past the checkpoint of step 4, then no more data: the trainer goes on
  // with what the gate had let in (up to eta + 1 = 2 batches more), so it
  // waits for step 6, 7 or 8 with 1 to 3 steps after its checkpoint.
  v1::TrainerStatus before = WaitFor(*trainer_stub, [](const v1::TrainerStatus& s) {
    return s.step() >= 5 || s.state() == v1::TRAINER_STATE_FAILED;
  });
  feeder.set_paused(true);
  ASSERT_GE(before.step(), 5) << before.last_error() << testing::ReadFile(trainer.log_path);
  // Nothing more comes in; the trainer has stopped once it waits for data,
  // has trained the last batch the buffer handed it, and the buffer holds
  // less than a batch. (Not "its step did not move for a while": on a loaded
  // machine a step can take that long.)
  before = WaitFor(*trainer_stub, [&](const v1::TrainerStatus& s) {
    if (s.state() == v1::TRAINER_STATE_FAILED) return true;
    if (s.state() != v1::TRAINER_STATE_WAITING_FOR_DATA) return false;
    const v1::BufferStats stats = BufferStats(*buffer_stub);
    return stats.last_recorded_step() == s.step() && stats.size_groups() < 2;
  });
  ASSERT_EQ(before.state(), v1::TRAINER_STATE_WAITING_FOR_DATA)
      << before.last_error() << testing::ReadFile(trainer.log_path);
  ASSERT_LE(before.step(), 7);
  ASSERT_EQ(before.state(), v1::TRAINER_STATE_WAITING_FOR_DATA);
  const uint64_t first_incarnation = before.incarnation();

  ASSERT_TRUE(trainer.process->Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(trainer.process->Wait(Soon()).ok());
  const v1::BufferStats at_kill = BufferStats(*buffer_stub);
  EXPECT_EQ(at_kill.policy_version(), before.step());
  int64_t newest = 0;
  int64_t checkpoint_bytes = 0;
  for (const auto& entry : fs::directory_iterator(dir + "/checkpoints")) {
    const std::string name = entry.path().filename();
    if (name.rfind("step-", 0) != 0) continue;
    const int64_t at = std::stoll(name.substr(5));
    if (at <= newest) continue;
    newest = at;
    checkpoint_bytes = 0;
    for (const auto& file : fs::directory_iterator(entry.path())) {
      checkpoint_bytes += static_cast<int64_t>(file.file_size());
    }
  }
  EXPECT_EQ(newest, 4);
  EXPECT_EQ(at_kill.committed_step(), newest);
  EXPECT_EQ(at_kill.last_recorded_step(), before.step());  // the next had no batch yet
  EXPECT_EQ(at_kill.retained_groups(), (before.step() - newest) * 2);

  // Its supervisor starts it again, at another address; the controller
  // sends the run again.
  feeder.set_paused(false);
  Service second =
      Start("sluice-trainer", dir + "/trainer2.log", {"--allowed-path-roots=" + dir});
  ASSERT_NE(second.process, nullptr);
  auto second_stub = Connect<v1::TrainerService>(second.grpc);
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::StartTrainingResponse started;
    const grpc::Status status = second_stub->StartTraining(&context, start, &started);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const v1::TrainerStatus next = WaitFor(*second_stub, [&](const v1::TrainerStatus& s) {
    return s.step() > newest || s.state() == v1::TRAINER_STATE_FAILED;
  });
  const double seconds_to_next_step = absl::ToDoubleSeconds(absl::Now() - killed);
  ASSERT_GT(next.step(), newest) << next.last_error() << testing::ReadFile(second.log_path);
  const v1::TrainerStatus done = WaitFor(*second_stub, [](const v1::TrainerStatus& s) {
    return s.state() == v1::TRAINER_STATE_FINISHED || s.state() == v1::TRAINER_STATE_FAILED;
  });
  ASSERT_EQ(done.state(), v1::TRAINER_STATE_FINISHED)
      << done.last_error() << testing::ReadFile(second.log_path);
  EXPECT_EQ(done.step(), kTotalSteps);
  EXPECT_EQ(done.resumed_from_step(), newest);
  EXPECT_EQ(done.steps_redone(), before.step() - newest);
  EXPECT_NE(done.incarnation(), first_incarnation);
  EXPECT_THAT(testing::ReadFile(second.log_path), ::testing::HasSubstr("resumed from a checkpoint"));

  const v1::BufferStats after = BufferStats(*buffer_stub);
  EXPECT_EQ(after.policy_version(), kTotalSteps);
  EXPECT_EQ(after.committed_step(), kTotalSteps);
  EXPECT_EQ(after.retained_groups(), 0);
  // The redone steps were handed their batches again; so was, perhaps, the
  // dead trainer's last Sample, still waiting in the buffer (up to its 1 s
  // timeout) when the new one asked for the same step: whichever got the
  // batch first recorded it, the other had it replayed.
  EXPECT_GE(after.replayed_batches(), before.step() - newest);
  EXPECT_LE(after.replayed_batches(), before.step() - newest + 1);

  std::printf("trainer resume: killed at step %lld, resumed from %lld, %lld steps redone; "
              "%.2f s from the kill to the next step; checkpoint of the tiny model %lld bytes\n",
              static_cast<long long>(before.step()), static_cast<long long>(newest),
              static_cast<long long>(done.steps_redone()), seconds_to_next_step,
              static_cast<long long>(checkpoint_bytes));
  ::testing::Test::RecordProperty("seconds_from_kill_to_next_step",
                                  absl::StrCat(seconds_to_next_step));
  ::testing::Test::RecordProperty("checkpoint_bytes", absl::StrCat(checkpoint_bytes));
  for (Service* service : {&second, &reward, &buffer}) {
    ASSERT_TRUE(service->process->Signal(SIGTERM).ok());
    ASSERT_TRUE(service->process->Wait(Soon()).ok());
  }
}

}  // namespace
}  // namespace sluice
