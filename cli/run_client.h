#ifndef SLUICE_CLI_RUN_CLIENT_H_
#define SLUICE_CLI_RUN_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "services/runtime/transport_security.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::cli {

inline constexpr char kDefaultControllerTarget[] = "127.0.0.1:50051";

// The controller's address, as the Python client resolves it: a non-empty
// `flag` (--target) wins; else the controller named in the endpoints.json of
// the state directory `state_dir` (--state-dir), else of $SLUICE_STATE_DIR,
// as `sluice up --state-dir DIR` writes it (NOT_FOUND saying so when it names
// none: the stack is not up); else that of the local stack
// (.sluice/stack/endpoints.json, then .sluice/endpoints.json, relative to the
// working directory); else kDefaultControllerTarget.
absl::StatusOr<std::string> ResolveControllerTarget(const std::string& flag,
                                                    const std::string& state_dir = "");

// How the CLI dials: `flags` when any is set; else $SLUICE_TOKEN_FILE,
// $SLUICE_TLS_CA (and $SLUICE_TLS_CERT/$SLUICE_TLS_KEY); else the CA and
// operator token a `sluice up --tls` stack named in its endpoints.json (the
// same file ResolveControllerTarget reads for `state_dir`); else plaintext
// without a token.
runtime::ClientSecurity ResolveClientSecurity(const runtime::ClientSecurity& flags,
                                              const std::string& state_dir = "");

struct SubmitOptions {
  // Only validate the spec and resolve its defaults; the returned run has an
  // empty run_id and the resolved spec.
  bool validate_only = false;
  // Follow the run until it ends (WatchRun), printing progress.
  bool watch = false;
  // WatchRun's min_interval_ms: how often progress is redrawn.
  int64_t watch_interval_ms = 1000;
  // Idempotency token for SubmitRun; empty = a fresh random one (so that a
  // retried submit never starts two runs).
  std::string request_id;
  // Where the run id and the final outcome go (null = nowhere).
  std::ostream* out = nullptr;
  // Where the live progress line goes (null = nowhere). With
  // progress_redraw it is one line rewritten with '\r' (a terminal),
  // otherwise one line per update (a log file).
  std::ostream* progress = nullptr;
  bool progress_redraw = false;
  // Deadline of each unary call (SubmitRun, GetRun).
  absl::Duration call_timeout = absl::Seconds(30);
  // A watch whose stream breaks (the controller restarting: under a
  // supervisor it is back within seconds and re-adopts the run; the
  // network) reconnects, quickly at first then every 2 s, until the
  // controller has not answered for this long.
  absl::Duration resume_for = absl::Minutes(1);
  // Set (by another thread) when whoever watches is stopping the controller
  // itself (`sluice quickstart` stopping its stack): a stream that breaks
  // then is not resumed, the watch returns CANCELLED at once.
  const std::atomic<bool>* stop_watching = nullptr;
};

// Submits `spec` to the controller at `target` and, with options.watch,
// follows it to its end: prints the run id on `out`, a live progress line on
// `progress` (state, step/total, version, reward mean, pass rate, staleness
// mean/max, generation and training tokens/s, latest eval, phase), and at the
// end the final state, the error if any and eval_before -> eval_after.
//
// Returns the run: as submitted (no watch), as validated (validate_only), or
// in its terminal state (watch). Errors are the controller's: INVALID_ARGUMENT
// with one "field: problem" line each for a bad spec, FAILED_PRECONDITION
// when the controller lacks a service, UNAVAILABLE (with a hint) when it
// cannot be reached. A watch whose stream breaks is resumed until the
// controller has not answered for options.resume_for (a minute), or says it
// no longer knows the run (NOT_FOUND). Blocks until then; thread-
// compatible.
absl::StatusOr<v1::Run> SubmitAndWatch(const std::string& target, const v1::RunSpec& spec,
                                       const SubmitOptions& options);

// Follows an existing run as SubmitAndWatch does, until it is terminal.
absl::StatusOr<v1::Run> WatchRun(const std::string& target, const std::string& run_id,
                                 const SubmitOptions& options);

absl::StatusOr<v1::Run> GetRun(const std::string& target, const std::string& run_id,
                               absl::Duration timeout = absl::Seconds(30));
// The run after the cancel, and whether it had already ended (nothing was
// cancelled then).
absl::StatusOr<v1::CancelRunResponse> CancelRun(const std::string& target,
                                                const std::string& run_id,
                                                const std::string& reason,
                                                absl::Duration timeout = absl::Seconds(30));
// What `sluice runs cancel` prints: "RUN_ID RUN_STATE_CANCELLED: reason", or
// "run RUN_ID had already ended (SUCCEEDED at ...); nothing was cancelled".
std::string FormatCancelOutcome(const v1::CancelRunResponse& response);
absl::StatusOr<v1::ListRunsResponse> ListRuns(const std::string& target,
                                              const v1::ListRunsRequest& request,
                                              absl::Duration timeout = absl::Seconds(30));

// One line of live progress: the state and the time since the run started,
// then the figures of its phase. In the warm start, its own: SFT steps (at
// most warm_start.sft_steps, "<=" when it stops at its dev-accuracy target),
// the latest dev accuracy against that target, and at most how long is left:
//   warm start  00:24  sft step 240/<=600  dev 38.0% (target 45%)  ETA <= 00:36
// In RL: step/total, version, reward mean, pass rate, staleness mean/max,
// generation and training tokens/s, the latest eval, and the time left at
// the rate of the steps so far:
//   training    01:15  step 12/200  v12  reward 0.412  pass 38.0%  stale 0.8/2
//   gen 1.5k tok/s  train 3.4k tok/s  eval 42.0% @10  ETA 19:35  | waiting for data
// Before either, the state, the time and the phase ("loading model"). While
// something holds the run back (Run.conditions), what and for how long:
//   ...  | waiting: trainer service_unresponsive 12s
std::string FormatProgressLine(const v1::Run& run);

// What holds the run back (Run.conditions), one line each, as of `now`:
//   waiting (since 12:00:01, 35s): trainer (127.0.0.1:50053) has not answered ...
// Empty when nothing does. `sluice runs get` prints it under the JSON.
std::string FormatConditions(const v1::Run& run, absl::Time now);

// `sluice runs list`: a header, then one line per run: id, state (a queued
// run with its place in the queue), name, when it was created (UTC), how
// long it ran (or has been running), steps.
//   RUN ID                      STATE    NAME       CREATED (UTC)        WALL   STEP
//   run-20260101-000000-ab12    QUEUED (position 2)  addition  2026-01-01 00:00:00  -  0/600
std::string FormatRunListHeader();
std::string FormatRunListLine(const v1::Run& run);

// The end of a run in a few lines: state and wall time, the error if any,
// eval_before -> eval_after and the main figures.
std::string FormatOutcome(const v1::Run& run);

// JSON of a run or spec as the run files write it (controller::ProtoToJson:
// snake_case names, defaults printed, 64-bit integers as numbers), indented.
std::string RunToJson(const google::protobuf::Message& message);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_RUN_CLIENT_H_
