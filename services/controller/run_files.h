#ifndef SLUICE_SERVICES_CONTROLLER_RUN_FILES_H_
#define SLUICE_SERVICES_CONTROLLER_RUN_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace sluice::controller {

// JSON as the run files use it (ProtoToJson: snake_case names, defaults
// printed, 64-bit integers as numbers). `pretty` = indented, multi-line
// (spec.json, summary.json); otherwise one line (the .jsonl files).
std::string ToJson(const google::protobuf::Message& message, bool pretty);

// The files of one run under <runs-dir>/<run-id>/ (docs/run-lifecycle.md):
// spec.json, metrics.jsonl, evals.jsonl, summary.json. Whole-file writes go
// through a temporary file and a rename, so a reader never sees half a
// file. Not thread-safe: the run's driver serializes calls.
class RunFiles {
 public:
  // Creates the directory (and its parents).
  static absl::StatusOr<RunFiles> Create(const std::string& runs_dir, const std::string& run_id);

  const std::string& dir() const { return dir_; }

  absl::Status WriteSpec(const google::protobuf::Message& spec) const;
  absl::Status AppendMetrics(const google::protobuf::Message& step) const;
  absl::Status AppendEval(const google::protobuf::Message& eval) const;
  absl::Status WriteSummary(const google::protobuf::Message& summary) const;

 private:
  explicit RunFiles(std::string dir) : dir_(std::move(dir)) {}
  absl::Status WriteWhole(const std::string& name, const std::string& text) const;
  absl::Status AppendLine(const std::string& name, const std::string& line) const;

  std::string dir_;
};

}  // namespace sluice::controller

#endif  // SLUICE_SERVICES_CONTROLLER_RUN_FILES_H_
