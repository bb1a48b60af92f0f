#ifndef SLUICE_CONTROLLER_RUN_RECORD_H_
#define SLUICE_CONTROLLER_RUN_RECORD_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {

// What the controller measured of a run at submit (EstimateSpecMemory), passed
// on to the services so that their own memory checks agree with its
// estimate: StartTrainingRequest / StartRolloutsRequest.max_prompt_tokens and
// ConfigureRunRequest.max_sequence_tokens. 0 = unknown.
struct RunSizes {
  int64_t max_prompt_tokens = 0;    // The longest tokenized prompt.
  int64_t max_sequence_tokens = 0;  // The longest prompt + completion.
};

// A run as its directory records it, and what a controller restarted on the
// same --runs-dir re-adopts it from ("the runs directory is the record").
//
//   <runs-dir>/<run-id>/
//     spec.json          the resolved RunSpec, written once at submit
//     state.json         this record, minus the spec and the evaluations:
//                        rewritten atomically (temporary file, fsync, rename)
//                        on every state change (then with a directory fsync
//                        too) and at most every RunDriverOptions.
//                        state_flush_interval for the counters in between
//     metrics.jsonl      one TrainingStepMetrics per step, appended
//     evals.jsonl        one EvalResult per evaluation, appended
//     prompt_feed.jsonl  the prompt feed's journal (prompt_feed.h)
//     summary.json       the RunSummary, written at the terminal state
//
// metrics.jsonl and evals.jsonl are appended as things happen, so they may
// be ahead of state.json: LoadRunRecord rebuilds the run's progress (step,
// last step's figures, totals, evaluations, latest eval accuracy) from them.
// What only state.json holds and a kill -9 can set back by up to
// state_flush_interval: the workers' token and group counts and the
// buffer's eviction count (informational; the next reports move them on).
struct RunRecord {
  // run_id, spec, state, error_message, created_at, finished_at, progress,
  // summary (evaluations and recovery included). queue_position is not
  // kept (the registry renumbers its queue).
  v1::Run run;
  // SubmitRunRequest.request_id, so that a retried submit finds the run
  // across a controller restart; may be empty.
  std::string request_id;
  // Submission order in the runs directory (1, 2, ...): the queue order.
  int64_t sequence = 0;
  RunSizes sizes;
  // The driver's own figures; absl::InfinitePast() = not yet.
  absl::Time left_pending_at = absl::InfinitePast();
  absl::Time warm_start_started_at = absl::InfinitePast();
  absl::Time rl_started_at = absl::InfinitePast();
  int64_t last_step = 0;
  int64_t max_policy_version = -1;
  // Mean rewards of the last steps (at most 10), for final_reward_mean.
  std::deque<double> recent_step_rewards;
  // The last incarnation seen of each service the driver watches for
  // restarts ("replay_buffer", "reward_server", "trainer"), so that a
  // restarted controller still counts a restart that happened around its
  // own; and what the driver counted them for ("replay_buffer.starts": the
  // buffer's start count; "trainer.resumed", "trainer.steps_redone": what
  // the newest trainer incarnation was counted for), so that it counts
  // nothing twice.
  std::map<std::string, uint64_t> incarnations;
};

// The record of a run just submitted: QUEUED, nothing measured yet. `run`
// carries run_id, the resolved spec and created_at.
RunRecord NewRunRecord(v1::Run run, std::string request_id, int64_t sequence, RunSizes sizes);

// state.json's text: one JSON object, {"format": 1, "run": <the Run as
// proto JSON without spec and evaluations>, "request_id", "sequence",
// "sizes", the driver's figures (times as Unix nanoseconds, absent =
// never)}.
std::string EncodeRunState(const RunRecord& record);
// The inverse; DATA_LOSS saying what is wrong with the text. The spec and
// evaluations come back empty.
absl::StatusOr<RunRecord> DecodeRunState(absl::string_view text);

// Reads the run in `dir` (<runs-dir>/<run_id>): spec.json, state.json, then
// the progress and evaluations rebuilt from metrics.jsonl and evals.jsonl
// (a partial last line, left by a controller killed while appending it, is
// ignored; an unparsable complete one is skipped with a warning).
//   NOT_FOUND  the directory holds no run (neither spec.json nor state.json,
//              e.g. `sluice quickstart`'s stack/ directory);
//   DATA_LOSS  it holds one that cannot be restored, saying why (spec.json
//              or state.json missing or corrupt, another run's record).
// A run directory written before state.json existed, with a terminal
// summary.json, loads as that terminal run. Reads only.
absl::StatusOr<RunRecord> LoadRunRecord(const std::string& dir, const std::string& run_id);

// A step's figures applied to the run's progress and summary: step, reward,
// pass rate, staleness, loss, throughput of the step; the totals (steps,
// groups and tokens trained, max staleness, rollout verification per
// worker) and final_reward_mean over
// `recent_step_rewards` (pushed to, kept at 10). Shared by the driver and
// LoadRunRecord, so that a restored run shows what the live one did.
void ApplyStepFigures(const v1::TrainingStepMetrics& step, v1::Run* run,
                      std::deque<double>* recent_step_rewards);
// An evaluation appended to the summary, with eval_before / eval_after /
// warm_start_accuracy and the latest eval accuracy and step.
void ApplyEvalFigures(const v1::EvalResult& eval, v1::Run* run);

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_RECORD_H_
