// Cancelling a run that is large for this machine: the five real services
// as separate processes (`sluice up`'s deployment), a run whose rollout
// worker generates 4,096 sequences per batch, CancelRun while it generates,
// and what must follow within seconds: the worker holds no run and its
// memory stops growing, the trainer is idle. (The issue: CancelRun marked
// the run CANCELLED while the worker's memory kept growing.)
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "cli/local_stack.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/rollout_worker.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

// Generous: a liveness bound, not a speed target (the stop is measured and
// printed).
constexpr absl::Duration kStopBound = absl::Seconds(30);

// 64 prompts x 64 samples = 4,096 sequences per worker batch, far more than
// the 2 cores of a small machine generate in a moment; the trainer splits
// its batch into 8 minibatches so that its step stays within a few GiB.
v1::RunSpec LargeSpec() {
  v1::RunSpec spec;
  spec.set_name("cancel-large");
  spec.set_seed(5);
  spec.mutable_model()->set_builtin("tiny");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(99);
  arithmetic->set_num_operands(2);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(2000);
  spec.mutable_task()->set_eval_split_size(16);
  auto* alg = spec.mutable_algorithm();
  alg->set_group_size(64);
  alg->set_batch_size_groups(64);
  alg->set_minibatches_per_batch(8);
  alg->set_max_staleness(1);
  alg->set_total_steps(1000);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(32);
  return spec;
}

// VmRSS of `pid` in bytes, read with read(2): nullopt once the process is
// gone (an ifstream would throw on the vanished file).
std::optional<int64_t> RssBytes(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/status";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char buffer[4096];
  ssize_t n = 0;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
  close(fd);
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, "VmRSS:")) continue;
    line = absl::StripAsciiWhitespace(line);
    absl::ConsumeSuffix(&line, " kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(line, &kib)) return kib * 1024;
  }
  return std::nullopt;
}

// Polls `done` every 20 ms until it holds (true) or `timeout` passes
// (false). The services offer no watch of their own status, so this reads
// it as an operator would.
bool PollUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

class CancelProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("cancel");
    cli::LocalStackOptions options;
    options.bin_dir = testing::BinDir();
    options.state_dir = dir_ + "/stack";
    options.runs_dir = dir_ + "/runs";
    stack_ = std::make_unique<cli::LocalStack>(options);
    const absl::Status started = stack_->Start();
    ASSERT_TRUE(started.ok()) << started;
    for (const auto& e : stack_->endpoints()) endpoints_[e.name] = e;
    const auto channel = [&](const std::string& name) {
      return grpc::CreateChannel(endpoints_[name].grpc, grpc::InsecureChannelCredentials());
    };
    controller_ = v1::ControllerService::NewStub(channel("controller"));
    worker_ = v1::RolloutWorkerService::NewStub(channel("rollout_worker-0"));
    trainer_ = v1::TrainerService::NewStub(channel("trainer"));
  }

  void TearDown() override {
    if (stack_ != nullptr) stack_->Stop().IgnoreError();
  }

  v1::RolloutWorkerStatus WorkerStatus() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetWorkerStatusResponse response;
    EXPECT_TRUE(worker_->GetWorkerStatus(&context, {}, &response).ok());
    return response.status();
  }

  v1::TrainerStatus TrainerStatus() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetTrainerStatusResponse response;
    EXPECT_TRUE(trainer_->GetTrainerStatus(&context, {}, &response).ok());
    return response.status();
  }

  v1::Run GetRun(const std::string& run_id) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetRunRequest request;
    request.set_run_id(run_id);
    v1::GetRunResponse response;
    EXPECT_TRUE(controller_->GetRun(&context, request, &response).ok());
    return response.run();
  }

  std::string dir_;
  std::unique_ptr<cli::LocalStack> stack_;
  std::map<std::string, cli::ServiceEndpoint> endpoints_;
  std::unique_ptr<v1::ControllerService::Stub> controller_;
  std::unique_ptr<v1::RolloutWorkerService::Stub> worker_;
  std::unique_ptr<v1::TrainerService::Stub> trainer_;
};

TEST_F(CancelProcessTest, CancellingALargeRunStopsItsWorkEverywhereWithinSeconds) {
  std::string run_id;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::SubmitRunRequest request;
    *request.mutable_spec() = LargeSpec();
    v1::SubmitRunResponse response;
    const grpc::Status status = controller_->SubmitRun(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    run_id = response.run().run_id();
  }

  // Training, the worker past its first batch of 4,096 sequences and in the
  // middle of the next (generating or scoring it).
  ASSERT_TRUE(PollUntil(
      [&] {
        const v1::RolloutWorkerStatus worker = WorkerStatus();
        return worker.runs_size() == 1 && worker.runs(0).tokens_generated() > 0 &&
               worker.groups_in_flight() > 0 && GetRun(run_id).state() == v1::RUN_STATE_TRAINING;
      },
      absl::Minutes(3)))
      << "never generating: " << GetRun(run_id).ShortDebugString();
  const pid_t worker_pid = endpoints_["rollout_worker-0"].pid;
  const std::optional<int64_t> rss_generating = RssBytes(worker_pid);
  ASSERT_TRUE(rss_generating.has_value());

  const absl::Time cancelled_at = absl::Now();
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::CancelRunRequest request;
    request.set_run_id(run_id);
    v1::CancelRunResponse response;
    const grpc::Status status = controller_->CancelRun(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.run().state(), v1::RUN_STATE_CANCELLED);
  }
  const bool stopped = PollUntil(
      [&] {
        const v1::RolloutWorkerStatus worker = WorkerStatus();
        return worker.runs_size() == 0 && worker.groups_in_flight() == 0 &&
               TrainerStatus().state() == v1::TRAINER_STATE_IDLE;
      },
      kStopBound);
  const absl::Duration took = absl::Now() - cancelled_at;
  std::printf("cancel of a run generating 4,096 sequences per batch: stopped everywhere in %s "
              "(worker RSS %.0f MiB when cancelled)\n",
              absl::FormatDuration(took).c_str(), *rss_generating / 1048576.0);
  ASSERT_TRUE(stopped) << "after " << absl::FormatDuration(kStopBound) << ": worker "
                       << WorkerStatus().ShortDebugString() << "; trainer "
                       << TrainerStatus().ShortDebugString();

  // Nothing keeps allocating once stopped.
  const std::optional<int64_t> rss_stopped = RssBytes(worker_pid);
  ASSERT_TRUE(rss_stopped.has_value()) << "the worker process died";
  absl::SleepFor(absl::Seconds(3));
  const std::optional<int64_t> rss_later = RssBytes(worker_pid);
  ASSERT_TRUE(rss_later.has_value()) << "the worker process died";
  EXPECT_LE(*rss_later, *rss_stopped + (int64_t{32} << 20))
      << "stopped at " << *rss_stopped / 1048576 << " MiB, 3 s later " << *rss_later / 1048576;
  std::printf("worker RSS when stopped %.0f MiB, 3 s later %.0f MiB\n", *rss_stopped / 1048576.0,
              *rss_later / 1048576.0);

  const v1::Run run = GetRun(run_id);
  EXPECT_EQ(run.state(), v1::RUN_STATE_CANCELLED);
}

}  // namespace
}  // namespace sluice
