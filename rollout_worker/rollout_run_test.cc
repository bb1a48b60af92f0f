#include "rollout_worker/rollout_run.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "rollout_worker/generation_budget.h"
#include "common/task/char_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/clients/retrying_clients.h"

namespace sluice::rollout_worker {
namespace {

// Publishes versions on demand and serves them like StreamWeights would.
class FakeTrainer : public clients::TrainerClient {
 public:
  FakeTrainer() {
    task::CharTokenizer tokenizer;
    config_ = *model::BuiltinModelConfig("micro", tokenizer.vocab_size());
  }
  // With `poisoned`, one weight of the version is NaN (as a trainer that
  // stepped on a NaN loss used to publish).
  void Publish(int64_t version, bool poisoned = false) {
    auto model = *model::Transformer::Create(config_, 100 + version);
    clients::FetchedWeights fetched;
    fetched.manifest.mutable_version()->set_version(version);
    for (const auto& [name, tensor] : model->parameters()) {
      v1::TensorSpec* spec = fetched.manifest.add_tensors();
      spec->set_name(name);
      spec->set_dtype(v1::DTYPE_FLOAT32);
      for (int64_t d : tensor.sizes()) spec->add_shape(d);
      fetched.tensor_bytes.push_back(model::TensorBytes(tensor.detach()));
      spec->set_size_bytes(fetched.tensor_bytes.back().size());
    }
    if (poisoned) {
      const float nan = std::nanf("");
      std::memcpy(fetched.tensor_bytes.back().data(), &nan, sizeof(nan));
    }
    absl::MutexLock lock(&mu_);
    latest_ = std::move(fetched);
    has_ = true;
  }
  absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string&) override {
    absl::MutexLock lock(&mu_);
    if (!has_) return absl::NotFoundError("nothing published");
    return latest_.manifest.version();
  }
  absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string&, int64_t after,
                                                            absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return has_ && latest_.manifest.version().version() > after;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) {
      return absl::DeadlineExceededError("no new version");
    }
    return latest_.manifest.version();
  }
  absl::StatusOr<clients::FetchedWeights> FetchWeights(const std::string&, int64_t) override {
    absl::MutexLock lock(&mu_);
    if (!has_) return absl::NotFoundError("nothing published");
    return latest_;
  }

 private:
  model::ModelConfig config_;
  absl::Mutex mu_;
  bool has_ ABSL_GUARDED_BY(mu_) = false;
  clients::FetchedWeights latest_ ABSL_GUARDED_BY(mu_);
};

// Grants every slot asked for and stores groups as the buffer does: once per
// idempotency key, a repeat answered DUPLICATE.
class FakeBuffer : public clients::ReplayBufferClient {
 public:
  explicit FakeBuffer(int64_t grant_version) : grant_version_(grant_version) {}
  // The next this many AcquireGenerationSlots calls fail UNAVAILABLE.
  std::atomic<int> acquire_failures{0};
  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest& request) override {
    if (acquire_failures.load() > 0) {
      --acquire_failures;
      return absl::UnavailableError("buffer restarting");
    }
    v1::AcquireGenerationSlotsResponse response;
    response.set_granted(request.num_groups());
    for (int i = 0; i < request.num_groups(); ++i) response.add_lease_ids(absl::StrCat("lease-", next_++));
    response.set_policy_version(grant_version_);
    return response;
  }
  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest& request) override {
    absl::MutexLock lock(&mu);
    released += request.lease_ids_size();
    return v1::ReleaseGenerationSlotsResponse();
  }
  std::function<absl::StatusOr<v1::InsertGroupsResponse>(const v1::InsertGroupsRequest&, int)> hook;
  std::atomic<int> insert_calls{0};
  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(const v1::InsertGroupsRequest& request) override {
    const int call = insert_calls++;
    if (hook) {
      auto r = hook(request, call);
      if (!r.ok() || r->results_size() > 0) return r;
    }
    return Store(request);
  }
  v1::InsertGroupsResponse Store(const v1::InsertGroupsRequest& request) {
    absl::MutexLock lock(&mu);
    v1::InsertGroupsResponse response;
    for (const auto& g : request.groups()) {
      auto* r = response.add_results();
      r->set_idempotency_key(g.idempotency_key());
      if (!keys.insert(g.idempotency_key()).second) {
        r->set_status(v1::INSERT_STATUS_DUPLICATE);
        continue;
      }
      groups.push_back(g);
      r->set_status(v1::INSERT_STATUS_STORED);
    }
    return response;
  }
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest&) override {
    return absl::UnimplementedError("");
  }
  void CancelSample() override {}

  absl::Mutex mu;
  std::vector<v1::Group> groups ABSL_GUARDED_BY(mu);
  std::set<std::string> keys ABSL_GUARDED_BY(mu);
  int released ABSL_GUARDED_BY(mu) = 0;

 private:
  const int64_t grant_version_;
  int next_ = 0;
};

