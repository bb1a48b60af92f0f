#include "controller/run_driver.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "controller/run_conditions.h"
#include "controller/run_spec.h"

namespace sluice::controller {

void SetTimestamp(absl::Time time, google::protobuf::Timestamp* timestamp) {
  const int64_t nanos = absl::ToUnixNanos(time);
  int64_t seconds = nanos / 1000000000;
  int64_t remainder = nanos % 1000000000;
  if (remainder < 0) {
    remainder += 1000000000;
    --seconds;
  }
  timestamp->set_seconds(seconds);
  timestamp->set_nanos(static_cast<int32_t>(remainder));
}

bool IsTerminal(v1::RunState state) {
  return state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED ||
         state == v1::RUN_STATE_CANCELLED;
}

RunDriver::RunDriver(RunRecord record, RunFiles files, ServiceClients clients,
                     v1::ServiceEndpoints endpoints, RunDriverOptions options,
                     RunObserver* observer)
    : run_id_(record.run.run_id()),
      spec_(record.run.spec()),
      request_id_(record.request_id),
      sequence_(record.sequence),
      files_(std::move(files)),
      record_(files_, options.record),
      clients_(std::move(clients)),
      sizes_(record.sizes),
      options_(std::move(options)),
      observer_(observer),
      services_(run_id_, spec_, sizes_, clients_, std::move(endpoints)),
      progress_(record, options_.throughput_window) {
  if (clients_.trainer) health_targets_.push_back({"trainer", clients_.trainer->address()});
  if (clients_.replay_buffer) {
    health_targets_.push_back({"replay_buffer", clients_.replay_buffer->address()});
  }
  if (!clients_.reward_server_address.empty()) {
    health_targets_.push_back({"reward_server", clients_.reward_server_address});
  }

  absl::MutexLock lock(&mu_);
  last_progress_at_ = absl::Now();
  last_persisted_at_ = absl::Now();
  run_ = std::move(record.run);
  run_.set_queue_position(0);
  // Conditions describe the controller's view now; a restored run earns its
  // own again.
  RunConditions::ClearAll(&run_);
  if (IsTerminal(run_.state())) {
    started_ = true;  // A record of a run that ended: nothing to start or stop.
    thread_exited_ = true;
  } else if (observer_ != nullptr) {
    // A restored run shows in the metrics at once. (Ended ones do not: a
    // long history would be as many series.)
    observer_->OnRunUpdated(run_);
  }
}

RunDriver::~RunDriver() { Shutdown(); }

void RunDriver::SetOnStopped(std::function<void()> on_stopped) {
  on_stopped_ = std::move(on_stopped);
}

bool RunDriver::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (started_) return false;
    started_ = true;
    if (IsTerminal(run_.state())) {
      thread_exited_ = true;  // Cancelled while queued: nothing to stop.
      return false;
    }
    run_.set_queue_position(0);
    run_.mutable_progress()->set_phase("starting services");
    TransitionLocked(v1::RUN_STATE_PENDING, "");
  }
  thread_ = std::thread([this] { Main(); });
  return true;
}

void RunDriver::SetQueuePosition(int position) {
  absl::MutexLock lock(&mu_);
  if (run_.state() != v1::RUN_STATE_QUEUED || run_.queue_position() == position) return;
  run_.set_queue_position(position);
  run_.mutable_progress()->set_phase(
      position == 1 ? "queued: next to start" : absl::StrCat("queued: ", position - 1,
                                                             " run(s) ahead"));
  TouchLocked();
}

bool RunDriver::Stopped() const {
  absl::MutexLock lock(&mu_);
  return thread_exited_;
}

absl::Time RunDriver::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

bool RunDriver::Terminal() const {
  absl::MutexLock lock(&mu_);
  return IsTerminal(run_.state());
}

bool RunDriver::Stopping() const {
  absl::MutexLock lock(&mu_);
  return IsTerminal(run_.state()) || shut_down_;
}

bool RunDriver::WakeDriver() const {
  return IsTerminal(run_.state()) || finish_requested_ || shut_down_;
}

