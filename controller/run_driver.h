#ifndef SLUICE_CONTROLLER_RUN_DRIVER_H_
#define SLUICE_CONTROLLER_RUN_DRIVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/prompt_feed.h"
#include "controller/run_files.h"
#include "controller/run_progress.h"
#include "controller/run_record.h"
#include "controller/run_record_writer.h"
#include "controller/run_services.h"
#include "controller/service_clients.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {

// Timing and plumbing of run drivers. The defaults are the production ones;
// tests shorten the intervals and inject the clock and the prompt source.
struct RunDriverOptions {
  // How long a prompt lease lasts without a renewal.
  absl::Duration lease_ttl = PromptFeed::kDefaultLeaseTtl;
  // LeasePrompts before the run is TRAINING answers "retry after this".
  absl::Duration lease_retry_after = absl::Milliseconds(200);
  // Health of the trainer, buffer and reward server of an active run is
  // checked this often (concurrently), and what the trainer and the workers
  // say they do is compared with the run...
  absl::Duration health_check_interval = absl::Seconds(1);
  // ...and this many consecutive checks in which the trainer serves another
  // run, or was stopped by another client, fail the run.
  int health_check_failures = 3;
  // A service unreachable this long fails the run. Shorter outages (a
  // restart by its supervisor) are waited out: the other services retry.
  absl::Duration service_unreachable_timeout = absl::Minutes(10);
  // The run fails when fewer than rollout.min_workers live workers serve it
  // for this long (workers are being started, or restarted).
  absl::Duration worker_grace = absl::Minutes(2);
  // An active run with no progress this long (no step, warm-start step,
  // evaluation, new policy version, generated tokens or state change) is
  // failed with what each service reported. Zero = never.
  absl::Duration stall_timeout = absl::Minutes(30);
  // Before starting, a run waits this long for the trainer and the workers
  // to have let go of an earlier run (one stopped from outside, or slow to
  // stop), then fails saying which is busy.
  absl::Duration service_free_timeout = absl::Minutes(2);
  // How often the wait above asks.
  absl::Duration service_free_poll = absl::Milliseconds(200);
  // Window of worker token reports behind the generation throughput.
  absl::Duration throughput_window = absl::Seconds(5);
  // Time stamps and durations of run figures (not the waits above, which
  // use the real clock). Null = absl::Now.
  std::function<absl::Time()> clock;
  // The run's training prompts in task order. Null = BuildTrainingPrompts.
  std::function<absl::StatusOr<std::vector<v1::Prompt>>(const v1::RunSpec &)>
      prompt_source;
  // state.json is rewritten on every state change, and for the counters in
  // between at most this often (real clock), by the driver thread on its
  // next wake-up (health_check_interval at the latest): a controller killed
  // -9 loses at most about this much plus that of the workers' token and
  // group counts (run_record.h).
  absl::Duration state_flush_interval = absl::Seconds(1);
  // The prompt feed's journal (prompt_feed.jsonl): fsync cadence and
  // compaction. `path` is set by the driver.
  PromptFeedJournalOptions prompt_journal;
  // A re-adopted run whose buffer or trainer is unreachable (restarting
  // too) keeps asking this long before it fails naming it.
  absl::Duration adoption_timeout = absl::Minutes(2);
  // A run whose record cannot be written (its runs directory full or
  // failing: RunRecordWriter) is paused, no new prompts leased, and fails
  // once it has been so this long. Its record is written when it can,
  // summary.json included.
  absl::Duration record_unwritable_timeout = absl::Minutes(10);
  // How the record's writes are retried and their failures logged.
  RunRecordWriterOptions record;
  // A worker's report that its inserts are refused (ReportRolloutProgress
  // insert_error) shows in Run.conditions until it inserts again, or for
  // this long after its last such report (a worker gone quiet).
  absl::Duration insert_refusal_ttl = absl::Minutes(1);
};

