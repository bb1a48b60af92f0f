#include "replay_buffer/group_validation.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "google/protobuf/repeated_field.h"
#include "common/status_macros.h"

namespace sluice::replay_buffer {
namespace {

std::string Field(int trajectory, absl::string_view field) {
  return absl::StrCat("trajectories[", trajectory, "].", field);
}

// These checks run on every insert over every token (a 64 KB group holds
// ~4k of each per-token array). Each array is first checked by a
// branch-free pass over fixed blocks of integers, which GCC vectorizes at
// -O2 (a plain loop over floats it does not); the loop that finds and names
// the offending entry runs only when that pass fails.

// True when bad(k) is 0 for every k in [0, size); bad returns 0 or 1.
template <typename Bad>
bool NoneBad(int size, Bad bad) {
  constexpr int kBlock = 16;
  uint32_t any = 0;
  int k = 0;
  for (; k + kBlock <= size; k += kBlock) {
    uint32_t block = 0;
    for (int j = 0; j < kBlock; ++j) block |= bad(k + j);
    any |= block;
  }
  for (; k < size; ++k) any |= bad(k);
  return any == 0;
}

// Every id in [0, limit); the unsigned compare takes a negative id as huge.
bool AllIdsBelow(const google::protobuf::RepeatedField<int32_t>& ids, uint32_t limit) {
  const int32_t* data = ids.data();
  return NoneBad(ids.size(),
                 [=](int k) -> uint32_t { return static_cast<uint32_t>(data[k]) >= limit; });
}

// Every log-prob finite and <= kMaxBehaviourLogProb, on the float's bits: a
// NaN or an infinity has every exponent bit set; a positive float's bits,
// read as a signed integer, grow with its value (a NaN's are above every
// finite one's), a negative float's are negative.
bool AllLogProbsValid(const google::protobuf::RepeatedField<float>& logprobs) {
  static_assert(sizeof(float) == sizeof(int32_t));
  int32_t max_bits;
  std::memcpy(&max_bits, &kMaxBehaviourLogProb, sizeof(max_bits));
  constexpr int32_t kExponent = 0x7f800000;
  const float* data = logprobs.data();
  return NoneBad(logprobs.size(), [=](int k) -> uint32_t {
    int32_t bits;
    std::memcpy(&bits, &data[k], sizeof(bits));  // a load; no aliasing through a cast
    return static_cast<uint32_t>(bits > max_bits) |
           static_cast<uint32_t>((bits & kExponent) == kExponent);
  });
}

// Every version >= 0 and none below its predecessor.
bool AllVersionsValid(const google::protobuf::RepeatedField<int64_t>& versions) {
  const int64_t* data = versions.data();
  if (versions.empty()) return true;
  if (data[0] < 0) return false;
  return NoneBad(versions.size() - 1,
                 [=](int k) -> uint32_t { return static_cast<uint32_t>(data[k + 1] < data[k]); });
}

// Every id of `ids` in [0, vocab_size) (>= 0 when vocab_size is 0).
absl::Status CheckTokenIds(const google::protobuf::RepeatedField<int32_t>& ids, int trajectory,
                           absl::string_view field, int64_t vocab_size) {
  const bool bounded = vocab_size > 0 && vocab_size <= std::numeric_limits<int32_t>::max();
  if (AllIdsBelow(ids, bounded ? static_cast<uint32_t>(vocab_size) : uint32_t{1} << 31)) {
    return absl::OkStatus();
  }
  for (int k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    if (id >= 0 && (!bounded || id < vocab_size)) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        Field(trajectory, field), "[", k, "]: must be ",
        bounded ? absl::StrCat("in [0, ", vocab_size, ") (the model's vocabulary)")
                : std::string(">= 0"),
        ", got ", id));
  }
  return absl::OkStatus();
}

absl::Status CheckLogProbs(const google::protobuf::RepeatedField<float>& logprobs,
                           int trajectory) {
  if (AllLogProbsValid(logprobs)) return absl::OkStatus();
  for (int t = 0; t < logprobs.size(); ++t) {
    // Written so that NaN fails too.
    if (!(std::isfinite(logprobs[t]) && logprobs[t] <= kMaxBehaviourLogProb)) {
      return absl::InvalidArgumentError(absl::StrCat(Field(trajectory, "behaviour_logprobs"), "[",
                                                     t, "]: must be finite and <= 0, got ",
                                                     logprobs[t]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckVersions(const google::protobuf::RepeatedField<int64_t>& versions,
                           int trajectory) {
  if (AllVersionsValid(versions)) return absl::OkStatus();
  for (int t = 0; t < versions.size(); ++t) {
    if (versions[t] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(Field(trajectory, "token_policy_versions"),
                                                     "[", t, "]: must be >= 0, got ",
                                                     versions[t]));
    }
    if (t > 0 && versions[t] < versions[t - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          Field(trajectory, "token_policy_versions"), ": must be non-decreasing; entry ", t,
          " is ", versions[t], " after ", versions[t - 1]));
    }
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
    RETURN_IF_ERROR(CheckLogProbs(trajectory.behaviour_logprobs(), i));
    RETURN_IF_ERROR(CheckVersions(trajectory.token_policy_versions(), i));
    RETURN_IF_ERROR(CheckReward(trajectory.reward(), i, limits));
    if (tokens > 0) {
      const auto& versions = trajectory.token_policy_versions();
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
        Field(i, "token_policy_versions"), "[", t, "]: must not be ahead of policy version ",
        policy_version, " (the newest the trainer can have published), got ", versions[t]));
  }
  return absl::OkStatus();
}

}  // namespace sluice::replay_buffer
