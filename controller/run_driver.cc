#include "controller/run_driver.h"

#include <algorithm>
#include <future>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "controller/run_conditions.h"
#include "controller/run_spec.h"
#include "controller/worker_registry.h"

namespace sluice::controller {
namespace {

double Seconds(absl::Duration duration) { return absl::ToDoubleSeconds(duration); }

// Run.conditions kinds this file sets (run_conditions.h).
constexpr char kRecordNotDurable[] = "record_not_durable";
constexpr char kInsertsRefused[] = "inserts_refused";

}  // namespace

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
      endpoints_(std::move(endpoints)),
      sizes_(record.sizes),
      options_(std::move(options)),
      observer_(observer) {
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
  const auto to_time = [](const google::protobuf::Timestamp& t) {
    return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
  };
  created_at_ = to_time(run_.created_at());
  if (run_.has_finished_at()) finished_at_ = to_time(run_.finished_at());
  left_pending_at_ = record.left_pending_at;
  warm_start_started_at_ = record.warm_start_started_at;
  rl_started_at_ = record.rl_started_at;
  last_step_ = record.last_step;
  max_policy_version_ = record.max_policy_version;
  recent_step_rewards_ = std::move(record.recent_step_rewards);
  known_incarnations_ = record.incarnations;
  const auto known = [&record](const char* key) -> uint64_t {
    auto it = record.incarnations.find(key);
    return it == record.incarnations.end() ? 0 : it->second;
  };
  buffer_incarnation_ = known("replay_buffer");
  buffer_starts_ = static_cast<int64_t>(known("replay_buffer.starts"));
  reward_incarnation_ = known("reward_server");
  // The newest trainer incarnation the record counted, and what for: its
  // later reports add only what is new, and older ones (counted before the
  // restart, or never) are not counted again.
  if (const uint64_t trainer = known("trainer"); trainer != 0) {
    newest_trainer_ = trainer;
    trainer_floor_ = trainer;
    trainers_counted_[trainer] = {known("trainer.resumed") != 0,
                                  static_cast<int64_t>(known("trainer.steps_redone"))};
  }
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
  trainer_started_ = true;  // It may be training the run now: stop it if the run ends.
  const absl::Status feed = OpenFeed();
  {
    absl::MutexLock lock(&mu_);
    v1::RecoveryStats& recovery = *run_.mutable_summary()->mutable_recovery();
    recovery.set_controller_readoptions(recovery.controller_readoptions() + 1);
    (*recovery.mutable_restarts())["controller"] += 1;
    run_.mutable_progress()->set_phase("re-adopted after a controller restart");
    log::Info("run re-adopted", {{"run_id", run_id_},
                                 {"state", v1::RunState_Name(run_.state())},
                                 {"step", last_step_},
                                 {"readoptions", recovery.controller_readoptions()}});
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

absl::Status RunDriver::CallWhileAdopting(const std::function<absl::Status()>& call) {
  const absl::Time deadline = absl::Now() + options_.adoption_timeout;
  while (true) {
    absl::Status status = call();
    const bool transient = status.code() == absl::StatusCode::kUnavailable ||
                           status.code() == absl::StatusCode::kDeadlineExceeded;
    if (status.ok() || !adopting_ || !transient || absl::Now() >= deadline) return status;
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &RunDriver::WakeDriver),
                         options_.service_free_poll);
    if (IsTerminal(run_.state()) || shut_down_) return status;
  }
}

void RunDriver::Main() {
  if ((adopting_ || AwaitServicesFree()) && StartServices()) Watch();
  v1::RunState state;
  {
    absl::MutexLock lock(&mu_);
    state = run_.state();
  }
  // A run left by a stopping controller keeps its services for the next one.
  if (state == v1::RUN_STATE_FAILED || state == v1::RUN_STATE_CANCELLED) StopServices();
  AwaitRecordWritten();
  {
    absl::MutexLock lock(&mu_);
    thread_exited_ = true;
  }
  if (on_stopped_) on_stopped_();
}

bool RunDriver::AwaitServicesFree() {
  const absl::Time deadline = absl::Now() + options_.service_free_timeout;
  std::string phase;
  while (!Stopping()) {
    // Who still holds another run; "" when nobody does. A service that does
    // not answer is left to StartServices, which names the failure.
    std::string busy;
    if (absl::StatusOr<v1::TrainerStatus> trainer = clients_.trainer->GetStatus(); trainer.ok()) {
      const v1::TrainerState state = trainer->state();
      if (!trainer->run_id().empty() && trainer->run_id() != run_id_ &&
          state != v1::TRAINER_STATE_IDLE && state != v1::TRAINER_STATE_FINISHED &&
          state != v1::TRAINER_STATE_FAILED) {
        busy = absl::StrCat("trainer (", clients_.trainer->address(), ") with run ",
                            trainer->run_id(), " (", v1::TrainerState_Name(state), ")");
      }
    }
    if (clients_.workers != nullptr) {
      for (const RunWorker& worker : clients_.workers->LiveWorkers()) {
        for (const v1::RolloutRunStatus& other : worker.status.runs()) {
          if (busy.empty() && other.run_id() != run_id_ && other.groups_in_flight() > 0) {
            busy = absl::StrCat("rollout worker ", worker.worker_id, " (", worker.address,
                                ") with run ", other.run_id());
          }
        }
      }
    }
    if (busy.empty()) {
      if (!phase.empty()) {
        absl::MutexLock lock(&mu_);
        run_.mutable_progress()->set_phase("starting services");
        TouchLocked();
      }
      return true;
    }
    if (absl::Now() >= deadline) {
      Fail(absl::StrCat("the ", busy, " is still busy after ",
                        absl::FormatDuration(options_.service_free_timeout),
                        "; stop that run first (sluice runs cancel, or StopTraining)"));
      return false;
    }
    const std::string waiting = absl::StrCat("waiting for the ", busy);
    if (waiting != phase) {
      phase = waiting;
      log::Info("run waits for a service", {{"run_id", run_id_}, {"busy", busy}});
      absl::MutexLock lock(&mu_);
      if (!IsTerminal(run_.state())) {
        run_.mutable_progress()->set_phase(phase);
        TouchLocked();
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &RunDriver::WakeDriver),
                         options_.service_free_poll);
  }
  return false;
}

void RunDriver::OfferToWorkers() {
  if (clients_.workers == nullptr || workers_offered_) return;
  v1::RolloutAssignment assignment;
  assignment.set_run_id(run_id_);
  *assignment.mutable_spec() = spec_;
  *assignment.mutable_endpoints() = endpoints_;
  assignment.set_max_prompt_tokens(sizes_.max_prompt_tokens);
  clients_.workers->Offer(assignment, spec_.rollout().num_workers());
  workers_offered_ = true;
}

bool RunDriver::StartServices() {
  // A spec the services cannot be sent (one recorded by an older
  // controller, before specs were bounded) fails here, saying why, instead
  // of holding the services and the queue behind it.
  if (absl::Status sizes = ValidateRunSpecSizes(spec_); !sizes.ok()) {
    Fail(absl::StrCat("the run's spec cannot be sent to its services: ", sizes.message()));
    return false;
  }
  // A re-adopted run's workers are still generating for it: they must find
  // it in their next heartbeat's answer (not an empty one, which would stop
  // them) even while the buffer and the trainer are asked again.
  if (adopting_) OfferToWorkers();
  bool have_feed = false;  // A re-adopted run's was restored by Adopt().
  {
    absl::MutexLock lock(&mu_);
    have_feed = feed_ != nullptr;
  }
  if (!have_feed) {
    if (absl::Status feed = OpenFeed(); !feed.ok()) {
      Fail(absl::StrCat(absl::IsFailedPrecondition(feed) || absl::IsInvalidArgument(feed)
                            ? "task: "
                            : "prompt feed: ",
                        feed.message()));
      return false;
    }
  }

  if (Stopping()) return false;
  v1::ConfigureRunRequest configure;
  configure.set_run_id(run_id_);
  *configure.mutable_config() = spec_.buffer();
  configure.set_batch_size_groups(spec_.algorithm().batch_size_groups());
  configure.set_max_staleness(spec_.algorithm().max_staleness());
  configure.set_staleness_bound(spec_.algorithm().staleness_bound());
  configure.set_group_size(spec_.algorithm().group_size());
  configure.set_initial_policy_version(0);
  configure.set_seed(spec_.seed());
  // What the buffer checks inserted groups against: ids in the model's
  // vocabulary, rewards in the reward server's [0, 1].
  if (auto model = run::LoadRunModelConfig(spec_.model()); model.ok()) {
    configure.set_vocab_size(model->vocab_size);
  }
  configure.set_min_reward(0.0);
  configure.set_max_reward(1.0);
  // What the controller measured at submit: the services check their own
  // memory budgets with the same sizes.
  configure.set_max_sequence_tokens(sizes_.max_sequence_tokens);
  // The trainer's batches the buffer keeps until a checkpoint covers them.
  configure.set_retained_step_batches(run::RetainedStepBatches(spec_));
  // A repeat for a run the buffer has (a re-adoption) is a no-op there.
  if (absl::Status status =
          CallWhileAdopting([&] { return clients_.replay_buffer->ConfigureRun(configure); });
      !status.ok()) {
    Fail(CallFailure("replay_buffer", clients_.replay_buffer->address(), "ConfigureRun", status));
    return false;
  }
  // The buffer's start count as the run begins: every later start of it is
  // a restart the run survived, seen between two checks or not.
  if (absl::StatusOr<v1::GetStatsResponse> stats = clients_.replay_buffer->GetStats(run_id_);
      stats.ok()) {
    NoteBufferStarts(stats->incarnation(), stats->starts());
  }

  if (Stopping()) return false;
  start_training_.set_run_id(run_id_);
  *start_training_.mutable_spec() = spec_;
  *start_training_.mutable_endpoints() = endpoints_;
  start_training_.set_max_prompt_tokens(sizes_.max_prompt_tokens);
  trainer_started_ = true;  // Even a failed call may have started it.
  // A trainer already training the run answers OK; one that restarted
  // resumes it from its checkpoint.
  if (absl::Status status =
          CallWhileAdopting([&] { return clients_.trainer->StartTraining(start_training_); });
      !status.ok()) {
    Fail(CallFailure("trainer", clients_.trainer->address(), "StartTraining", status));
    return false;
  }

  // Workers pull the run with their next heartbeat; the controller calls
  // none of them.
  if (Terminal()) return false;
  OfferToWorkers();
  absl::MutexLock lock(&mu_);
  if (run_.state() == v1::RUN_STATE_PENDING && run_.progress().phase() == "starting services") {
    run_.mutable_progress()->set_phase("loading model");
    TouchLocked();
  }
  return !IsTerminal(run_.state());
}

void RunDriver::Finish() {
  std::shared_ptr<PromptFeed> feed;
  {
    absl::MutexLock lock(&mu_);
    feed = feed_;
  }
  if (feed) feed->MarkDone();
  // Workers drop the run with their next heartbeat (and LeasePrompts says
  // run_done); the next run waits until they have.
  if (workers_offered_) clients_.workers->Withdraw(run_id_);
  absl::StatusOr<v1::GetStatsResponse> response = clients_.replay_buffer->GetStats(run_id_);
  if (!response.ok()) {
    log::Warning("cannot read replay buffer statistics",
                 {{"run_id", run_id_}, {"error", response.status().ToString()}});
  }
  const absl::StatusOr<v1::BufferStats> stats =
      response.ok() ? absl::StatusOr<v1::BufferStats>(response->stats()) : response.status();
  absl::MutexLock lock(&mu_);
  if (stats.ok()) {
    int64_t stale = 0;
    int64_t evicted = 0;
    for (const v1::EvictionCount& count : stats->evictions()) {
      if (count.reason() == v1::EVICTION_REASON_STALE) stale += count.groups();
      if (count.reason() == v1::EVICTION_REASON_STALE ||
          count.reason() == v1::EVICTION_REASON_CAPACITY) {
        evicted += count.groups();
      }
    }
    run_.mutable_summary()->set_groups_evicted_stale(stale);
    run_.mutable_progress()->set_groups_evicted(evicted);
  }
  TransitionLocked(v1::RUN_STATE_SUCCEEDED, "");
}

void RunDriver::StopServices() {
  if (workers_offered_) clients_.workers->Withdraw(run_id_);
  if (trainer_started_) {
    v1::StopTrainingRequest stop_training;
    stop_training.set_run_id(run_id_);
    stop_training.set_checkpoint(!spec_.checkpoint().dir().empty());
    if (absl::Status status = clients_.trainer->StopTraining(stop_training); !status.ok()) {
      log::Warning("cannot stop training", {{"run_id", run_id_},
                                            {"address", clients_.trainer->address()},
                                            {"error", status.ToString()}});
    }
  }
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
  if (run_.state() == v1::RUN_STATE_PENDING && state != v1::RUN_STATE_PENDING) {
    left_pending_at_ = now;
  }
  if (state == v1::RUN_STATE_WARM_START && run_.state() != v1::RUN_STATE_WARM_START) {
    warm_start_started_at_ = now;
  }
  if (state == v1::RUN_STATE_TRAINING && rl_started_at_ == absl::InfinitePast()) {
    rl_started_at_ = now;
  }
  run_.set_state(state);
  run_.set_queue_position(0);
  ProgressLocked();
  v1::RunSummary& summary = *run_.mutable_summary();
  summary.set_state(v1::RunState_Name(state));
  if (IsTerminal(state)) {
    finished_at_ = now;
    SetTimestamp(now, run_.mutable_finished_at());
    run_.set_error_message(error);
    summary.set_error_message(error);
    summary.set_wall_seconds(Seconds(now - created_at_));
    v1::RunProgress& progress = *run_.mutable_progress();
    if (left_pending_at_ != absl::InfinitePast()) {
      progress.set_elapsed_seconds(Seconds(now - left_pending_at_));
    }
    progress.set_generated_tokens_per_second(0);
    progress.set_phase(state == v1::RUN_STATE_SUCCEEDED ? "done"
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
  record.left_pending_at = left_pending_at_;
  record.warm_start_started_at = warm_start_started_at_;
  record.rl_started_at = rl_started_at_;
  record.last_step = last_step_;
  record.max_policy_version = max_policy_version_;
  record.recent_step_rewards = recent_step_rewards_;
  record.incarnations = known_incarnations_;
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

void RunDriver::KeepRecordDurable() {
  std::shared_ptr<PromptFeed> feed;
  {
    absl::MutexLock lock(&mu_);
    if (IsTerminal(run_.state())) return;
    feed = feed_;
  }
  // The feed's journal first: its repair is a checkpoint of the feed as it
  // is now, which covers the events it could not write.
  bool journal_written = true;
  if (feed != nullptr && !feed->journal_error().ok()) {
    if (absl::Status repaired = feed->RepairJournal(); !repaired.ok()) {
      record_.NoteFailure(files_.Path(RunFiles::kPromptFeed), repaired);
      journal_written = false;
    }
  }
  if (journal_written) record_.Retry().IgnoreError();  // Health says the rest.
  const RunRecordWriter::Health health = record_.health();
  if (!health.behind) {
    ClearCondition(kRecordNotDurable, "controller");
    return;
  }
  SetCondition(kRecordNotDurable, "controller",
               absl::StrCat(health.error.message(), "; the run is paused (no new prompts) until ",
                            "its record in ", files_.dir(),
                            " can be written again, and fails if it cannot for ",
                            absl::FormatDuration(options_.record_unwritable_timeout)));
  if (absl::Now() - health.since >= options_.record_unwritable_timeout) {
    Fail(absl::StrCat(
        "the run's record in ", files_.dir(), " could not be written for ",
        absl::FormatDuration(absl::Trunc(absl::Now() - health.since, absl::Seconds(1))), ": ",
        health.error.message(),
        " (free space in the runs directory, --runs-dir; the record, summary.json "
        "included, is written once it can be)"));
  }
}

void RunDriver::AwaitRecordWritten() {
  while (!record_.Retry().ok()) {
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&shut_down_), options_.health_check_interval)) {
      return;  // The next controller finds what was written.
    }
  }
}

void RunDriver::FillFeedFiguresLocked(v1::Run* run) const {
  if (feed_ == nullptr) return;
  const PromptFeedStats stats = feed_->stats();
  v1::RecoveryStats& recovery = *run->mutable_summary()->mutable_recovery();
  recovery.set_prompts_reissued(stats.reissued);
  recovery.set_prompt_leases_expired(stats.leases_expired);
}

double RunDriver::TokensPerSecondLocked(absl::Time now) const {
  const absl::Time since = now - options_.throughput_window;
  int64_t tokens = 0;
  for (const auto& [time, count] : token_reports_) {
    if (time > since && time <= now) tokens += count;
  }
  const double window = Seconds(options_.throughput_window);
  return window > 0 ? static_cast<double>(tokens) / window : 0;
}

void RunDriver::FillLiveFiguresLocked(v1::Run* run, absl::Time now) const {
  if (IsTerminal(run->state())) return;  // Frozen at the transition.
  FillFeedFiguresLocked(run);
  v1::RunProgress& progress = *run->mutable_progress();
  progress.set_generated_tokens_per_second(TokensPerSecondLocked(now));
  if (left_pending_at_ != absl::InfinitePast()) {
    progress.set_elapsed_seconds(Seconds(now - left_pending_at_));
  }
  run->mutable_summary()->set_wall_seconds(Seconds(now - created_at_));
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

namespace {

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

std::string RunDriver::BufferAddress() const {
  return clients_.replay_buffer != nullptr ? clients_.replay_buffer->address() : "";
}

void RunDriver::NoteInsertOutcomeLocked(const v1::ReportRolloutProgressRequest& request) {
  bool changed = false;
  if (!request.insert_error().empty()) {
    insert_refusals_[request.worker_id()] = {request.insert_error(), absl::Now()};
    changed = true;
  } else if (request.groups_inserted() > 0) {
    changed = insert_refusals_.erase(request.worker_id()) > 0;
  }
  if (changed && SyncInsertRefusals(insert_refusals_, BufferAddress(), Now(), &run_)) {
    TouchLocked();
  }
}

void RunDriver::ExpireInsertRefusals() {
  absl::MutexLock lock(&mu_);
  if (insert_refusals_.empty() || IsTerminal(run_.state())) return;
  const size_t before = insert_refusals_.size();
  const absl::Time oldest = absl::Now() - options_.insert_refusal_ttl;
  for (auto it = insert_refusals_.begin(); it != insert_refusals_.end();) {
    it = it->second.second < oldest ? insert_refusals_.erase(it) : std::next(it);
  }
  if (insert_refusals_.size() != before &&
      SyncInsertRefusals(insert_refusals_, BufferAddress(), Now(), &run_)) {
    TouchLocked();
  }
}

bool RunDriver::IsQuarantinedLocked(const std::string& worker_id) const {
  if (quarantined_workers_.count(worker_id) > 0) return true;
  for (const v1::WorkerVerification& w : run_.summary().verification().workers()) {
    if (w.worker_id() == worker_id && w.quarantined()) return true;
  }
  return false;
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
    if (IsQuarantinedLocked(request.worker_id())) {
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
  NoteInsertOutcomeLocked(request);
  if (request.late_groups_refused() > 0) {
    v1::RecoveryStats& recovery = *run_.mutable_summary()->mutable_recovery();
    recovery.set_late_groups_refused(recovery.late_groups_refused() + request.late_groups_refused());
    TouchLocked();
  }
  const int64_t tokens = std::max<int64_t>(0, request.tokens_generated());
  const int64_t groups = std::max<int64_t>(0, request.groups_inserted());
  if (tokens > 0 || groups > 0) {
    ProgressLocked();
    if (tokens > 0) {
      token_reports_.emplace_back(now, tokens);
      while (!token_reports_.empty() &&
             token_reports_.front().first <= now - options_.throughput_window) {
        token_reports_.pop_front();
      }
    }
    v1::RunSummary& summary = *run_.mutable_summary();
    summary.set_tokens_generated(summary.tokens_generated() + tokens);
    summary.set_groups_generated(summary.groups_generated() + groups);
    run_.mutable_progress()->set_groups_generated(summary.groups_generated());
    TouchLocked();
  }
  return response;
}

void RunDriver::NotePolicyVersionLocked(int64_t version) {
  if (version <= max_policy_version_) return;
  ProgressLocked();
  max_policy_version_ = version;
  run_.mutable_progress()->set_policy_version(version);
  run_.mutable_summary()->set_weight_versions(version + 1);
}

void RunDriver::ApplyEvalLocked(const v1::EvalResult& eval) {
  // A trainer that resumed from a checkpoint evaluates again at the steps it
  // redoes: keep the first report of each.
  for (const v1::EvalResult& seen : run_.summary().evals()) {
    if (seen.phase() == eval.phase() && seen.step() == eval.step()) return;
  }
  ProgressLocked();
  ApplyEvalFigures(eval, &run_);
  record_.AppendEval(eval);
}

void RunDriver::ApplyStepLocked(v1::TrainingStepMetrics step) {
  // A repeated report, or a step redone by a trainer resumed from an older
  // checkpoint: the run's figures keep the first.
  if (step.step() <= last_step_) return;
  ProgressLocked();
  const absl::Time now = Now();
  last_step_ = step.step();
  step.set_rollout_tokens_per_second(TokensPerSecondLocked(now));
  NotePolicyVersionLocked(step.policy_version());
  ApplyStepFigures(step, &run_, &recent_step_rewards_);
  if (rl_started_at_ != absl::InfinitePast()) {
    run_.mutable_summary()->set_rl_seconds(Seconds(now - rl_started_at_));
  }
  record_.AppendMetrics(step);
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
  if (request.policy_version() >= 0) NotePolicyVersionLocked(request.policy_version());
  if (request.warm_start_step() > run_.progress().warm_start_step()) {
    ProgressLocked();
    run_.mutable_progress()->set_warm_start_step(request.warm_start_step());
    run_.mutable_summary()->set_warm_start_steps(request.warm_start_step());
  }
  if (request.has_eval()) ApplyEvalLocked(request.eval());
  if (request.state() != last_trainer_state_) {
    last_trainer_state_ = request.state();
    ProgressLocked();  // E.g. loading -> evaluating: the trainer moved on.
  }
  if (request.has_step()) ApplyStepLocked(request.step());
  NoteTrainerLocked(request.trainer_incarnation(), request.has_resumed_from_step(),
                    request.steps_redone());
  for (const std::string& worker : request.quarantined_worker_ids()) {
    if (!quarantined_workers_.insert(worker).second) continue;
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
  if (run_.state() == v1::RUN_STATE_WARM_START && warm_start_report &&
      warm_start_started_at_ != absl::InfinitePast()) {
    run_.mutable_summary()->set_warm_start_seconds(Seconds(now - warm_start_started_at_));
  }
  TouchLocked();
  response.set_stop(IsTerminal(run_.state()));
  return response;
}

}  // namespace sluice::controller
