#include "trainer/step_guard.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace sluice::trainer {
namespace {

template <typename Ids>
absl::Status CheckIds(const Ids& ids, const v1::Trajectory& t, const char* field,
                      int64_t vocab_size) {
  for (int k = 0; k < ids.size(); ++k) {
    if (ids[k] < 0 || ids[k] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("trajectory ", t.trajectory_id(), ": ", field,
                                                     "[", k, "] is ", ids[k],
                                                     ", outside the model's vocabulary [0, ",
                                                     vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckTrainableGroup(const v1::Group& group, int64_t vocab_size,
                                 int64_t trainer_version) {
  for (const v1::Trajectory& t : group.trajectories()) {
    const std::string where = absl::StrCat("trajectory ", t.trajectory_id(), ": ");
    if (!std::isfinite(t.reward())) {
      return absl::InvalidArgumentError(absl::StrCat(where, "reward is ", t.reward()));
    }
    if (t.prompt_token_ids().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, "the prompt is empty"));
    }
    if (absl::Status ids = CheckIds(t.prompt_token_ids(), t, "prompt_token_ids", vocab_size);
        !ids.ok()) {
      return ids;
    }
    if (absl::Status ids =
            CheckIds(t.completion_token_ids(), t, "completion_token_ids", vocab_size);
        !ids.ok()) {
      return ids;
    }
    const int tokens = t.completion_token_ids_size();
    if (t.behaviour_logprobs_size() != tokens || t.token_policy_versions_size() != tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "has ", t.behaviour_logprobs_size(), " behaviour log-probs and ",
          t.token_policy_versions_size(), " token versions for ", tokens, " tokens"));
    }
    for (int k = 0; k < tokens; ++k) {
      if (!std::isfinite(t.behaviour_logprobs(k))) {
        return absl::InvalidArgumentError(absl::StrCat(where, "behaviour_logprobs[", k, "] is ",
                                                       t.behaviour_logprobs(k)));
      }
      // Every token carries the version that sampled it; versions never go
      // down along a completion, none predates the group's minimum and none
      // is newer than what the trainer has published.
      const int64_t v = t.token_policy_versions(k);
      if (v < group.min_policy_version() || v > trainer_version ||
          (k > 0 && v < t.token_policy_versions(k - 1))) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "token ", k, " has policy version ", v, " (group min ",
            group.min_policy_version(), ", trainer at ", trainer_version, ")"));
      }
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> FirstNonFiniteParameter(const std::vector<model::NamedTensor>& params) {
  torch::NoGradGuard no_grad;
  for (const model::NamedTensor& param : params) {
    if (!torch::isfinite(param.tensor).all().item<bool>()) return param.name;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> GuardedStep(torch::optim::Optimizer& optimizer,
                                        const std::vector<model::NamedTensor>& params, double loss,
                                        double grad_norm,
                                        const std::function<absl::Status()>& restore) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    optimizer.zero_grad();
    return absl::StrCat("the loss (", loss, ") or the gradient norm (", grad_norm,
                        ") is not finite");
  }
  optimizer.step();
  std::optional<std::string> bad = FirstNonFiniteParameter(params);
  if (!bad.has_value()) return std::string();
  if (absl::Status restored = restore(); !restored.ok()) return restored;
  optimizer.state().clear();
  return absl::StrCat("the update made ", *bad, " non-finite; the previous weights were restored");
}

}  // namespace sluice::trainer
