#include "common/run/run_paths.h"

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"

namespace sluice::run {

absl::Status ConfineRunSpecPaths(const PathPolicy& policy, v1::RunSpec* spec,
                                 RunSpecPathUse use) {
  struct Field {
    const char* name;
    const std::string& value;
    std::function<void(std::string)> set;
  };
  // Read through const accessors; a setter runs only for a path it changes,
  // so that a spec is never touched otherwise (no empty submessage appears).
  const v1::ModelConfig& model = spec->model();
  std::vector<Field> fields;
  if (use.model && model.has_hf_model_dir()) {
    fields.push_back({"model.hf_model_dir", model.hf_model_dir(), [spec](std::string path) {
                        spec->mutable_model()->set_hf_model_dir(std::move(path));
                      }});
  }
  if (use.model) {
    fields.push_back({"model.tokenizer_path", model.tokenizer_path(), [spec](std::string path) {
                        spec->mutable_model()->set_tokenizer_path(std::move(path));
                      }});
  }
  if (use.dataset && spec->task().has_dataset()) {
    fields.push_back({"task.dataset.path", spec->task().dataset().path(), [spec](std::string path) {
                        spec->mutable_task()->mutable_dataset()->set_path(std::move(path));
                      }});
  }
  if (use.checkpoint) {
    fields.push_back({"checkpoint.dir", spec->checkpoint().dir(), [spec](std::string path) {
                        spec->mutable_checkpoint()->set_dir(std::move(path));
                      }});
  }
  std::vector<std::string> problems;
  std::vector<std::pair<const Field*, std::string>> confined;
  for (const Field& field : fields) {
    if (field.value.empty()) continue;
    absl::StatusOr<std::string> path = policy.Confine(field.name, field.value);
    if (!path.ok()) {
      problems.emplace_back(path.status().message());
    } else if (*path != field.value) {
      confined.emplace_back(&field, *std::move(path));
    }
  }
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
  for (auto& [field, path] : confined) field->set(std::move(path));
  return absl::OkStatus();
}

}  // namespace sluice::run