// Hands out "d+d=" prompts, every other one's reference marked as a
// solution; says the run is done after `batches` leases.
class FakeController : public clients::ControllerClient {
 public:
  explicit FakeController(int batches) : batches_(batches) {}
  absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(const v1::LeasePromptsRequest& request) override {
    absl::MutexLock lock(&mu);
    v1::LeasePromptsResponse response;
    completed_at_lease.push_back(completed);
    if (leases++ >= batches_) {
      response.set_run_done(true);
      return response;
    }
    prompts_leased += request.max_prompts();
    for (int i = 0; i < request.max_prompts(); ++i) {
      v1::Prompt* p = response.add_prompts();
      const int a = (leases * 3 + i) % 10;
      p->set_prompt_id(reissue ? absl::StrCat("p1-", i) : absl::StrCat("p", leases, "-", i));
      if (grow) {
        // Each lease's prompts longer than the last's: "a+1=", "a+1+1=", ...
        std::string text = absl::StrCat(a);
        for (int k = 0; k < leases; ++k) text += "+1";
        p->set_text(text + "=");
        p->set_reference_answer(absl::StrCat(a + leases));
      } else {
        p->set_text(absl::StrCat(a, "+1="));
        p->set_reference_answer(absl::StrCat(a + 1));
      }
      p->set_reference_is_solution(i % 2 == 0);
    }
    response.set_lease_id(absl::StrCat("L", leases));
    return response;
  }
  absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest& request) override {
    absl::MutexLock lock(&mu);
    completed += request.completed_prompt_ids_size();
    abandoned += request.abandoned_prompt_ids_size();
    tokens += request.tokens_generated();
    late_groups_refused += request.late_groups_refused();
    insert_errors.push_back(request.insert_error());
    for (const auto& id : request.abandoned_prompt_ids()) abandoned_ids.push_back(id);
    return v1::ReportRolloutProgressResponse();
  }
  absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::Mutex mu;
  int leases ABSL_GUARDED_BY(mu) = 0;
  // Prompts handed out (the finisher scores and inserts a batch while the
  // loop leases and generates the next ones: a run that fails gives back
  // every prompt it leased and did not complete).
  int prompts_leased ABSL_GUARDED_BY(mu) = 0;
  int completed ABSL_GUARDED_BY(mu) = 0;
  int abandoned ABSL_GUARDED_BY(mu) = 0;
  int64_t tokens ABSL_GUARDED_BY(mu) = 0;
  int64_t late_groups_refused ABSL_GUARDED_BY(mu) = 0;
  std::vector<std::string> abandoned_ids ABSL_GUARDED_BY(mu);
  // ReportRolloutProgressRequest.insert_error of every report, in order.
  std::vector<std::string> insert_errors ABSL_GUARDED_BY(mu);
  // Prompts completed when each lease was asked for.
  std::vector<int> completed_at_lease ABSL_GUARDED_BY(mu);
  // Every lease hands out the first lease's prompt ids again, as the
  // controller does with prompts whose lease expired.
  bool reissue = false;
  // Every lease's prompts are longer than the previous lease's.
  bool grow = false;

 private:
  const int batches_;
};

class FakeReward : public clients::RewardClient {
 public:
  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration) override {
    v1::ScoreBatchResponse response;
    for (const auto& item : request.items()) {
      auto* r = response.add_results();
      r->set_item_id(item.item_id());
      r->mutable_result()->set_reward(item.response() == item.reference_answer() ? 1.0 : 0.0);
      r->mutable_result()->set_verifier_name("fake-math");
      r->mutable_result()->set_extracted_answer(item.response());
    }
    absl::MutexLock lock(&mu);
    items += request.items_size();
    for (const auto& item : request.items()) solution_items += item.reference_is_solution();
    return response;
  }
  absl::Mutex mu;
  int items ABSL_GUARDED_BY(mu) = 0;
  int solution_items ABSL_GUARDED_BY(mu) = 0;  // Items marked reference_is_solution.
};

v1::RunSpec Spec() {
  v1::RunSpec spec;
  spec.set_seed(3);
  spec.mutable_model()->set_builtin("micro");
  spec.mutable_algorithm()->set_group_size(4);
  spec.mutable_algorithm()->set_batch_size_groups(3);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(5);
  spec.mutable_reward()->add_verifiers()->set_name("math");
  return spec;
}

