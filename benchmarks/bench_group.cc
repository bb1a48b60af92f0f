#include "benchmarks/bench_group.h"

#include <algorithm>
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"

namespace sluice::bench {
namespace {

// Token ids in [2^14, 2^21) encode as 3-byte varints; 151936 is Qwen's vocab.
constexpr int32_t kMinTokenId = 1 << 14;
constexpr int32_t kMaxTokenId = 151935;

}  // namespace

v1::Group MakeBenchGroupWithTokens(const std::string& run_id, const std::string& group_id,
                                   int group_size, int completion_tokens, int64_t policy_version,
                                   uint64_t seed) {
  std::mt19937_64 random(seed);
  std::uniform_int_distribution<int32_t> token(kMinTokenId, kMaxTokenId);
  std::uniform_real_distribution<float> logprob(-8.0f, -0.01f);
  const int prompt_tokens = std::max(1, completion_tokens / 4);
  const std::string prompt_id = absl::StrCat("prompt-", group_id);

  v1::Group group;
  group.set_run_id(run_id);
  group.set_prompt_id(prompt_id);
  std::vector<int32_t> prompt(static_cast<size_t>(prompt_tokens));
  for (int32_t& id : prompt) id = token(random);
  for (int i = 0; i < group_size; ++i) {
    v1::Trajectory* trajectory = group.add_trajectories();
    trajectory->set_prompt_id(prompt_id);
    trajectory->set_sample_index(i);
    trajectory->mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    trajectory->mutable_completion_token_ids()->Reserve(completion_tokens);
    trajectory->mutable_behaviour_logprobs()->Reserve(completion_tokens);
    trajectory->mutable_token_policy_versions()->Reserve(completion_tokens);
    for (int t = 0; t < completion_tokens; ++t) {
      trajectory->add_completion_token_ids(token(random));
      trajectory->add_behaviour_logprobs(logprob(random));
      trajectory->add_token_policy_versions(policy_version);
    }
    trajectory->set_finish_reason(v1::FINISH_REASON_STOP);
    const double reward = (i % 2 == 0) ? 1.0 : 0.0;
    trajectory->set_reward(reward);
    v1::VerifierResult* verifier = trajectory->mutable_verifier();
    verifier->set_reward(reward);
    verifier->set_error_kind(v1::VERIFIER_ERROR_NONE);
    verifier->set_verifier_name("math");
    trajectory->set_rollout_worker_id("bench-worker");
    trajectory->set_worker_incarnation(1);
  }
  RenameGroup(group_id, &group);
  return group;
}

v1::Group MakeBenchGroup(const std::string& run_id, const std::string& group_id, int group_size,
                         int64_t target_bytes, int64_t policy_version, uint64_t seed) {
  auto size_at = [&](int tokens) {
    return static_cast<int64_t>(
        MakeBenchGroupWithTokens(run_id, group_id, group_size, tokens, policy_version, seed)
            .ByteSizeLong());
  };
  // Size is linear in the length but for varint length prefixes; fit a line
  // through two points, then step to the closest length.
  constexpr int kProbe = 1024;
  const int64_t at_one = size_at(1);
  const double per_token = static_cast<double>(size_at(kProbe + 1) - at_one) / kProbe;
  int tokens =
      std::max(1, 1 + static_cast<int>(static_cast<double>(target_bytes - at_one) / per_token));
  int best = tokens;
  int64_t best_error = std::llabs(size_at(tokens) - target_bytes);
  for (int candidate = std::max(1, tokens - 3); candidate <= tokens + 3; ++candidate) {
    const int64_t error = std::llabs(size_at(candidate) - target_bytes);
    if (error < best_error) {
      best = candidate;
      best_error = error;
    }
  }
  return MakeBenchGroupWithTokens(run_id, group_id, group_size, best, policy_version, seed);
}

void RenameGroup(const std::string& group_id, v1::Group* group) {
  group->set_group_id(group_id);
  group->set_idempotency_key(absl::StrCat(group->run_id(), "/", group_id));
  for (v1::Trajectory& trajectory : *group->mutable_trajectories()) {
    trajectory.set_group_id(group_id);
    trajectory.set_trajectory_id(absl::StrCat(group_id, "/", trajectory.sample_index()));
  }
}

}  // namespace sluice::bench