// Told about every change of every run (metrics).
class RunObserver {
public:
  virtual ~RunObserver() = default;
  // Called under the run's lock after each change: keep it short and call
  // nothing of the controller from it.
  virtual void OnRunUpdated(const v1::Run &run) = 0;
};

// One run, from QUEUED to a terminal state, and its own thread.
//
//   QUEUED -> PENDING -> WARM_START -> TRAINING -> EVALUATING -> SUCCEEDED
//      QUEUED -> CANCELLED (CancelRun before its turn; nothing was started)
//      any active state -> FAILED (a service failed or is unreachable)
//      any active state -> CANCELLED (CancelRun)
//
// A driver is created QUEUED; the registry calls Start() when it is the
// run's turn. The thread then waits until the trainer and the workers are
// free, configures the replay buffer, starts the trainer and the rollout
// workers (docs/run-lifecycle.md, step 2), then watches the run until it
// ends: the health of every service, whether the trainer and the workers
// still serve this run (a trainer stopped from outside, or restarted, fails
// it), and progress (none for options.stall_timeout fails it). On the
// trainer's FINISHED it
// stops the workers, reads the buffer's statistics and marks the run
// SUCCEEDED; on FAILED or CANCELLED it stops the workers and the trainer.
// Everything else arrives through the RPC handlers below (the trainer's and
// the workers' reports), which only update state under the lock and never
// call another service.
//
// Surviving the controller (docs/run-lifecycle.md, "Controller restart"):
// the driver keeps the run's record in <runs-dir>/<run-id>/ (run_record.h):
// state.json on every state change and at most every
// options.state_flush_interval in between, metrics.jsonl and evals.jsonl
// as they come, the prompt feed's journal. Only CancelRun or a failure ends
// a run: a controller that stops (SIGTERM: Shutdown) or dies leaves it as it
// is, its trainer and workers going on, and the next controller on the same
// runs directory restores the record and calls Adopt() instead of Start():
// no wait for free services and no new lifecycle (the state stays what it
// was), the prompt feed restored from its journal, ConfigureRun and
// StartTraining sent again (both answer OK for a run the service already
// has; a restarted trainer resumes the run from its checkpoint), then the
// same watch as above. RecoveryStats.controller_readoptions counts it.
//
// Files under <runs-dir>/<run-id>/: state.json (see above), metrics.jsonl
// gets one line per step, evals.jsonl one per evaluation, prompt_feed.jsonl
// the feed's journal, summary.json is written whenever the run reaches a
// terminal state. (spec.json and the first state.json are written by the
// registry.)
//
// Its collaborators (members, each with its own test):
//   RunServices  sets the run's services up (ConfigureRun, StartTraining,
//                the offer to the workers) and releases them at the end;
//                it decides nothing about the run.
//   RunProgress  folds the trainer's and the workers' reports and the
//                buffer's statistics into the run's progress and summary
//                figures (steps, throughput, times, recovery counts); pure
//                data, held under mu_.
// The driver keeps the state machine, the record, and the thread that
// waits, watches and decides (run_driver_watch.cc).
//
// Thread-safe.
class RunDriver {
public:
  // `record`: a run just submitted (NewRunRecord: QUEUED), or one restored
  // from its directory (LoadRunRecord): a terminal one stays as it is (its
  // files are not written again), a QUEUED one waits for Start(), an active
  // one for Adopt().
  RunDriver(RunRecord record, RunFiles files, ServiceClients clients,
            v1::ServiceEndpoints endpoints, RunDriverOptions options,
            RunObserver *observer);
  // Shutdown(): leaves a non-terminal run as it is and joins the thread.
  ~RunDriver();

  RunDriver(const RunDriver &) = delete;
  RunDriver &operator=(const RunDriver &) = delete;

  // Called at the end of the driver thread, once the run's services were
  // told to stop (and for a run cancelled while queued, by Start()). Set
  // before Start().
  void SetOnStopped(std::function<void()> on_stopped);

