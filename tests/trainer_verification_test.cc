// The trainer verifying rollout workers end to end (issue 19): real runs of
// the trainer over the real run table (replay_buffer/run_table.h), fed by an
// honest worker that generates with the published weights (model::Generate:
// batched, KV-cached decoding) and a rogue one that forges. The rogue's
// groups are left out of every batch and it ends quarantined: the buffer
// refuses its slots (PERMISSION_DENIED) and inserts; the honest worker's
// groups all pass.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/model/generation.h"
#include "common/run/run_model.h"
#include "common/status_macros.h"
#include "common/task/char_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/proto_convert.h"
#include "replay_buffer/run_table.h"
#include "trainer/rollout_verifier.h"
#include "trainer/trainer.h"

namespace sluice::trainer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kRun[] = "run-verify";
constexpr int kGroupSize = 4;
constexpr char kHonest[] = "honest-worker";
constexpr char kRogue[] = "rogue-worker";

// Who inserts the groups, as the buffer service stamps it (Group.inserted_by),
// and which worker id the rogue's groups name.
struct Senders {
  std::string honest;
  std::string rogue;
  std::string rogue_claims;
};
// Workers with credentials: each can only name itself.
const Senders kAuthenticated{"worker:honest-worker", "worker:rogue-worker", kRogue};
// A plain stack: the rogue names the honest worker; only the connections
// tell them apart.
const Senders kPlain{"peer:ipv4:127.0.0.1:41001", "peer:ipv4:127.0.0.1:42002", kHonest};

v1::RunSpec VerifySpec(int64_t steps) {
  v1::RunSpec spec;
  spec.set_seed(5);
  spec.mutable_model()->set_builtin("micro");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(9);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(40);
  arithmetic->set_num_operands(2);
  spec.mutable_task()->set_eval_split_size(8);
  auto* alg = spec.mutable_algorithm();
  alg->set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  alg->set_group_size(kGroupSize);
  alg->set_batch_size_groups(4);
  alg->set_max_staleness(1);
  alg->set_clip_eps_low(0.2);
  alg->set_behaviour_weight_cap(5);
  // Large steps, so that versions differ (a claim of another version shows).
  alg->set_learning_rate(1e-2);
  alg->set_grad_clip_norm(1.0);
  alg->set_advantage_eps(1e-6);
  alg->set_total_steps(steps);
  alg->set_minibatches_per_batch(1);
  alg->mutable_rollout_verification()->set_quarantine_after_failed_groups(3);
  spec.mutable_rollout()->mutable_sampling()->set_temperature(1.0);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(6);
  spec.mutable_eval()->set_num_prompts(4);
  return spec;
}

class ExactReward : public clients::RewardClient {
 public:
  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration) override {
    v1::ScoreBatchResponse response;
    for (const auto& item : request.items()) {
      v1::ScoreResult* result = response.add_results();
      result->set_item_id(item.item_id());
      result->mutable_result()->set_reward(item.response() == item.reference_answer() ? 1.0 : 0.0);
      result->mutable_result()->set_error_kind(v1::VERIFIER_ERROR_NONE);
    }
    return response;
  }
};