TEST(RolloutRunTest, GeneratesScoresAndInsertsWholeGroups) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(/*grant_version=*/0);
  FakeController controller(/*batches=*/2);
  FakeReward reward;
  RolloutRun run("run-1", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 42});
  ASSERT_TRUE(run.Run().ok());

  absl::MutexLock lock(&buffer.mu);
  ASSERT_EQ(buffer.groups.size(), 6u);  // 2 batches x B = 3 prompts
  std::set<std::string> keys, leases;
  int64_t tokens = 0;
  for (const auto& g : buffer.groups) {
    EXPECT_EQ(g.run_id(), "run-1");
    EXPECT_EQ(g.trajectories_size(), 4);
    // The key is the prompt's (one group per prompt is stored, whoever
    // generates it); the group id names this generation.
    EXPECT_EQ(g.idempotency_key(), "run-1/" + g.prompt_id());
    EXPECT_THAT(g.group_id(), ::testing::StartsWith(g.prompt_id() + "@w1.42."));
    keys.insert(g.idempotency_key());
    leases.insert(g.slot_lease_id());
    EXPECT_EQ(g.min_policy_version(), 0);
    for (const auto& t : g.trajectories()) {
      ASSERT_GT(t.completion_token_ids_size(), 0);
      EXPECT_LE(t.completion_token_ids_size(), 5);
      EXPECT_EQ(t.behaviour_logprobs_size(), t.completion_token_ids_size());
      EXPECT_EQ(t.token_policy_versions_size(), t.completion_token_ids_size());
      for (float lp : t.behaviour_logprobs()) EXPECT_LE(lp, 0.0f);
      EXPECT_EQ(t.verifier().verifier_name(), "fake-math");
      EXPECT_EQ(t.rollout_worker_id(), "w1");
      EXPECT_EQ(t.worker_incarnation(), 42u);
      EXPECT_NE(t.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
      tokens += t.completion_token_ids_size();
    }
  }
  EXPECT_EQ(keys.size(), 6u);
  EXPECT_EQ(leases.size(), 6u);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, 6);
  EXPECT_EQ(controller.tokens, tokens);
  absl::MutexLock lock3(&reward.mu);
  EXPECT_EQ(reward.items, 24);
  // The marked prompts' items say so: 2 of each batch's 3 prompts, G = 4.
  EXPECT_EQ(reward.solution_items, 16);
}

TEST(RolloutRunTest, WaitsForWeightsAsNewAsTheAdmissionVersion) {
  // The buffer admits at version 1 while the trainer still serves 0: the
  // worker must not generate until it holds version 1.
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(/*grant_version=*/1);
  FakeController controller(/*batches=*/1);
  FakeReward reward;
  RolloutRun run("run-2", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  absl::Notification done;
  std::thread thread([&] {
    EXPECT_TRUE(run.Run().ok());
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  {
    absl::MutexLock lock(&controller.mu);
    EXPECT_EQ(controller.leases, 0);  // still waiting for weights, no prompts leased
  }
  trainer.Publish(1);
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  thread.join();
  absl::MutexLock lock(&buffer.mu);
  ASSERT_EQ(buffer.groups.size(), 3u);
  for (const auto& g : buffer.groups) {
    EXPECT_EQ(g.min_policy_version(), 1);
    for (const auto& t : g.trajectories()) {
      for (int64_t v : t.token_policy_versions()) EXPECT_EQ(v, 1);
    }
  }
}

// The trainer publishes a version with a NaN weight while the buffer admits
// at that version: the worker refuses it, says so, and generates with the
// version it has instead of dying in torch::multinomial or waiting forever
// for weights it will not take.
TEST(RolloutRunTest, ANonFiniteVersionIsRefusedAndGenerationGoesOnWithTheOldOne) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(/*grant_version=*/1);
  FakeController controller(/*batches=*/1);
  FakeReward reward;
  absl::Notification loaded;
  std::atomic<int64_t> refused{-1};
  RolloutRunDeps deps{&trainer, &buffer, &controller, &reward, "w1", 1};
  deps.on_weights_loaded = [&](int64_t version, double) {
    if (version == 0 && !loaded.HasBeenNotified()) loaded.Notify();
  };
  deps.on_weights_refused = [&](int64_t version) { refused = version; };
  RolloutRun run("run-nan", Spec(), deps);
  absl::Notification done;
  absl::Status result;
  std::thread thread([&] {
    result = run.Run();
    done.Notify();
  });
  ASSERT_TRUE(loaded.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // Holding version 0, admitted at 1: waiting for 1.
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  trainer.Publish(1, /*poisoned=*/true);
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  thread.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(refused.load(), 1);
  EXPECT_EQ(run.Status().weight_versions_refused(), 1);
  EXPECT_EQ(run.Status().weight_syncs(), 1);
  absl::MutexLock lock(&buffer.mu);
  ASSERT_EQ(buffer.groups.size(), 3u);
  for (const auto& g : buffer.groups) {
    for (const auto& t : g.trajectories()) {
      for (int64_t v : t.token_policy_versions()) EXPECT_EQ(v, 0);
      for (float lp : t.behaviour_logprobs()) EXPECT_TRUE(std::isfinite(lp));
    }
  }
}

TEST(RolloutRunTest, StopReturnsPromptlyWhileWaitingForWeights) {
  FakeTrainer trainer;  // publishes nothing
  FakeBuffer buffer(0);
  FakeController controller(5);
  FakeReward reward;
  RolloutRun run("run-3", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  absl::Notification done;
  std::thread thread([&] {
    EXPECT_TRUE(run.Run().ok());
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  run.Stop(/*abort=*/true);
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  thread.join();
  absl::MutexLock lock(&buffer.mu);
  EXPECT_TRUE(buffer.groups.empty());
  EXPECT_GT(buffer.released, 0);  // the slots it held went back
}

// The bytes of one group's generation batch for the FakeController's
// prompts ("d+1="), as the worker computes them.
int64_t OneGroupGenerationBytes(const v1::RunSpec& spec, model::ModelConfig* config) {
  *config = *run::LoadRunModelConfig(spec.model());
  auto tokenizer = *run::LoadRunTokenizer(spec.model());
  const int64_t prompt = static_cast<int64_t>(run::EncodePrompt(*tokenizer, "3+1=").size());
  return WorkerWeightBytes(*config) +
         run::GenerationBatchBytes(*config, spec.algorithm().group_size(), prompt,
                                   prompt + spec.rollout().sampling().max_new_tokens());
}

// A budget that holds one group's generation at a time: the engine gets
// rows for one group (the others wait in its queue), the worker leases more
// as groups finish, and every group is still scored and inserted whole.
TEST(RolloutRunTest, ABatchOverTheMemoryBudgetIsGeneratedInPiecesThatFit) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/2);
  FakeReward reward;
  model::ModelConfig config;
  RolloutRunDeps deps{&trainer, &buffer, &controller, &reward, "w1", 1};
  deps.memory_budget_bytes = OneGroupGenerationBytes(Spec(), &config);
  RolloutRun run("run-budget", Spec(), deps);
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  absl::MutexLock lock(&buffer.mu);
  // The first lease's three groups, and at least one more leased as they
  // finished one by one (the fake says the run is done at its third lease).
  ASSERT_GE(buffer.groups.size(), 4u);
  for (const auto& g : buffer.groups) EXPECT_EQ(g.trajectories_size(), 4);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, static_cast<int>(buffer.groups.size()));
  EXPECT_EQ(controller.abandoned, 0);
  // The second lease came while the first lease's groups were still being
  // generated: the engine was topped up, not drained first.
  ASSERT_GE(controller.completed_at_lease.size(), 2u);
  EXPECT_LT(controller.completed_at_lease[1], 3);
}

// Prompts longer than the engine was made for (its rows sized to the budget
// for the first lease's prompts) wait until it is idle and it is remade with
// room for them: every group is still generated whole, with its full
// max_new_tokens available, and nothing is abandoned.
TEST(RolloutRunTest, LongerPromptsThanTheEngineWasMadeForWaitForItToBeRemade) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/4);
  controller.grow = true;
  FakeReward reward;
  RolloutRunDeps deps{&trainer, &buffer, &controller, &reward, "w1", 1};
  v1::RunSpec spec = Spec();
  spec.mutable_rollout()->set_max_concurrent_groups_per_worker(8);
  RolloutRun run("run-grow", spec, deps);
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  absl::MutexLock lock(&buffer.mu);
  ASSERT_GE(buffer.groups.size(), 16u);
  std::set<int> prompt_lengths;
  for (const auto& g : buffer.groups) {
    EXPECT_EQ(g.trajectories_size(), 4);
    prompt_lengths.insert(g.trajectories(0).prompt_token_ids_size());
    for (const auto& t : g.trajectories()) {
      // Never cut short by a cache made for shorter prompts.
      EXPECT_TRUE(t.finish_reason() == v1::FINISH_REASON_STOP ||
                  t.completion_token_ids_size() == 5)
          << t.completion_token_ids_size();
    }
  }
  EXPECT_GE(prompt_lengths.size(), 3u);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.abandoned, 0);
  EXPECT_EQ(controller.completed, static_cast<int>(buffer.groups.size()));
}