bool RunDriver::Adopt() {
  {
    absl::MutexLock lock(&mu_);
    if (started_) return false;
    started_ = true;
    if (IsTerminal(run_.state())) {
      thread_exited_ = true;
      return false;
    }
  }
  adopting_ = true;
  services_.MarkTrainerStarted();  // It may be training the run now: stop it if the run ends.
  const absl::Status feed = OpenFeed();
  {
    absl::MutexLock lock(&mu_);
    RunProgress::NoteReadoption(&run_);
    run_.mutable_progress()->set_phase("re-adopted after a controller restart");
    log::Info("run re-adopted",
              {{"run_id", run_id_},
               {"state", v1::RunState_Name(run_.state())},
               {"step", progress_.last_step()},
               {"readoptions", run_.summary().recovery().controller_readoptions()}});
    if (feed.ok()) {
      TouchLocked();
      PersistLocked(/*durable=*/true);
    } else {
      TransitionLocked(v1::RUN_STATE_FAILED,
                       absl::StrCat("cannot re-adopt the run: prompt feed: ", feed.message()));
    }
  }
  thread_ = std::thread([this] { Main(); });
  return true;
}

absl::Status RunDriver::OpenFeed() {
  absl::StatusOr<std::vector<v1::Prompt>> prompts =
      options_.prompt_source ? options_.prompt_source(spec_) : BuildTrainingPrompts(spec_);
  if (prompts.ok() && prompts->empty()) {
    prompts = absl::FailedPreconditionError("the task has no training prompts");
  }
  if (!prompts.ok()) return prompts.status();
  PromptFeedJournalOptions journal = options_.prompt_journal;
  journal.path = files_.Path(RunFiles::kPromptFeed);
  absl::StatusOr<std::unique_ptr<PromptFeed>> feed =
      PromptFeed::Open(std::move(*prompts), spec_.seed(), options_.lease_ttl, journal);
  if (!feed.ok()) return feed.status();
  const PromptFeedRestore& restore = (*feed)->restore();
  if (restore.restored) {
    log::Info("prompt feed restored", {{"run_id", run_id_},
                                       {"events", restore.events},
                                       {"reissue_queued", restore.reissue_queued},
                                       {"torn_tail_bytes", restore.torn_tail_bytes},
                                       {"epoch", (*feed)->stats().epoch}});
  }
  absl::MutexLock lock(&mu_);
  feed_ = std::move(*feed);
  return absl::OkStatus();
}

void RunDriver::Fail(const std::string& message) {
  absl::MutexLock lock(&mu_);
  if (TransitionLocked(v1::RUN_STATE_FAILED, message)) {
    log::Error("run failed", {{"run_id", run_id_}, {"error", message}});
  }
  if (!started_) {  // Failed before its turn (a restored record): nothing to stop.
    started_ = true;
    thread_exited_ = true;
  }
}

v1::Run RunDriver::Cancel(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (TransitionLocked(v1::RUN_STATE_CANCELLED, reason.empty() ? "cancelled by user" : reason)) {
    log::Info("run cancelled", {{"run_id", run_id_}, {"reason", run_.error_message()}});
  }
  if (!started_) thread_exited_ = true;  // Cancelled while queued: nothing to stop.
  v1::Run run = run_;
  FillLiveFiguresLocked(&run, Now());
  return run;
}

void RunDriver::BeginShutdown() {
  std::shared_ptr<PromptFeed> feed;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    if (!started_) {
      started_ = true;  // Never starts now; the next controller will.
      thread_exited_ = true;
    }
    if (!IsTerminal(run_.state())) {
      log::Info("run left for the next controller",
                {{"run_id", run_id_}, {"state", v1::RunState_Name(run_.state())}});
      PersistLocked(/*durable=*/true);
    }
    feed = feed_;
  }
  if (feed != nullptr) {
    if (absl::Status synced = feed->SyncJournal(); !synced.ok()) {
      log::Warning("cannot sync the prompt feed's journal",
                   {{"run_id", run_id_}, {"error", std::string(synced.message())}});
    }
  }
}

void RunDriver::Shutdown() {
  BeginShutdown();
  if (thread_.joinable()) thread_.join();
  // Reports that arrived while the server drained.
  absl::MutexLock lock(&mu_);
  if (persist_pending_ && !IsTerminal(run_.state())) PersistLocked(/*durable=*/true);
}

bool RunDriver::WaitUntilStopped(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&thread_exited_), timeout);
}

