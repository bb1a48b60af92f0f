// The loop end to end: the five real service binaries as separate processes
// (the embedded default deployment), one short RL run submitted over gRPC,
// and the invariants of an asynchronous run checked on what it leaves behind.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
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
#include "cli/local_stack.h"
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
  // Rollout verification (on by default): the stack's own worker is
  // trusted, so its groups are a sample (1/16 of 48: expected 3, all 48 with
  // probability 16^-48), every one matching the trainer's recomputation.
  const auto& verification = summary["verification"];
  EXPECT_LT(verification["groups_verified"].get<int64_t>(), 12 * 4);
  EXPECT_EQ(verification["groups_failed"].get<int64_t>(), 0);
  const auto spec = nlohmann::json::parse(testing::ReadFile(run_dir + "/spec.json"));
  const auto& policy = spec["algorithm"]["rollout_verification"];
  EXPECT_EQ(policy.value("trusted_worker_ids", nlohmann::json::array()),
            nlohmann::json::array({"worker-0"}))
      << policy.dump();
  EXPECT_EQ(policy.value("fraction", 0.0), 1.0);
  EXPECT_EQ(policy.value("trusted_fraction", 0.0), 1.0 / 16);
  EXPECT_LT(verification["max_abs_diff_verified"].get<double>(), 1e-4);
  std::printf("honest run eta=%d: %lld of 48 groups verified, 0 failed, max |delta| %.3g\n", eta,
              static_cast<long long>(verification["groups_verified"].get<int64_t>()),
              verification["max_abs_diff_verified"].get<double>());

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
  EXPECT_GT(testing::MetricSum(Metrics("reward_server"),
                      "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"ScoreBatch\""),
            12);
  EXPECT_GE(testing::MetricSum(Metrics("rollout_worker-0"), "sluice_rollout_weight_syncs_total"), 2);
  EXPECT_EQ(testing::MetricSum(Metrics("trainer"), "sluice_trainer_policy_version"), 12);
  EXPECT_GT(testing::MetricSum(Metrics("rollout_worker-0"), "sluice_rollout_tokens_generated_total"), 0);

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

// weight_sync: {dtype: bfloat16}: the trainer publishes bf16 versions, each
// encoded as a sparse delta against the one before; the worker fetches
// deltas and loads the rebuilt versions; the rollout verifier recomputes from
// the same bf16 weights, so every group still verifies.
TEST_F(LoopProcessTest, ABfloat16RunSyncsWeightsAsSparseDeltasAndSucceeds) {
  v1::RunSpec spec = ShortSpec(1);
  spec.mutable_weight_sync()->set_dtype(v1::DTYPE_BFLOAT16);
  // Every group, the stack's own worker's too (a sample might be none).
  spec.mutable_algorithm()->mutable_rollout_verification()->set_fraction(1);
  const std::string run_id = Submit(spec);
  ASSERT_FALSE(run_id.empty());
  const v1::Run run = Watch(run_id);
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << run.error_message();
  const auto summary =
      nlohmann::json::parse(testing::ReadFile(dir_ + "/runs/" + run_id + "/summary.json"));
  EXPECT_EQ(summary["steps"].get<int64_t>(), 12);
  EXPECT_EQ(summary["verification"]["groups_failed"].get<int64_t>(), 0);
  EXPECT_GT(summary["verification"]["groups_verified"].get<int64_t>(), 0);
  // summary.json's weight_sync: every RL version went out in bf16, those
  // after the first with a delta smaller than the versions in full.
  const auto& sync = summary["weight_sync"];
  EXPECT_EQ(sync["transport"].get<std::string>(), "grpc");
  EXPECT_EQ(sync["dtype"].get<std::string>(), "bfloat16");
  EXPECT_TRUE(sync["delta"].get<bool>());
  EXPECT_EQ(sync["versions"].get<int64_t>(), 12);
  EXPECT_GT(sync["delta_versions"].get<int64_t>(), 0);
  EXPECT_LT(sync["delta_bytes"].get<int64_t>(), sync["delta_versions_full_bytes"].get<int64_t>());

  const std::string worker = Metrics("rollout_worker-0");
  const std::string trainer = Metrics("trainer");
  const auto sum = [](const std::string& text, const std::string& name, const std::string& t) {
    return testing::MetricSum(text, name + "{transport=\"" + t + "\"}");
  };
  const double delta_wire =
      sum(worker, "sluice_rollout_weight_sync_wire_bytes_total", "grpc_delta");
  const double delta_full =
      sum(worker, "sluice_rollout_weight_sync_full_bytes_total", "grpc_delta");
  const double full_wire = sum(worker, "sluice_rollout_weight_sync_wire_bytes_total", "grpc");
  EXPECT_GT(delta_wire, 0);
  EXPECT_LT(delta_wire, delta_full);
  // The first version came in full; versions the worker skipped too.
  EXPECT_GT(full_wire, 0);
  EXPECT_EQ(testing::MetricSum(worker, "sluice_rollout_weight_delta_fallbacks_total"), 0);
  EXPECT_LT(sum(trainer, "sluice_trainer_weight_sync_wire_bytes_total", "grpc_delta"),
            sum(trainer, "sluice_trainer_weight_sync_full_bytes_total", "grpc_delta"));
  const double version_full =
      testing::MetricSum(trainer, "sluice_trainer_weight_version_bytes{encoding=\"full\"}");
  const double version_delta =
      testing::MetricSum(trainer, "sluice_trainer_weight_version_bytes{encoding=\"delta\"}");
  EXPECT_GT(version_delta, 0);
  EXPECT_LT(version_delta, version_full);
  std::printf("bf16 run: worker received %.0f delta bytes for %.0f bytes of versions (%.1f%%), "
              "%.0f bytes of full versions; the last version: %.0f bytes full, %.0f as a delta\n",
              delta_wire, delta_full, 100 * delta_wire / delta_full, full_wire, version_full,
              version_delta);
}

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