// Not even one group fits: the run ends with RESOURCE_EXHAUSTED saying so
// (the worker's status FAILED), its slots and prompts given back.
TEST(RolloutRunTest, AGroupThatCannotFitTheMemoryBudgetEndsTheRun) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/2);
  FakeReward reward;
  model::ModelConfig config;
  RolloutRunDeps deps{&trainer, &buffer, &controller, &reward, "w1", 1};
  deps.memory_budget_bytes = OneGroupGenerationBytes(Spec(), &config) - 1;
  RolloutRun run("run-oom", Spec(), deps);
  const absl::Status status = run.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_NE(status.message().find("generating: rollout worker: one group of prompt 0"),
            absl::string_view::npos)
      << status;
  EXPECT_NE(status.message().find("algorithm.group_size"), absl::string_view::npos);
  absl::MutexLock lock(&buffer.mu);
  EXPECT_TRUE(buffer.groups.empty());
  EXPECT_GE(buffer.released, 3);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.abandoned, 3);
  absl::MutexLock lock3(&reward.mu);
  EXPECT_EQ(reward.items, 0);
}

TEST(RolloutInsertTest, TransientFailureIsRetried) {
  FakeTrainer trainer; trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.hook = [](const v1::InsertGroupsRequest&, int call) -> absl::StatusOr<v1::InsertGroupsResponse> {
    if (call == 0) return absl::UnavailableError("down");
    return v1::InsertGroupsResponse();
  };
  FakeController controller(1);
  FakeReward reward;
  RolloutRun run("run-t", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  ASSERT_TRUE(run.Run().ok());
  // The failed call and its retry (and one more call per further batch:
  // groups are handed to the finisher as they finish).
  EXPECT_GE(buffer.insert_calls.load(), 2);
  absl::MutexLock lock(&buffer.mu);
  EXPECT_EQ(buffer.groups.size(), 3u);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, 3);
  EXPECT_EQ(controller.abandoned, 0);
  EXPECT_EQ(run.Status().groups_inserted(), 3);
  EXPECT_EQ(run.Status().groups_dropped(), 0);
}

