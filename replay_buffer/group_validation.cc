#include "replay_buffer/group_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace sluice::replay_buffer {
namespace {

std::string Field(int trajectory, absl::string_view field) {
  return absl::StrCat("trajectories[", trajectory, "].", field);
}

// Every id of `ids` in [0, vocab_size) (>= 0 when vocab_size is 0).
template <typename Ids>
absl::Status CheckTokenIds(const Ids& ids, int trajectory, absl::string_view field,
                           int64_t vocab_size) {
  for (int k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (id >= 0 && (vocab_size == 0 || id < vocab_size)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        Field(trajectory, field), "[", k, "]: must be ",
        vocab_size == 0 ? std::string(">= 0")
                        : absl::StrCat("in [0, ", vocab_size, ") (the model's vocabulary)"),
        ", got ", id));
  }
  return absl::OkStatus();
}

absl::Status CheckReward(double reward, int trajectory, const GroupLimits& limits) {
  if (!std::isfinite(reward)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Field(trajectory, "reward"), ": must be finite, got ", reward));
  }
  if ((limits.min_reward.has_value() && reward < *limits.min_reward) ||
      (limits.max_reward.has_value() && reward > *limits.max_reward)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Field(trajectory, "reward"), ": must be in the run's reward range [",
        limits.min_reward.has_value() ? absl::StrCat(*limits.min_reward) : "-inf", ", ",
        limits.max_reward.has_value() ? absl::StrCat(*limits.max_reward) : "inf", "], got ",
        reward));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GroupVersions> ValidateGroup(const v1::Group& group, const GroupLimits& limits) {
  if (group.idempotency_key().empty()) {
    return absl::InvalidArgumentError("idempotency_key: required");
  }
  if (group.run_id() != limits.run_id) {
    return absl::InvalidArgumentError(absl::StrCat("run_id: group is for run \"", group.run_id(),
                                                   "\", this table is run \"", limits.run_id,
                                                   "\""));
  }
  if (group.trajectories_size() != limits.group_size) {
    return absl::InvalidArgumentError(absl::StrCat("trajectories: expected group_size = ",
                                                   limits.group_size, ", got ",
                                                   group.trajectories_size()));
  }
  int64_t min_version = std::numeric_limits<int64_t>::max();
  int64_t max_version = std::numeric_limits<int64_t>::min();
  for (int i = 0; i < group.trajectories_size(); ++i) {
    const v1::Trajectory& trajectory = group.trajectories(i);
    const int tokens = trajectory.completion_token_ids_size();
    if (trajectory.behaviour_logprobs_size() != tokens ||
        trajectory.token_policy_versions_size() != tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("trajectories[", i, "]: completion_token_ids has ", tokens,
                       " entries, behaviour_logprobs ", trajectory.behaviour_logprobs_size(),
                       " and token_policy_versions ", trajectory.token_policy_versions_size(),
                       "; each needs one entry per completion token"));
    }
    if (trajectory.prompt_token_ids().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Field(i, "prompt_token_ids"), ": must not be empty"));
    }
    if (tokens == 0 && trajectory.finish_reason() != v1::FINISH_REASON_ABORTED) {
      return absl::InvalidArgumentError(absl::StrCat(
          Field(i, "completion_token_ids"),
          ": must not be empty unless finish_reason is FINISH_REASON_ABORTED, finish_reason is ",
          v1::FinishReason_Name(trajectory.finish_reason())));
    }
    RETURN_IF_ERROR(
        CheckTokenIds(trajectory.prompt_token_ids(), i, "prompt_token_ids", limits.vocab_size));
    RETURN_IF_ERROR(CheckTokenIds(trajectory.completion_token_ids(), i, "completion_token_ids",
                                  limits.vocab_size));
    const auto& logprobs = trajectory.behaviour_logprobs();
    for (int t = 0; t < logprobs.size(); ++t) {
      // Written so that NaN fails too.
      if (!(std::isfinite(logprobs[t]) && logprobs[t] <= kMaxBehaviourLogProb)) {
        return absl::InvalidArgumentError(absl::StrCat(Field(i, "behaviour_logprobs"), "[", t,
                                                       "]: must be finite and <= 0, got ",
                                                       logprobs[t]));
      }
    }
    const auto& versions = trajectory.token_policy_versions();
    for (int t = 0; t < versions.size(); ++t) {
      if (versions[t] < 0) {
        return absl::InvalidArgumentError(absl::StrCat(Field(i, "token_policy_versions"), "[", t,
                                                       "]: must be >= 0, got ", versions[t]));
      }
      if (t > 0 && versions[t] < versions[t - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            Field(i, "token_policy_versions"), ": must be non-decreasing; entry ", t, " is ",
            versions[t], " after ", versions[t - 1]));
      }
    }
    RETURN_IF_ERROR(CheckReward(trajectory.reward(), i, limits));
    if (tokens > 0) {
      min_version = std::min<int64_t>(min_version, versions[0]);
      max_version = std::max<int64_t>(max_version, versions[tokens - 1]);
    }
  }
  if (min_version == std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(
        "trajectories: the group has no completion tokens, so its policy version is undefined");
  }
  return GroupVersions{min_version, max_version};
}

absl::Status CheckVersionsNotAhead(const v1::Group& group, int64_t policy_version) {
  for (int i = 0; i < group.trajectories_size(); ++i) {
    const auto& versions = group.trajectories(i).token_policy_versions();
    if (versions.empty() || versions[versions.size() - 1] <= policy_version) continue;
    const auto first_ahead = std::upper_bound(versions.begin(), versions.end(), policy_version);
    const int t = static_cast<int>(first_ahead - versions.begin());
    return absl::InvalidArgumentError(absl::StrCat(
        Field(i, "token_policy_versions"), "[", t, "]: must not be ahead of the policy version ",
        policy_version, " (the newest the trainer has published), got ", versions[t]));
  }
  return absl::OkStatus();
}

}  // namespace sluice::replay_buffer
