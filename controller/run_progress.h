#ifndef SLUICE_CONTROLLER_RUN_PROGRESS_H_
#define SLUICE_CONTROLLER_RUN_PROGRESS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "controller/prompt_feed.h"
#include "controller/run_record.h"
#include "sluice/v1/controller.pb.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace sluice::controller {

// What the reports of a run's services add up to: the figures of Run.progress
// and Run.summary (steps, evaluations, policy versions, throughput, elapsed
// times, recovery counts, evictions) folded from the trainer's and the
// workers' reports and the buffer's statistics, and what the driver must
// remember between reports to fold the next one right (the newest step and
// policy version, the last rewards, the incarnations seen of each service).
//
// The run's state machine is not here: RunDriver decides the states and tells
// this class when they change (NoteTransition). Nor is anything that waits or
// calls out: each method takes the report and the run's v1::Run, updates
// both, and says what changed, so that the driver knows whether to count it
// as progress (the stall check), to wake watchers, or to write the record.
//
//   worker report ──ApplyRolloutReport──┐
//   trainer report ─ApplyStep, ApplyEval,├──> v1::Run progress / summary
//                   NoteTrainer, ...    │        (the caller's)
//   buffer stats ──NoteBufferStarts,  ──┘
//                  NoteGroupsEvicted
//   RunRecord <──FillRecord── what a restarted controller resumes from
//
// Times: `now` is the run's clock (RunDriverOptions.clock) unless a method
// says otherwise. Every method is O(1) in the run's length except where said.
//
// Thread-compatible: RunDriver holds it under its lock.
class RunProgress {
 public:
  // The figures a run restores from its record (NewRunRecord: none yet);
  // worker token reports older than `throughput_window` do not count
  // towards the generation throughput.
  RunProgress(const RunRecord& record, absl::Duration throughput_window);

  // --- The run's phases ---

  // The run moves from state `from` to `to` at `now`: remembers when it left
  // PENDING (elapsed_seconds), started its warm start (warm_start_seconds)
  // and its RL phase (rl_seconds; the first time only).
  void NoteTransition(v1::RunState from, v1::RunState to, absl::Time now);
  // A terminal state at `now` freezes the time figures (wall_seconds,
  // elapsed_seconds) and zeroes the generation throughput.
  void FreezeFigures(absl::Time now, v1::Run* run) const;
  // The figures of a live run as of `now`, for a snapshot: generation
  // throughput, elapsed_seconds, wall_seconds. O(token reports in window).
  void FillLiveFigures(absl::Time now, v1::Run* run) const;
  // RecoveryStats of the prompt feed: prompts re-issued, leases expired.
  static void FillFeedFigures(const PromptFeedStats& feed, v1::Run* run);
  // The prompts re-issued only; true when they changed.
  static bool NoteReissuedPrompts(const PromptFeedStats& feed, v1::Run* run);

  // --- The trainer's reports ---

  // A policy version newer than any seen: progress.policy_version and
  // summary.weight_versions. True when it was newer (progress).
  bool NotePolicyVersion(int64_t version, v1::Run* run);
  // The warm start's step, when further than the last; true then.
  static bool NoteWarmStartStep(int64_t warm_start_step, v1::Run* run);
  // An evaluation added to the summary (ApplyEvalFigures). False, and
  // nothing changes, for a phase and step already reported (a trainer that
  // resumed from a checkpoint evaluates again at the steps it redoes).
  // O(evaluations so far).
  static bool ApplyEval(const v1::EvalResult& eval, v1::Run* run);
  // A training step at `now`: its figures (ApplyStepFigures), the policy
  // version it trained, rl_seconds. Returns the step as the run records it
  // (with the generation throughput at `now`), or nullopt, and nothing
  // changes, for a step at or before the last one applied (a repeated
  // report, or a step redone by a trainer that resumed from an older
  // checkpoint: the run keeps the first).
  std::optional<v1::TrainingStepMetrics> ApplyStep(v1::TrainingStepMetrics step, absl::Time now,
                                                   v1::Run* run);
  // The trainer's reported state; true when it differs from the last one
  // (the trainer moved on: progress).
  bool NoteTrainerState(v1::TrainerState state);
  // The warm start's duration so far, from when it began (NoteTransition)
  // to `now`; nothing before it began.
  void NoteWarmStartSeconds(absl::Time now, v1::Run* run) const;

  // What a trainer incarnation said of itself (a report or a status): each
  // one newer than the newest seen is a restart, each that resumed a
  // resume, and the steps it redid are added as they grow. An incarnation
  // the restored record may already have counted (at or below its newest)
  // counts nothing. 0 = a trainer that does not say. O(log incarnations).
  struct TrainerChange {
    bool restarted = false;  // RecoveryStats.restarts["trainer"] grew.
    bool counted = false;    // trainer_resumes or trainer_steps_redone grew.
  };
  TrainerChange NoteTrainer(uint64_t incarnation, bool resumed, int64_t steps_redone, v1::Run* run);

  // Workers the trainer's rollout verification quarantined: true when
  // `worker_id` is newly so. A worker is quarantined when so reported, or
  // when the run's verification summary marks it (a restored run).
  bool Quarantine(const std::string& worker_id);
  bool IsQuarantined(const std::string& worker_id, const v1::Run& run) const;