TEST(RolloutInsertTest, StoredInsertsReportNoInsertError) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/1);
  FakeReward reward;
  RolloutRun run("run-stored", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  ASSERT_TRUE(run.Run().ok());
  absl::MutexLock lock(&controller.mu);
  ASSERT_FALSE(controller.insert_errors.empty());
  for (const std::string& error : controller.insert_errors) EXPECT_EQ(error, "");
}

TEST(RolloutInsertTest, RefusedGroupAbandonsItsPrompt) {
  FakeTrainer trainer; trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.hook = [](const v1::InsertGroupsRequest& request, int call) -> absl::StatusOr<v1::InsertGroupsResponse> {
    v1::InsertGroupsResponse response;
    for (int i = 0; i < request.groups_size(); ++i) {
      auto* r = response.add_results();
      r->set_idempotency_key(request.groups(i).idempotency_key());
      r->set_status(request.groups(i).prompt_id() == "p1-1" ? v1::INSERT_STATUS_REJECTED_STALE
                                                            : v1::INSERT_STATUS_STORED);
    }
    return response;
  };
  FakeController controller(1);
  FakeReward reward;
  RolloutRun run("run-r", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  ASSERT_TRUE(run.Run().ok());
  // One call, or more: groups are handed to the finisher as they finish.
  EXPECT_GE(buffer.insert_calls.load(), 1);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, 2);
  // Abandoned, not completed: the controller hands the prompt out again
  // rather than skipping it.
  EXPECT_EQ(controller.abandoned, 1);
  EXPECT_EQ(controller.abandoned_ids, std::vector<std::string>({"p1-1"}));
  EXPECT_EQ(controller.late_groups_refused, 1);
  EXPECT_EQ(run.Status().groups_inserted(), 2);
  EXPECT_EQ(run.Status().groups_dropped(), 1);
  EXPECT_EQ(run.Status().late_groups_refused(), 1);
}

// A group refused as INVALID is dropped and its prompt abandoned, but it is
// not a late group.
TEST(RolloutInsertTest, AnInvalidGroupIsNotCountedLate) {
  FakeTrainer trainer; trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.hook = [](const v1::InsertGroupsRequest& request, int) -> absl::StatusOr<v1::InsertGroupsResponse> {
    v1::InsertGroupsResponse response;
    for (int i = 0; i < request.groups_size(); ++i) {
      auto* r = response.add_results();
      r->set_idempotency_key(request.groups(i).idempotency_key());
      r->set_status(request.groups(i).prompt_id() == "p1-0" ? v1::INSERT_STATUS_INVALID
                                                            : v1::INSERT_STATUS_STORED);
    }
    return response;
  };
  FakeController controller(1);
  FakeReward reward;
  RolloutRun run("run-i", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  ASSERT_TRUE(run.Run().ok());
  EXPECT_EQ(run.Status().groups_dropped(), 1);
  EXPECT_EQ(run.Status().late_groups_refused(), 0);
  absl::MutexLock lock(&controller.mu);
  EXPECT_EQ(controller.abandoned, 1);
  EXPECT_EQ(controller.late_groups_refused, 0);
}

TEST(RolloutInsertTest, FatalErrorEndsTheRun) {
  FakeTrainer trainer; trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.hook = [](const v1::InsertGroupsRequest&, int) -> absl::StatusOr<v1::InsertGroupsResponse> {
    return absl::UnimplementedError("no such method");
  };
  FakeController controller(3);
  FakeReward reward;
  RolloutRun run("run-f", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  absl::Status status = run.Run();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
  EXPECT_EQ(buffer.insert_calls.load(), 1);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, 0);
  EXPECT_GE(controller.abandoned, 3);
  EXPECT_EQ(controller.abandoned, controller.prompts_leased);
  // The batch the buffer refused (all three, unless they finished apart
  // and the rest were given back unsent).
  EXPECT_GE(run.Status().groups_dropped(), 1);
  EXPECT_LE(run.Status().groups_dropped(), 3);
  absl::MutexLock lock(&buffer.mu);
  EXPECT_GE(buffer.released, 3);  // the three slots, and the run's release-all at the end
}

TEST(RolloutInsertTest, StopDuringRetriesAbandons) {
  FakeTrainer trainer; trainer.Publish(0);
  FakeBuffer buffer(0);
  absl::Notification retrying;
  buffer.hook = [&](const v1::InsertGroupsRequest&,
                    int call) -> absl::StatusOr<v1::InsertGroupsResponse> {
    if (call >= 1 && !retrying.HasBeenNotified()) retrying.Notify();
    return absl::UnavailableError("down");
  };
  FakeController controller(3);
  FakeReward reward;
  RolloutRun run("run-s", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  absl::Notification done;
  std::thread thread([&] { EXPECT_TRUE(run.Run().ok()); done.Notify(); });
  ASSERT_TRUE(retrying.WaitForNotificationWithTimeout(absl::Seconds(30)));
  run.Stop(false);
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  thread.join();
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, 0);
  EXPECT_GE(controller.abandoned, 3);
  EXPECT_EQ(controller.abandoned, controller.prompts_leased);
  absl::MutexLock lock(&buffer.mu);
  EXPECT_GE(buffer.released, 3);
}

// ---- late groups ----------------------------------------------------------

// The same prompts handed out twice (their first lease expired) and both
// generations finished: the buffer stores each prompt once, the second
// group is a late group refused, and the prompt is complete (it is in the
// buffer). With keys taken from the generation, both would be stored and
// the prompt trained twice.
TEST(RolloutLateGroupTest, APromptFinishedTwiceIsStoredOnceAndTheSecondGroupCountedLate) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/2);
  controller.reissue = true;
  FakeReward reward;
  std::atomic<int64_t> late_observed{0};
  RolloutRunDeps deps{&trainer, &buffer, &controller, &reward, "w1", 7};
  deps.on_late_groups_refused = [&](int64_t n) { late_observed += n; };
  RolloutRun run("run-late", Spec(), deps);
  ASSERT_TRUE(run.Run().ok());

  absl::MutexLock lock(&buffer.mu);
  ASSERT_EQ(buffer.groups.size(), 3u);
  std::set<std::string> prompts;
  for (const auto& g : buffer.groups) prompts.insert(g.prompt_id());
  EXPECT_EQ(prompts, std::set<std::string>({"p1-0", "p1-1", "p1-2"}));
  EXPECT_EQ(run.Status().groups_inserted(), 3);
  EXPECT_EQ(run.Status().late_groups_refused(), 3);
  EXPECT_EQ(run.Status().groups_dropped(), 3);
  EXPECT_EQ(late_observed.load(), 3);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, 6);
  EXPECT_EQ(controller.abandoned, 0);
  EXPECT_EQ(controller.late_groups_refused, 3);
}

