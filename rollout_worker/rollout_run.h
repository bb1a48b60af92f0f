#ifndef SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_H_
#define SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/clients/clients.h"
#include "services/weights/relay_fetcher.h"
#include "services/clients/retrier.h"
#include "sluice/v1/rollout_worker.pb.h"

namespace sluice::rollout_worker {

// One weight download, for the service's metrics.
struct WeightTransfer {
  std::string transport;  // "grpc" or "grpc_delta"
  int64_t version = -1;
  int64_t wire_bytes = 0;
  int64_t full_bytes = 0;
  double seconds = 0;
};

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
  // What each download moved: transport "grpc" (a full version, from the
  // trainer or a relay) or "grpc_delta" (a sparse delta from the trainer),
  // bytes on the wire, what the version takes in full, and seconds.
  std::function<void(const WeightTransfer&)> on_weights_transferred;
  // A delta download failed and the full version was fetched instead:
  // "data_loss" (it did not apply or verify) or "unavailable" (the stream
  // failed). A trainer that had no delta to send is not counted.
  std::function<void(const std::string& reason)> on_weight_delta_fallback;
  // A received version was refused (non-finite values, shapes that do not
  // fit the model).
  std::function<void(int64_t version)> on_weights_refused;
  std::function<void(int64_t swaps)> on_mid_generation_swaps;
  // Groups the buffer refused as late (see RolloutRun).
  std::function<void(int64_t groups)> on_late_groups_refused;
  // Shared with the clients' retries (retrying_clients.h); Stop() cancels
  // it, so that a stopping run does not sit in the backoff of a service that
  // is away. May be null.
  std::shared_ptr<clients::RetryCancellation> retry_cancellation;
  // How long inserts keep trying to reach the buffer before the run fails:
  // the clients' RetryOptions::deadline.
  absl::Duration retry_deadline = clients::RetryOptions().deadline;
  // Downloads versions through the trainer's fan-out tree, relaying them to
  // other workers (services/weights). Null: FetchWeights straight from the
  // trainer, as with a trainer that has no GetWeightSource.
  std::shared_ptr<weights::RelayFetcher> weight_fetcher;
};

// One run on a rollout worker (docs/run-lifecycle.md, step 5). Three threads:
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
//    many prompts from the controller and keeps the engine's rows busy with
//    their G samples each (continuous batching: leasing more as groups
//    finish), handing each batch of done groups to the finisher;
//  - the finisher has every completion of a batch scored by the reward
//    server (in calls within its batch limit), inserts the groups into the
//    buffer and reports progress to the controller, in the order the
//    batches were handed over, while the loop decodes on (those round trips
//    would leave the rows idle). At most two batches wait for it; its first
//    error ends the run.
//
// RolloutRunStatus says where the loop's time went (decode_seconds,
// idle_seconds) and the finisher's (finish_seconds).
//
// The decoder asks for the latest policy before every decoding step, so a
// version that arrives mid-batch is used from the next token on (the KV cache
// is kept; later tokens carry the new version) without draining the batch.
//
// Services restarting. The clients are expected to retry (the worker wraps
// them in retrying_clients.h): a reward server, buffer or controller that is
// away for less than the retry deadline only delays the loop. A client error
// marked IsRetriesExhausted (its service away for the whole deadline) ends
// the run with that error, which names the service and how long it was away,
// after giving the batch's slots and prompts back; other errors of the
// admission and lease calls are logged and the loop goes on.
//
// Exactly one group per prompt. A group's idempotency key is
// "<run_id>/<prompt_id>" (prompt ids are unique within a run, epochs
// included): a prompt handed out again after its lease expired, and then
// also finished late by its first worker (or an older incarnation of this
// one), is stored once, the buffer answering DUPLICATE to the second group.
// group_id stays unique per generation ("<prompt_id>@<worker>.<incarnation>.
// <batch>") and names the trajectories. The buffer's answers:
//
//   STORED                     stored; the prompt is reported completed.
//   DUPLICATE, on the group's  our own group, stored by an earlier send whose
//   second or later send       ack was lost: as STORED.
//   DUPLICATE, on its first    another generation of the prompt got in first:
//   send                       a late group refused (late_groups_refused,
//                              groups_dropped); the prompt is completed (it
//                              is in the buffer).
//   REJECTED_STALE             staler than eta: a late group refused; the
//                              prompt is abandoned, so that the controller
//                              hands it out again (completing it would skip
//                              it silently).
//   INVALID, UNKNOWN_RUN       refused (groups_dropped); the prompt abandoned.
//   no answer (deadline)       unconfirmed: abandoned, its slot released; a
//                              regeneration of the prompt is stored only if
//                              this one was not (same key).
//
// (A DUPLICATE on a later send cannot tell our lost ack from another
// generation that got in between; it is counted as ours, so a rare race
// counts one group stored that was refused. Nothing is stored twice.)
//
// Run() blocks until the controller says the run is done (OK), Stop() is
// called (OK; with abort the in-flight batch is cut short and its prompts
// abandoned), or an error ends it.
class RolloutRun {
 public:
  RolloutRun(std::string run_id, v1::RunSpec spec, RolloutRunDeps deps);
  ~RolloutRun();

  absl::Status Run();
  // Thread-safe; returns at once (Run() returns soon after). Cancels
  // deps.retry_cancellation: a call waiting to retry returns at once.
  void Stop(bool abort);

  v1::RolloutRunStatus Status() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::rollout_worker

#endif  // SLUICE_ROLLOUT_WORKER_ROLLOUT_RUN_H_