bool RunDriver::TransitionLocked(v1::RunState state, const std::string& error) {
  if (IsTerminal(run_.state())) return false;
  const absl::Time now = Now();
  progress_.NoteTransition(run_.state(), state, now);
  run_.set_state(state);
  run_.set_queue_position(0);
  ProgressLocked();
  v1::RunSummary& summary = *run_.mutable_summary();
  summary.set_state(v1::RunState_Name(state));
  if (IsTerminal(state)) {
    SetTimestamp(now, run_.mutable_finished_at());
    run_.set_error_message(error);
    summary.set_error_message(error);
    progress_.FreezeFigures(now, &run_);
    run_.mutable_progress()->set_phase(state == v1::RUN_STATE_SUCCEEDED ? "done"
                                       : state == v1::RUN_STATE_FAILED  ? "failed"
                                                                        : "cancelled");
    if (feed_) feed_->MarkDone();
    FillFeedFiguresLocked(&run_);
    RunConditions::ClearAll(&run_);
  }
  SetTimestamp(now, run_.mutable_updated_at());
  // The record first: a summary.json without it would be re-adopted as the
  // active run it no longer is.
  PersistLocked(/*durable=*/true);
  // Written now, or kept until the runs directory takes it (the driver
  // thread retries: AwaitRecordWritten).
  if (IsTerminal(state)) record_.WriteSummary(summary);
  log::Info("run state", {{"run_id", run_id_}, {"state", v1::RunState_Name(state)}});
  TouchLocked();
  return true;
}

void RunDriver::ProgressLocked() { last_progress_at_ = absl::Now(); }

void RunDriver::TouchLocked() {
  ++generation_;
  SetTimestamp(Now(), run_.mutable_updated_at());
  if (observer_ != nullptr) observer_->OnRunUpdated(run_);
  // Counters between state changes: written by the driver thread
  // (FlushState), not here: the workers' reports must not wait for a disk.
  persist_pending_ = true;
}

void RunDriver::FlushState() {
  RunRecord record;
  int64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!persist_pending_ || IsTerminal(run_.state()) || run_.state() == v1::RUN_STATE_QUEUED ||
        absl::Now() - last_persisted_at_ < options_.state_flush_interval) {
      return;
    }
    record = RecordLocked();
    generation = generation_;
    last_persisted_at_ = absl::Now();
    persist_pending_ = false;
  }
  const std::string text = EncodeRunState(record);
  absl::MutexLock files(&files_mu_);
  // A state change written meanwhile (PersistLocked) is newer: keep it.
  if (generation <= written_generation_) return;
  written_generation_ = generation;
  record_.WriteState(std::move(text), /*durable=*/false);
}

RunRecord RunDriver::RecordLocked() const {
  RunRecord record;
  record.run = run_;
  FillFeedFiguresLocked(&record.run);
  record.request_id = request_id_;
  record.sequence = sequence_;
  record.sizes = sizes_;
  progress_.FillRecord(&record);
  return record;
}

void RunDriver::PersistLocked(bool durable) {
  last_persisted_at_ = absl::Now();
  persist_pending_ = false;
  const std::string text = EncodeRunState(RecordLocked());
  absl::MutexLock files(&files_mu_);
  written_generation_ = std::max(written_generation_, generation_);
  record_.WriteState(std::move(text), durable);
}

void RunDriver::FillFeedFiguresLocked(v1::Run* run) const {
  if (feed_ != nullptr) RunProgress::FillFeedFigures(feed_->stats(), run);
}

void RunDriver::FillLiveFiguresLocked(v1::Run* run, absl::Time now) const {
  if (IsTerminal(run->state())) return;  // Frozen at the transition.
  FillFeedFiguresLocked(run);
  progress_.FillLiveFigures(now, run);
}

RunDriver::Snapshot RunDriver::Get() const {
  absl::MutexLock lock(&mu_);
  Snapshot snapshot{run_, generation_};
  FillLiveFiguresLocked(&snapshot.run, Now());
  return snapshot;
}

bool RunDriver::AwaitUpdate(int64_t seen_generation, v1::RunState seen_state,
                            absl::Time progress_not_before, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  const auto state_changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return run_.state() != seen_state || shut_down_;
  };
  const auto anything_changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_changed() || generation_ != seen_generation;
  };
  // Progress is coalesced until progress_not_before; a state change is not.
  if (absl::Now() < progress_not_before &&
      mu_.AwaitWithDeadline(absl::Condition(&state_changed),
                            std::min(progress_not_before, deadline))) {
    return true;
  }
  if (absl::Now() >= deadline) return state_changed();
  return mu_.AwaitWithDeadline(absl::Condition(&anything_changed), deadline);
}