// The trainer's buffer client over a real run table, with the workers'
// part played inline: before a new step is sampled, groups are generated
// with the weights the trainer published (at its version or one before, so
// that some are stale and verified under an older version) and inserted
// as the buffer's InsertGroups would. UpdatePolicyVersion passes the
// quarantine on as the buffer service does.
class WorkersAndTable : public clients::ReplayBufferClient {
 public:
  // Every `rogue_every`-th group (0 = none) is the rogue's, forged.
  WorkersAndTable(const v1::RunSpec& spec, WeightStore* weights, int rogue_every,
                  Senders senders = kAuthenticated)
      : weights_(weights), rogue_every_(rogue_every), senders_(std::move(senders)) {
    replay_buffer::RunConfig config;
    config.run_id = kRun;
    config.batch_size_groups = spec.algorithm().batch_size_groups();
    config.max_staleness = spec.algorithm().max_staleness();
    config.group_size = kGroupSize;
    config.seed = spec.seed();
    absl::StatusOr<std::unique_ptr<replay_buffer::RunTable>> table =
        replay_buffer::RunTable::Create(config);
    EXPECT_TRUE(table.ok()) << table.status();
    table_ = std::move(table).value();
  }

  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest&) override {
    return absl::UnimplementedError("not used by the trainer");
  }
  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest&) override {
    return absl::UnimplementedError("not used by the trainer");
  }
  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(const v1::InsertGroupsRequest&) override {
    return absl::UnimplementedError("not used by the trainer");
  }

  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request) override {
    const replay_buffer::RunStats stats = table_->Stats();
    if (request.step() > std::max(stats.last_recorded_step, stats.committed_step)) {
      while (table_->Stats().size_groups < request.batch_size_groups()) {
        RETURN_IF_ERROR(MakeAndInsert(request.trainer_policy_version()));
      }
    }
    absl::StatusOr<replay_buffer::SampleResult> result =
        table_->Sample(replay_buffer::SampleRequestFromProto(request, absl::Seconds(1)));
    v1::SampleResponse response;
    if (absl::IsDeadlineExceeded(result.status())) {
      response.set_timed_out(true);
      return response;
    }
    if (!result.ok()) return result.status();
    for (const replay_buffer::SampledGroup& sampled : result->groups) {
      v1::SampledGroup* out = response.add_groups();
      *out->mutable_group() = *sampled.group;
      out->set_staleness(sampled.staleness);
      out->set_times_sampled(sampled.times_sampled);
      absl::MutexLock lock(&mu_);
      ++sampled_by_sender_[sampled.group->inserted_by()];
    }
    response.set_policy_version(result->policy_version);
    response.set_buffer_version(result->buffer_version);
    return response;
  }

  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest& request) override {
    if (request.quarantined_worker_ids_size() > 0) {
      absl::StatusOr<std::vector<std::string>> added = table_->QuarantineWorkers(
          {request.quarantined_worker_ids().begin(), request.quarantined_worker_ids().end()});
      if (!added.ok()) return added.status();
    }
    table_->QuarantineConnections(
        {request.quarantined_connections().begin(), request.quarantined_connections().end()});
    absl::StatusOr<replay_buffer::UpdateVersionResult> updated =
        table_->UpdatePolicyVersion(request.policy_version());
    if (!updated.ok()) return updated.status();
    v1::UpdatePolicyVersionResponse response;
    response.set_policy_version(updated->policy_version);
    return response;
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest&) override {
    v1::GetStatsResponse response;
    replay_buffer::RunStatsToProto(table_->Stats(), response.mutable_stats());
    return response;
  }
  absl::StatusOr<v1::CommitTrainedStepsResponse> CommitTrainedSteps(
      const v1::CommitTrainedStepsRequest& request) override {
    absl::StatusOr<replay_buffer::CommitResult> committed =
        table_->CommitTrainedSteps(request.step());
    if (!committed.ok()) return committed.status();
    v1::CommitTrainedStepsResponse response;
    response.set_committed_step(committed->committed_step);
    return response;
  }
  void CancelSample() override {}

  replay_buffer::RunTable& table() { return *table_; }
  // A group as the named worker would make it now (forged for the rogue).
  absl::StatusOr<v1::Group> MakeGroup(const std::string& worker, int64_t trainer_version) {
    return Make(worker, trainer_version, next_group_++, /*rogue=*/worker == kRogue);
  }
  // Groups sampled, by who inserted them (Senders).
  std::map<std::string, int64_t> sampled_by_sender() {
    absl::MutexLock lock(&mu_);
    return sampled_by_sender_;
  }
  int64_t rogue_refused() const { return rogue_refused_; }
  // Forgeries made, by kind.
  std::map<std::string, int64_t> forged;

 private:
  absl::Status MakeAndInsert(int64_t trainer_version) {
    const int n = next_group_++;
    const bool rogue = rogue_every_ > 0 && n % rogue_every_ == rogue_every_ - 1;
    absl::StatusOr<v1::Group> group =
        Make(rogue ? senders_.rogue_claims : kHonest, trainer_version, n, rogue);
    if (!group.ok()) return group.status();
    group->set_inserted_by(rogue ? senders_.rogue : senders_.honest);
    const replay_buffer::InsertResult inserted = table_->Insert(*std::move(group));
    if (inserted.status == replay_buffer::InsertStatus::kQuarantined) {
      EXPECT_TRUE(rogue);
      EXPECT_THAT(inserted.message, HasSubstr("quarantined"));
      ++rogue_refused_;
      return absl::OkStatus();
    }
    if (inserted.status != replay_buffer::InsertStatus::kStored) {
      return absl::InternalError(inserted.message);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<v1::Group> Make(const std::string& worker, int64_t trainer_version, int n,
                                 bool rogue) {
    // Half the groups one version old (staleness 1 = eta).
    const int64_t version = std::max<int64_t>(0, trainer_version - n % 2);
    absl::StatusOr<std::shared_ptr<const PublishedVersion>> published =
        weights_->Get(kRun, version);
    if (!published.ok()) return published.status();
    auto model = Model(**published);
    if (!model.ok()) return model.status();
    task::CharTokenizer tokenizer;
    const std::vector<int32_t> prompt =
        *tokenizer.Encode(absl::StrCat(n % 10, "+", (n / 10) % 10, "="));
    model::SamplingOptions sampling;
    sampling.temperature = 1.0;
    sampling.max_new_tokens = 6;
    sampling.stop_token_ids = {tokenizer.eos_id()};
    sampling.seed = 1000 + n;
    absl::StatusOr<std::vector<model::Completion>> completions = model::Generate(
        {*model, version}, std::vector<std::vector<int32_t>>(kGroupSize, prompt), sampling);
    if (!completions.ok()) return completions.status();
    v1::Group group;
    group.set_run_id(kRun);
    group.set_group_id(absl::StrCat("g", n));
    group.set_idempotency_key(absl::StrCat(kRun, "/g", n));
    for (int i = 0; i < kGroupSize; ++i) {
      const model::Completion& c = (*completions)[i];
      v1::Trajectory* t = group.add_trajectories();
      t->set_trajectory_id(absl::StrCat("g", n, "/", i));
      t->set_rollout_worker_id(worker);
      for (int32_t id : prompt) t->add_prompt_token_ids(id);
      for (size_t k = 0; k < c.tokens.size(); ++k) {
        t->add_completion_token_ids(c.tokens[k]);
        t->add_behaviour_logprobs(c.logprobs[k]);
        t->add_token_policy_versions(c.versions[k]);
      }
      t->set_reward((i + n) % 2);  // a signal in every group
      t->set_finish_reason(c.finish == model::Finish::kStop ? v1::FINISH_REASON_STOP
                                                            : v1::FINISH_REASON_LENGTH);
    }
    if (rogue) Forge(group, n, version, trainer_version);
    return group;
  }

  // The rogue's lies, in turn: log-probs inflated, a token replaced with
  // its log-prob kept, the versions claimed one older (or, for a group
  // already one old, one newer: older would be past eta, which the buffer's
  // staleness gate refuses by itself) than generated them.
  void Forge(v1::Group& group, int n, int64_t version, int64_t trainer_version) {
    v1::Trajectory& t = *group.mutable_trajectories(n % kGroupSize);
    const int kind = (n / rogue_every_) % 3;
    if (kind == 0 || (kind == 2 && version == 0)) {
      for (int k = 0; k < t.behaviour_logprobs_size(); ++k) {
        t.set_behaviour_logprobs(k, t.behaviour_logprobs(k) * 0.9f);
      }
      ++forged["log-probs scaled x0.9"];
    } else if (kind == 1) {
      const int k = t.completion_token_ids_size() / 2;
      t.set_completion_token_ids(k, t.completion_token_ids(k) == 5 ? 6 : 5);
      ++forged["a token replaced, log-prob kept"];
    } else if (version == trainer_version) {
      for (int k = 0; k < t.token_policy_versions_size(); ++k) {
        t.set_token_policy_versions(k, version - 1);
      }
      ++forged["versions claimed one older"];
    } else {
      for (int k = 0; k < t.token_policy_versions_size(); ++k) {
        t.set_token_policy_versions(k, version + 1);
      }
      ++forged["versions claimed one newer"];
    }
  }

  static absl::StatusOr<std::shared_ptr<const model::Transformer>> Model(
      const PublishedVersion& published) {
    static const model::ModelConfig config = [] {
      absl::StatusOr<model::ModelConfig> c = run::LoadRunModelConfig(VerifySpec(1).model());
      EXPECT_TRUE(c.ok()) << c.status();
      return *c;
    }();
    absl::StatusOr<std::unique_ptr<model::Transformer>> model =
        model::Transformer::CreateUninitialized(config);
    if (!model.ok()) return model.status();
    std::vector<model::NamedTensor> weights;
    for (size_t i = 0; i < published.tensors.size(); ++i) {
      const v1::TensorSpec& spec = published.tensors[i];
      absl::StatusOr<torch::Tensor> tensor = model::Float32TensorFromBytes(
          std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), published.bytes[i]);
      if (!tensor.ok()) return tensor.status();
      weights.push_back({spec.name(), *tensor});
    }
    RETURN_IF_ERROR((*model)->LoadWeights(weights));
    return std::shared_ptr<const model::Transformer>(std::move(*model));
  }

  WeightStore* const weights_;
  const int rogue_every_;
  const Senders senders_;
  std::unique_ptr<replay_buffer::RunTable> table_;
  int next_group_ = 0;
  int64_t rogue_refused_ = 0;
  absl::Mutex mu_;
  std::map<std::string, int64_t> sampled_by_sender_ ABSL_GUARDED_BY(mu_);
};

