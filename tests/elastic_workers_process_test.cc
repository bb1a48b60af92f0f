// Elastic rollout workers: a worker started by hand with nothing but the
// controller's address joins a running run and generates for it; stopped
// again, it leaves and the run goes on to SUCCEEDED. The generation rate with
// one, two and again one worker is printed (the test asserts what each
// worker did, not speed).
#include <signal.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/health_client.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

v1::RunSpec LongSpec() {
  v1::RunSpec spec;
  spec.set_name("elastic");
  spec.set_seed(5);
  spec.mutable_model()->set_builtin("micro");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->set_num_operands(2);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(400);
  spec.mutable_task()->set_eval_split_size(20);
  spec.mutable_warm_start()->set_sft_steps(20);
  spec.mutable_warm_start()->set_batch_size(32);
  auto* alg = spec.mutable_algorithm();
  alg->set_group_size(4);
  alg->set_batch_size_groups(4);
  alg->set_max_staleness(4);
  alg->set_total_steps(800);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(4);
  spec.mutable_rollout()->set_max_concurrent_groups_per_worker(4);
  spec.mutable_eval()->set_every_n_steps(1000);
  return spec;
}

class ElasticWorkersProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("elastic");
    SubprocessOptions up;
    up.argv = {testing::BinDir() + "/sluice", "up", "--state-dir=" + dir_ + "/stack",
               "--runs-dir=" + dir_ + "/runs", "--rollout-workers=1",
               absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
    up.log_path = dir_ + "/up.log";
    up.ready_pipe = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(up);
    ASSERT_TRUE(started.ok()) << started.status();
    up_ = std::move(*started);
    absl::StatusOr<std::string> ready = up_->WaitReady(absl::Now() + absl::Minutes(2));
    ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(dir_ + "/up.log");
    const nlohmann::json endpoints = nlohmann::json::parse(testing::ReadFile(*ready));
    controller_address_ = endpoints["services"]["controller"]["grpc"].get<std::string>();
    controller_ = v1::ControllerService::NewStub(
        grpc::CreateChannel(controller_address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (extra_ != nullptr) extra_->Stop(absl::Seconds(10));
    if (up_ == nullptr) return;
    up_->Signal(SIGTERM).IgnoreError();
    EXPECT_TRUE(up_->Wait(absl::Now() + absl::Seconds(60)).ok());
  }

  v1::Run Get(const std::string& run_id) {
    grpc::ClientContext context;
    v1::GetRunRequest request;
    request.set_run_id(run_id);
    v1::GetRunResponse response;
    EXPECT_TRUE(controller_->GetRun(&context, request, &response).ok());
    return response.run();
  }

  // Follows the run (testing::AwaitRun: WatchRun, reopened while the
  // controller is away) until `done` holds or `timeout` passes.
  v1::Run AwaitRun(const std::string& run_id, const std::function<bool(const v1::Run&)>& done,
                   absl::Duration timeout) {
    return testing::AwaitRun(*controller_, run_id, done, timeout);
  }


  // Completion tokens per second over the next `steps` steps.
  double Rate(const std::string& run_id, int steps) {
    const v1::Run start = Get(run_id);
    const absl::Time t0 = absl::Now();
    const v1::Run end = AwaitRun(
        run_id, [&](const v1::Run& r) { return r.progress().step() >= start.progress().step() + steps; },
        absl::Minutes(2));
    return static_cast<double>(end.summary().tokens_generated() -
                               start.summary().tokens_generated()) /
           absl::ToDoubleSeconds(absl::Now() - t0);
  }

  std::string dir_;
  std::string controller_address_;
  std::unique_ptr<Subprocess> up_;
  std::unique_ptr<Subprocess> extra_;
  std::unique_ptr<v1::ControllerService::Stub> controller_;
};

TEST_F(ElasticWorkersProcessTest, AWorkerJoinsARunningRunAndLeavesIt) {
  std::string run_id;
  {
    grpc::ClientContext context;
    v1::SubmitRunRequest request;
    *request.mutable_spec() = LongSpec();
    v1::SubmitRunResponse response;
    const grpc::Status status = controller_->SubmitRun(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    run_id = response.run().run_id();
  }
  v1::Run run = AwaitRun(
      run_id, [](const v1::Run& r) { return r.progress().step() >= 5; }, absl::Minutes(3));
  ASSERT_GE(run.progress().step(), 5) << run.error_message();
  ASSERT_EQ(run.progress().workers_live(), 1);
  const double one = Rate(run_id, 60);

  // Join: nothing but the controller's address.
  SubprocessOptions worker;
  worker.argv = {testing::BinDir() + "/sluice-rollout-worker",
                 "--controller-address=" + controller_address_,
                 "--worker-id=extra",
                 "--listen-address=127.0.0.1:0",
                 "--metrics-port=0",
                 "--torch-threads=1",
                 absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
  worker.env.emplace_back("OPENBLAS_NUM_THREADS", "1");
  worker.log_path = dir_ + "/extra-worker.log";
  worker.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(worker);
  ASSERT_TRUE(started.ok()) << started.status();
  extra_ = std::move(*started);
  absl::StatusOr<std::string> ready = extra_->WaitReady(absl::Now() + absl::Minutes(1));
  ASSERT_TRUE(ready.ok()) << ready.status() << testing::ReadFile(worker.log_path);
  const std::string metrics = nlohmann::json::parse(*ready).value("metrics", "");

  run = AwaitRun(
      run_id, [](const v1::Run& r) { return r.progress().workers_live() == 2; }, absl::Minutes(1));
  ASSERT_EQ(run.progress().workers_live(), 2) << testing::ReadFile(worker.log_path);
  const double two = Rate(run_id, 60);
  // It generated and inserted groups for the run.
  absl::StatusOr<std::string> scraped = runtime::HttpGet(metrics, absl::Seconds(5));
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  EXPECT_GT(testing::MetricSum(*scraped, "sluice_rollout_groups_inserted_total"), 0) << *scraped;

  // Leave: a graceful stop (a scale-down) tells the controller at once; the
  // run goes on with one worker.
  ASSERT_TRUE(extra_->Signal(SIGTERM).ok());
  ASSERT_TRUE(extra_->Wait(absl::Now() + absl::Seconds(30)).ok());
  extra_.reset();
  run = AwaitRun(
      run_id, [](const v1::Run& r) { return r.progress().workers_live() == 1; }, absl::Seconds(5));
  EXPECT_EQ(run.progress().workers_live(), 1);
  EXPECT_EQ(run.summary().recovery().workers_lost(), 0);  // It left; it was not lost.
  const double again = Rate(run_id, 60);
  std::printf("elastic: completion tokens/s with 1 worker %.0f, 2 workers %.0f, 1 worker %.0f\n",
              one, two, again);

  run = AwaitRun(
      run_id,
      [](const v1::Run& r) {
        return r.state() == v1::RUN_STATE_SUCCEEDED || r.state() == v1::RUN_STATE_FAILED;
      },
      absl::Minutes(5));
  ASSERT_EQ(v1::RunState_Name(run.state()), "RUN_STATE_SUCCEEDED") << run.error_message();
  EXPECT_GE(run.summary().recovery().workers_joined(), 2);
}

// A copy-paste in a deployment: a second process started with the worker id
// of the stack's live worker-0. It is refused, not taken for a restart of
// worker-0: worker-0 keeps serving the run, both are told loudly, and the
// run's record counts no restart.
TEST_F(ElasticWorkersProcessTest, ASecondProcessWithALiveWorkersIdIsRefusedNotARestart) {
  std::string run_id;
  {
    grpc::ClientContext context;
    v1::SubmitRunRequest request;
    *request.mutable_spec() = LongSpec();
    v1::SubmitRunResponse response;
    const grpc::Status status = controller_->SubmitRun(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    run_id = response.run().run_id();
  }
  v1::Run run = AwaitRun(
      run_id, [](const v1::Run& r) { return r.progress().step() >= 2; }, absl::Minutes(3));
  ASSERT_GE(run.progress().step(), 2) << run.error_message();

  SubprocessOptions worker;
  worker.argv = {testing::BinDir() + "/sluice-rollout-worker",
                 "--controller-address=" + controller_address_,
                 "--worker-id=worker-0",
                 "--listen-address=127.0.0.1:0",
                 "--metrics-port=0",
                 "--torch-threads=1",
                 absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
  worker.env.emplace_back("OPENBLAS_NUM_THREADS", "1");
  worker.log_path = dir_ + "/duplicate-worker.log";
  worker.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(worker);
  ASSERT_TRUE(started.ok()) << started.status();
  extra_ = std::move(*started);
  ASSERT_TRUE(extra_->WaitReady(absl::Now() + absl::Minutes(1)).ok())
      << testing::ReadFile(worker.log_path);

  // The holder is told (ListWorkers shows the conflict); the newcomer says
  // in its log that it is refused.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  v1::WorkerInfo holder;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(controller_->ListWorkers(&context, v1::ListWorkersRequest(), &workers).ok());
    for (const v1::WorkerInfo& info : workers.workers()) {
      if (info.worker_id() == "worker-0") holder = info;
    }
    if (!holder.conflict().empty() &&
        absl::StrContains(testing::ReadFile(worker.log_path), "another live process")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_TRUE(absl::StrContains(holder.conflict(), "asked for this worker id and was refused"))
      << holder.DebugString();
  EXPECT_EQ(holder.restarts(), 0);
  EXPECT_TRUE(holder.live());
  EXPECT_TRUE(absl::StrContains(testing::ReadFile(worker.log_path),
                                "the controller refuses this worker: another live process has "
                                "the same worker id"))
      << testing::ReadFile(worker.log_path);

  // worker-0 serves on: the run moves, nothing counts a restart.
  const int64_t step = Get(run_id).progress().step();
  run = AwaitRun(
      run_id,
      [&](const v1::Run& r) {
        return r.progress().step() >= step + 5 || r.state() == v1::RUN_STATE_SUCCEEDED ||
               r.state() == v1::RUN_STATE_FAILED;
      },
      absl::Minutes(2));
  EXPECT_NE(run.state(), v1::RUN_STATE_FAILED) << run.error_message();
  EXPECT_TRUE(run.progress().step() >= step + 5 || run.state() == v1::RUN_STATE_SUCCEEDED);
  EXPECT_EQ(run.summary().recovery().restarts().count("rollout_worker"), 0u)
      << run.summary().recovery().DebugString();
  const std::string controller_log = testing::ReadFile(dir_ + "/stack/logs/controller.log");
  EXPECT_FALSE(absl::StrContains(controller_log, "rollout worker restarted"));
  EXPECT_TRUE(absl::StrContains(controller_log, "two live processes claim one rollout worker id"));
}

}  // namespace
}  // namespace sluice