  // QUEUED -> PENDING and starts the driver thread; false (nothing started)
  // when the run already ended (cancelled while queued). Call once, and not
  // with Adopt().
  bool Start() ABSL_LOCKS_EXCLUDED(mu_);

  // Re-adopts a restored active run (PENDING to EVALUATING) after a
  // controller restart: restores the prompt feed from its journal, counts
  // the re-adoption (persisted at once), and starts the thread, which sends
  // ConfigureRun and StartTraining again and watches the run (class
  // comment). A feed that cannot be restored fails the run, naming the
  // file. False (nothing started) for a terminal run. Blocks while the
  // journal is read (O(events since its last checkpoint)); call once,
  // before the run's RPC handlers can be reached, so that no completion
  // report arrives before the feed is back.
  bool Adopt() ABSL_LOCKS_EXCLUDED(mu_);

  // Run.queue_position while QUEUED (1 = next).
  void SetQueuePosition(int position) ABSL_LOCKS_EXCLUDED(mu_);

  // True once the thread has exited, or the run ended before it started.
  bool Stopped() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string &run_id() const { return run_id_; }

  // The run as of now (throughput and elapsed times computed now), and the
  // change counter it corresponds to.
  struct Snapshot {
    v1::Run run;
    int64_t generation = 0;
  };
  Snapshot Get() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until there is something new to show a watcher: the state differs
  // from `seen_state` (returns at once), or the change counter differs from
  // `seen_generation` and it is `progress_not_before` or later. Returns true
  // then, false at `deadline`. Returns true at once once the driver is shut
  // down. Real clock.
  bool AwaitUpdate(int64_t seen_generation, v1::RunState seen_state,
                   absl::Time progress_not_before, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Marks the run CANCELLED (Run.error_message = `reason`, or "cancelled by
  // user") and has the thread stop the trainer and the workers. A run that is
  // already terminal is left as it is. Returns the run after the call.
  v1::Run Cancel(const std::string &reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails an active run with `message` (the thread then stops its
  // services); no-op when terminal.
  void Fail(const std::string &message) ABSL_LOCKS_EXCLUDED(mu_);

  // What holds the run back (Run.conditions, run_conditions.h): set while it
  // lasts (again to update its message), cleared once it no longer holds.
  // Watchers are woken on a change. Ignored once the run is terminal, which
  // clears them all.
  void SetCondition(absl::string_view kind, absl::string_view service,
                    absl::string_view message) ABSL_LOCKS_EXCLUDED(mu_);
  void ClearCondition(absl::string_view kind, absl::string_view service)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Controller stop (SIGTERM): leaves the run in its state for the next
  // controller to re-adopt (its record and feed journal flushed and
  // synced, its trainer and workers left running), wakes watchers (AwaitUpdate
  // returns true), and returns once the thread has exited without stopping
  // any service. A run that is not started any more stays QUEUED.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  // The first half of Shutdown; does not wait for the thread.
  void BeginShutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // True once the thread has exited (the run is terminal and its services
  // were told to stop), waiting at most `timeout`.
  bool WaitUntilStopped(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

  // The RPC handlers of the run's services. Non-blocking (never call out).
  // LeasePrompts of a worker the trainer's rollout verification quarantined
  // (ReportTrainerProgressRequest.quarantined_worker_ids, or the summary's
  // verification section, which a restored run rebuilds) is
  // PERMISSION_DENIED naming the quarantine.
  absl::StatusOr<v1::LeasePromptsResponse>
  LeasePrompts(const v1::LeasePromptsRequest &request) ABSL_LOCKS_EXCLUDED(mu_);
  v1::ReportRolloutProgressResponse
  ReportRolloutProgress(const v1::ReportRolloutProgressRequest &request)
      ABSL_LOCKS_EXCLUDED(mu_);
  v1::ReportTrainerProgressResponse
  ReportTrainerProgress(const v1::ReportTrainerProgressRequest &request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A supervisor gave up restarting a service (ReportServiceFailure): a
  // singleton fails the run; a rollout worker fails it only when fewer than
  // rollout.min_workers remain. Returns true when the run failed.
  bool OnServiceFailure(const std::string &service,
                        const std::string &description,
                        const std::string &worker_id) ABSL_LOCKS_EXCLUDED(mu_);

private:
  struct HealthTarget {
    std::string name; // "trainer", "replay_buffer", "reward_server"
    std::string address;
    // When the current outage began; InfiniteFuture while healthy.
    absl::Time failing_since = absl::InfiniteFuture();
  };

  void Main();
  // Waits (phase "waiting for ...") until the trainer and the workers serve
  // no other run; false when the run ended or failed meanwhile.
  bool AwaitServicesFree();
  // Step 2 of the lifecycle, through services_; false (the run failed,
  // naming the service) when the run ended meanwhile.
  bool StartServices();
  // Health checks until the run is terminal or the trainer finished.
  void Watch();
  void CheckHealth();
  // Compares what the trainer says it does with the run; re-sends
  // StartTraining to a trainer that restarted (it resumes from checkpoint).
  void ReconcileTrainer();
  // Workers: joins, restarts and losses (their leases and slots are given
  // back), failures, and the rollout.min_workers floor.
  void ReconcileWorkers();
  // Counts restarts of the reward server (RunProgress::NoteIncarnation) and
  // of the buffer (RunProgress::NoteBufferStarts), and records them.
  void NoteIncarnation(const std::string &service, uint64_t incarnation)
      ABSL_LOCKS_EXCLUDED(mu_);
  void NoteBufferStarts(uint64_t incarnation, int64_t starts)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A restart counted is written at once, not at the next flush: a
  // controller killed within the flush interval would otherwise forget it
  // (a rare event). A first incarnation waits for the next flush.
  void RecordRestartsLocked(const std::string &service,
                            RunProgress::IncarnationChange change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a trainer incarnation said of itself (a report or a status),
  // counted by RunProgress::NoteTrainer and persisted with the record
  // (RunRecord::incarnations), so that a restarted controller neither
  // forgets nor counts again.
  void NoteTrainerLocked(uint64_t incarnation, bool resumed,
                         int64_t steps_redone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Run.conditions for the services the health check found failing (which,
  // since when, and what the run will do), cleared when they answer again.
  void ShowServiceWait(const HealthTarget &target, const absl::Status &status,
                       absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Fails the run when it made no progress for options_.stall_timeout.
  void CheckStall();
  // The run's record on disk (each tick): writes what it owes (RunRecordWriter
  // and the prompt feed's journal); while it cannot, the run is paused (no
  // prompts leased) with a record_not_durable condition saying why, and it
  // fails after options_.record_unwritable_timeout.
  void KeepRecordDurable() ABSL_LOCKS_EXCLUDED(mu_);
  // After the run ended: retries what its record owes (summary.json) until
  // it is written or the controller stops.
  void AwaitRecordWritten() ABSL_LOCKS_EXCLUDED(mu_);
  // Run.conditions from the workers' reports (inserts_refused,
  // RunProgress::NoteInsertOutcome), expired after
  // options_.insert_refusal_ttl, and from the buffer's statistics
  // (buffer_cannot_write).
  void ExpireInsertRefusals() ABSL_LOCKS_EXCLUDED(mu_);
  void NoteBufferWriteHealth(const v1::GetStatsResponse &stats)
      ABSL_LOCKS_EXCLUDED(mu_);
  void RefreshBufferStats();
  // The trainer said FINISHED: stop workers, read the buffer, SUCCEEDED.
  void Finish();

  absl::Time Now() const;
  bool Terminal() const ABSL_LOCKS_EXCLUDED(mu_);
  // Terminal, or the controller is stopping: the thread should return.
  bool Stopping() const ABSL_LOCKS_EXCLUDED(mu_);
  bool WakeDriver() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the training prompts and opens the feed on its journal
  // (restoring it when the journal holds events); sets feed_.
  absl::Status OpenFeed() ABSL_LOCKS_EXCLUDED(mu_);
  // `call` until it succeeds or fails otherwise than UNAVAILABLE /
  // DEADLINE_EXCEEDED; only a re-adopted run retries (its services may be
  // restarting too), for at most options_.adoption_timeout.
  absl::Status CallWhileAdopting(const std::function<absl::Status()> &call)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The record as of now, and state.json written from it (`durable`: with
  // the directory fsync). Write errors are logged.
  RunRecord RecordLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistLocked(bool durable) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The driver thread's write of state.json between state changes: when a
  // change is unwritten and the last write is options_.state_flush_interval
  // old, the record is taken under mu_ and written outside it, so that the
  // RPC handlers (the workers' reports) never wait for the disk.
  void FlushState() ABSL_LOCKS_EXCLUDED(mu_, files_mu_);
  // RecoveryStats from the prompt feed (re-issued prompts, expired leases).
  void FillFeedFiguresLocked(v1::Run *run) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to `state`, with the bookkeeping of terminal states (summary.json,
  // no more prompts). False (and nothing changes) when already terminal.
  bool TransitionLocked(v1::RunState state, const std::string &error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a change: counter, updated_at, observer.
  void TouchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records progress for the stall check (real clock).
  void ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The state and phase the trainer's report implies.
  void ApplyTrainerStateLocked(const v1::ReportTrainerProgressRequest &request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillLiveFiguresLocked(v1::Run *run, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string run_id_;
  const v1::RunSpec spec_;
  const std::string request_id_; // Kept in the record.
  const int64_t sequence_;       // Kept in the record.
  const RunFiles files_;
  // Every write of the record but the prompt feed's journal goes through it.
  RunRecordWriter record_;
  // What the watch asks (health, the trainer's status, the workers, the
  // buffer's statistics); setting up and releasing the services goes
  // through services_.
  const ServiceClients clients_;
  const RunSizes sizes_;
  const RunDriverOptions options_;
  RunObserver *const observer_;
  RunServices services_;
  // Only the driver thread touches these.
  std::vector<HealthTarget> health_targets_;
  bool adopting_ = false; // Set by Adopt() before the thread starts.
  int trainer_mismatches_ = 0;
  uint64_t trainer_incarnation_ = 0;
  // Since when fewer than rollout.min_workers workers serve the run.
  absl::Time workers_short_since_ = absl::InfiniteFuture();
  std::optional<v1::TrainerStatus> last_trainer_status_;
  std::optional<v1::BufferStats> last_buffer_stats_;
  std::function<void()> on_stopped_;

  mutable absl::Mutex mu_;
  v1::Run run_ ABSL_GUARDED_BY(mu_);
  // What the services' reports add up to in run_ (and what folding the next
  // one needs).
  RunProgress progress_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<PromptFeed> feed_ ABSL_GUARDED_BY(mu_);
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool thread_exited_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // state.json: when last written, and whether a change since is unwritten.
  absl::Time last_persisted_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool persist_pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_progress_at_ ABSL_GUARDED_BY(mu_);

  // Serialises the writes of state.json (taken after mu_ where both are).
  absl::Mutex files_mu_ ABSL_ACQUIRED_AFTER(mu_);
  // generation_ of the newest record written to state.json.
  int64_t written_generation_ ABSL_GUARDED_BY(files_mu_) = -1;

  std::thread thread_;
};

// SUCCEEDED, FAILED or CANCELLED.
bool IsTerminal(v1::RunState state);

void SetTimestamp(absl::Time time, google::protobuf::Timestamp *timestamp);

} // namespace sluice::controller

#endif // SLUICE_CONTROLLER_RUN_DRIVER_H_