struct RunFigures {
  std::vector<v1::TrainingStepMetrics> steps;
  std::map<std::string, v1::WorkerVerification> by_worker;
  std::vector<std::string> quarantined;
  std::vector<std::string> quarantined_connections;
  int64_t verified = 0, failed = 0, unverifiable = 0;
  double max_abs_diff = 0, verification_seconds = 0, step_seconds = 0;
};

RunFigures Figures(const std::vector<v1::TrainingStepMetrics>& steps) {
  RunFigures f;
  f.steps = steps;
  for (const v1::TrainingStepMetrics& s : steps) {
    f.verified += s.groups_verified();
    f.failed += s.groups_verification_failed();
    f.unverifiable += s.groups_unverifiable();
    f.max_abs_diff = std::max(f.max_abs_diff, s.verification_max_abs_diff());
    f.verification_seconds += s.verification_seconds();
    f.step_seconds += s.step_seconds();
    for (const v1::WorkerVerification& w : s.verification_by_worker()) {
      v1::WorkerVerification& total = f.by_worker[w.worker_id()];
      total.set_groups_verified(total.groups_verified() + w.groups_verified());
      total.set_groups_failed(total.groups_failed() + w.groups_failed());
      for (const std::string& c : w.quarantined_connections()) {
        f.quarantined_connections.push_back(c);
      }
    }
    for (const std::string& q : s.workers_quarantined()) f.quarantined.push_back(q);
  }
  return f;
}