// Our own first send was stored but its ack was lost: the resend is answered
// DUPLICATE, which is our group stored, not a late one.
TEST(RolloutLateGroupTest, ADuplicateOfOurOwnLostAckIsStoredNotLate) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.hook = [&buffer](const v1::InsertGroupsRequest& request,
                          int call) -> absl::StatusOr<v1::InsertGroupsResponse> {
    if (call == 0) {
      buffer.Store(request);
      return absl::UnavailableError("connection reset after the groups were stored");
    }
    return v1::InsertGroupsResponse();  // the fake's own answer: DUPLICATE
  };
  FakeController controller(1);
  FakeReward reward;
  RolloutRun run("run-ack", Spec(), {&trainer, &buffer, &controller, &reward, "w1", 1});
  ASSERT_TRUE(run.Run().ok());
  EXPECT_GE(buffer.insert_calls.load(), 2);  // the lost ack and its resend
  EXPECT_EQ(run.Status().groups_inserted(), 3);
  EXPECT_EQ(run.Status().late_groups_refused(), 0);
  EXPECT_EQ(run.Status().groups_dropped(), 0);
  absl::MutexLock lock(&buffer.mu);
  EXPECT_EQ(buffer.groups.size(), 3u);
  absl::MutexLock lock2(&controller.mu);
  EXPECT_EQ(controller.completed, 3);
  EXPECT_EQ(controller.late_groups_refused, 0);
}

// ---- services away -------------------------------------------------------

clients::RetryOptions FastRetries(absl::Duration deadline = absl::Minutes(1)) {
  clients::RetryOptions options;
  options.initial_backoff = absl::Milliseconds(5);
  options.max_backoff = absl::Milliseconds(20);
  options.deadline = deadline;
  return options;
}

// Fails the first `failures` calls UNAVAILABLE, as a reward server that is
// restarting; later calls reach `inner`.
class RestartingReward : public clients::RewardClient {
 public:
  RestartingReward(clients::RewardClient& inner, int failures)
      : inner_(inner), failures_(failures) {}
  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration timeout) override {
    if (calls++ == 0) first_call.Notify();
    if (failures_.fetch_sub(1) > 0) return absl::UnavailableError("reward server restarting");
    return inner_.ScoreBatch(request, timeout);
  }
  std::atomic<int> calls{0};
  absl::Notification first_call;

 private:
  clients::RewardClient& inner_;
  std::atomic<int> failures_;
};

// More failures than the run's own three attempts used to allow: the client
// rides them out, and the batch is scored once and inserted once.
TEST(RolloutServicesAwayTest, ARewardServerAwayForAWhileScoresTheBatchOnceAndInsertsItOnce) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/1);
  FakeReward reward;
  RestartingReward restarting(reward, /*failures=*/6);
  clients::RetryingRewardClient retrying(restarting, FastRetries());
  RolloutRun run("run-rs", Spec(), {&trainer, &buffer, &controller, &retrying, "w1", 1});
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  // Six failures and the call that got through (and one call per further
  // batch, if the groups finished apart).
  EXPECT_GE(restarting.calls.load(), 7);
  absl::MutexLock lock(&reward.mu);
  EXPECT_EQ(reward.items, 12);  // 3 prompts x G = 4, scored once
  absl::MutexLock lock2(&buffer.mu);
  EXPECT_EQ(buffer.groups.size(), 3u);
  EXPECT_EQ(buffer.insert_calls.load(), restarting.calls.load() - 6);  // once per batch
  absl::MutexLock lock3(&controller.mu);
  EXPECT_EQ(controller.completed, 3);
  EXPECT_EQ(controller.abandoned, 0);
}

