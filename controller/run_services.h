#ifndef SLUICE_CONTROLLER_RUN_SERVICES_H_
#define SLUICE_CONTROLLER_RUN_SERVICES_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/run_record.h"
#include "controller/service_clients.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {

// The services one run uses, as its driver sets them up and releases them
// (docs/run-lifecycle.md, step 2 and the end of a run), through the
// controller's client interfaces (service_clients.h):
//
//   set up:    ConfigureBuffer (ConfigureRun)  ->  StartTraining  ->  OfferToWorkers
//   resume:    StartTraining again, to a trainer that restarted (ResumeTraining)
//   release:   WithdrawFromWorkers (the run finished)
//              Release: withdraw + StopTraining (it failed or was cancelled)
//
// Every request the services get for the run is built here from the run's
// spec, sizes and endpoints, so that a re-adopted run sends them exactly what
// the first controller did. The class decides nothing about the run: each
// call returns the service's answer, and RunDriver decides what a failure
// does to the run (and whether to retry, CallWhileAdopting). It remembers
// only what was started, so that Release stops no more than that.
//
// Calls block for at most the clients' deadlines. Thread-safe; the driver
// thread makes every call but ReleaseWorkerSlots and offered_to_workers,
// which the RPC handlers may reach too.
class RunServices {
 public:
  // `clients.trainer` and `clients.replay_buffer` must not be null (the
  // registry submits no run without them); no workers = none are offered.
  RunServices(std::string run_id, v1::RunSpec spec, RunSizes sizes, ServiceClients clients,
              v1::ServiceEndpoints endpoints);

  RunServices(const RunServices&) = delete;
  RunServices& operator=(const RunServices&) = delete;

  // The services' addresses, for messages ("" without the service).
  const std::string& trainer_address() const;
  const std::string& buffer_address() const;

  // Who still holds another run, for "waiting for the <...>" and the error
  // when it does not let go: "trainer (<address>) with run <id> (<STATE>)" or
  // "rollout worker <id> (<address>) with run <id>"; "" when nobody does. A
  // trainer that does not answer counts as free (StartTraining then names
  // the failure). Asks the trainer (GetStatus) and the worker registry.
  std::string OtherRunHolder() const;

  // What ConfigureRun carries: the spec's buffer config and algorithm, the
  // model's vocabulary size (when its config can be read), rewards in the
  // reward server's [0, 1], the sizes measured at submit.
  v1::ConfigureRunRequest ConfigureRunRequest() const;
  // Configures the replay buffer for the run; a repeat for a run the buffer
  // has (a re-adoption) is a no-op there. The buffer's error as it is.
  absl::Status ConfigureBuffer();
  // The buffer's statistics of the run (its start count and incarnation).
  absl::StatusOr<v1::GetStatsResponse> BufferStats();

  // What StartTraining carries: run id, spec, endpoints, max_prompt_tokens.
  const v1::StartTrainingRequest& start_training_request() const { return start_training_; }
  // Starts the trainer on the run. Counts as started even when it fails (a
  // failed call may have started it), so that Release stops it. A trainer
  // already training the run answers OK; one that restarted resumes it from
  // its checkpoint.
  absl::Status StartTraining();
  // The same request again, to a trainer that restarted (it resumes from
  // the run's latest checkpoint, or refuses when it cannot).
  absl::Status ResumeTraining();
  // A re-adopted run's trainer may be training it now: Release stops it.
  void MarkTrainerStarted() { trainer_started_ = true; }

  // Makes the run available to the registered workers, who pull it with
  // their next heartbeat (the controller calls none of them). Once; no-op
  // without a worker registry.
  void OfferToWorkers();
  bool offered_to_workers() const { return workers_offered_; }
  // Workers drop the run with their next heartbeat (and LeasePrompts says
  // run_done); the next run waits until they have. No-op unless offered.
  void WithdrawFromWorkers();
  // After a failure or cancellation: withdraws the run from the workers and
  // stops the trainer if it was started (checkpointing when the spec has a
  // checkpoint dir). A trainer that cannot be stopped is logged.
  void Release();
  // Gives back the generation slots a lost worker holds in the buffer.
  absl::Status ReleaseWorkerSlots(const std::string& worker_id);

 private:
  const std::string run_id_;
  const v1::RunSpec spec_;
  const RunSizes sizes_;
  const ServiceClients clients_;
  const v1::ServiceEndpoints endpoints_;
  const v1::StartTrainingRequest start_training_;
  std::atomic<bool> trainer_started_{false};
  std::atomic<bool> workers_offered_{false};
};

// What a run's error says of a failed call: "trainer (127.0.0.1:5) is
// unreachable: ..." for transport failures, else "trainer (127.0.0.1:5)
// refused StartTraining: CODE: ...".
std::string CallFailure(absl::string_view service, absl::string_view address,
                        absl::string_view method, const absl::Status& status);

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_SERVICES_H_
