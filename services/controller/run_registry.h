#ifndef SLUICE_SERVICES_CONTROLLER_RUN_REGISTRY_H_
#define SLUICE_SERVICES_CONTROLLER_RUN_REGISTRY_H_

#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/controller/run_driver.h"
#include "services/controller/service_clients.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {

struct RunRegistryOptions {
  // Run files go to <runs_dir>/<run-id>/.
  std::string runs_dir = "sluice-runs";
  RunDriverOptions driver;
};

// The controller's core: every run by id, in memory for the life of the
// process (each with its RunDriver and thread), and the operations of
// ControllerService on them with protos as plain data. The gRPC edge
// (controller_service.h) only converts statuses.
//
// One run is active at a time (the services serve one run each): a run
// submitted while another is active is QUEUED, and runs start in
// submission order, each once the one before has stopped its services.
//
// Thread-safe. Operations on one run serialize on that run's lock; the
// registry lock is held only to find, add or list runs.
class RunRegistry {
 public:
  // `clients`: the services runs are driven with (null ones make SubmitRun
  // fail with FAILED_PRECONDITION naming the missing flag). `observer` may
  // be null; it must outlive the registry.
  RunRegistry(RunRegistryOptions options, ServiceClients clients, RunObserver* observer = nullptr);
  // Shutdown().
  ~RunRegistry();

  RunRegistry(const RunRegistry&) = delete;
  RunRegistry& operator=(const RunRegistry&) = delete;

  // The address the other services reach this controller at; passed to them
  // in ServiceEndpoints. Set once the server has bound its port.
  void SetControllerAddress(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  // Resolves defaults, validates (INVALID_ARGUMENT naming each bad field),
  // checks the verifier names against the reward server's and the memory
  // estimate against the budgets the services report, then unless
  // validate_only creates the run: id, directory with spec.json, and a
  // driver that starts now or, behind an active run, is QUEUED. A repeated
  // non-empty request_id returns the existing run. FAILED_PRECONDITION when
  // a service the run needs was not configured; UNAVAILABLE when the reward
  // server cannot be asked for its verifiers.
  absl::StatusOr<v1::Run> Submit(const v1::SubmitRunRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // NOT_FOUND for an unknown id.
  absl::StatusOr<v1::Run> Get(const std::string& run_id) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::Run> Cancel(const std::string& run_id, const std::string& reason)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Newest first; INVALID_ARGUMENT for a page token this registry did not hand out.
  absl::StatusOr<v1::ListRunsResponse> List(const v1::ListRunsRequest& request) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // The driver of a run (for WatchRun), or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<RunDriver>> Find(const std::string& run_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Worker and trainer calls. An unknown run answers run_done / stop = true
  // (the controller may have restarted and forgotten it); bad arguments are
  // INVALID_ARGUMENT.
  absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(const v1::LeasePromptsRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // A rollout worker's heartbeat: registers it and answers with its runs.
  // INVALID_ARGUMENT without worker_id / incarnation; UNAVAILABLE when the
  // controller was built without a worker registry.
  absl::StatusOr<v1::WorkerHeartbeatResponse> WorkerHeartbeat(
      const v1::WorkerHeartbeatRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  v1::ListWorkersResponse ListWorkers() ABSL_LOCKS_EXCLUDED(mu_);
  // A supervisor gave up on a service: the active run decides (see
  // RunDriver::OnServiceFailure). INVALID_ARGUMENT for an unknown service.
  absl::StatusOr<v1::ReportServiceFailureResponse> ReportServiceFailure(
      const v1::ReportServiceFailureRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Fails every active run ("the controller shut down ..."), which wakes
  // their watchers, and joins the driver threads after they have stopped
  // their services. Later Submit calls fail with UNAVAILABLE. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  // The first half of Shutdown, for the server's shutdown callback: fails
  // the active runs and refuses new ones, without waiting for any thread.
  void BeginShutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status CheckServicesConfigured(const v1::RunSpec& spec) const;
  // The reward server's verifier names and the services' memory budgets.
  // Returns the run's sizes as the memory estimate measured them (the
  // longest prompt and sequence), for the driver to pass on; zeros
  // (unknown) when no estimate could be made and no service reports a
  // budget to check it against.
  absl::StatusOr<RunSizes> CheckAgainstServices(const v1::RunSpec& spec) const;
  std::string NewRunIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next queued run when none is active; renumbers the queue.
  void DispatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RenumberQueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A driver's thread ended: the services are free for the next run.
  void OnRunStopped() ABSL_LOCKS_EXCLUDED(mu_);

  const RunRegistryOptions options_;
  const ServiceClients clients_;
  RunObserver* const observer_;

  mutable absl::Mutex mu_;
  std::string controller_address_ ABSL_GUARDED_BY(mu_);
  // Runs in order of creation (oldest first) and by id.
  std::vector<std::shared_ptr<RunDriver>> runs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<RunDriver>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> by_request_id_ ABSL_GUARDED_BY(mu_);
  // The run that holds the services (possibly stopped), and those waiting.
  std::shared_ptr<RunDriver> active_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<RunDriver>> queue_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 random_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::controller

#endif  // SLUICE_SERVICES_CONTROLLER_RUN_REGISTRY_H_
