#ifndef SLUICE_CLI_SCORE_COMMAND_H_
#define SLUICE_CLI_SCORE_COMMAND_H_

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sluice/v1/reward_server.pb.h"

namespace CLI {
class App;
}  // namespace CLI

// `sluice score --input IN.jsonl --output OUT.jsonl`: scores records offline
// with the reward server's verifiers, the way users evaluate a checkpoint's
// outputs. Each input line is a JSON object
//
//   {"verifier": "math", "response": "...", "reference": "..."}
//   {"verifier": "code", "response": "...", "prompt": "...", "test": "...",
//    "entry_point": "..."}
//
// ("reference_answer" is accepted for "reference"; optional "metadata": an
// object of verifier parameters, "timeout_ms": the item's deadline). The
// reference is the bare answer ("3\sqrt{13}", "1,-2"), which the math
// verifier compares as a whole; a full worked solution is marked, so that
// its final answer is extracted (ScoreItem.reference_is_solution):
//
//   {"verifier": "math", "response": "...", "solution": "... #### 18"}
//   {"verifier": "math", "response": "...", "reference": "... \boxed{18}",
//    "reference_is_solution": true}
//
// ("solution" is read only when the line has no "reference"; a
// "reference_is_solution" that is not a boolean makes the line invalid).
// Each is written back, every key kept, with what the verifier found added:
//
//   "reward" (0..1), "error_kind" ("none", "timeout", "crash", "parse",
//   "sandbox", ...), "extracted_answer", "detail", "verifier", "duration_ms",
//   and for code "tests_passed"/"tests_total", for a composition
//   "components" (one object per verifier with its "weight").
//
// Output lines are in input order, one per input line (blank lines skipped).
// A line that is not a JSON object, or lacks "response", is written back as
// {"line": N, "input": "<the raw text>"} or with its keys, plus reward 0 and
// error_kind "invalid_input" naming what is wrong; scoring goes on.
//
// By default the verifiers run in this process (the same library the reward
// server runs, sandbox included); with --target the lines are sent to a
// running reward server instead.
namespace sluice::cli {

struct ScoreFlags {
  std::string input;   // Path, or "-" for stdin.
  std::string output;  // Path, or "-" for stdout.
  // Verifier for lines that name none; empty = such lines need --composition.
  std::string verifier;
  // "math:1,format:0.1": the weighted composition for lines that name no
  // verifier (run params are not expressible here; use a line's metadata).
  std::string composition;
  // Reward server HOST:PORT; empty = score in this process.
  std::string target;
  int workers = 2;           // In-process verifier threads.
  int batch_size = 64;       // Lines per ScoreBatch.
  int64_t timeout_ms = 0;    // Per item; 0 = each verifier's default.
  bool quiet = false;        // No summary on stderr.
};

// Adds `score` to `app`, parsing into `flags`; returns the command.
CLI::App* AddScoreCommand(CLI::App& app, ScoreFlags* flags);

// Scores one batch (one ScoreBatch call's worth).
using ScoreBatchFn =
    std::function<absl::StatusOr<v1::ScoreBatchResponse>(const v1::ScoreBatchRequest&)>;

struct ScoreSummary {
  int64_t lines = 0;          // Non-blank input lines.
  int64_t invalid_lines = 0;  // Not an object, or no "response".
  double reward_sum = 0;      // Over every written line.
  std::map<std::string, int64_t> error_kinds;  // error_kind -> lines.
  std::map<std::string, std::pair<int64_t, double>> by_verifier;  // lines, reward sum.
};

// The core of the command: reads JSONL from `in`, scores it in batches of
// `flags.batch_size` with `score`, writes JSONL to `out`. Errors: an RPC
// failure of `score` (the lines of that batch are not written) or a parse
// failure of --composition (INVALID_ARGUMENT naming it).
absl::StatusOr<ScoreSummary> ScoreJsonl(const ScoreFlags& flags, std::istream& in,
                                        std::ostream& out, const ScoreBatchFn& score);

// "math:1,format:0.1" -> composition entries. INVALID_ARGUMENT naming the
// bad entry.
absl::StatusOr<std::vector<v1::WeightedVerifier>> ParseComposition(const std::string& text);

// Runs `sluice score`: opens the files, builds the in-process scorer (or the
// client for --target), prints the summary on `err`. Exit code: 0; 1 when the
// files cannot be opened or the scorer cannot be built or reached; 3 when
// every line was scored but some were invalid input.
int RunScore(const ScoreFlags& flags, std::ostream& err);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_SCORE_COMMAND_H_
