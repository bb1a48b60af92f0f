#ifndef SLUICE_REPLAY_BUFFER_RUN_CONFIG_H_
#define SLUICE_REPLAY_BUFFER_RUN_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace sluice::replay_buffer {

// What ConfigureRun fixes for one run (sluice.v1.ConfigureRunRequest).
struct RunConfig {
  std::string run_id;
  // B: groups per training batch; the admission limit is (eta + v + 1) * B.
  int32_t batch_size_groups = 0;
  // eta: maximum staleness in policy versions (0 = synchronous).
  int32_t max_staleness = 0;
  // G: trajectories per group; inserts with another count are INVALID.
  int32_t group_size = 0;
  // What eta bounds: with STALENESS_BOUND_TOKEN a group is stale when its
  // newest token is more than eta versions old, otherwise when its oldest
  // is. Fixed for the table's life, as B, eta and G are.
  v1::StalenessBound staleness_bound = v1::STALENESS_BOUND_UNSPECIFIED;
  // Sampler, max_times_sampled, capacity, min size to sample.
  v1::BufferConfig buffer;
  // Version the run starts from (> 0 when resuming from a checkpoint).
  int64_t initial_policy_version = 0;
  // Seed of the random samplers.
  uint64_t seed = 0;
  // What inserted groups are checked against (group_validation.h): the
  // model's vocabulary size (0 = ids only checked to be >= 0) and the
  // run's reward range (unset = unbounded on that side). Unlike B, eta and
  // G they may change on a reconfigure.
  int64_t vocab_size = 0;
  std::optional<double> min_reward;
  std::optional<double> max_reward;
  // The longest sequence (prompt + completion) of the run, in tokens; with
  // it ReplayBuffer::ConfigureRun checks a new table's memory estimate
  // against the buffer's budget. 0 = unknown (not checked then).
  int64_t max_sequence_tokens = 0;
  // The step batches the trainer keeps uncommitted at most
  // (run::RetainedStepBatches); counted by ConfigureRun's memory check only.
  int64_t retained_step_batches = 0;

  // Every problem, one per line, each naming its field:
  // "batch_size_groups: must be > 0, got -3".
  absl::Status Validate() const;

  // buffer.max_times_sampled with its default (1: each group trained once).
  int32_t max_times_sampled() const;
  // staleness_bound with its default (GROUP).
  v1::StalenessBound resolved_staleness_bound() const {
    return staleness_bound == v1::STALENESS_BOUND_TOKEN ? v1::STALENESS_BOUND_TOKEN
                                                        : v1::STALENESS_BOUND_GROUP;
  }
};

RunConfig RunConfigFromProto(const v1::ConfigureRunRequest& request);
v1::ConfigureRunRequest RunConfigToProto(const RunConfig& config);

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_RUN_CONFIG_H_