RunFigures Train(const v1::RunSpec& spec, int rogue_every,
                 std::unique_ptr<WorkersAndTable>* kept = nullptr,
                 const Senders& senders = kAuthenticated) {
  WeightStore weights(8);
  auto buffer = std::make_unique<WorkersAndTable>(spec, &weights, rogue_every, senders);
  ExactReward reward;
  std::vector<v1::TrainingStepMetrics> steps;
  TrainerRunDeps deps{buffer.get(), &reward, nullptr, &weights};
  deps.on_step = [&](const v1::TrainingStepMetrics& step) { steps.push_back(step); };
  TrainerRun run(kRun, spec, deps);
  const absl::Status status = run.Run();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(run.Status().step(), spec.algorithm().total_steps());
  if (kept != nullptr) *kept = std::move(buffer);
  return Figures(steps);
}

TEST(TrainerVerificationTest, RogueWorkerIsLeftOutAndQuarantinedHonestOneIsNot) {
  const v1::RunSpec spec = VerifySpec(/*steps=*/12);
  std::unique_ptr<WorkersAndTable> buffer;
  const RunFigures f = Train(spec, /*rogue_every=*/3, &buffer);
  std::map<std::string, int64_t> sampled;
  for (const auto& [sender, count] : buffer->sampled_by_sender()) {
    sampled[sender == kAuthenticated.rogue ? kRogue : kHonest] += count;
  }
  // Every rogue group the trainer sampled failed; no honest one did.
  ASSERT_GT(sampled.count(kRogue), 0u);
  EXPECT_EQ(f.by_worker.at(kRogue).groups_failed(), sampled.at(kRogue));
  EXPECT_EQ(f.by_worker.at(kRogue).groups_verified(), 0);
  EXPECT_EQ(f.by_worker.at(kHonest).groups_failed(), 0);
  EXPECT_EQ(f.by_worker.at(kHonest).groups_verified(), sampled.at(kHonest));
  EXPECT_TRUE(f.quarantined_connections.empty());
  EXPECT_EQ(f.unverifiable, 0);
  // Quarantined once, at the third failure; the buffer refuses it since
  // (only the rest of that step's batch can hold more of its groups).
  EXPECT_THAT(f.quarantined, ElementsAre(kRogue));
  EXPECT_GE(sampled.at(kRogue), 3);
  EXPECT_LT(sampled.at(kRogue), 3 + spec.algorithm().batch_size_groups());
  EXPECT_GT(buffer->rogue_refused(), 0);
  EXPECT_THAT(buffer->table().QuarantinedWorkers(), ElementsAre(kRogue));
  replay_buffer::AcquireRequest acquire;
  acquire.worker_id = kRogue;
  acquire.worker_incarnation = 99;
  acquire.num_groups = 1;
  const absl::StatusOr<replay_buffer::AcquireResult> refused =
      buffer->table().AcquireSlots(acquire);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("quarantined"));
  acquire.worker_id = kHonest;
  EXPECT_TRUE(buffer->table().AcquireSlots(acquire).ok());
  // Steps whose batch lost groups still trained and published.
  int64_t trained_groups = 0;
  for (const v1::TrainingStepMetrics& s : f.steps) trained_groups += s.groups();
  EXPECT_EQ(trained_groups, 12 * 4 - sampled.at(kRogue));
  const replay_buffer::RunStats stats = buffer->table().Stats();
  EXPECT_EQ(stats.committed_step, 12);  // every step's batch let go of
  std::printf("rogue in a trainer run: sampled rogue groups=%lld flagged=%lld; honest "
              "groups=%lld flagged=%lld; rogue inserts refused after quarantine=%lld\n",
              static_cast<long long>(sampled.at(kRogue)),
              static_cast<long long>(f.by_worker.at(kRogue).groups_failed()),
              static_cast<long long>(sampled.at(kHonest)),
              static_cast<long long>(f.by_worker.at(kHonest).groups_failed()),
              static_cast<long long>(buffer->rogue_refused()));
  for (const auto& [kind, count] : buffer->forged) {
    std::printf("  forged %-34s %lld\n", kind.c_str(), static_cast<long long>(count));
  }
}

