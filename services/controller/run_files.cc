#include "services/controller/run_files.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "services/controller/proto_json.h"

namespace sluice::controller {

namespace fs = std::filesystem;

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  return ProtoToJson(message, pretty);
}

absl::StatusOr<RunFiles> RunFiles::Create(const std::string& runs_dir, const std::string& run_id) {
  const fs::path dir = fs::path(runs_dir) / run_id;
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create run directory ", dir.string(), ": ", error.message()));
  }
  return RunFiles(dir.string());
}

absl::Status RunFiles::WriteSpec(const google::protobuf::Message& spec) const {
  return WriteWhole("spec.json", ToJson(spec, /*pretty=*/true));
}

absl::Status RunFiles::AppendMetrics(const google::protobuf::Message& step) const {
  return AppendLine("metrics.jsonl", ToJson(step, /*pretty=*/false));
}

absl::Status RunFiles::AppendEval(const google::protobuf::Message& eval) const {
  return AppendLine("evals.jsonl", ToJson(eval, /*pretty=*/false));
}

absl::Status RunFiles::WriteSummary(const google::protobuf::Message& summary) const {
  return WriteWhole("summary.json", ToJson(summary, /*pretty=*/true));
}

absl::Status RunFiles::WriteWhole(const std::string& name, const std::string& text) const {
  const fs::path path = fs::path(dir_) / name;
  const fs::path temporary = fs::path(dir_) / (name + ".tmp");
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    if (!text.empty() && text.back() != '\n') out << "\n";
    if (!out.flush()) {
      return absl::InternalError(
          absl::StrCat("cannot write ", temporary.string(), ": ", std::strerror(errno)));
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot write ", path.string(), ": ", error.message()));
  }
  return absl::OkStatus();
}

absl::Status RunFiles::AppendLine(const std::string& name, const std::string& line) const {
  const fs::path path = fs::path(dir_) / name;
  std::ofstream out(path, std::ios::app);
  out << line << "\n";
  if (!out.flush()) {
    return absl::InternalError(
        absl::StrCat("cannot append to ", path.string(), ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace sluice::controller
