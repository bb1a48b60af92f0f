#ifndef SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_
#define SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rollout_worker/rollout_run.h"
#include "sluice/v1/rollout_worker.grpc.pb.h"

namespace prometheus {
class Registry;
}

namespace sluice::rollout_worker {

struct RolloutMetrics;

// The gRPC edge of the rollout worker: StartRollouts starts a RolloutRun on
// its own thread with gRPC clients for the run's trainer, buffer, controller
// and reward server; StopRollouts stops it (drain or abort); the worker's
// Prometheus metrics. One run at a time in this release.
//
// The memory budget (--memory-budget): StartRollouts refuses a run whose
// worker estimate (run::EstimateRunMemory with the request's
// max_prompt_tokens) exceeds it with RESOURCE_EXHAUSTED naming the fields,
// the estimate and the budget, whoever asks; the run checks each batch it
// generates against it too (RolloutRunDeps::memory_budget_bytes).
class RolloutWorkerServiceImpl final : public v1::RolloutWorkerService::Service {
 public:
  // `memory_budget_bytes` <= 0: none (nothing is checked).
  RolloutWorkerServiceImpl(prometheus::Registry& registry, std::string worker_id,
                           int64_t memory_budget_bytes = 0);
  ~RolloutWorkerServiceImpl() override;

  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::Status StartRollouts(grpc::ServerContext* context, const v1::StartRolloutsRequest* request,
                             v1::StartRolloutsResponse* response) override;
  grpc::Status StopRollouts(grpc::ServerContext* context, const v1::StopRolloutsRequest* request,
                            v1::StopRolloutsResponse* response) override;
  grpc::Status GetWorkerStatus(grpc::ServerContext* context,
                               const v1::GetWorkerStatusRequest* request,
                               v1::GetWorkerStatusResponse* response) override;

 private:
  struct ActiveRun;
  v1::RolloutWorkerStatus CurrentStatus() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::RolloutWorkerStatus CurrentStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the run and blocks until its thread has returned; the status
  // shows it (draining) until then.
  void StopActiveRun(bool abort) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string worker_id_;
  const uint64_t incarnation_;
  const int64_t memory_budget_bytes_;
  const absl::Time started_at_;
  std::unique_ptr<RolloutMetrics> metrics_;
  mutable absl::Mutex mu_;
  std::shared_ptr<ActiveRun> run_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::rollout_worker

#endif  // SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_