void RunDriver::SetCondition(absl::string_view kind, absl::string_view service,
                             absl::string_view message) {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(run_.state())) return;
  if (RunConditions::Set(&run_, kind, service, message, Now())) TouchLocked();
}

void RunDriver::ClearCondition(absl::string_view kind, absl::string_view service) {
  absl::MutexLock lock(&mu_);
  if (RunConditions::Clear(&run_, kind, service)) TouchLocked();
}

absl::StatusOr<v1::LeasePromptsResponse> RunDriver::LeasePrompts(
    const v1::LeasePromptsRequest& request) {
  v1::LeasePromptsResponse response;
  std::shared_ptr<PromptFeed> feed;
  {
    absl::MutexLock lock(&mu_);
    if (IsTerminal(run_.state())) {
      response.set_run_done(true);
      return response;
    }
    if (progress_.IsQuarantined(request.worker_id(), run_)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "rollout worker ", request.worker_id(), " is quarantined for run ", run_id_,
          ": the trainer's rollout verification found its groups' log-probs, tokens or "
          "versions forged; it is leased no more prompts for the rest of the run"));
    }
    // Paused while its record cannot be written (KeepRecordDurable): no
    // new work whose results the record could not keep.
    if (run_.state() == v1::RUN_STATE_TRAINING && !record_.behind()) feed = feed_;
  }
  if (feed == nullptr) {
    response.set_retry_after_ms(absl::ToInt64Milliseconds(options_.lease_retry_after));
    return response;
  }
  const absl::Time now = Now();
  feed->ObserveWorker(request.worker_id(), request.worker_incarnation());
  PromptLease lease =
      feed->Lease(request.worker_id(), request.worker_incarnation(), request.max_prompts(), now);
  if (lease.prompts.empty()) {
    if (feed->done()) {
      response.set_run_done(true);
    } else {
      response.set_retry_after_ms(absl::ToInt64Milliseconds(options_.lease_retry_after));
    }
    return response;
  }
  for (v1::Prompt& prompt : lease.prompts) *response.add_prompts() = std::move(prompt);
  response.set_lease_id(lease.lease_id);
  SetTimestamp(lease.expires_at, response.mutable_lease_expires_at());
  response.set_lease_ttl_ms(absl::ToInt64Milliseconds(feed->lease_ttl()));
  return response;
}

v1::ReportRolloutProgressResponse RunDriver::ReportRolloutProgress(
    const v1::ReportRolloutProgressRequest& request) {
  v1::ReportRolloutProgressResponse response;
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  if (IsTerminal(run_.state())) {
    response.set_run_done(true);
    return response;
  }
  if (feed_) {
    feed_->ObserveWorker(request.worker_id(), request.worker_incarnation());
    const std::vector<std::string> completed(request.completed_prompt_ids().begin(),
                                             request.completed_prompt_ids().end());
    feed_->Complete(completed);
    const std::vector<std::string> abandoned(request.abandoned_prompt_ids().begin(),
                                             request.abandoned_prompt_ids().end());
    feed_->Abandon(abandoned);
    absl::Time expires_at = now + feed_->lease_ttl();
    for (const std::string& lease_id : request.renew_lease_ids()) {
      absl::StatusOr<absl::Time> renewed = feed_->Renew(lease_id, now);
      if (renewed.ok()) expires_at = *renewed;
    }
    SetTimestamp(expires_at, response.mutable_lease_expires_at());
    response.set_lease_ttl_ms(absl::ToInt64Milliseconds(feed_->lease_ttl()));
    response.set_run_done(feed_->done());
  }
  if (progress_.NoteInsertOutcome(request, services_.buffer_address(), absl::Now(), Now(),
                                 &run_)) {
    TouchLocked();
  }
  const RunProgress::RolloutChange change = progress_.ApplyRolloutReport(request, now, &run_);
  if (change.late_groups_refused) TouchLocked();
  if (change.generated) {
    ProgressLocked();
    TouchLocked();
  }
  return response;
}

