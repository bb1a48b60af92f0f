#ifndef SLUICE_CLI_BUFFER_COMMAND_H_
#define SLUICE_CLI_BUFFER_COMMAND_H_

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace CLI {
class App;
}  // namespace CLI

// `sluice buffer stats --target ADDR --run-id ID [--json]`: what one run's
// table in the replay buffer holds and has done (BufferStats from GetStats).
//
// The formatting is pure (proto in, text out) so that it is tested without a
// server; the command adds the call and the error messages.
namespace sluice::cli {

struct BufferStatsFlags {
  // Replay buffer HOST:PORT.
  std::string target;
  // The run whose table to describe. GetStats describes one run and the
  // buffer cannot list its runs, so this is required (checked by
  // RunBufferStats, which says where to find run ids).
  std::string run_id;
  // One JSON object instead of the text summary.
  bool json = false;
  // Deadline of the GetStats call.
  int64_t timeout_ms = 5000;
};

// Adds `buffer` and its subcommand `stats` to `app`, parsing into `flags`.
// Returns the `buffer` command: when it was given, call RunBufferStats.
CLI::App* AddBufferCommand(CLI::App& app, BufferStatsFlags* flags);

// Runs `sluice buffer stats`: the summary (or JSON) on `out`, one line per
// error on `err`. Without --run-id: every run (the one run's object when
// there is exactly one, else the totals with "runs": [...]). Returns the
// exit code: 0; 1 when the buffer cannot be reached or does not know the
// run (the line names the address or the run). Blocks for at most the
// timeout.
int RunBufferStats(const BufferStatsFlags& flags, std::ostream& out, std::ostream& err);

// GetStats of `run_id` from the replay buffer at `target`. Errors keep the
// RPC's code, in one line: UNAVAILABLE or DEADLINE_EXCEEDED "cannot reach
// the replay buffer at <target>: ..."; NOT_FOUND "the replay buffer at
// <target> has no run \"<run_id>\" ..."; UNIMPLEMENTED when <target> is not
// a replay buffer.
absl::StatusOr<v1::BufferStats> FetchBufferStats(const std::string& target,
                                                 const std::string& run_id, absl::Duration timeout);

// Every run's stats (GetStats with no run id), by run id.
absl::StatusOr<std::vector<v1::BufferStats>> FetchAllBufferStats(const std::string& target,
                                                                 absl::Duration timeout);

// Several runs: {"groups": total, "trajectories": total, "bytes": total,
// "runs": [BufferStatsToJson of each]}; and a text form.
std::string BufferSummaryToJson(const std::vector<v1::BufferStats>& runs);
std::string BufferSummaryToText(const std::vector<v1::BufferStats>& runs);

// The stats as one JSON object, indented by two spaces, keys in this order:
//
//   run_id, groups (= size_groups), trajectories, bytes, policy_version,
//   accepted, running, admission_limit, batch_size_groups, max_staleness,
//   inserted_groups, duplicate_inserts, rejected_inserts, sampled_groups,
//   evictions      {"stale": n, "max_times_sampled": n, "capacity": n,
//                   "run_deleted": n}: every EvictionReason, 0 when absent
//                   (a reason this build does not know is "reason_<n>");
//   staleness      {"sampled_groups": H, "sampled_tokens": H}, where H is
//                   {"buckets": [{"le": 0, "count": n, "cumulative": n}, ...,
//                   {"le": "+Inf", ...}], "count": n, "sum": n, "mean": x}:
//                   `count` of a bucket is the values in (previous le, le]
//                   (as BufferStats keeps them), `cumulative` those <= le
//                   (as Prometheus does); `mean` is null with no values;
//   rate_limiter   {"insert_blocked_ms": n, "sample_blocked_ms": n},
//   admission_blocked_ms,
//   config         the BufferConfig as proto JSON (snake_case, defaults
//                   printed, enums by name).
std::string BufferStatsToJson(const v1::BufferStats& stats);

// The stats as a readable summary: sizes, policy version and gate, insert
// and sample counters, evictions by reason, blocked times, the config's
// non-default fields, and each staleness histogram as one row per bucket
// (count and a bar) under its total and mean.
std::string BufferStatsToText(const v1::BufferStats& stats);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_BUFFER_COMMAND_H_
