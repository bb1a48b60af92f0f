#ifndef SLUICE_REPLAY_BUFFER_GROUP_VALIDATION_H_
#define SLUICE_REPLAY_BUFFER_GROUP_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/common.pb.h"

// What a group must be for the buffer to store it. Any client can insert
// into a live run, and one poisoned group used to take the whole stack down:
// a NaN log-prob made the loss NaN, the trainer published NaN weights and
// the rollout workers died sampling from them; a token id outside the
// vocabulary failed the run in the embedding. The buffer is where every
// group enters, so it refuses such groups there (INSERT_STATUS_INVALID,
// with the field and index named) before anything of them is logged; the
// trainer and the workers keep their own guards behind it.
//
// A group is valid when:
//   - idempotency_key is set, run_id is the table's, it has group_size
//     trajectories;
//   - per trajectory i:
//       prompt_token_ids       not empty, every id in [0, vocab_size)
//       completion_token_ids   every id in [0, vocab_size); empty only when
//                              finish_reason is ABORTED (a cut-off completion
//                              the trainer leaves out of the loss)
//       behaviour_logprobs     one per completion token, each finite and
//                              <= kMaxBehaviourLogProb
//       token_policy_versions  one per completion token, each >= 0,
//                              non-decreasing
//       reward                 finite, and within [min_reward, max_reward]
//                              when the run sets them
//   - at least one completion token in the group (its policy version);
//   - (checked by the table, under its lock: CheckVersionsNotAhead) no token
//     version beyond the table's policy version + 1: a worker only has the
//     versions the trainer published, and the trainer tells the buffer of
//     each right after publishing it (so v + 1 may arrive first).
// vocab_size 0 means ids are only checked to be >= 0.
namespace sluice::replay_buffer {

// log_softmax in float32 is <= 0 mathematically but may round a hair above
// it for a token holding nearly all the mass: a little slack is allowed.
// Anything larger is no log-probability.
inline constexpr float kMaxBehaviourLogProb = 1e-5f;

// The run's facts a group is checked against (from ConfigureRun).
struct GroupLimits {
  std::string run_id;
  int32_t group_size = 0;
  int64_t vocab_size = 0;  // 0 = ids only checked to be >= 0
  std::optional<double> min_reward;
  std::optional<double> max_reward;
};

// The oldest and newest token policy version of a valid group.
struct GroupVersions {
  int64_t min_policy_version = 0;
  int64_t max_policy_version = 0;
};

// Checks everything above but the version bound. INVALID_ARGUMENT naming the
// first offending field and index, e.g.
// "trajectories[3].behaviour_logprobs[17]: must be finite and <= 0, got nan".
// O(tokens); pure (thread-safe).
absl::StatusOr<GroupVersions> ValidateGroup(const v1::Group& group, const GroupLimits& limits);

// INVALID_ARGUMENT naming the first completion token whose policy version is
// ahead of `policy_version`, the newest the trainer can have published; OK
// when none is. O(tokens) only when one is
// (versions are non-decreasing per trajectory, so the check looks at each
// trajectory's last token first).
absl::Status CheckVersionsNotAhead(const v1::Group& group, int64_t policy_version);

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_GROUP_VALIDATION_H_
