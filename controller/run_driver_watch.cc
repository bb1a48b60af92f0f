// RunDriver's own thread (Main), from the start of the run's services to
// their release: waiting until they are free, setting them up (through
// RunServices), then watching them: their health, restarts and incarnations
// (a trainer or worker that came back is re-adopted or the run fails naming
// it), stalls, the buffer's figures and the run's record on disk. What
// happens to a run when a service dies is here. (run_driver.cc holds the
// run's state, its record and the RPC handlers.)
#include "controller/run_driver.h"

#include <algorithm>
#include <future>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "controller/run_spec.h"
#include "controller/worker_registry.h"

namespace sluice::controller {
namespace {

// Run.conditions kind this file sets (run_conditions.h).
constexpr char kRecordNotDurable[] = "record_not_durable";

}  // namespace

void RunDriver::Main() {
  if ((adopting_ || AwaitServicesFree()) && StartServices()) Watch();
  v1::RunState state;
  {
    absl::MutexLock lock(&mu_);
    state = run_.state();
  }
  // A run left by a stopping controller keeps its services for the next one.
  if (state == v1::RUN_STATE_FAILED || state == v1::RUN_STATE_CANCELLED) services_.Release();
  AwaitRecordWritten();
  {
    absl::MutexLock lock(&mu_);
    thread_exited_ = true;
  }
  if (on_stopped_) on_stopped_();
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

bool RunDriver::AwaitServicesFree() {
  const absl::Time deadline = absl::Now() + options_.service_free_timeout;
  std::string phase;
  while (!Stopping()) {
    // A service that does not answer is left to StartServices, which names
    // the failure.
    const std::string busy = services_.OtherRunHolder();
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
  if (adopting_) services_.OfferToWorkers();
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
  // A repeat for a run the buffer has (a re-adoption) is a no-op there.
  if (absl::Status status = CallWhileAdopting([&] { return services_.ConfigureBuffer(); });
      !status.ok()) {
    Fail(CallFailure("replay_buffer", services_.buffer_address(), "ConfigureRun", status));
    return false;
  }
  // The buffer's start count as the run begins: every later start of it is
  // a restart the run survived, seen between two checks or not.
  if (absl::StatusOr<v1::GetStatsResponse> stats = services_.BufferStats(); stats.ok()) {
    NoteBufferStarts(stats->incarnation(), stats->starts());
  }

  if (Stopping()) return false;
  // A trainer already training the run answers OK; one that restarted
  // resumes it from its checkpoint.
  if (absl::Status status = CallWhileAdopting([&] { return services_.StartTraining(); });
      !status.ok()) {
    Fail(CallFailure("trainer", services_.trainer_address(), "StartTraining", status));
    return false;
  }

  // Workers pull the run with their next heartbeat; the controller calls
  // none of them.
  if (Terminal()) return false;
  services_.OfferToWorkers();
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
  services_.WithdrawFromWorkers();
  absl::StatusOr<v1::GetStatsResponse> response = services_.BufferStats();
  if (!response.ok()) {
    log::Warning("cannot read replay buffer statistics",
                 {{"run_id", run_id_}, {"error", response.status().ToString()}});
  }
  const absl::StatusOr<v1::BufferStats> stats =
      response.ok() ? absl::StatusOr<v1::BufferStats>(response->stats()) : response.status();
  absl::MutexLock lock(&mu_);
  if (stats.ok()) RunProgress::ApplyFinalBufferStats(*stats, &run_);
  TransitionLocked(v1::RUN_STATE_SUCCEEDED, "");
}

void RunDriver::Watch() {
  absl::Time next_check = absl::Now() + options_.health_check_interval;
  while (true) {
    bool terminal = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(this, &RunDriver::WakeDriver), next_check);
      terminal = IsTerminal(run_.state()) || shut_down_;
      finish = finish_requested_;
    }
    if (terminal) return;
    if (finish) {
      Finish();
      return;
    }
    FlushState();
    if (absl::Now() >= next_check) {
      CheckHealth();
      ReconcileTrainer();
      ReconcileWorkers();
      RefreshBufferStats();
      ExpireInsertRefusals();
      KeepRecordDurable();
      CheckStall();
      next_check = absl::Now() + options_.health_check_interval;
    }
  }
}

void RunDriver::CheckHealth() {
  if (!clients_.health || Terminal()) return;
  // Concurrently: one slow or unreachable service must not delay the others'
  // checks (nor the workers', which heartbeat instead).
  std::vector<std::future<absl::Status>> checks;
  for (const HealthTarget& target : health_targets_) {
    checks.push_back(std::async(std::launch::async, [this, address = target.address] {
      return clients_.health->Check(address);
    }));
  }
  const absl::Time now = absl::Now();
  for (size_t i = 0; i < health_targets_.size(); ++i) {
    HealthTarget& target = health_targets_[i];
    const absl::Status status = checks[i].get();
    ShowServiceWait(target, status, now);
    if (status.ok()) {
      if (target.failing_since != absl::InfiniteFuture()) {
        log::Info("service reachable again",
                  {{"run_id", run_id_},
                   {"service", target.name},
                   {"address", target.address},
                   {"outage_ms", absl::ToInt64Milliseconds(now - target.failing_since)}});
      }
      target.failing_since = absl::InfiniteFuture();
      continue;
    }
    if (target.failing_since == absl::InfiniteFuture()) {
      target.failing_since = now;
      log::Warning("health check failed; waiting for the service to come back",
                   {{"run_id", run_id_},
                    {"service", target.name},
                    {"address", target.address},
                    {"gives_up_after_ms",
                     absl::ToInt64Milliseconds(options_.service_unreachable_timeout)},
                    {"error", std::string(status.message())}});
    }
    if (now - target.failing_since >= options_.service_unreachable_timeout) {
      Fail(absl::StrCat(target.name, " (", target.address, ") is unreachable: ", status.message(),
                        " (for ", absl::FormatDuration(absl::Trunc(now - target.failing_since,
                                                                   absl::Seconds(1))),
                        ")"));
      return;
    }
  }
}

void RunDriver::NoteBufferWriteHealth(const v1::GetStatsResponse& stats) {
  constexpr char kBufferCannotWrite[] = "buffer_cannot_write";
  if (stats.write_error().empty()) {
    ClearCondition(kBufferCannotWrite, "replay_buffer");
    return;
  }
  SetCondition(kBufferCannotWrite, "replay_buffer",
               absl::StrCat("replay_buffer (", services_.buffer_address(),
                            ") cannot write its data directory: ", stats.write_error(),
                            "; it refuses inserts until it can, and resumes by itself then"));
}

void RunDriver::ShowServiceWait(const HealthTarget& target, const absl::Status& status,
                                absl::Time now) {
  // A process that does not answer within the deadline (stopped, hung) is
  // told apart from one that refuses or says it cannot serve.
  static constexpr absl::string_view kUnresponsive = "service_unresponsive";
  static constexpr absl::string_view kUnreachable = "service_unreachable";
  if (status.ok()) {
    ClearCondition(kUnresponsive, target.name);
    ClearCondition(kUnreachable, target.name);
    return;
  }
  const bool unresponsive = status.code() == absl::StatusCode::kDeadlineExceeded;
  const absl::Time since =
      target.failing_since == absl::InfiniteFuture() ? now : target.failing_since;
  const absl::string_view kind = unresponsive ? kUnresponsive : kUnreachable;
  ClearCondition(unresponsive ? kUnreachable : kUnresponsive, target.name);
  SetCondition(kind, target.name,
               absl::StrCat(target.name, " (", target.address, ") ",
                            unresponsive ? "has not answered its health check since "
                                         : "cannot be reached since ",
                            absl::FormatTime("%H:%M:%S", since, absl::LocalTimeZone()), ": ",
                            status.message(), "; the run waits for it and fails after ",
                            absl::FormatDuration(options_.service_unreachable_timeout),
                            " (--service-unreachable-timeout-ms)"));
}

void RunDriver::NoteIncarnation(const std::string& service, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  RecordRestartsLocked(service, progress_.NoteIncarnation(service, incarnation, &run_));
}

void RunDriver::NoteBufferStarts(uint64_t incarnation, int64_t starts) {
  absl::MutexLock lock(&mu_);
  RecordRestartsLocked("replay_buffer", progress_.NoteBufferStarts(incarnation, starts, &run_));
}

void RunDriver::RecordRestartsLocked(const std::string& service,
                                     RunProgress::IncarnationChange change) {
  if (change.restarts == 0) {
    if (change.recorded) persist_pending_ = true;
    return;
  }
  log::Warning("service restarted",
               {{"run_id", run_id_}, {"service", service}, {"restarts", change.restarts}});
  TouchLocked();
  if (!IsTerminal(run_.state()) && run_.state() != v1::RUN_STATE_QUEUED) PersistLocked(false);
}

void RunDriver::NoteTrainerLocked(uint64_t incarnation, bool resumed, int64_t steps_redone) {
  const RunProgress::TrainerChange change =
      progress_.NoteTrainer(incarnation, resumed, steps_redone, &run_);
  if (change.restarted) {
    log::Warning("trainer restarted (a new incarnation)",
                 {{"run_id", run_id_}, {"incarnation", std::to_string(incarnation)}});
    TouchLocked();
  }
  if (change.counted) TouchLocked();
}

void RunDriver::ReconcileTrainer() {
  if (Terminal()) return;
  absl::StatusOr<v1::TrainerStatus> trainer = clients_.trainer->GetStatus();
  if (!trainer.ok()) return;  // Reachability is the health check's.
  last_trainer_status_ = *trainer;
  const uint64_t incarnation = trainer->incarnation();
  const bool restarted = incarnation != 0 && trainer_incarnation_ != 0 &&
                         incarnation != trainer_incarnation_;
  if (incarnation != 0 && incarnation != trainer_incarnation_) {
    trainer_incarnation_ = incarnation;
    if (restarted) {
      log::Warning("trainer restarted; asking it to resume the run",
                   {{"run_id", run_id_}, {"address", clients_.trainer->address()}});
    }
  }
  const bool ours = trainer->run_id() == run_id_;
  const v1::TrainerState state = trainer->state();
  {
    // Counted here and from its reports, whichever sees it first.
    absl::MutexLock lock(&mu_);
    NoteTrainerLocked(incarnation, ours && trainer->resumed_from_step() >= 0,
                      ours ? trainer->steps_redone() : 0);
  }
  if (restarted && (trainer->run_id().empty() || state == v1::TRAINER_STATE_IDLE)) {
    // A new incarnation knows nothing of the run: it resumes from the run's
    // latest checkpoint, or refuses (FAILED_PRECONDITION) when it cannot.
    if (absl::Status status = services_.ResumeTraining(); !status.ok()) {
      if (status.code() == absl::StatusCode::kUnavailable ||
          status.code() == absl::StatusCode::kDeadlineExceeded) {
        trainer_incarnation_ = 0;  // Not told yet: ask again next time.
        return;
      }
      Fail(CallFailure("trainer", clients_.trainer->address(),
                       "StartTraining (resuming after its restart)", status));
    }
    trainer_mismatches_ = 0;
    return;
  }
  if (ours && state == v1::TRAINER_STATE_FAILED) {
    // Its own report of the failure may have been lost.
    Fail(absl::StrCat("trainer: ", trainer->last_error().empty() ? "failed without an error message"
                                                                 : trainer->last_error()));
    return;
  }
  if (ours && state == v1::TRAINER_STATE_FINISHED) {
    absl::MutexLock lock(&mu_);
    finish_requested_ = true;  // As if its FINISHED report had arrived.
  }
  if (!ours || state == v1::TRAINER_STATE_IDLE) {
    if (++trainer_mismatches_ >= options_.health_check_failures) {
      Fail(absl::StrCat("trainer (", clients_.trainer->address(),
                        ") is no longer training this run: it reports ",
                        trainer->run_id().empty() ? std::string("no run")
                                                  : absl::StrCat("run ", trainer->run_id()),
                        " in state ", v1::TrainerState_Name(state),
                        " (stopped by another client)"));
      return;
    }
  } else {
    trainer_mismatches_ = 0;
  }
}

void RunDriver::ReconcileWorkers() {
  if (Terminal() || clients_.workers == nullptr || !services_.offered_to_workers()) return;
  std::shared_ptr<PromptFeed> feed;
  {
    absl::MutexLock lock(&mu_);
    feed = feed_;
  }
  for (const WorkerEvent& event : clients_.workers->TakeEvents(run_id_)) {
    switch (event.kind) {
      case WorkerEvent::Kind::kJoined: {
        // A newer incarnation gives back what the older one leased.
        if (feed) feed->ObserveWorker(event.worker_id, event.incarnation);
        absl::MutexLock lock(&mu_);
        RunProgress::NoteWorkerJoined(&run_);
        TouchLocked();
        break;
      }
      case WorkerEvent::Kind::kRestarted: {
        absl::MutexLock lock(&mu_);
        RunProgress::AddRestarts("rollout_worker", 1, &run_);
        TouchLocked();
        break;
      }
      case WorkerEvent::Kind::kLeft:
      case WorkerEvent::Kind::kLost: {
        const bool lost = event.kind == WorkerEvent::Kind::kLost;
        log::Warning(lost ? "rollout worker lost; its prompts and generation slots go to others"
                          : "rollout worker left; its prompts and generation slots go to others",
                     {{"run_id", run_id_},
                      {"worker_id", event.worker_id},
                      {"silent_ms", absl::ToInt64Milliseconds(event.silent_for)}});
        int given_back = 0;
        if (feed) given_back = feed->GiveBackWorker(event.worker_id);
        if (absl::Status released = services_.ReleaseWorkerSlots(event.worker_id);
            !released.ok()) {
          // Not fatal: the buffer's slot leases expire by themselves.
          log::Warning("cannot release a lost worker's generation slots",
                       {{"run_id", run_id_},
                        {"worker_id", event.worker_id},
                        {"error", std::string(released.message())}});
        }
        log::Info("lost worker's prompts given back", {{"run_id", run_id_},
                                                       {"worker_id", event.worker_id},
                                                       {"prompts", given_back}});
        absl::MutexLock lock(&mu_);
        // A worker that left on purpose (a scale-down) was not lost.
        if (lost) RunProgress::NoteWorkerLost(&run_);
        TouchLocked();
        break;
      }
    }
  }

  if (feed) {
    const PromptFeedStats feed_stats = feed->stats();
    absl::MutexLock lock(&mu_);
    if (RunProgress::NoteReissuedPrompts(feed_stats, &run_)) TouchLocked();
  }
  const WorkerRegistry::RunWorkerSummary workers = clients_.workers->SummarizeRunWorkers(run_id_);
  for (const RunWorker& worker : workers.failed) {
    const bool serving = std::any_of(worker.status.runs().begin(), worker.status.runs().end(),
                                     [&](const v1::RolloutRunStatus& r) {
                                       return r.run_id() == run_id_;
                                     });
    if (serving && worker.status.state() == v1::ROLLOUT_WORKER_STATE_FAILED) {
      Fail(absl::StrCat("rollout worker ", worker.worker_id, " (", worker.address, ") failed: ",
                        worker.status.last_error().empty() ? "no error message"
                                                           : worker.status.last_error()));
      return;
    }
  }
  const int live = workers.live;
  const int min_workers = std::max(1, spec_.rollout().min_workers());
  {
    absl::MutexLock lock(&mu_);
    if (RunProgress::NoteWorkersLive(live, &run_)) TouchLocked();
  }
  const absl::Time now = absl::Now();
  static constexpr absl::string_view kNoWorker = "no_worker";
  if (live >= min_workers) {
    workers_short_since_ = absl::InfiniteFuture();
    ClearCondition(kNoWorker, "rollout_worker");
    return;
  }
  if (workers_short_since_ == absl::InfiniteFuture()) workers_short_since_ = now;
  // Shown while it lasts (GetRun, `sluice runs get`), with since when and
  // what happens next, so that a run without workers never sits in
  // TRAINING with nothing said.
  SetCondition(
      kNoWorker, "rollout_worker",
      absl::StrCat(live == 0 ? std::string("no rollout worker serves the run")
                             : absl::StrCat("only ", live, " rollout worker(s) serve the run"),
                   " (rollout.min_workers = ", min_workers, ") since ",
                   absl::FormatTime("%H:%M:%S", workers_short_since_, absl::LocalTimeZone()),
                   "; the run fails if none comes within ",
                   absl::FormatDuration(options_.worker_grace),
                   " (--worker-grace-ms): start workers with --controller-address "
                   "pointing at this controller"));
  const std::map<std::string, std::string> given_up = clients_.workers->GivenUp();
  if (given_up.empty() && now - workers_short_since_ < options_.worker_grace) return;
  std::string message = absl::StrCat(
      live == 0 ? std::string("no rollout worker serves the run")
                : absl::StrCat("only ", live, " rollout worker(s) serve the run"),
      " (rollout.min_workers = ", min_workers, ")");
  if (!given_up.empty()) {
    std::vector<std::string> parts;
    for (const auto& [worker_id, why] : given_up) parts.push_back(worker_id + ": " + why);
    absl::StrAppend(&message, "; given up by their supervisor: ", absl::StrJoin(parts, "; "));
  } else {
    absl::StrAppend(&message, " for ",
                    absl::FormatDuration(absl::Trunc(now - workers_short_since_,
                                                     absl::Milliseconds(1))),
                    " (grace ", absl::FormatDuration(options_.worker_grace),
                    "); start workers with --controller-address pointing at this controller");
  }
  Fail(message);
}

bool RunDriver::OnServiceFailure(const std::string& service, const std::string& description,
                                 const std::string& worker_id) {
  if (Terminal()) return false;
  if (service == "rollout_worker") {
    // ReconcileWorkers decides, counting the workers still live.
    ReconcileWorkers();
    return Terminal();
  }
  Fail(absl::StrCat(service, " ", description));
  return true;
}

void RunDriver::CheckStall() {
  if (options_.stall_timeout <= absl::ZeroDuration()) return;
  std::string message;
  {
    absl::MutexLock lock(&mu_);
    if (IsTerminal(run_.state())) return;
    const absl::Duration quiet = absl::Now() - last_progress_at_;
    if (quiet < options_.stall_timeout) return;
    const v1::RunProgress& progress = run_.progress();
    const absl::Duration shown =
        absl::Trunc(quiet, quiet >= absl::Minutes(1) ? absl::Seconds(1) : absl::Milliseconds(1));
    message = absl::StrCat("no progress for ", absl::FormatDuration(shown),
                           " (stall timeout ", absl::FormatDuration(options_.stall_timeout),
                           "): phase \"", progress.phase(), "\", step ", progress.step(), "/",
                           progress.total_steps(), ", policy version ", progress.policy_version());
  }
  if (last_trainer_status_.has_value()) {
    absl::StrAppend(&message, "; the trainer reports ",
                    v1::TrainerState_Name(last_trainer_status_->state()));
    if (!last_trainer_status_->last_error().empty()) {
      absl::StrAppend(&message, " (last error: ", last_trainer_status_->last_error(), ")");
    }
  }
  if (last_buffer_stats_.has_value()) {
    absl::StrAppend(&message, "; the replay buffer holds ", last_buffer_stats_->size_groups(),
                    " groups, ", last_buffer_stats_->running(), " being generated, admission limit ",
                    last_buffer_stats_->admission_limit());
  }
  Fail(message);
}

void RunDriver::RefreshBufferStats() {
  {
    absl::MutexLock lock(&mu_);
    if (run_.state() != v1::RUN_STATE_TRAINING && run_.state() != v1::RUN_STATE_EVALUATING) return;
  }
  absl::StatusOr<v1::GetStatsResponse> response = clients_.replay_buffer->GetStats(run_id_);
  if (!response.ok()) {
    if (response.status().code() == absl::StatusCode::kNotFound) {
      // The buffer answers but lost the run's table: it restarted without
      // its --data-dir. What was acknowledged is gone; the run cannot go on.
      Fail(absl::StrCat("replay_buffer (", clients_.replay_buffer->address(),
                        ") no longer knows the run (restarted without a durable --data-dir?): ",
                        response.status().message()));
    }
    return;  // Not fatal; the health check judges reachability.
  }
  NoteBufferStarts(response->incarnation(), response->starts());
  NoteBufferWriteHealth(*response);
  if (clients_.reward_server != nullptr) {
    if (absl::StatusOr<uint64_t> reward = clients_.reward_server->Incarnation(); reward.ok()) {
      NoteIncarnation("reward_server", *reward);
    }
  }
  last_buffer_stats_ = response->stats();
  absl::MutexLock lock(&mu_);
  if (IsTerminal(run_.state())) return;
  if (RunProgress::NoteGroupsEvicted(response->stats(), &run_)) TouchLocked();
}

void RunDriver::ExpireInsertRefusals() {
  absl::MutexLock lock(&mu_);
  if (IsTerminal(run_.state())) return;
  if (progress_.ExpireInsertRefusals(absl::Now() - options_.insert_refusal_ttl,
                                     services_.buffer_address(), Now(), &run_)) {
    TouchLocked();
  }
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

}  // namespace sluice::controller