// Fails the first `lease_failures` LeasePrompts and `report_failures`
// ReportRolloutProgress calls UNAVAILABLE, as a controller restarting.
class RestartingController : public clients::ControllerClient {
 public:
  RestartingController(clients::ControllerClient& inner, int lease_failures,
                       int report_failures)
      : inner_(inner), lease_failures_(lease_failures), report_failures_(report_failures) {}
  absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(
      const v1::LeasePromptsRequest& request) override {
    if (lease_failures_.fetch_sub(1) > 0) return absl::UnavailableError("controller restarting");
    return inner_.LeasePrompts(request);
  }
  absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest& request) override {
    if (report_failures_.fetch_sub(1) > 0) return absl::UnavailableError("controller restarting");
    return inner_.ReportRolloutProgress(request);
  }
  absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest& request) override {
    return inner_.ReportTrainerProgress(request);
  }

 private:
  clients::ControllerClient& inner_;
  std::atomic<int> lease_failures_;
  std::atomic<int> report_failures_;
};

// The worker does not fail, and does not lose its report, while the
// controller restarts: the completed prompts reach it once it is back.
TEST(RolloutServicesAwayTest, AControllerAwayForAWhileGetsTheLeasesAndReportsOnceBack) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/1);
  RestartingController restarting(controller, /*lease_failures=*/4, /*report_failures=*/4);
  clients::RetryingControllerClient retrying(restarting, FastRetries());
  FakeReward reward;
  RolloutRun run("run-cs", Spec(), {&trainer, &buffer, &retrying, &reward, "w1", 1});
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  absl::MutexLock lock(&controller.mu);
  EXPECT_EQ(controller.completed, 3);
  EXPECT_EQ(controller.abandoned, 0);
  absl::MutexLock lock2(&buffer.mu);
  EXPECT_EQ(buffer.groups.size(), 3u);
}

// The buffer restarting: admission is retried until it is back.
TEST(RolloutServicesAwayTest, ABufferAwayForAWhileIsWaitedForAtAdmission) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.acquire_failures = 5;
  clients::RetryingReplayBufferClient retrying(buffer, FastRetries());
  FakeController controller(/*batches=*/1);
  FakeReward reward;
  RolloutRun run("run-bs", Spec(), {&trainer, &retrying, &controller, &reward, "w1", 1});
  const absl::Status status = run.Run();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(buffer.acquire_failures.load(), 0);
  absl::MutexLock lock(&buffer.mu);
  EXPECT_EQ(buffer.groups.size(), 3u);
}

// Runs `run` on a thread; its status, or nullopt if it has not returned
// within `timeout` (then it is stopped, so that the test ends).
std::optional<absl::Status> RunWithin(RolloutRun& run, absl::Duration timeout) {
  absl::Notification done;
  absl::Status status;
  std::thread thread([&] {
    status = run.Run();
    done.Notify();
  });
  const bool returned = done.WaitForNotificationWithTimeout(timeout);
  if (!returned) run.Stop(/*abort=*/true);
  thread.join();
  if (!returned) return std::nullopt;
  return status;
}

// Only the retry deadline running out fails the run, and its error names the
// service and how long it was away; the batch's prompts go back.
TEST(RolloutServicesAwayTest, ARewardServerGoneForTheWholeRetryDeadlineFailsTheRunNamingIt) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/3);
  FakeReward reward;
  RestartingReward gone(reward, /*failures=*/1 << 30);
  clients::RetryingRewardClient retrying(gone, FastRetries(absl::Milliseconds(300)));
  RolloutRun run("run-gone", Spec(), {&trainer, &buffer, &controller, &retrying, "w1", 1});
  const std::optional<absl::Status> status = RunWithin(run, absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "the run did not end";
  EXPECT_EQ(status->code(), absl::StatusCode::kUnavailable) << *status;
  EXPECT_THAT(std::string(status->message()),
              ::testing::HasSubstr("scoring rollouts: reward_server unreachable for"));
  absl::MutexLock lock(&controller.mu);
  EXPECT_GE(controller.abandoned, 3);
  EXPECT_EQ(controller.abandoned, controller.prompts_leased);
  absl::MutexLock lock2(&buffer.mu);
  EXPECT_TRUE(buffer.groups.empty());
}

TEST(RolloutServicesAwayTest, ABufferGoneForTheWholeRetryDeadlineFailsTheRunNamingIt) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.acquire_failures = 1 << 30;
  clients::RetryingReplayBufferClient retrying(buffer, FastRetries(absl::Milliseconds(300)));
  FakeController controller(/*batches=*/3);
  FakeReward reward;
  RolloutRun run("run-bgone", Spec(), {&trainer, &retrying, &controller, &reward, "w1", 1});
  const std::optional<absl::Status> status = RunWithin(run, absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "the run kept waiting for the buffer";
  EXPECT_EQ(status->code(), absl::StatusCode::kUnavailable) << *status;
  EXPECT_THAT(std::string(status->message()),
              ::testing::HasSubstr("acquiring generation slots: replay_buffer unreachable for"));
}