// Any client can insert into a live run. Poisoned groups sent to the buffer
// mid-run (a NaN log-prob, a token id far outside the vocabulary, a NaN and
// a 1e300 reward, versions 10^12 ahead) are refused with the field named,
// and the run goes on to succeed. Before, the NaN group made the trainer
// publish NaN weights, which killed the rollout worker, and the far-future
// version failed the trainer's run.
TEST_F(LoopProcessTest, PoisonedGroupsInsertedIntoALiveRunAreRefusedAndTheRunSucceeds) {
  const std::string run_id = Submit(ShortSpec(2));
  ASSERT_FALSE(run_id.empty());
  auto buffer = v1::ReplayBufferService::NewStub(
      grpc::CreateChannel(endpoints_["replay_buffer"].grpc, grpc::InsecureChannelCredentials()));
  const auto poisoned = [&](const std::string& name,
                            const std::function<void(v1::Group&)>& poison) {
    v1::Group group;
    group.set_run_id(run_id);
    group.set_group_id("poison-" + name);
    group.set_prompt_id("poison");
    group.set_idempotency_key(run_id + "/poison-" + name);
    for (int i = 0; i < 4; ++i) {
      v1::Trajectory* t = group.add_trajectories();
      t->set_trajectory_id(group.group_id() + "/" + std::to_string(i));
      for (int id : {1, 2, 3}) t->add_prompt_token_ids(id);
      for (int id : {4, 5}) {
        t->add_completion_token_ids(id);
        t->add_behaviour_logprobs(-1.0f);
        t->add_token_policy_versions(1);
      }
      t->set_finish_reason(v1::FINISH_REASON_STOP);
      t->set_reward(i % 2);
    }
    poison(group);
    return group;
  };
  v1::InsertGroupsRequest insert;
  *insert.add_groups() = poisoned("nan-logprob", [](v1::Group& g) {
    g.mutable_trajectories(2)->set_behaviour_logprobs(1, std::nanf(""));
  });
  *insert.add_groups() = poisoned("oov", [](v1::Group& g) {
    g.mutable_trajectories(0)->set_completion_token_ids(0, 1000000000);
  });
  *insert.add_groups() = poisoned("nan-reward", [](v1::Group& g) {
    g.mutable_trajectories(1)->set_reward(std::nan(""));
  });
  *insert.add_groups() = poisoned("huge-reward", [](v1::Group& g) {
    g.mutable_trajectories(3)->set_reward(1e300);
  });
  *insert.add_groups() = poisoned("future", [](v1::Group& g) {
    for (auto& t : *g.mutable_trajectories()) {
      for (int k = 0; k < t.token_policy_versions_size(); ++k) {
        t.set_token_policy_versions(k, 1'000'000'000'000);
      }
    }
  });
  const std::vector<std::string> fields = {
      "trajectories[2].behaviour_logprobs[1]: must be finite and <= 0, got nan",
      "trajectories[0].completion_token_ids[0]: must be in [0, ",
      "trajectories[1].reward: must be finite, got nan",
      "trajectories[3].reward: must be in the run's reward range [0, 1], got 1e+300",
      "trajectories[0].token_policy_versions[0]: must not be ahead of policy version"};

  grpc::ClientContext watch_context;
  watch_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(4)));
  v1::WatchRunRequest watch;
  watch.set_run_id(run_id);
  watch.set_min_interval_ms(100);
  auto reader = controller_->WatchRun(&watch_context, watch);
  v1::RunUpdate update;
  v1::Run run;
  bool inserted = false;
  while (reader->Read(&update)) {
    run = update.run();
    if (inserted || run.progress().step() < 1) continue;
    // Training: the trainer is sampling, the worker generating.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto stream = buffer->InsertGroups(&context);
    ASSERT_TRUE(stream->Write(insert));
    stream->WritesDone();
    std::vector<v1::InsertGroupResult> results;
    v1::InsertGroupsResponse response;
    while (stream->Read(&response)) {
      results.insert(results.end(), response.results().begin(), response.results().end());
    }
    ASSERT_TRUE(stream->Finish().ok());
    ASSERT_EQ(results.size(), fields.size());
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_EQ(results[i].status(), v1::INSERT_STATUS_INVALID) << i;
      EXPECT_THAT(results[i].message(), HasSubstr(fields[i])) << i;
    }
    inserted = true;
  }
  EXPECT_TRUE(reader->Finish().ok());
  ASSERT_TRUE(inserted) << "the run ended before its first step: " << run.error_message();
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << run.error_message();
  EXPECT_EQ(run.progress().step(), 12);

  grpc::ClientContext context;
  v1::GetStatsRequest request;
  request.set_run_id(run_id);
  v1::GetStatsResponse stats;
  ASSERT_TRUE(buffer->GetStats(&context, request, &stats).ok());
  EXPECT_GE(stats.stats().rejected_inserts(), 5);
  EXPECT_EQ(testing::MetricSum(Metrics("trainer"), "sluice_trainer_updates_skipped_total"), 0);
  EXPECT_EQ(testing::MetricSum(Metrics("trainer"), "sluice_trainer_groups_invalid_total"), 0);
  EXPECT_EQ(
      testing::MetricSum(Metrics("rollout_worker-0"), "sluice_rollout_weight_versions_refused_total"), 0);
}

