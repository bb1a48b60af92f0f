// A service killed with SIGKILL and started again at the same address, as its
// supervisor would: the retrying clients of the services that call it
// (services/clients/retrying_clients.h) wait for it and carry on, over the
// real binaries and real gRPC channels that reconnect by themselves.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/clients/grpc_clients.h"
#include "services/clients/retrying_clients.h"
#include "services/runtime/health_client.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/reward_server.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

struct Service {
  std::unique_ptr<Subprocess> process;
  std::string grpc;
  std::string metrics;
};

// Starts `binary` listening on `listen` ("127.0.0.1:0" picks a port).
Service StartService(const std::string& binary, const std::string& listen,
                     const std::string& log_path, std::vector<std::string> extra = {}) {
  Service service;
  SubprocessOptions options;
  options.argv = {testing::BinDir() + "/" + binary, "--listen-address=" + listen,
                  "--metrics-port=0", absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
  for (std::string& flag : extra) options.argv.push_back(std::move(flag));
  options.env.emplace_back("OPENBLAS_NUM_THREADS", "1");
  options.log_path = log_path;
  options.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return service;
  service.process = std::move(*process);
  absl::StatusOr<std::string> ready = service.process->WaitReady(Soon());
  EXPECT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(log_path);
  if (!ready.ok()) return service;
  const nlohmann::json info = nlohmann::json::parse(*ready);
  service.grpc = info["grpc"];
  service.metrics = info["metrics"];
  return service;
}

uint64_t RewardServerIncarnation(const std::string& target) {
  auto stub = v1::RewardService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::ListVerifiersResponse response;
  const grpc::Status status = stub->ListVerifiers(&context, v1::ListVerifiersRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.incarnation();
}

v1::ScoreBatchRequest ThreeItems() {
  v1::ScoreBatchRequest request;
  request.add_composition()->set_name("math");
  for (int i = 0; i < 3; ++i) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id(absl::StrCat(i));
    item->set_verifier("math");
    item->set_response(absl::StrCat("the answer is \\boxed{", i + 1, "}"));
    item->set_reference_answer("2");
  }
  return request;
}

// Two-sided: while the reward server is dead, a rollout worker's ScoreBatch
// waits in its retries (it neither fails nor returns made-up scores); once
// the server is back at its address the same call returns the real scores.
// The restarted server says it is a new incarnation.
TEST(ServiceRestartProcessTest, ScoreBatchRidesOutARewardServerKilledAndRestartedAtItsAddress) {
  const std::string dir = testing::MakeTempDir("reward-restart");
  Service first = StartService("sluice-reward-server", "127.0.0.1:0", dir + "/reward1.log");
  ASSERT_NE(first.process, nullptr);
  ASSERT_FALSE(first.grpc.empty());
  const uint64_t first_incarnation = RewardServerIncarnation(first.grpc);
  EXPECT_GT(first_incarnation, 0u);

  std::atomic<int> retries{0};
  clients::RetryOptions options;
  options.initial_backoff = absl::Milliseconds(50);
  options.max_backoff = absl::Milliseconds(500);
  options.deadline = absl::Minutes(2);
  options.observer = [&](const clients::RetryEvent& event) {
    if (event.kind == clients::RetryEvent::Kind::kRetry) ++retries;
  };
  std::unique_ptr<clients::RewardClient> reward =
      clients::WithRetries(clients::NewGrpcRewardClient(first.grpc), options);
  ASSERT_TRUE(reward->ScoreBatch(ThreeItems(), absl::Seconds(30)).ok());

  ASSERT_TRUE(first.process->Signal(SIGKILL).ok());
  absl::StatusOr<ExitStatus> exit = first.process->Wait(Soon());
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->signaled && exit->signal == SIGKILL) << exit->ToString();

  absl::Notification returned;
  absl::StatusOr<v1::ScoreBatchResponse> scored;
  std::thread worker([&] {
    scored = reward->ScoreBatch(ThreeItems(), absl::Seconds(30));
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Seconds(1)));
  EXPECT_GT(retries.load(), 0);

  Service second = StartService("sluice-reward-server", first.grpc, dir + "/reward2.log");
  EXPECT_EQ(second.grpc, first.grpc);
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(60)));
  worker.join();
  ASSERT_TRUE(scored.ok()) << scored.status();
  ASSERT_EQ(scored->results_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(scored->results(i).result().reward(), i == 1 ? 1.0 : 0.0) << i;
  }
  if (second.process != nullptr) {
    EXPECT_GT(RewardServerIncarnation(second.grpc), first_incarnation);
  }
}

// Sum of every sample of a Prometheus metric whose line starts with `prefix`.
double MetricSum(const std::string& url, const std::string& prefix) {
  absl::StatusOr<std::string> text = runtime::HttpGet(url, absl::Seconds(10));
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return 0;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::StartsWith(line, prefix)) {
      sum += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
    }
  }
  return sum;
}

