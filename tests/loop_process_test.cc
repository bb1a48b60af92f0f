// The loop end to end: the five real service binaries as separate processes
// (the embedded default deployment), one short RL run submitted over gRPC,
// and the invariants of an asynchronous run checked on what it leaves behind.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/cli/local_stack.h"
#include "services/runtime/health_client.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// A run small enough for a few seconds of CPU: single-digit addition, the
// "micro" model, a short warm start and 12 RL steps.
v1::RunSpec ShortSpec(int eta) {
  v1::RunSpec spec;
  spec.set_name("loop-e2e");
  spec.set_seed(1);
  spec.mutable_model()->set_builtin("micro");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->set_num_operands(2);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(80);
  spec.mutable_task()->set_eval_split_size(20);
  spec.mutable_warm_start()->set_sft_steps(50);
  spec.mutable_warm_start()->set_learning_rate(3e-3);
  spec.mutable_warm_start()->set_batch_size(32);
  spec.mutable_warm_start()->set_target_accuracy(0.3);
  auto* alg = spec.mutable_algorithm();
  alg->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  alg->set_group_size(4);
  alg->set_batch_size_groups(4);
  alg->set_max_staleness(eta);
  alg->set_learning_rate(3e-4);
  alg->set_total_steps(12);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(4);
  spec.mutable_eval()->set_every_n_steps(6);
  return spec;
}

class LoopProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("loop");
    cli::LocalStackOptions options;
    options.bin_dir = testing::BinDir();
    options.state_dir = dir_ + "/stack";
    options.runs_dir = dir_ + "/runs";
    stack_ = std::make_unique<cli::LocalStack>(options);
    const absl::Status started = stack_->Start();
    ASSERT_TRUE(started.ok()) << started;
    for (const auto& e : stack_->endpoints()) endpoints_[e.name] = e;
    controller_ = v1::ControllerService::NewStub(
        grpc::CreateChannel(endpoints_["controller"].grpc, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (stack_ != nullptr) stack_->Stop().IgnoreError();
  }

  std::string Submit(const v1::RunSpec& spec) {
    grpc::ClientContext context;
    v1::SubmitRunRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitRunResponse response;
    const grpc::Status status = controller_->SubmitRun(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.run().run_id();
  }

  // Follows WatchRun to the terminal snapshot.
  v1::Run Watch(const std::string& run_id) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(4)));
    v1::WatchRunRequest request;
    request.set_run_id(run_id);
    request.set_min_interval_ms(200);
    auto reader = controller_->WatchRun(&context, request);
    v1::RunUpdate update;
    v1::Run last;
    while (reader->Read(&update)) last = update.run();
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return last;
  }

  std::string Metrics(const std::string& service) {
    auto body = runtime::HttpGet(endpoints_[service].metrics, absl::Seconds(5));
    EXPECT_TRUE(body.ok()) << body.status();
    return body.ok() ? *body : "";
  }

  std::string dir_;
  std::unique_ptr<cli::LocalStack> stack_;
  std::map<std::string, cli::ServiceEndpoint> endpoints_;
  std::unique_ptr<v1::ControllerService::Stub> controller_;
};

// Sum of every sample of a Prometheus metric whose line starts with `prefix`.
double MetricSum(const std::string& text, const std::string& prefix) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, prefix)) {
      sum += std::stod(std::string(line.substr(line.rfind(' ') + 1)));
    }
  }
  return sum;
}

class LoopInvariantsTest : public LoopProcessTest, public ::testing::WithParamInterface<int> {};

