#include "cli/stack_options.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/state_dir.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace sluice::cli {

const std::vector<std::string>& StackServiceKinds() {
  static const auto* kinds = new std::vector<std::string>{
      "reward_server", "replay_buffer", "trainer", "controller", "rollout_worker"};
  return *kinds;
}

absl::Status LocalStackOptions::Validate() const {
  if (bin_dir.empty()) return absl::InvalidArgumentError("bin_dir must be set");
  if (state_dir.empty()) return absl::InvalidArgumentError("state_dir must be set");
  for (const std::string& kind : StackServiceKinds()) {
    const std::filesystem::path binary = std::filesystem::path(bin_dir) / BinaryFor(kind);
    if (access(binary.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("service binary ", binary.string(),
                                              " is missing or not executable; build it first "
                                              "(cmake --build build) or pass --bin-dir"));
    }
  }
  if (rollout_workers < 0 || rollout_workers > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("rollout_workers must be in [0, 256], got ", rollout_workers));
  }
  const MemoryShares& shares = memory_shares;
  if (!(shares.trainer >= 0 && shares.rollout_workers >= 0 && shares.replay_buffer >= 0) ||
      shares.trainer + shares.rollout_workers + shares.replay_buffer > 100) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory_shares must be >= 0 and add up to at most 100%%; got trainer %g%%, rollout "
        "workers %g%%, replay buffer %g%%",
        shares.trainer, shares.rollout_workers, shares.replay_buffer));
  }
  if (torch_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("torch_threads must be >= 0; got ", torch_threads));
  }
  RETURN_IF_ERROR(restart.Validate());
  RETURN_IF_ERROR(liveness.Validate());
  return log::ParseFormat(log_format).status();
}

}  // namespace sluice::cli
