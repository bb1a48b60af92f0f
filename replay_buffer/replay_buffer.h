#ifndef SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_H_
#define SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "replay_buffer/run_table.h"
#include "sluice/v1/common.pb.h"

namespace sluice::replay_buffer {

// The replay buffer's core: one RunTable per run, found by run_id. Knows
// nothing of gRPC; the service (replay_buffer_service.h) is a thin edge over
// it.
//
// Tables are shared_ptrs so that a call keeps its table alive without holding
// the buffer's lock, and a blocked Sample on one run never delays another run.
//
// Thread-safe.
class ReplayBuffer {
 public:
  // `options` applies to every table; INVALID_ARGUMENT from Create when it
  // does not validate.
  static absl::StatusOr<std::unique_ptr<ReplayBuffer>> Create(RunTableOptions options = {});

  struct ConfigureResult {
    bool created = false;
    RunStats stats;
  };

  // Creates the run's table (created = true) or re-applies the configuration
  // to an existing one: the same configuration is a no-op, a different B,
  // eta or G is FAILED_PRECONDITION, a different buffer config replaces the
  // old (stored groups are kept). INVALID_ARGUMENT naming every bad field.
  // UNAVAILABLE after Shutdown.
  absl::StatusOr<ConfigureResult> ConfigureRun(const RunConfig& config) ABSL_LOCKS_EXCLUDED(mu_);

  // The run's table; NOT_FOUND naming the run when it was never configured.
  absl::StatusOr<std::shared_ptr<RunTable>> GetRun(absl::string_view run_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Inserts each group into its run's table (Group.run_id); one result per
  // group, in order. A group for an unconfigured run is UNKNOWN_RUN. Never
  // blocks.
  std::vector<InsertResult> Insert(std::vector<v1::Group> groups) ABSL_LOCKS_EXCLUDED(mu_);

  // Shuts every table down (see RunTable::Shutdown), and the tables that
  // ConfigureRun would create later refuse to start. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit ReplayBuffer(RunTableOptions options) : options_(std::move(options)) {}

  const RunTableOptions options_;
  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::shared_ptr<RunTable>> runs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_H_
