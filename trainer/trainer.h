#ifndef SLUICE_TRAINER_TRAINER_H_
#define SLUICE_TRAINER_TRAINER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/clients/clients.h"
#include "sluice/v1/controller.pb.h"
#include "sluice/v1/trainer.pb.h"
#include "trainer/weight_publisher.h"
#include "trainer/weight_store.h"

namespace sluice::trainer {

struct TrainerRunDeps {
  clients::ReplayBufferClient* buffer = nullptr;
  clients::RewardClient* reward = nullptr;
  clients::ControllerClient* controller = nullptr;  // may be null (tests)
  // Where each published version goes (weight_publisher.h): the service's
  // WeightStore for the gRPC stream.
  WeightPublisher* publisher = nullptr;
  // Called after every RL step and evaluation (for the service's metrics).
  std::function<void(const v1::TrainingStepMetrics&)> on_step;
  std::function<void(const v1::EvalResult&)> on_eval;
  // Called with every version published (its delta encoded), before any
  // worker can fetch it.
  std::function<void(const PublishedVersion&)> on_published;
  // The trainer's --memory-budget in bytes; <= 0 = none. Each training
  // batch (an RL minibatch, a warm-start batch) is checked against what it
  // leaves after the weights, optimizer state and published versions
  // before it is padded and run forward: one that does not fit fails the
  // run with RESOURCE_EXHAUSTED naming its size and the fields to lower,
  // rather than allocating past the budget.
  int64_t memory_budget_bytes = 0;
  // This trainer process's incarnation (TrainerStatus.incarnation), put on
  // its reports to the controller with its resume and redone steps, so that
  // the run's record counts every incarnation that reported.
  uint64_t incarnation = 0;
};

// One run on the trainer, from model creation to the final evaluation (see
// docs/run-lifecycle.md, steps 3, 4, 6 and 7):
//
//   build model (seeded) -> warm start (SFT until the dev accuracy reaches the
//   target or the step cap) -> held-out eval "before" -> publish version 0 ->
//   for each step: Sample B groups (staleness <= eta) -> GRPO advantages ->
//   the objective (objective.h: decoupled PPO, GRPO or trajectory balance,
//   with the spec's corrections; docs/objectives.md) -> AdamW with gradient
//   clipping -> publish version v+1 -> tell the buffer -> report the step ->
//   ... -> held-out eval "after". A run that keeps a reference policy
//   freezes it when RL starts, after the warm start.
//
// Bad input is not a fault (step_guard.h): a sampled group the model cannot
// train on (a token id outside its vocabulary, a non-finite reward or
// log-prob) is left out of the batch and counted (groups_invalid); a step
// whose loss or gradient norm is not finite, or whose update leaves a
// non-finite weight (then rolled back to the last published weights), makes
// no update and is counted (update_skipped), and its version is published
// with the previous weights so that the admission gate moves on. A
// non-finite weight is never published.
//
// Everything it needs from other services comes through TrainerRunDeps, so
// the whole loop runs in tests against fakes. Run() blocks (the service runs
// it on its own thread); Stop() from any thread makes it return CANCELLED at
// the next step boundary or blocked sample. Status() is thread-safe.
class TrainerRun {
 public:
  TrainerRun(std::string run_id, v1::RunSpec spec, TrainerRunDeps deps);
  ~TrainerRun();

  // Returns OK when all steps and the final evaluation are done, CANCELLED
  // after Stop(), or the error that ended the run (already reported to the
  // controller as TRAINER_STATE_FAILED).
  absl::Status Run();
  // With `checkpoint`, Run() writes a checkpoint of the weights it has
  // before it returns (when spec.checkpoint.dir is set).
  void Stop(bool checkpoint = false);

  v1::TrainerStatus Status() const;
  const std::string& run_id() const { return run_id_; }

 private:
  class Impl;
  const std::string run_id_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAINER_H_