TEST_P(LoopInvariantsTest, GroupsFlowVersionsAdvanceAndNothingStalerThanEtaIsTrained) {
  const int eta = GetParam();
  const std::string run_id = Submit(ShortSpec(eta));
  ASSERT_FALSE(run_id.empty());
  const v1::Run run = Watch(run_id);
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << run.error_message();

  // summary.json: what the run did.
  const std::string run_dir = dir_ + "/runs/" + run_id;
  const auto summary = nlohmann::json::parse(testing::ReadFile(run_dir + "/summary.json"));
  EXPECT_EQ(summary["steps"].get<int64_t>(), 12);
  EXPECT_EQ(summary["eta"].get<int64_t>(), eta);
  EXPECT_LE(summary["max_staleness"].get<int64_t>(), eta);
  EXPECT_EQ(summary["groups_trained"].get<int64_t>(), 12 * 4);
  EXPECT_EQ(summary["weight_versions"].get<int64_t>(), 13);
  EXPECT_GT(summary["tokens_generated"].get<int64_t>(), 0);
  EXPECT_GT(summary["tokens_trained"].get<int64_t>(), 0);
  EXPECT_GE(summary["groups_generated"].get<int64_t>(), 12 * 4);
  EXPECT_TRUE(summary.contains("eval_before"));
  EXPECT_TRUE(summary.contains("eval_after"));
  EXPECT_GT(summary["wall_seconds"].get<double>(), 0);

  // metrics.jsonl: one line per step, versions advancing by one, staleness
  // histogram within [0, eta].
  std::ifstream lines(run_dir + "/metrics.jsonl");
  std::string line;
  int64_t expected_step = 1;
  while (std::getline(lines, line)) {
    const auto m = nlohmann::json::parse(line);
    EXPECT_EQ(m["step"].get<int64_t>(), expected_step);
    EXPECT_EQ(m["policy_version"].get<int64_t>(), expected_step);
    EXPECT_LE(m["staleness_max"].get<int64_t>(), eta);
    EXPECT_LE(static_cast<int>(m["staleness_histogram"].size()), eta + 1);
    EXPECT_EQ(m["groups"].get<int64_t>(), 4);
    ++expected_step;
  }
  EXPECT_EQ(expected_step, 13);

  // The reward came from the reward server (every rollout and eval batch
  // went through ScoreBatch), the worker followed the versions, the buffer
  // saw the groups.
  EXPECT_GT(MetricSum(Metrics("reward_server"),
                      "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"ScoreBatch\""),
            12);
  EXPECT_GE(MetricSum(Metrics("rollout_worker"), "sluice_rollout_weight_syncs_total"), 2);
  EXPECT_EQ(MetricSum(Metrics("trainer"), "sluice_trainer_policy_version"), 12);
  EXPECT_GT(MetricSum(Metrics("rollout_worker"), "sluice_rollout_tokens_generated_total"), 0);

  // The buffer's own account: every trained group was sampled from it, none
  // staler than eta.
  auto buffer = v1::ReplayBufferService::NewStub(
      grpc::CreateChannel(endpoints_["replay_buffer"].grpc, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::GetStatsRequest request;
  request.set_run_id(run_id);
  v1::GetStatsResponse stats;
  ASSERT_TRUE(buffer->GetStats(&context, request, &stats).ok());
  EXPECT_EQ(stats.stats().sampled_groups(), 12 * 4);
  EXPECT_EQ(stats.stats().policy_version(), 12);
  const auto& histogram = stats.stats().sampled_group_staleness();
  for (int i = 0; i < histogram.counts_size() && i < histogram.bucket_upper_bounds_size(); ++i) {
    if (histogram.bucket_upper_bounds(i) > eta) {
      EXPECT_EQ(histogram.counts(i), 0) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Eta, LoopInvariantsTest, ::testing::Values(0, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Eta" + std::to_string(info.param);
                         });

TEST_F(LoopProcessTest, ARewardServerThatDiesFailsTheRunNamingIt) {
  v1::RunSpec spec = ShortSpec(1);
  spec.mutable_algorithm()->set_total_steps(100000);
  const std::string run_id = Submit(spec);
  ASSERT_FALSE(run_id.empty());
  // Once the run is training (a step done), kill the reward server outright.
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(4)));
  v1::WatchRunRequest request;
  request.set_run_id(run_id);
  request.set_min_interval_ms(100);
  auto reader = controller_->WatchRun(&context, request);
  v1::RunUpdate update;
  bool killed = false;
  v1::Run run;
  while (reader->Read(&update)) {
    run = update.run();
    if (!killed && run.progress().step() >= 1) {
      ASSERT_EQ(kill(endpoints_["reward_server"].pid, SIGKILL), 0);
      killed = true;
    }
  }
  EXPECT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(killed) << "the run ended before its first step: " << run.error_message();
  EXPECT_EQ(run.state(), v1::RUN_STATE_FAILED);
  EXPECT_THAT(run.error_message(), HasSubstr("reward_server"));
  const auto summary =
      nlohmann::json::parse(testing::ReadFile(dir_ + "/runs/" + run_id + "/summary.json"));
  EXPECT_THAT(summary["error_message"].get<std::string>(), HasSubstr("reward_server"));
}

TEST_F(LoopProcessTest, AnInvalidSpecIsRefusedNamingTheField) {
  v1::RunSpec spec = ShortSpec(1);
  spec.mutable_algorithm()->set_group_size(1);
  grpc::ClientContext context;
  v1::SubmitRunRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitRunResponse response;
  const grpc::Status status = controller_->SubmitRun(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("algorithm.group_size"));
}

}  // namespace
}  // namespace sluice
