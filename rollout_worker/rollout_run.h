#ifndef SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_H_
#define SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "services/clients/clients.h"
#include "sluice/v1/rollout_worker.pb.h"

namespace sluice::rollout_worker {

struct RolloutRunDeps {
  clients::TrainerClient* trainer = nullptr;
  clients::ReplayBufferClient* buffer = nullptr;
  clients::ControllerClient* controller = nullptr;
  clients::RewardClient* reward = nullptr;
  std::string worker_id;
  uint64_t incarnation = 0;
  // The worker's --memory-budget in bytes; <= 0 = none. Each leased batch
  // is generated in as few model::Generate calls as fit it
  // (generation_budget.h); a prompt whose one group does not fit ends the
  // run with RESOURCE_EXHAUSTED.
  int64_t memory_budget_bytes = 0;
  // Observers for the service's metrics (may be unset).
  std::function<void(int64_t tokens, double seconds)> on_batch_generated;
  std::function<void(int64_t groups)> on_groups_inserted;
  std::function<void(int64_t version, double seconds)> on_weights_loaded;
  // A received version was refused (non-finite values, shapes that do not
  // fit the model).
  std::function<void(int64_t version)> on_weights_refused;
  std::function<void(int64_t swaps)> on_mid_generation_swaps;
};

// One run on a rollout worker (docs/run-lifecycle.md, step 5). Two threads:
//
//  - the weight follower waits for each new version the trainer publishes
//    (WatchVersions), downloads it (StreamWeights), builds a fresh model with
//    it and makes it the latest policy. A version whose tensors hold a NaN or
//    an infinity, or do not fit the model, is refused (logged, counted in
//    weight_versions_refused): the worker keeps generating with the version
//    it has, and a wait for weights at least as new as a refused version is
//    over (generating with older weights only makes the groups staler,
//    which the buffer bounds);
//  - the generation loop acquires admission slots from the buffer, makes
//    sure it holds weights at least as new as the buffer's version, leases as
//    many prompts from the controller, samples G completions per prompt in
//    one batch (or, when the batch would not fit the memory budget, in as
//    few consecutive ones as do), has every completion scored by the reward
//    server (in calls within its batch limit), inserts the groups into the
//    buffer and reports progress to the controller.
//
// The decoder asks for the latest policy before every decoding step, so a
// version that arrives mid-batch is used from the next token on (the KV cache
// is kept; later tokens carry the new version) without draining the batch.
//
// Run() blocks until the controller says the run is done (OK), Stop() is
// called (OK; with abort the in-flight batch is cut short and its prompts
// abandoned), or an error ends it.
class RolloutRun {
 public:
  RolloutRun(std::string run_id, v1::RunSpec spec, RolloutRunDeps deps);
  ~RolloutRun();

  absl::Status Run();
  // Thread-safe; returns at once (Run() returns soon after).
  void Stop(bool abort);

  v1::RolloutRunStatus Status() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::rollout_worker

#endif  // SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_H_