// Inserts the buffer refuses for the whole retry deadline (every stream
// refused: another client holds the streams) are reported to the controller
// with why, so that the run's status can say it; a stored insert reports
// none.
TEST(RolloutInsertTest, InsertsRefusedUntilTheDeadlineAreReportedWithTheReason) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.hook = [](const v1::InsertGroupsRequest&,
                   int) -> absl::StatusOr<v1::InsertGroupsResponse> {
    return absl::ResourceExhaustedError(
        "InsertGroups: the connection of ipv4:127.0.0.1:4000 already has 256 streams open");
  };
  FakeController controller(/*batches=*/3);
  FakeReward reward;
  RolloutRunDeps deps{&trainer, &buffer, &controller, &reward, "w1", 1};
  deps.retry_deadline = absl::Milliseconds(500);
  RolloutRun run("run-refused", Spec(), deps);
  ASSERT_TRUE(RunWithin(run, absl::Seconds(60)).has_value()) << "the run did not end";
  absl::MutexLock lock(&controller.mu);
  // While the insert retries, and once it gave up.
  std::vector<std::string> said;
  for (const std::string& error : controller.insert_errors) {
    if (!error.empty()) said.push_back(error);
  }
  ASSERT_GE(said.size(), 2u);
  EXPECT_THAT(said.front(), ::testing::HasSubstr("RESOURCE_EXHAUSTED"));
  for (const std::string& error : said) {
    EXPECT_THAT(error, ::testing::HasSubstr("256 streams open"));
  }
}

// Inserts that never reach the buffer end the run once the retry deadline
// passes (they used to be abandoned and the loop went on for ever), the
// prompts given back.
TEST(RolloutServicesAwayTest, InsertsUnreachableForTheRetryDeadlineFailTheRun) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  buffer.hook = [](const v1::InsertGroupsRequest&, int) -> absl::StatusOr<v1::InsertGroupsResponse> {
    return absl::UnavailableError("connection refused");
  };
  FakeController controller(/*batches=*/3);
  FakeReward reward;
  RolloutRunDeps deps{&trainer, &buffer, &controller, &reward, "w1", 1};
  deps.retry_deadline = absl::Milliseconds(500);
  RolloutRun run("run-igone", Spec(), deps);
  const std::optional<absl::Status> status = RunWithin(run, absl::Seconds(60));
  ASSERT_TRUE(status.has_value()) << "the run did not end";
  EXPECT_THAT(std::string(status->message()),
              ::testing::HasSubstr("inserting groups: replay_buffer unreachable"));
  EXPECT_TRUE(clients::IsRetriesExhausted(*status));
  EXPECT_GE(buffer.insert_calls.load(), 2);
  absl::MutexLock lock(&controller.mu);
  EXPECT_GE(controller.abandoned, 3);
  EXPECT_EQ(controller.abandoned, controller.prompts_leased);
  EXPECT_EQ(controller.completed, 0);
}

// Two-sided: a worker told to stop while its reward client waits to retry
// returns at once, not after the retry deadline, and gives its prompts back.
TEST(RolloutServicesAwayTest, StopEndsTheClientsRetriesPromptly) {
  FakeTrainer trainer;
  trainer.Publish(0);
  FakeBuffer buffer(0);
  FakeController controller(/*batches=*/3);
  FakeReward reward;
  RestartingReward gone(reward, /*failures=*/1 << 30);
  clients::RetryOptions options;
  options.initial_backoff = absl::Minutes(5);
  options.max_backoff = absl::Minutes(5);
  options.cancellation = std::make_shared<clients::RetryCancellation>();
  clients::RetryingRewardClient retrying(gone, options);
  RolloutRunDeps deps{&trainer, &buffer, &controller, &retrying, "w1", 1};
  deps.retry_cancellation = options.cancellation;
  RolloutRun run("run-stop", Spec(), deps);
  absl::Notification done;
  absl::Status status;
  std::thread thread([&] {
    status = run.Run();
    done.Notify();
  });
  // Scoring has started and waits in its first backoff.
  EXPECT_TRUE(gone.first_call.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  run.Stop(/*abort=*/false);
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  thread.join();
  EXPECT_TRUE(status.ok()) << status;
  // One attempt for each batch handed to the finisher (the one waiting in
  // its backoff, and those queued behind it, tried once when stopping), no
  // retries.
  absl::MutexLock lock(&controller.mu);
  EXPECT_GE(gone.calls.load(), 1);
  EXPECT_LE(gone.calls.load(), controller.prompts_leased);  // a batch holds a group or more
  EXPECT_GE(controller.abandoned, 3);
  EXPECT_EQ(controller.abandoned, controller.prompts_leased);
}

}  // namespace
}  // namespace sluice::rollout_worker
