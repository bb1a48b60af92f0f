#ifndef SLUICE_REPLAY_BUFFER_TEST_UTIL_H_
#define SLUICE_REPLAY_BUFFER_TEST_UTIL_H_

// Test-only helpers shared by the replay buffer's tests.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sluice/v1/common.pb.h"

namespace sluice::replay_buffer::testing {

// A group of `group_size` trajectories of `tokens` completion tokens each,
// every token generated at `policy_version`; idempotency key
// "<run_id>/<group_id>".
inline v1::Group MakeGroup(const std::string& run_id, const std::string& group_id, int group_size,
                           int64_t policy_version, int tokens = 10,
                           const std::string& slot_lease_id = "") {
  v1::Group group;
  group.set_run_id(run_id);
  group.set_group_id(group_id);
  group.set_prompt_id(absl::StrCat("prompt-", group_id));
  group.set_idempotency_key(absl::StrCat(run_id, "/", group_id));
  group.set_slot_lease_id(slot_lease_id);
  for (int i = 0; i < group_size; ++i) {
    v1::Trajectory* trajectory = group.add_trajectories();
    trajectory->set_trajectory_id(absl::StrCat(group_id, "/", i));
    trajectory->set_group_id(group_id);
    trajectory->set_sample_index(i);
    for (int t = 0; t < tokens; ++t) {
      trajectory->add_prompt_token_ids(t);
      trajectory->add_completion_token_ids(100 + t);
      trajectory->add_behaviour_logprobs(-0.5f);
      trajectory->add_token_policy_versions(policy_version);
    }
    trajectory->set_reward(i % 2);
  }
  return group;
}

// A clock that moves only when told to; thread-safe.
class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration duration) {
    absl::MutexLock lock(&mu_);
    now_ += duration;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'800'000'000);
};

}  // namespace sluice::replay_buffer::testing

#endif  // SLUICE_REPLAY_BUFFER_TEST_UTIL_H_