void RunDriver::ApplyTrainerStateLocked(const v1::ReportTrainerProgressRequest& request) {
  v1::RunProgress& progress = *run_.mutable_progress();
  const v1::RunState state = run_.state();
  const bool before_rl = state == v1::RUN_STATE_PENDING || state == v1::RUN_STATE_WARM_START;
  switch (request.state()) {
    case v1::TRAINER_STATE_LOADING:
      progress.set_phase("loading model");
      break;
    case v1::TRAINER_STATE_WARM_START:
      if (state == v1::RUN_STATE_PENDING) TransitionLocked(v1::RUN_STATE_WARM_START, "");
      progress.set_phase(absl::StrCat("warm start ", progress.warm_start_step(), "/",
                                      spec_.warm_start().sft_steps()));
      break;
    case v1::TRAINER_STATE_EVALUATING:
      if (request.eval().phase() == "after" ||
          (state == v1::RUN_STATE_TRAINING && progress.step() >= progress.total_steps())) {
        if (state != v1::RUN_STATE_EVALUATING) TransitionLocked(v1::RUN_STATE_EVALUATING, "");
        progress.set_phase("final evaluation");
      } else if (before_rl) {
        progress.set_phase(request.eval().phase() == "warm_start"
                               ? absl::StrCat("warm start eval @ ", request.eval().step())
                               : "evaluation before RL");
      } else if (state == v1::RUN_STATE_TRAINING) {
        progress.set_phase(absl::StrCat("eval @ step ", progress.step()));
      }
      break;
    case v1::TRAINER_STATE_WAITING_FOR_DATA:
    case v1::TRAINER_STATE_TRAINING:
      if (before_rl) TransitionLocked(v1::RUN_STATE_TRAINING, "");
      if (run_.state() == v1::RUN_STATE_TRAINING) {
        progress.set_phase(request.state() == v1::TRAINER_STATE_TRAINING ? "training"
                           : progress.step() == 0 ? "waiting for the first batch"
                                                  : "waiting for data");
      }
      break;
    case v1::TRAINER_STATE_CHECKPOINTING:
      progress.set_phase("checkpointing");
      break;
    case v1::TRAINER_STATE_FINISHED:
      finish_requested_ = true;
      progress.set_phase("finishing");
      break;
    case v1::TRAINER_STATE_FAILED:
      TransitionLocked(
          v1::RUN_STATE_FAILED,
          absl::StrCat("trainer: ", request.error().empty() ? "failed without an error message"
                                                            : request.error()));
      break;
    default:
      break;
  }
}

v1::ReportTrainerProgressResponse RunDriver::ReportTrainerProgress(
    const v1::ReportTrainerProgressRequest& request) {
  v1::ReportTrainerProgressResponse response;
  absl::MutexLock lock(&mu_);
  if (IsTerminal(run_.state())) {
    response.set_stop(true);
    return response;
  }
  const absl::Time now = Now();
  if (request.policy_version() >= 0 &&
      progress_.NotePolicyVersion(request.policy_version(), &run_)) {
    ProgressLocked();
  }
  if (RunProgress::NoteWarmStartStep(request.warm_start_step(), &run_)) ProgressLocked();
  // A trainer that resumed from a checkpoint evaluates again at the steps it
  // redoes: the run keeps the first report of each.
  if (request.has_eval() && RunProgress::ApplyEval(request.eval(), &run_)) {
    ProgressLocked();
    record_.AppendEval(request.eval());
  }
  // E.g. loading -> evaluating: the trainer moved on.
  if (progress_.NoteTrainerState(request.state())) ProgressLocked();
  if (request.has_step()) {
    if (std::optional<v1::TrainingStepMetrics> step =
            progress_.ApplyStep(request.step(), Now(), &run_)) {
      ProgressLocked();
      record_.AppendMetrics(*step);
    }
  }
  NoteTrainerLocked(request.trainer_incarnation(), request.has_resumed_from_step(),
                    request.steps_redone());
  for (const std::string& worker : request.quarantined_worker_ids()) {
    if (!progress_.Quarantine(worker)) continue;
    // Its prompts go back to the feed for the honest workers.
    const int given_back = feed_ != nullptr ? feed_->GiveBackWorker(worker) : 0;
    log::Warning("quarantined rollout worker: its prompt leases are revoked and its "
                 "LeasePrompts refused (the trainer's rollout verification)",
                 {{"run_id", run_id_}, {"worker", worker}, {"prompts_given_back", given_back}});
  }
  ApplyTrainerStateLocked(request);
  // Warm start lasts until its last step or dev evaluation was reported.
  const bool warm_start_report =
      request.state() == v1::TRAINER_STATE_WARM_START || request.eval().phase() == "warm_start";
  if (run_.state() == v1::RUN_STATE_WARM_START && warm_start_report) {
    progress_.NoteWarmStartSeconds(now, &run_);
  }
  TouchLocked();
  response.set_stop(IsTerminal(run_.state()));
  return response;
}

}  // namespace sluice::controller
