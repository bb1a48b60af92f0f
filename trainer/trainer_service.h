#ifndef SLUICE_TRAINER_TRAINER_SERVICE_H_
#define SLUICE_TRAINER_TRAINER_SERVICE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/path_policy.h"
#include "sluice/v1/trainer.grpc.pb.h"
#include "services/clients/clients.h"
#include "services/weights/relay_tree.h"
#include "trainer/trainer.h"
#include "trainer/weight_store.h"

namespace prometheus {
class Registry;
}

namespace sluice::trainer {

class TrainerMetrics;

// The gRPC edge of the trainer: one run at a time (StartTraining starts a
// TrainerRun on its own thread with gRPC clients for the run's buffer, reward
// server and controller), the weight store behind GetLatestVersion /
// WatchVersions / StreamWeights, and the trainer's Prometheus metrics.
//
// The memory budget (--memory-budget): StartTraining refuses a run whose
// trainer estimate (run::EstimateRunMemory with the request's
// max_prompt_tokens) exceeds it with RESOURCE_EXHAUSTED naming the fields,
// the estimate and the budget, whoever asks; the run checks each training
// batch against it too (TrainerRunDeps::memory_budget_bytes).
//
// Restarts (checkpoint.h, docs/run-lifecycle.md): StartTraining for the run
// the trainer is already training returns its status and restarts nothing.
// For a run the trainer does not hold (a new one, or one whose trainer was
// killed and restarted), the run resumes from its newest checkpoint; when
// the replay buffer says the run already trained past version 0 and no
// checkpoint can continue it, StartTraining is FAILED_PRECONDITION naming
// the run, the buffer's version and checkpoint.dir. Every status carries
// this process's incarnation (its start time in ns).
class TrainerServiceImpl final : public v1::TrainerService::Service {
 public:
  // `memory_budget_bytes` <= 0: none (nothing is checked). `allowed_paths`
  // (--allowed-path-roots): StartTraining refuses a spec naming a path
  // outside them with INVALID_ARGUMENT before it opens anything, whoever
  // asks (run::ConfineRunSpecPaths); the binary always sets it.
  explicit TrainerServiceImpl(prometheus::Registry& registry, int64_t memory_budget_bytes = 0,
                              weights::RelayTreeOptions relay = {},
                              PathPolicy allowed_paths = PathPolicy::Unrestricted());
  ~TrainerServiceImpl() override;

  // Stops the current run and wakes streams (server shutdown).
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::Status StartTraining(grpc::ServerContext* context, const v1::StartTrainingRequest* request,
                             v1::StartTrainingResponse* response) override;
  grpc::Status StopTraining(grpc::ServerContext* context, const v1::StopTrainingRequest* request,
                            v1::StopTrainingResponse* response) override;
  grpc::Status GetLatestVersion(grpc::ServerContext* context,
                                const v1::GetLatestVersionRequest* request,
                                v1::GetLatestVersionResponse* response) override;
  grpc::Status WatchVersions(grpc::ServerContext* context, const v1::WatchVersionsRequest* request,
                             grpc::ServerWriter<v1::VersionAnnouncement>* writer) override;
  grpc::Status StreamWeights(grpc::ServerContext* context, const v1::StreamWeightsRequest* request,
                             grpc::ServerWriter<v1::WeightsChunk>* writer) override;
  grpc::Status GetTrainerStatus(grpc::ServerContext* context,
                                const v1::GetTrainerStatusRequest* request,
                                v1::GetTrainerStatusResponse* response) override;
  grpc::Status GetWeightSource(grpc::ServerContext* context,
                               const v1::GetWeightSourceRequest* request,
                               v1::GetWeightSourceResponse* response) override;

  // The versions this trainer serves. For benchmarks and tests that publish
  // without training (bench_weight_fanout).
  WeightStore& weight_store() { return weights_; }

 private:
  struct ActiveRun;
  // Stops and joins the run; with `checkpoint` it writes one first.
  void StopActiveRun(bool checkpoint) ABSL_LOCKS_EXCLUDED(mu_);
  v1::TrainerStatus CurrentStatus() const ABSL_LOCKS_EXCLUDED(mu_);
  // PlanResume's refusal for `run_id`, from the checkpoints in its
  // checkpoint.dir and the buffer's stats; OK when the buffer cannot be
  // asked (the run checks again).
  static absl::Status CheckResumable(const std::string& run_id, const v1::RunSpec& spec,
                                     clients::ReplayBufferClient& buffer);

  const int64_t memory_budget_bytes_;
  const PathPolicy allowed_paths_;
  const uint64_t incarnation_;
  WeightStore weights_;
  // Who streams each version to whom (GetWeightSource).
  weights::RelayTree relay_tree_;
  std::unique_ptr<TrainerMetrics> metrics_;
  mutable absl::Mutex mu_;
  std::shared_ptr<ActiveRun> run_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAINER_SERVICE_H_
