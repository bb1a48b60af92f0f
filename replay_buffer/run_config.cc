#include "replay_buffer/run_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/run/run_buffer.h"

namespace sluice::replay_buffer {

int32_t RunConfig::max_times_sampled() const {
  return buffer.max_times_sampled() > 0 ? buffer.max_times_sampled() : 1;
}

RunConfig RunConfigFromProto(const v1::ConfigureRunRequest& request) {
  RunConfig config;
  config.run_id = request.run_id();
  config.batch_size_groups = request.batch_size_groups();
  config.max_staleness = request.max_staleness();
  config.group_size = request.group_size();
  config.staleness_bound = request.staleness_bound();
  config.buffer = request.config();
  config.initial_policy_version = request.initial_policy_version();
  config.seed = request.seed();
  config.vocab_size = request.vocab_size();
  config.max_sequence_tokens = request.max_sequence_tokens();
  config.retained_step_batches = request.retained_step_batches();
  if (request.has_min_reward()) config.min_reward = request.min_reward();
  if (request.has_max_reward()) config.max_reward = request.max_reward();
  return config;
}

v1::ConfigureRunRequest RunConfigToProto(const RunConfig& config) {
  v1::ConfigureRunRequest request;
  request.set_run_id(config.run_id);
  request.set_batch_size_groups(config.batch_size_groups);
  request.set_max_staleness(config.max_staleness);
  request.set_group_size(config.group_size);
  request.set_staleness_bound(config.staleness_bound);
  *request.mutable_config() = config.buffer;
  request.set_initial_policy_version(config.initial_policy_version);
  request.set_seed(config.seed);
  request.set_vocab_size(config.vocab_size);
  request.set_max_sequence_tokens(config.max_sequence_tokens);
  request.set_retained_step_batches(config.retained_step_batches);
  if (config.min_reward.has_value()) request.set_min_reward(*config.min_reward);
  if (config.max_reward.has_value()) request.set_max_reward(*config.max_reward);
  return request;
}

absl::Status RunConfig::Validate() const {
  std::vector<std::string> problems;
  if (run_id.empty()) problems.push_back("run_id: required");
  if (batch_size_groups <= 0) {
    problems.push_back(absl::StrCat("batch_size_groups: must be > 0, got ", batch_size_groups));
  }
  if (max_staleness < 0) {
    problems.push_back(absl::StrCat("max_staleness: must be >= 0, got ", max_staleness));
  }
  if (group_size <= 0) {
    problems.push_back(absl::StrCat("group_size: must be > 0, got ", group_size));
  }
  if (!v1::StalenessBound_IsValid(staleness_bound)) {
    problems.push_back(
        absl::StrCat("staleness_bound: unknown value ", static_cast<int>(staleness_bound)));
  }
  if (initial_policy_version < 0) {
    problems.push_back(
        absl::StrCat("initial_policy_version: must be >= 0, got ", initial_policy_version));
  }
  if (vocab_size < 0) {
    problems.push_back(
        absl::StrCat("vocab_size: must be >= 0 (0 = ids unchecked), got ", vocab_size));
  }
  if (max_sequence_tokens < 0) {
    problems.push_back(
        absl::StrCat("max_sequence_tokens: must be >= 0 (0 = unknown), got ", max_sequence_tokens));
  }
  if (retained_step_batches < 0) {
    problems.push_back(
        absl::StrCat("retained_step_batches: must be >= 0, got ", retained_step_batches));
  }
  if (min_reward.has_value() && !std::isfinite(*min_reward)) {
    problems.push_back(absl::StrCat("min_reward: must be finite, got ", *min_reward));
  }
  if (max_reward.has_value() && !std::isfinite(*max_reward)) {
    problems.push_back(absl::StrCat("max_reward: must be finite, got ", *max_reward));
  }
  if (min_reward.has_value() && max_reward.has_value() && *min_reward > *max_reward) {
    problems.push_back(
        absl::StrCat("min_reward: must be <= max_reward, got ", *min_reward, " > ", *max_reward));
  }
  // The buffer section's rules, as the controller applied them at submit.
  run::ValidateBufferConfig(buffer, batch_size_groups, &problems);
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

}  // namespace sluice::replay_buffer
