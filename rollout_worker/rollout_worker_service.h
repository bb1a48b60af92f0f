#ifndef SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_
#define SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/path_policy.h"
#include "rollout_worker/controller_link.h"
#include "rollout_worker/rollout_run.h"
#include "services/weights/version_stream.h"
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
//
// It is also the LinkedWorker of its ControllerLink (controller_link.h): the
// runs the controller assigns start and stop through the same code as
// StartRollouts / StopRollouts. A start that is refused shows in the status
// (FAILED, last_error) with the run, so that the controller sees why.
class RolloutWorkerServiceImpl final : public v1::RolloutWorkerService::Service,
                                       public LinkedWorker {
 public:
  // `memory_budget_bytes` <= 0: none (nothing is checked). `allowed_paths`
  // (--allowed-path-roots): a run whose spec names a path outside them is
  // refused (INVALID_ARGUMENT) before the worker opens anything, whoever
  // asks (run::ConfineRunSpecPaths); the binary always sets it.
  RolloutWorkerServiceImpl(prometheus::Registry& registry, std::string worker_id,
                           int64_t memory_budget_bytes = 0,
                           PathPolicy allowed_paths = PathPolicy::Unrestricted());
  ~RolloutWorkerServiceImpl() override;

  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::Status StartRollouts(grpc::ServerContext* context, const v1::StartRolloutsRequest* request,
                             v1::StartRolloutsResponse* response) override;
  grpc::Status StopRollouts(grpc::ServerContext* context, const v1::StopRolloutsRequest* request,
                            v1::StopRolloutsResponse* response) override;
  grpc::Status GetWorkerStatus(grpc::ServerContext* context,
                               const v1::GetWorkerStatusRequest* request,
                               v1::GetWorkerStatusResponse* response) override;

  // LinkedWorker.
  v1::RolloutWorkerStatus Status() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StartRun(const v1::RolloutAssignment& assignment) override ABSL_LOCKS_EXCLUDED(mu_);
  void StopRun(const std::string& run_id) override ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& worker_id() const { return worker_id_; }
  uint64_t incarnation() const { return incarnation_; }

  // Runs started from now on relay the weight versions they receive through
  // `cache` (served by this worker's WeightRelay service at
  // `relay_address`, host:port as other workers reach it).
  void EnableWeightRelay(std::shared_ptr<weights::RelayCache> cache, std::string relay_address)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct ActiveRun;
  // StartRollouts and StartRun: checks the request, then starts the run on
  // its own thread. The status code is what StartRollouts answers.
  absl::Status Start(const std::string& run_id, const v1::RunSpec& spec,
                     const v1::ServiceEndpoints& endpoints, int64_t max_prompt_tokens)
      ABSL_LOCKS_EXCLUDED(mu_);
  v1::RolloutWorkerStatus CurrentStatus() const ABSL_LOCKS_EXCLUDED(mu_);
  v1::RolloutWorkerStatus CurrentStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the run and blocks until its thread has returned; the status
  // shows it (draining) until then.
  void StopActiveRun(bool abort) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string worker_id_;
  const uint64_t incarnation_;
  const int64_t memory_budget_bytes_;
  const PathPolicy allowed_paths_;
  const absl::Time started_at_;
  std::unique_ptr<RolloutMetrics> metrics_;
  mutable absl::Mutex mu_;
  std::shared_ptr<ActiveRun> run_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // The last assigned run this worker refused to start, and why; shown in the
  // status until another run starts.
  std::string refused_run_id_ ABSL_GUARDED_BY(mu_);
  std::string refused_error_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<weights::RelayCache> relay_cache_ ABSL_GUARDED_BY(mu_);
  std::string relay_address_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::rollout_worker

#endif  // SLUICE_ROLLOUT_WORKER_ROLLOUT_WORKER_SERVICE_H_