// The hostile test's attack on a plain stack: a local client inserts forged
// groups naming the honest worker. Its groups are left out as before, but
// the honest worker is not quarantined (its name was only claimed): the
// connection that sent them is, and the buffer refuses that connection while
// the honest worker goes on.
TEST(TrainerVerificationTest, ForgedGroupsNamingTheHonestWorkerQuarantineTheirConnectionOnly) {
  const v1::RunSpec spec = VerifySpec(/*steps=*/12);
  std::unique_ptr<WorkersAndTable> buffer;
  const RunFigures f = Train(spec, /*rogue_every=*/3, &buffer, kPlain);
  const std::map<std::string, int64_t> sampled = buffer->sampled_by_sender();
  ASSERT_GT(sampled.count(kPlain.rogue), 0u);
  // All under the honest worker's name: the forged ones failed, the rest passed.
  EXPECT_EQ(f.by_worker.size(), 1u);
  EXPECT_EQ(f.by_worker.at(kHonest).groups_failed(), sampled.at(kPlain.rogue));
  EXPECT_EQ(f.by_worker.at(kHonest).groups_verified(), sampled.at(kPlain.honest));
  EXPECT_TRUE(f.quarantined.empty());
  EXPECT_TRUE(buffer->table().QuarantinedWorkers().empty());
  EXPECT_THAT(f.quarantined_connections, ElementsAre(kPlain.rogue));
  EXPECT_GT(buffer->rogue_refused(), 0);  // Its inserts, by its connection.
  replay_buffer::AcquireRequest acquire;
  acquire.worker_id = kHonest;
  acquire.worker_incarnation = 99;
  acquire.num_groups = 1;
  acquire.caller = kPlain.rogue;
  const absl::StatusOr<replay_buffer::AcquireResult> refused =
      buffer->table().AcquireSlots(acquire);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("the connection " + kPlain.rogue + " is quarantined"));
  acquire.caller = kPlain.honest;
  EXPECT_TRUE(buffer->table().AcquireSlots(acquire).ok());
  int64_t trained_groups = 0;
  for (const v1::TrainingStepMetrics& s : f.steps) trained_groups += s.groups();
  EXPECT_EQ(trained_groups, 12 * 4 - sampled.at(kPlain.rogue));
}

