#include "services/runtime/allowed_path_roots.h"

#include <algorithm>
#include <filesystem>

#include "CLI/CLI.hpp"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace sluice::runtime {

AllowedPathRootsFlag::AllowedPathRootsFlag(CLI::App& app) {
  app.add_option("--allowed-path-roots", roots_,
                 "directories the paths a run spec names (model.hf_model_dir, "
                 "model.tokenizer_path, task.dataset.path, checkpoint.dir) must lie in, once "
                 "symlinks and '..' are resolved; a relative path is resolved against the first. "
                 "Others are refused (INVALID_ARGUMENT). Repeat the flag, or give a YAML list. "
                 "Default: the working directory")
      ->type_name("DIR")
      // Every occurrence adds roots: the config file's list and the
      // command line's flags (ServiceMain's default is the last one only).
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

absl::StatusOr<PathPolicy> AllowedPathRootsFlag::Apply() const {
  std::vector<std::string> roots = roots_;
  if (roots.empty()) {
    std::error_code error;
    const std::filesystem::path cwd = std::filesystem::current_path(error);
    if (error) {
      return absl::FailedPreconditionError(
          "--allowed-path-roots: the working directory (the default root) cannot be read; "
          "give the roots");
    }
    roots.push_back(cwd.string());
  }
  absl::StatusOr<PathPolicy> policy = PathPolicy::Create(roots);
  if (!policy.ok()) return policy.status();
  const std::string described = policy->DescribeRoots();
  if (std::find(policy->roots().begin(), policy->roots().end(), "/") != policy->roots().end()) {
    log::Warning("a run spec may name any path: / is an allowed path root; set "
                 "--allowed-path-roots to the directories runs need",
                 {{"allowed_path_roots", described}});
  } else {
    log::Info("allowed path roots", {{"allowed_path_roots", described}});
  }
  return policy;
}

}  // namespace sluice::runtime