// The whole loop, each service a process started here, and the reward server
// killed with SIGKILL mid-run and started again at its address after a short
// outage (as a supervisor would): the worker's ScoreBatch calls wait for it,
// the run goes on and succeeds, with every step trained on groups the buffer
// stored once, none staler than eta. Before the clients retried, the worker
// failed its run at the first ScoreBatch that found the reward server gone.
TEST(ServiceRestartProcessTest, ARunSurvivesItsRewardServerKilledAndRestartedAtItsAddress) {
  const std::string dir = testing::MakeTempDir("loop-reward-restart");
  constexpr int kSteps = 40;
  constexpr int kGroups = 4;
  constexpr int kEta = 2;
  Service reward = StartService("sluice-reward-server", "127.0.0.1:0", dir + "/reward1.log");
  Service buffer = StartService("sluice-replay-buffer", "127.0.0.1:0", dir + "/buffer.log");
  Service trainer = StartService("sluice-trainer", "127.0.0.1:0", dir + "/trainer.log",
                                 {"--torch-threads=1"});
  ASSERT_TRUE(reward.process && buffer.process && trainer.process);
  Service controller = StartService(
      "sluice-controller", "127.0.0.1:0", dir + "/controller.log",
      {"--runs-dir=" + dir + "/runs", "--trainer-address=" + trainer.grpc,
       "--replay-buffer-address=" + buffer.grpc, "--reward-server-address=" + reward.grpc});
  ASSERT_NE(controller.process, nullptr);
  // The worker registers itself with the controller.
  Service worker = StartService("sluice-rollout-worker", "127.0.0.1:0", dir + "/worker.log",
                                {"--torch-threads=1", "--controller-address=" + controller.grpc});
  ASSERT_NE(worker.process, nullptr);
  auto stub = v1::ControllerService::NewStub(
      grpc::CreateChannel(controller.grpc, grpc::InsecureChannelCredentials()));

  v1::RunSpec spec;
  spec.set_name("reward-restart");
  spec.set_seed(1);
  spec.mutable_model()->set_builtin("micro");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->set_num_operands(2);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(80);
  spec.mutable_task()->set_eval_split_size(20);
  spec.mutable_warm_start()->set_sft_steps(20);
  spec.mutable_warm_start()->set_learning_rate(3e-3);
  spec.mutable_warm_start()->set_batch_size(32);
  auto* alg = spec.mutable_algorithm();
  alg->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  alg->set_group_size(4);
  alg->set_batch_size_groups(kGroups);
  alg->set_max_staleness(kEta);
  alg->set_learning_rate(3e-4);
  alg->set_total_steps(kSteps);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(4);
  v1::SubmitRunResponse submitted;
  {
    grpc::ClientContext context;
    v1::SubmitRunRequest request;
    *request.mutable_spec() = spec;
    const grpc::Status status = stub->SubmitRun(&context, request, &submitted);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const std::string run_id = submitted.run().run_id();

  // Once a few steps are trained, kill the reward server and start it again.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(4)));
  v1::WatchRunRequest watch;
  watch.set_run_id(run_id);
  watch.set_min_interval_ms(100);
  auto reader = stub->WatchRun(&context, watch);
  v1::RunUpdate update;
  v1::Run run;
  Service restarted;
  while (reader->Read(&update)) {
    run = update.run();
    if (restarted.process == nullptr && run.progress().step() >= 3) {
      ASSERT_TRUE(reward.process->Signal(SIGKILL).ok());
      ASSERT_TRUE(reward.process->Wait(Soon()).ok());
      // The outage: the worker keeps generating and its scoring waits.
      absl::SleepFor(absl::Milliseconds(700));
      restarted = StartService("sluice-reward-server", reward.grpc, dir + "/reward2.log");
      ASSERT_NE(restarted.process, nullptr);
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  ASSERT_NE(restarted.process, nullptr) << "the run ended before its third step";
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED)
      << run.error_message() << "\n--- worker ---\n" << testing::ReadFile(dir + "/worker.log");

  const auto summary =
      nlohmann::json::parse(testing::ReadFile(dir + "/runs/" + run_id + "/summary.json"));
  EXPECT_EQ(summary["steps"].get<int64_t>(), kSteps);
  EXPECT_EQ(summary["groups_trained"].get<int64_t>(), kSteps * kGroups);
  EXPECT_LE(summary["max_staleness"].get<int64_t>(), kEta);
  // The worker met the outage and retried; the restarted reward server scored
  // the rest of the run's rollouts.
  EXPECT_GT(MetricSum(worker.metrics, "sluice_client_retries_total{service=\"reward_server\"}"),
            0);
  EXPECT_EQ(MetricSum(worker.metrics, "sluice_client_retry_give_ups_total"), 0);
  EXPECT_GT(MetricSum(restarted.metrics,
                      "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"ScoreBatch\""),
            0);
  // The buffer stored each prompt's group once and the trainer sampled each
  // stored group once: as many groups sampled as trained.
  auto buffer_stub = v1::ReplayBufferService::NewStub(
      grpc::CreateChannel(buffer.grpc, grpc::InsecureChannelCredentials()));
  grpc::ClientContext stats_context;
  v1::GetStatsRequest stats_request;
  stats_request.set_run_id(run_id);
  v1::GetStatsResponse stats;
  ASSERT_TRUE(buffer_stub->GetStats(&stats_context, stats_request, &stats).ok());
  EXPECT_EQ(stats.stats().sampled_groups(), kSteps * kGroups);
}

}  // namespace
}  // namespace sluice
