#ifndef SLUICE_CONTROLLER_RUN_REGISTRY_H_
#define SLUICE_CONTROLLER_RUN_REGISTRY_H_

#include <deque>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/path_policy.h"
#include "controller/run_driver.h"
#include "controller/service_clients.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {

struct RunRegistryOptions {
  // Run files go to <runs_dir>/<run-id>/; Restore() reads them back.
  std::string runs_dir = "sluice-runs";
  // Where the paths a submitted spec names may lie (--allowed-path-roots):
  // SubmitRun refuses others with INVALID_ARGUMENT before it reads any
  // file of the spec (run::ConfineRunSpecPaths), and stores relative ones
  // resolved. The binary always sets it; unrestricted only for tests.
  PathPolicy allowed_paths = PathPolicy::Unrestricted();
  // Most runs waiting in the queue (--max-queued-runs); one more is refused
  // with RESOURCE_EXHAUSTED saying so. A queued run costs its record (the
  // spec and a few figures, O(spec)) in memory and on disk.
  int max_queued_runs = 1000;
  // Rollout workers this deployment started itself (--trusted-worker-ids):
  // a submitted spec that names no trusted workers gets these
  // (run::ResolveRolloutVerificationDefaults), so their groups are verified
  // at the sampled trusted_fraction.
  std::vector<std::string> trusted_worker_ids;
  RunDriverOptions driver;
};

// What RunRegistry::Restore found in the runs directory.
struct RunRegistryRestore {
  int terminal = 0;    // Ended runs, listed as they ended.
  int queued = 0;      // Back in the queue, in submission order.
  int adopted = 0;     // The active run re-adopted (0 or 1).
  int failed = 0;       // Active runs failed at restore: more than one was active.
  int not_resumed = 0;  // Left as recorded: this controller lacks their services.
  int unreadable = 0;   // Run directories whose record could not be read.
};

// The controller's core: every run by id (each with its RunDriver and
// thread), and the operations of ControllerService on them with protos as
// plain data. The gRPC edge (controller_service.h) only converts statuses.
//
// One run is active at a time (the services serve one run each): a run
// submitted while another is active is QUEUED, and runs start in
// submission order, each once the one before has stopped its services.
//
// The runs directory is the record (run_record.h): a controller started on
// the runs directory of one that stopped or died calls Restore() and goes
// on where it left off: ended runs are listed as before, queued runs queue
// again in order, and the active run is re-adopted (RunDriver::Adopt). A
// controller stop (Shutdown, SIGTERM) therefore ends no run: only CancelRun
// or a failure does.
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

  // Loads every run of options.runs_dir (a fresh directory has none) and
  // re-adopts the active one; call once, before the first Submit and
  // before the server answers (a trainer's report about a run not yet
  // loaded would be told to stop), after SetControllerAddress (the adopted
  // run's services are given the endpoints again).
  //   - terminal runs: listed (ListRuns, GetRun) as they ended; their files
  //     are not written again;
  //   - QUEUED runs: queued again in submission order;
  //   - the active run (PENDING to EVALUATING; at most one): re-adopted.
  //     Should a directory hold more than one, the oldest is adopted and
  //     the others fail ("... active alongside ...");
  //   - a run whose record cannot be read (spec.json or state.json missing
  //     or corrupt): logged as an error and listed as FAILED with the
  //     reason ("cannot restore the run after a controller restart: ..."),
  //     its files left untouched for inspection. It never stops the others
  //     from being restored or the controller from starting;
  //   - a queued or active run that needs a service this controller was
  //     started without is not resumed: logged as an error naming the flag,
  //     listed as recorded (reports about it are still taken), and left for
  //     a controller started with the flag. It neither fails nor queues.
  // FAILED_PRECONDITION when called twice or after a Submit; an error only
  // when the runs directory itself cannot be listed.
  absl::StatusOr<RunRegistryRestore> Restore() ABSL_LOCKS_EXCLUDED(mu_);

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

  // Controller stop (SIGTERM): ends no run. Every run is left in its state
  // for the next controller on the same runs directory to restore (records
  // and prompt feed journals flushed and synced; the active run's trainer
  // and workers go on), watchers are woken (WatchRun then ends UNAVAILABLE
  // and `sluice runs watch` reconnects), and the driver threads are joined,
  // which stop no service. Later Submit calls fail with UNAVAILABLE.
  // Idempotent. A Kubernetes rollout of the controller pod thus costs the
  // run a few seconds, as a kill -9 would, and never the run itself.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);
  // The first half of Shutdown, for the server's shutdown callback: wakes
  // the watchers and refuses new runs, without waiting for any thread.
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
  v1::ServiceEndpoints EndpointsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Creates the driver of `record` and indexes it (runs_, by_id_,
  // by_request_id_).
  std::shared_ptr<RunDriver> AddDriverLocked(RunRecord record, RunFiles files)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  // RunRecord.sequence of the next run submitted.
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  bool restored_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_REGISTRY_H_