// A local client inserting groups whose log-probs are made up (well formed:
// the buffer's validation cannot tell) into a live run, naming the honest
// worker (worker-0): on this stack without identities a worker id is a
// claim. The trainer's verification leaves each forged group out of its
// batch and, at the third, quarantines the connection that sent them, not
// the worker they name: the buffer then refuses that connection's slots and
// inserts with PERMISSION_DENIED, while worker-0 goes on serving. Every
// other group passes; the run succeeds.
TEST_F(LoopProcessTest, ARogueWorkerIsQuarantinedAndTheRunSucceeds) {
  constexpr int64_t kSteps = 20;
  v1::RunSpec spec = ShortSpec(2);
  spec.mutable_algorithm()->set_total_steps(kSteps);
  // Newest first: FIFO would put the rogue's groups (which skip the
  // admission gate) behind a full queue, stale before they are reached.
  spec.mutable_buffer()->set_sampler(v1::SAMPLER_KIND_LIFO);
  // The rogue names the stack's own worker, which a plain stack trusts on its
  // word (its groups sampled): the spec asks for every group to be checked.
  spec.mutable_algorithm()->mutable_rollout_verification()->set_fraction(1);
  const std::string run_id = Submit(spec);
  ASSERT_FALSE(run_id.empty());
  auto buffer = v1::ReplayBufferService::NewStub(
      grpc::CreateChannel(endpoints_["replay_buffer"].grpc, grpc::InsecureChannelCredentials()));
  const auto forged = [&](int n, int64_t version) {
    v1::Group group;
    group.set_run_id(run_id);
    group.set_group_id("rogue-" + std::to_string(n));
    group.set_prompt_id("rogue");
    group.set_idempotency_key(run_id + "/rogue-" + std::to_string(n));
    for (int i = 0; i < 4; ++i) {
      v1::Trajectory* t = group.add_trajectories();
      t->set_trajectory_id(group.group_id() + "/" + std::to_string(i));
      t->set_rollout_worker_id("worker-0");  // The honest worker's name.
      for (int id : {1, 2, 3}) t->add_prompt_token_ids(id);
      for (int id : {4, 5}) {
        t->add_completion_token_ids(id);
        t->add_behaviour_logprobs(-0.01f);  // "the policy was sure": inflated
        t->add_token_policy_versions(version);
      }
      t->set_finish_reason(v1::FINISH_REASON_STOP);
      t->set_reward(i % 2);
    }
    return group;
  };
  const auto insert = [&](const std::vector<v1::Group>& groups,
                          std::vector<v1::InsertGroupResult>* results) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto stream = buffer->InsertGroups(&context);
    v1::InsertGroupsRequest request;
    for (const v1::Group& g : groups) *request.add_groups() = g;
    EXPECT_TRUE(stream->Write(request));
    stream->WritesDone();
    v1::InsertGroupsResponse response;
    while (stream->Read(&response)) {
      results->insert(results->end(), response.results().begin(), response.results().end());
    }
    return stream->Finish();
  };

  grpc::ClientContext watch_context;
  watch_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(4)));
  v1::WatchRunRequest watch;
  watch.set_run_id(run_id);
  watch.set_min_interval_ms(20);
  auto reader = controller_->WatchRun(&watch_context, watch);
  v1::RunUpdate update;
  v1::Run run;
  // Forged groups at each new step seen, until the buffer refuses them.
  int64_t last_step = 0;
  int next = 0;
  bool refused_while_running = false;
  while (reader->Read(&update)) {
    run = update.run();
    if (refused_while_running || run.progress().step() <= last_step) continue;
    last_step = run.progress().step();
    const int64_t version = run.progress().policy_version();
    std::vector<v1::InsertGroupResult> results;
    const grpc::Status status = insert({forged(next, version), forged(next + 1, version),
                                        forged(next + 2, version), forged(next + 3, version)},
                                       &results);
    next += 4;
    if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      refused_while_running = true;
      continue;
    }
    ASSERT_TRUE(status.ok()) << status.error_message();
    for (const auto& r : results) EXPECT_EQ(r.status(), v1::INSERT_STATUS_STORED) << r.message();
  }
  EXPECT_TRUE(reader->Finish().ok());
  ASSERT_EQ(run.state(), v1::RUN_STATE_SUCCEEDED) << run.error_message();
  EXPECT_EQ(run.progress().step(), kSteps);
  EXPECT_TRUE(refused_while_running);

  // The summary: all under worker-0's name, the forged groups failed (every
  // sampled one: the honest ones all passed); the connection that sent them
  // is quarantined, worker-0 is not.
  const auto summary =
      nlohmann::json::parse(testing::ReadFile(dir_ + "/runs/" + run_id + "/summary.json"));
  const auto& verification = summary["verification"];
  ASSERT_EQ(verification["workers"].size(), 1u) << verification;
  const auto& named = verification["workers"][0];
  EXPECT_EQ(named["worker_id"], "worker-0");
  const int64_t rogue_failed = named.value("groups_failed", int64_t{0});
  const int64_t honest_verified = named.value("groups_verified", int64_t{0});
  EXPECT_GE(rogue_failed, 3);
  EXPECT_FALSE(named.value("quarantined", false));
  ASSERT_EQ(named["quarantined_connections"].size(), 1u) << named;
  const std::string connection = named["quarantined_connections"][0];
  EXPECT_THAT(connection, ::testing::StartsWith("peer:"));
  EXPECT_EQ(honest_verified + rogue_failed, kSteps * 4);
  EXPECT_EQ(summary["groups_trained"].get<int64_t>(), kSteps * 4 - rogue_failed);
  EXPECT_EQ(testing::MetricSum(Metrics("trainer"), "sluice_trainer_worker_quarantined"), 0);

  // The buffer refuses the connection, whatever worker it names; worker-0
  // itself served the run to its end.
  v1::AcquireGenerationSlotsRequest acquire;
  acquire.set_run_id(run_id);
  acquire.set_worker_id("worker-0");
  acquire.set_worker_incarnation(1);
  acquire.set_num_groups(1);
  v1::AcquireGenerationSlotsResponse slots;
  grpc::ClientContext acquire_context;
  const grpc::Status acquired = buffer->AcquireGenerationSlots(&acquire_context, acquire, &slots);
  EXPECT_EQ(acquired.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(acquired.error_message(),
              HasSubstr("the connection " + connection + " is quarantined"));
  std::vector<v1::InsertGroupResult> results;
  const grpc::Status refused = insert({forged(next, kSteps)}, &results);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("quarantined"));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].status(), v1::INSERT_STATUS_REFUSED_QUARANTINED);
  std::printf(
      "rogue client naming worker-0 in a live run: %d forged groups sent, %lld sampled "
      "and all flagged, its connection quarantined; honest groups %lld passed\n",
      next, static_cast<long long>(rogue_failed), static_cast<long long>(honest_verified));
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
