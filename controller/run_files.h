#ifndef SLUICE_CONTROLLER_RUN_FILES_H_
#define SLUICE_CONTROLLER_RUN_FILES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace sluice::controller {

// An absl::Status for errno `error_number`: "cannot <what> <path>:
// <strerror>", coded so that a caller can tell a full disk from a missing
// file: ENOENT NOT_FOUND, ENOSPC and EDQUOT RESOURCE_EXHAUSTED, EACCES and
// EPERM PERMISSION_DENIED, EROFS and EIO UNAVAILABLE, the rest INTERNAL.
absl::Status PosixFileError(int error_number, absl::string_view what, const std::string& path);

// JSON as the run files use it (ProtoToJson: snake_case names, defaults
// printed, 64-bit integers as numbers). `pretty` = indented, multi-line
// (spec.json, summary.json); otherwise one line (the .jsonl files).
std::string ToJson(const google::protobuf::Message& message, bool pretty);

// Writes `text` (plus a final newline if it lacks one) to `path` through
// `<path>.tmp` and rename(2), so that a reader, or a controller restarted
// after kill -9, sees the old file or the new one and never half of one. The
// temporary file's data is fsync'd before the rename; with `durable` the
// directory is fsync'd after it as well, so that the rename itself survives
// a machine crash. On an error the temporary file is removed and `path` is
// left as it was.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view text, bool durable);

// Appends `line` and a newline to `path` (created if missing) with a single
// write(2) on an O_APPEND descriptor: a process killed meanwhile leaves at
// worst a partial last line, which ReadCompleteLines leaves out and
// DropTornTail removes. A write that fails (a full disk) truncates the file
// back to where it was, so that the next append starts a line of its own.
absl::Status AppendLineToFile(const std::string& path, absl::string_view line);

// The whole content of `path`; NOT_FOUND when it does not exist.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// The lines of a .jsonl file that a newline ends, without it; a partial
// last line (no newline: its write was cut short) is left out and its size
// reported. NOT_FOUND when the file does not exist.
struct CompleteLines {
  std::vector<std::string> lines;
  int64_t torn_tail_bytes = 0;
};
absl::StatusOr<CompleteLines> ReadCompleteLines(const std::string& path);

// Truncates a partial last line of `path` (see above) so that the next
// append starts on a line of its own. Returns the bytes removed; 0 when the
// file ends with a newline, is empty or does not exist.
absl::StatusOr<int64_t> DropTornTail(const std::string& path);

// The files of one run under <runs-dir>/<run-id>/ (docs/run-lifecycle.md):
// spec.json, state.json (the record a restarted controller re-adopts the run
// from), metrics.jsonl, evals.jsonl, prompt_feed.jsonl (PromptFeed's
// journal), summary.json. Whole-file writes go through WriteFileAtomically;
// appends through AppendLineToFile. Not thread-safe: the run's driver
// serializes calls.
class RunFiles {
 public:
  static constexpr char kSpec[] = "spec.json";
  static constexpr char kState[] = "state.json";
  static constexpr char kMetrics[] = "metrics.jsonl";
  static constexpr char kEvals[] = "evals.jsonl";
  static constexpr char kSummary[] = "summary.json";
  static constexpr char kPromptFeed[] = "prompt_feed.jsonl";

  // Creates the directory (and its parents) if missing.
  static absl::StatusOr<RunFiles> Create(const std::string& runs_dir, const std::string& run_id);
  // The files of the existing run directory `dir`; creates nothing.
  static RunFiles At(std::string dir) { return RunFiles(std::move(dir)); }

  const std::string& dir() const { return dir_; }
  // <dir>/<name>.
  std::string Path(absl::string_view name) const;

  absl::Status WriteSpec(const google::protobuf::Message& spec) const;
  // state.json; `durable` as in WriteFileAtomically.
  absl::Status WriteState(absl::string_view text, bool durable) const;
  absl::Status AppendMetrics(const google::protobuf::Message& step) const;
  absl::Status AppendEval(const google::protobuf::Message& eval) const;
  absl::Status WriteSummary(const google::protobuf::Message& summary) const;

  // After a restart: drops a partial last line of metrics.jsonl and
  // evals.jsonl (a controller killed mid-append) so that new lines start on
  // lines of their own. Logs what it removed.
  absl::Status RepairAppendedFiles() const;

 private:
  explicit RunFiles(std::string dir) : dir_(std::move(dir)) {}

  std::string dir_;
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_FILES_H_
