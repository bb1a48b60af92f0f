// TrainerRun::Impl's verification of rollout workers (issue 19): which
// groups of a batch are checked, what a failed group does to the batch, and
// when a worker is quarantined. The comparison itself is rollout_verifier.h;
// docs/rollout-verification.md says how the tolerance was chosen.
#include "trainer/trainer_impl.h"

#include "absl/strings/match.h"
#include "common/run/run_objective.h"

namespace sluice::trainer {
namespace {

constexpr int64_t kDefaultQuarantineAfterFailedGroups = 3;

// What a quarantine may act on, from who the buffer says inserted a group
// (Group.inserted_by): a worker that proved its identity, or else the
// connection; a worker id alone is a claim anyone can make.
struct Attribution {
  enum class Kind { kWorker, kConnection, kNone } kind = Kind::kNone;
  std::string name;  // The worker's identity, or "peer:<address>".
};

Attribution Attribute(const std::string& inserted_by) {
  if (absl::StartsWith(inserted_by, "worker:") && inserted_by.size() > 7) {
    return {Attribution::Kind::kWorker, inserted_by.substr(7)};
  }
  if (absl::StartsWith(inserted_by, "peer:") && inserted_by.size() > 5) {
    return {Attribution::Kind::kConnection, inserted_by};
  }
  return {};
}

}  // namespace

void TrainerRun::Impl::ConfigureVerification() {
  const v1::AlgorithmConfig& alg = spec_.algorithm();
  const v1::RolloutVerificationConfig& config = alg.rollout_verification();
  verify_policy_ = run::ResolveRolloutVerification(config);
  verify_options_.tolerance =
      config.tolerance() > 0 ? config.tolerance() : kDefaultVerifyTolerance;
  verify_options_.temperature = temperature_;
  verify_options_.swap_mode = spec_.rollout().weight_swap_mode() == v1::WEIGHT_SWAP_MODE_RECOMPUTE
                                  ? v1::WEIGHT_SWAP_MODE_RECOMPUTE
                                  : v1::WEIGHT_SWAP_MODE_KEEP_CACHE;
  quarantine_after_failed_groups_ = config.quarantine_after_failed_groups() > 0
                                        ? config.quarantine_after_failed_groups()
                                        : kDefaultQuarantineAfterFailedGroups;
  const bool trusted_sampled =
      verify_policy_.trusted_fraction > 0 && !verify_policy_.trusted_worker_ids.empty();
  if (verify_policy_.fraction <= 0 && !trusted_sampled) return;
  // A sampled group is at most eta versions older than the trainer when
  // sampled, and the batch's minibatches publish more before its last one:
  // hold them all.
  const int64_t eta = run::ResolvedMaxStaleness(alg);
  policy_history_ = std::make_unique<PolicyHistory>(
      model_->config(), static_cast<int>(eta + Minibatches() + 1));
}

v1::TrainingStepMetrics TrainerRun::Impl::VerifyBatch(v1::SampleResponse& batch,
                                                      int64_t batch_step) {
  v1::TrainingStepMetrics figures;
  const double start = Now();
  std::vector<double> fractions;
  fractions.reserve(batch.groups_size());
  std::vector<std::string> worker_ids;
  for (const v1::SampledGroup& sampled : batch.groups()) {
    worker_ids.clear();
    for (const v1::Trajectory& t : sampled.group().trajectories()) {
      worker_ids.push_back(t.rollout_worker_id());
    }
    fractions.push_back(verify_policy_.FractionFor(worker_ids));
  }
  const std::vector<bool> chosen = ChooseGroupsToVerify(fractions, spec_.seed(), batch_step);
  std::vector<const v1::Group*> groups;
  std::vector<int> indices;
  for (int g = 0; g < batch.groups_size(); ++g) {
    if (!chosen[g]) continue;
    groups.push_back(&batch.groups(g).group());
    indices.push_back(g);
  }
  RolloutVerifierOptions options = verify_options_;
  options.newest_version = step_;
  const std::vector<GroupVerification> verdicts = VerifyGroups(
      groups, [this](int64_t version) { return policy_history_->Get(version); }, options);

  std::vector<bool> failed(batch.groups_size(), false);
  std::map<std::string, v1::WorkerVerification> by_worker;
  double max_abs_diff = 0;
  for (size_t i = 0; i < verdicts.size(); ++i) {
    const GroupVerification& v = verdicts[i];
    if (v.verdict == VerifyVerdict::kUnverifiable) {
      figures.set_groups_unverifiable(figures.groups_unverifiable() + 1);
      continue;
    }
    v1::WorkerVerification& worker = by_worker[v.worker_id];
    worker.set_worker_id(v.worker_id);
    // Counted per who inserted them, not per the name they carry: forged
    // groups that name an honest worker count against their sender.
    const Attribution attribution = Attribute(v.inserted_by);
    WorkerVerificationCounts& counts =
        worker_verification_[v.inserted_by.empty() ? "claimed:" + v.worker_id : v.inserted_by];
    if (v.verdict == VerifyVerdict::kVerified) {
      figures.set_groups_verified(figures.groups_verified() + 1);
      worker.set_groups_verified(worker.groups_verified() + 1);
      ++counts.verified;
      max_abs_diff = std::max(max_abs_diff, v.max_abs_diff);
      continue;
    }
    failed[indices[i]] = true;
    figures.set_groups_verification_failed(figures.groups_verification_failed() + 1);
    worker.set_groups_failed(worker.groups_failed() + 1);
    ++counts.failed;
    log::Warning("rollout verification failed: the group is left out of the batch",
                 {{"run_id", run_id_},
                  {"step", step_ + 1},
                  {"group", v.group_id},
                  {"worker", v.worker_id},
                  {"inserted_by", v.inserted_by},
                  {"max_abs_diff", v.max_abs_diff},
                  {"why", v.why}});
    if (counts.failed != quarantine_after_failed_groups_) continue;
    const auto quarantine = [&](std::vector<std::string>& list, const std::string& name) {
      if (std::find(list.begin(), list.end(), name) != list.end()) return false;
      list.push_back(name);
      return true;
    };
    switch (attribution.kind) {
      case Attribution::Kind::kWorker:
        if (quarantine(quarantined_workers_, attribution.name)) {
          figures.add_workers_quarantined(attribution.name);
          log::Error(
              "quarantined rollout worker: its groups failed verification; the replay "
              "buffer now refuses its generation slots and inserts",
              {{"run_id", run_id_},
               {"worker", attribution.name},
               {"failed_groups", counts.failed},
               {"verified_groups", counts.verified},
               {"threshold", quarantine_after_failed_groups_}});
        }
        break;
      case Attribution::Kind::kConnection:
        if (quarantine(quarantined_connections_, attribution.name)) {
          worker.add_quarantined_connections(attribution.name);
          log::Error(
              "quarantined a connection: groups it inserted under a worker id it did not "
              "prove failed verification; the replay buffer now refuses that connection, "
              "and the worker it named keeps serving",
              {{"run_id", run_id_},
               {"connection", attribution.name},
               {"claimed_worker", v.worker_id},
               {"failed_groups", counts.failed},
               {"threshold", quarantine_after_failed_groups_}});
        }
        break;
      case Attribution::Kind::kNone:
        log::Error(
            "groups failed verification but nobody can be quarantined for them: the "
            "buffer did not say who inserted them (they are left out of the batches)",
            {{"run_id", run_id_}, {"claimed_worker", v.worker_id}});
        break;
    }
  }
  for (auto& [id, worker] : by_worker) *figures.add_verification_by_worker() = std::move(worker);
  figures.set_verification_max_abs_diff(max_abs_diff);
  if (figures.groups_verification_failed() > 0) {
    google::protobuf::RepeatedPtrField<v1::SampledGroup> all;
    all.Swap(batch.mutable_groups());
    for (int g = 0; g < all.size(); ++g) {
      if (!failed[g]) *batch.add_groups() = std::move(*all.Mutable(g));
    }
  }
  figures.set_verification_seconds(Now() - start);
  return figures;
}

}  // namespace sluice::trainer
