#include "controller/run_progress.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "controller/run_conditions.h"

namespace sluice::controller {
namespace {

double Seconds(absl::Duration duration) { return absl::ToDoubleSeconds(duration); }

absl::Time ToTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

// Run.conditions kind of the workers' refused inserts (run_conditions.h).
constexpr char kInsertsRefused[] = "inserts_refused";

// Sets or clears the inserts_refused condition from the workers whose
// inserts are refused; true when the run changed.
bool SyncInsertRefusals(const std::map<std::string, std::pair<std::string, absl::Time>>& refusals,
                        absl::string_view buffer_address, absl::Time now, v1::Run* run) {
  if (refusals.empty()) return RunConditions::Clear(run, kInsertsRefused, "replay_buffer");
  const auto& [worker, refusal] = *refusals.begin();
  std::string message = absl::StrCat("rollout worker ", worker, ": the replay buffer (",
                                     buffer_address, ") refuses its inserts: ", refusal.first);
  if (refusals.size() > 1) {
    absl::StrAppend(&message, " (and ", refusals.size() - 1, " other worker(s))");
  }
  return RunConditions::Set(run, kInsertsRefused, "replay_buffer", message, now);
}

}  // namespace

RunProgress::RunProgress(const RunRecord& record, absl::Duration throughput_window)
    : throughput_window_(throughput_window),
      created_at_(ToTime(record.run.created_at())),
      left_pending_at_(record.left_pending_at),
      warm_start_started_at_(record.warm_start_started_at),
      rl_started_at_(record.rl_started_at),
      last_step_(record.last_step),
      max_policy_version_(record.max_policy_version),
      recent_step_rewards_(record.recent_step_rewards),
      incarnations_(record.incarnations) {
  // The newest trainer incarnation the record counted, and what for: its
  // later reports add only what is new, and older ones (counted before the
  // restart, or never) are not counted again.
  if (const uint64_t trainer = KnownIncarnation("trainer"); trainer != 0) {
    newest_trainer_ = trainer;
    trainer_floor_ = trainer;
    trainers_counted_[trainer] = {KnownIncarnation("trainer.resumed") != 0,
                                  static_cast<int64_t>(KnownIncarnation("trainer.steps_redone"))};
  }
}

uint64_t RunProgress::KnownIncarnation(const std::string& key) const {
  auto it = incarnations_.find(key);
  return it == incarnations_.end() ? 0 : it->second;
}

void RunProgress::NoteTransition(v1::RunState from, v1::RunState to, absl::Time now) {
  if (from == v1::RUN_STATE_PENDING && to != v1::RUN_STATE_PENDING) left_pending_at_ = now;
  if (to == v1::RUN_STATE_WARM_START && from != v1::RUN_STATE_WARM_START) {
    warm_start_started_at_ = now;
  }
  if (to == v1::RUN_STATE_TRAINING && rl_started_at_ == absl::InfinitePast()) {
    rl_started_at_ = now;
  }
}

void RunProgress::FreezeFigures(absl::Time now, v1::Run* run) const {
  run->mutable_summary()->set_wall_seconds(Seconds(now - created_at_));
  v1::RunProgress& progress = *run->mutable_progress();
  if (left_pending_at_ != absl::InfinitePast()) {
    progress.set_elapsed_seconds(Seconds(now - left_pending_at_));
  }
  progress.set_generated_tokens_per_second(0);
}

void RunProgress::FillLiveFigures(absl::Time now, v1::Run* run) const {
  v1::RunProgress& progress = *run->mutable_progress();
  progress.set_generated_tokens_per_second(TokensPerSecond(now));
  if (left_pending_at_ != absl::InfinitePast()) {
    progress.set_elapsed_seconds(Seconds(now - left_pending_at_));
  }
  run->mutable_summary()->set_wall_seconds(Seconds(now - created_at_));
}

void RunProgress::FillFeedFigures(const PromptFeedStats& feed, v1::Run* run) {
  v1::RecoveryStats& recovery = *run->mutable_summary()->mutable_recovery();
  recovery.set_prompts_reissued(feed.reissued);
  recovery.set_prompt_leases_expired(feed.leases_expired);
}

bool RunProgress::NoteReissuedPrompts(const PromptFeedStats& feed, v1::Run* run) {
  v1::RecoveryStats& recovery = *run->mutable_summary()->mutable_recovery();
  if (recovery.prompts_reissued() == feed.reissued) return false;
  recovery.set_prompts_reissued(feed.reissued);
  return true;
}

bool RunProgress::NotePolicyVersion(int64_t version, v1::Run* run) {
  if (version <= max_policy_version_) return false;
  max_policy_version_ = version;
  run->mutable_progress()->set_policy_version(version);
  run->mutable_summary()->set_weight_versions(version + 1);
  return true;
}

bool RunProgress::NoteWarmStartStep(int64_t warm_start_step, v1::Run* run) {
  if (warm_start_step <= run->progress().warm_start_step()) return false;
  run->mutable_progress()->set_warm_start_step(warm_start_step);
  run->mutable_summary()->set_warm_start_steps(warm_start_step);
  return true;
}

bool RunProgress::ApplyEval(const v1::EvalResult& eval, v1::Run* run) {
  for (const v1::EvalResult& seen : run->summary().evals()) {
    if (seen.phase() == eval.phase() && seen.step() == eval.step()) return false;
  }
  ApplyEvalFigures(eval, run);
  return true;
}

std::optional<v1::TrainingStepMetrics> RunProgress::ApplyStep(v1::TrainingStepMetrics step,
                                                              absl::Time now, v1::Run* run) {
  if (step.step() <= last_step_) return std::nullopt;
  last_step_ = step.step();
  step.set_rollout_tokens_per_second(TokensPerSecond(now));
  NotePolicyVersion(step.policy_version(), run);
  ApplyStepFigures(step, run, &recent_step_rewards_);
  if (rl_started_at_ != absl::InfinitePast()) {
    run->mutable_summary()->set_rl_seconds(Seconds(now - rl_started_at_));
  }
  return step;
}

bool RunProgress::NoteTrainerState(v1::TrainerState state) {
  if (state == last_trainer_state_) return false;
  last_trainer_state_ = state;
  return true;
}

void RunProgress::NoteWarmStartSeconds(absl::Time now, v1::Run* run) const {
  if (warm_start_started_at_ == absl::InfinitePast()) return;
  run->mutable_summary()->set_warm_start_seconds(Seconds(now - warm_start_started_at_));
}

RunProgress::TrainerChange RunProgress::NoteTrainer(uint64_t incarnation, bool resumed,
                                                    int64_t steps_redone, v1::Run* run) {
  TrainerChange change;
  if (incarnation == 0) return change;
  auto it = trainers_counted_.find(incarnation);
  if (it == trainers_counted_.end()) {
    if (incarnation <= trainer_floor_) return change;  // Counted before, or cannot tell.
    const bool first = trainers_counted_.empty();
    it = trainers_counted_.emplace(incarnation, TrainerCounted{}).first;
    if (!first) {
      AddRestarts("trainer", 1, run);
      change.restarted = true;
    }
  }
  v1::RecoveryStats& recovery = *run->mutable_summary()->mutable_recovery();
  TrainerCounted& counted = it->second;
  if (resumed && !counted.resumed) {
    counted.resumed = true;
    recovery.set_trainer_resumes(recovery.trainer_resumes() + 1);
    change.counted = true;
  }
  if (steps_redone > counted.steps_redone) {
    recovery.set_trainer_steps_redone(recovery.trainer_steps_redone() + steps_redone -
                                      counted.steps_redone);
    counted.steps_redone = steps_redone;
    change.counted = true;
  }
  newest_trainer_ = std::max(newest_trainer_, incarnation);
  const TrainerCounted& newest = trainers_counted_.at(newest_trainer_);
  incarnations_["trainer"] = newest_trainer_;
  incarnations_["trainer.resumed"] = newest.resumed ? 1 : 0;
  incarnations_["trainer.steps_redone"] = static_cast<uint64_t>(newest.steps_redone);
  return change;
}

bool RunProgress::Quarantine(const std::string& worker_id) {
  return quarantined_workers_.insert(worker_id).second;
}

bool RunProgress::IsQuarantined(const std::string& worker_id, const v1::Run& run) const {
  if (quarantined_workers_.count(worker_id) > 0) return true;
  for (const v1::WorkerVerification& w : run.summary().verification().workers()) {
    if (w.worker_id() == worker_id && w.quarantined()) return true;
  }
  return false;
}

RunProgress::RolloutChange RunProgress::ApplyRolloutReport(
    const v1::ReportRolloutProgressRequest& request, absl::Time now, v1::Run* run) {
  RolloutChange change;
  v1::RunSummary& summary = *run->mutable_summary();
  if (request.late_groups_refused() > 0) {
    v1::RecoveryStats& recovery = *summary.mutable_recovery();
    recovery.set_late_groups_refused(recovery.late_groups_refused() +
                                     request.late_groups_refused());
    change.late_groups_refused = true;
  }
  const int64_t tokens = std::max<int64_t>(0, request.tokens_generated());
  const int64_t groups = std::max<int64_t>(0, request.groups_inserted());
  if (tokens == 0 && groups == 0) return change;
  if (tokens > 0) {
    token_reports_.emplace_back(now, tokens);
    while (!token_reports_.empty() && token_reports_.front().first <= now - throughput_window_) {
      token_reports_.pop_front();
    }
  }
  summary.set_tokens_generated(summary.tokens_generated() + tokens);
  summary.set_groups_generated(summary.groups_generated() + groups);
  run->mutable_progress()->set_groups_generated(summary.groups_generated());
  change.generated = true;
  return change;
}

double RunProgress::TokensPerSecond(absl::Time now) const {
  const absl::Time since = now - throughput_window_;
  int64_t tokens = 0;
  for (const auto& [time, count] : token_reports_) {
    if (time > since && time <= now) tokens += count;
  }
  const double window = Seconds(throughput_window_);
  return window > 0 ? static_cast<double>(tokens) / window : 0;
}

bool RunProgress::NoteInsertOutcome(const v1::ReportRolloutProgressRequest& request,
                                    absl::string_view buffer_address, absl::Time report_time,
                                    absl::Time now, v1::Run* run) {
  bool changed = false;
  if (!request.insert_error().empty()) {
    insert_refusals_[request.worker_id()] = {request.insert_error(), report_time};
    changed = true;
  } else if (request.groups_inserted() > 0) {
    changed = insert_refusals_.erase(request.worker_id()) > 0;
  }
  return changed && SyncInsertRefusals(insert_refusals_, buffer_address, now, run);
}

bool RunProgress::ExpireInsertRefusals(absl::Time oldest, absl::string_view buffer_address,
                                       absl::Time now, v1::Run* run) {
  if (insert_refusals_.empty()) return false;
  const size_t before = insert_refusals_.size();
  for (auto it = insert_refusals_.begin(); it != insert_refusals_.end();) {
    it = it->second.second < oldest ? insert_refusals_.erase(it) : std::next(it);
  }
  return insert_refusals_.size() != before &&
         SyncInsertRefusals(insert_refusals_, buffer_address, now, run);
}

void RunProgress::NoteWorkerJoined(v1::Run* run) {
  v1::RecoveryStats& recovery = *run->mutable_summary()->mutable_recovery();
  recovery.set_workers_joined(recovery.workers_joined() + 1);
}

void RunProgress::NoteWorkerLost(v1::Run* run) {
  v1::RecoveryStats& recovery = *run->mutable_summary()->mutable_recovery();
  recovery.set_workers_lost(recovery.workers_lost() + 1);
}

bool RunProgress::NoteWorkersLive(int live, v1::Run* run) {
  if (run->progress().workers_live() == live) return false;
  run->mutable_progress()->set_workers_live(live);
  return true;
}

void RunProgress::AddRestarts(const std::string& service, int64_t count, v1::Run* run) {
  (*run->mutable_summary()->mutable_recovery()->mutable_restarts())[service] += count;
}

void RunProgress::NoteReadoption(v1::Run* run) {
  v1::RecoveryStats& recovery = *run->mutable_summary()->mutable_recovery();
  recovery.set_controller_readoptions(recovery.controller_readoptions() + 1);
  (*recovery.mutable_restarts())["controller"] += 1;
}

RunProgress::IncarnationChange RunProgress::NoteIncarnation(const std::string& service,
                                                            uint64_t incarnation, v1::Run* run) {
  IncarnationChange change;
  const uint64_t known = KnownIncarnation(service);
  if (incarnation == 0 || incarnation <= known) return change;
  incarnations_[service] = incarnation;
  change.recorded = true;
  if (known != 0) {
    AddRestarts(service, 1, run);
    change.restarts = 1;
  }
  return change;
}

RunProgress::IncarnationChange RunProgress::NoteBufferStarts(uint64_t incarnation, int64_t starts,
                                                             v1::Run* run) {
  // A buffer without a data directory counts no starts.
  if (starts <= 0) return NoteIncarnation("replay_buffer", incarnation, run);
  IncarnationChange change;
  const int64_t before = static_cast<int64_t>(KnownIncarnation("replay_buffer.starts"));
  if (starts == before) return change;
  incarnations_["replay_buffer"] = std::max(KnownIncarnation("replay_buffer"), incarnation);
  incarnations_["replay_buffer.starts"] = static_cast<uint64_t>(starts);
  change.recorded = true;
  if (before != 0 && starts > before) {
    AddRestarts("replay_buffer", starts - before, run);
    change.restarts = starts - before;
  }
  return change;
}

int64_t RunProgress::GroupsEvicted(const v1::BufferStats& stats) {
  int64_t evicted = 0;
  for (const v1::EvictionCount& count : stats.evictions()) {
    if (count.reason() == v1::EVICTION_REASON_STALE ||
        count.reason() == v1::EVICTION_REASON_CAPACITY) {
      evicted += count.groups();
    }
  }
  return evicted;
}

bool RunProgress::NoteGroupsEvicted(const v1::BufferStats& stats, v1::Run* run) {
  const int64_t evicted = GroupsEvicted(stats);
  if (run->progress().groups_evicted() == evicted) return false;
  run->mutable_progress()->set_groups_evicted(evicted);
  return true;
}

void RunProgress::ApplyFinalBufferStats(const v1::BufferStats& stats, v1::Run* run) {
  int64_t stale = 0;
  for (const v1::EvictionCount& count : stats.evictions()) {
    if (count.reason() == v1::EVICTION_REASON_STALE) stale += count.groups();
  }
  run->mutable_summary()->set_groups_evicted_stale(stale);
  run->mutable_progress()->set_groups_evicted(GroupsEvicted(stats));
}

void RunProgress::FillRecord(RunRecord* record) const {
  record->left_pending_at = left_pending_at_;
  record->warm_start_started_at = warm_start_started_at_;
  record->rl_started_at = rl_started_at_;
  record->last_step = last_step_;
  record->max_policy_version = max_policy_version_;
  record->recent_step_rewards = recent_step_rewards_;
  record->incarnations = incarnations_;
}

}  // namespace sluice::controller