// The deployment's own worker is trusted (trusted_worker_ids): its groups
// are a sample at the default trusted_fraction (1/16), while a worker with
// another id is verified in full, and still caught and quarantined.
TEST(TrainerVerificationTest, TrustedWorkersAreSampledOthersVerifiedInFull) {
  v1::RunSpec spec = VerifySpec(/*steps=*/12);
  spec.mutable_algorithm()->mutable_rollout_verification()->add_trusted_worker_ids(kHonest);
  std::unique_ptr<WorkersAndTable> buffer;
  const RunFigures f = Train(spec, /*rogue_every=*/3, &buffer);
  std::map<std::string, int64_t> sampled;
  for (const auto& [sender, count] : buffer->sampled_by_sender()) {
    sampled[sender == kAuthenticated.rogue ? kRogue : kHonest] += count;
  }
  ASSERT_GT(sampled.count(kRogue), 0u);
  EXPECT_EQ(f.by_worker.at(kRogue).groups_failed(), sampled.at(kRogue));
  EXPECT_THAT(f.quarantined, ElementsAre(kRogue));
  // About 1/16 of the ~40 honest groups: never all of them (16^-40).
  const int64_t honest_verified =
      f.by_worker.count(kHonest) > 0 ? f.by_worker.at(kHonest).groups_verified() : 0;
  EXPECT_LT(honest_verified, sampled.at(kHonest));
  EXPECT_EQ(f.failed, sampled.at(kRogue));
  std::printf(
      "trusted honest worker: %lld of %lld groups verified; untrusted rogue: %lld of "
      "%lld flagged\n",
      static_cast<long long>(honest_verified), static_cast<long long>(sampled.at(kHonest)),
      static_cast<long long>(f.by_worker.at(kRogue).groups_failed()),
      static_cast<long long>(sampled.at(kRogue)));
}

// A long honest run: no group fails. Also what verification costs the
// trainer (printed; a test asserts no wall-clock figure).
TEST(TrainerVerificationTest, LongHonestRunFlagsNothing) {
  constexpr int64_t kSteps = 40;
  const RunFigures on = Train(VerifySpec(kSteps), /*rogue_every=*/0);
  EXPECT_EQ(on.failed, 0);
  EXPECT_EQ(on.verified, kSteps * 4);
  EXPECT_LT(on.max_abs_diff, kDefaultVerifyTolerance / 20);
  v1::RunSpec off_spec = VerifySpec(kSteps);
  off_spec.mutable_algorithm()->mutable_rollout_verification()->set_fraction(0);
  const RunFigures off = Train(off_spec, 0);
  EXPECT_EQ(off.verified + off.failed + off.unverifiable, 0);
  std::printf("honest trainer run: groups=%lld flagged=%lld max|delta|=%.3g; per step: "
              "verification %.2f ms, training step %.2f ms with verification on, %.2f ms off\n",
              static_cast<long long>(on.verified + on.failed), static_cast<long long>(on.failed),
              on.max_abs_diff, 1e3 * on.verification_seconds / kSteps,
              1e3 * on.step_seconds / kSteps, 1e3 * off.step_seconds / kSteps);
}

}  // namespace
}  // namespace sluice::trainer