  // --- The workers' reports ---

  // What a worker's ReportRolloutProgress changed: late groups refused
  // counted, and generated tokens or groups added (progress).
  struct RolloutChange {
    bool late_groups_refused = false;
    bool generated = false;
  };
  RolloutChange ApplyRolloutReport(const v1::ReportRolloutProgressRequest& request, absl::Time now,
                                   v1::Run* run);
  // Generated tokens per second over the window ending at `now`.
  // O(token reports in window).
  double TokensPerSecond(absl::Time now) const;

  // Run.conditions' inserts_refused (kind "inserts_refused", service
  // "replay_buffer") from the workers' reports: set while some worker's last
  // report said the buffer at `buffer_address` refuses its inserts, cleared
  // by its next report of inserted groups, or by ExpireInsertRefusals.
  // `report_time` is the real clock's (the expiry's), `now` the run's. True
  // when the run changed.
  bool NoteInsertOutcome(const v1::ReportRolloutProgressRequest& request,
                         absl::string_view buffer_address, absl::Time report_time, absl::Time now,
                         v1::Run* run);
  // Forgets the refusals reported before `oldest` (a worker gone quiet).
  // O(workers refused).
  bool ExpireInsertRefusals(absl::Time oldest, absl::string_view buffer_address, absl::Time now,
                            v1::Run* run);

  // Workers joining, lost (a worker that left on purpose is not), and live.
  static void NoteWorkerJoined(v1::Run* run);
  static void NoteWorkerLost(v1::Run* run);
  // True when the number changed.
  static bool NoteWorkersLive(int live, v1::Run* run);

  // --- Restarts ---

  // RecoveryStats.restarts[service] += count.
  static void AddRestarts(const std::string& service, int64_t count, v1::Run* run);
  // The controller re-adopted the run after its restart.
  static void NoteReadoption(v1::Run* run);

  // What a service's incarnation changed: the record's incarnations (the
  // record owes a write), and the restarts counted (0 or more; written at
  // once by the driver).
  struct IncarnationChange {
    bool recorded = false;
    int64_t restarts = 0;
  };
  // Incarnations are start times: only one newer than the newest seen is a
  // restart of `service` (an answer of an older process, or another
  // replica, is not); the first one seen is not either. 0 = unknown.
  IncarnationChange NoteIncarnation(const std::string& service, uint64_t incarnation, v1::Run* run);
  // The buffer's restarts, from its start count (GetStatsResponse.starts:
  // every start on its data directory, seen or not) where it has one, else
  // from its incarnation as above. The first count seen is where the run's
  // own count begins; one that went down is another directory (a replaced
  // volume), a new beginning too.
  IncarnationChange NoteBufferStarts(uint64_t incarnation, int64_t starts, v1::Run* run);

  // --- The buffer's statistics ---

  // Groups evicted stale or for capacity.
  static int64_t GroupsEvicted(const v1::BufferStats& stats);
  // progress.groups_evicted from the buffer's statistics; true when changed.
  static bool NoteGroupsEvicted(const v1::BufferStats& stats, v1::Run* run);
  // At the end of a run: groups_evicted and summary.groups_evicted_stale.
  static void ApplyFinalBufferStats(const v1::BufferStats& stats, v1::Run* run);

  // --- The record ---

  // The figures above that state.json keeps (RunRecord's driver figures and
  // incarnations); the v1::Run is the caller's.
  void FillRecord(RunRecord* record) const;
  // The last training step applied (0 = none).
  int64_t last_step() const { return last_step_; }

 private:
  uint64_t KnownIncarnation(const std::string& key) const;

  const absl::Duration throughput_window_;
  const absl::Time created_at_;
  absl::Time left_pending_at_;
  absl::Time warm_start_started_at_;
  absl::Time rl_started_at_;
  int64_t last_step_;
  int64_t max_policy_version_;
  v1::TrainerState last_trainer_state_ = v1::TRAINER_STATE_UNSPECIFIED;
  std::deque<double> recent_step_rewards_;                    // The last steps' (RunRecord).
  std::deque<std::pair<absl::Time, int64_t>> token_reports_;  // Within the window.
  // The newest incarnation seen of each service, and what the driver
  // counted them for (RunRecord::incarnations): "replay_buffer",
  // "replay_buffer.starts", "reward_server", "trainer", "trainer.resumed",
  // "trainer.steps_redone".
  std::map<std::string, uint64_t> incarnations_;
  // What each trainer incarnation seen by this controller was counted for,
  // and the newest.
  struct TrainerCounted {
    bool resumed = false;
    int64_t steps_redone = 0;
  };
  std::map<uint64_t, TrainerCounted> trainers_counted_;
  uint64_t newest_trainer_ = 0;
  // The newest one the restored record knew: an unknown incarnation at or
  // below it was counted before this controller started, or cannot be told
  // apart from one that was.
  uint64_t trainer_floor_ = 0;
  // Workers the trainer reported quarantined (besides those the summary
  // marks).
  std::set<std::string> quarantined_workers_;
  // Workers whose last report said their inserts are refused: the error and
  // when (real clock).
  std::map<std::string, std::pair<std::string, absl::Time>> insert_refusals_;
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_PROGRESS_H_
