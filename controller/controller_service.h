#ifndef SLUICE_CONTROLLER_CONTROLLER_SERVICE_H_
#define SLUICE_CONTROLLER_CONTROLLER_SERVICE_H_

#include <atomic>

#include "absl/time/time.h"
#include "controller/run_registry.h"
#include "sluice/v1/controller.grpc.pb.h"

namespace sluice::controller {

// The gRPC edge of the controller (sluice.v1.ControllerService): hands each
// call to the RunRegistry and maps absl::Status to grpc::Status. The only
// logic of its own is WatchRun's streaming loop:
//
// WatchRun sends the current snapshot at once (sequence 0), then a snapshot
// whenever the state changes (promptly) or progress changes (at most every
// min_interval_ms, default 1000), and ends with OK right after the snapshot
// that shows a terminal state. It ends with CANCELLED when the client goes
// away and UNAVAILABLE when the controller shuts down under a run that is
// still active (normally Shutdown fails such runs first, so watchers get
// the FAILED snapshot instead).
//
// Thread-safe.
class ControllerServiceImpl final : public v1::ControllerService::Service {
 public:
  // `registry` must outlive the service. WatchRun notices a client that went
  // away within `watch_poll_interval`.
  explicit ControllerServiceImpl(RunRegistry* registry,
                                 absl::Duration watch_poll_interval = absl::Milliseconds(200));

  // Server shutdown begins: watchers get their run's last snapshot and end
  // UNAVAILABLE (the runs stay active for the next controller to re-adopt:
  // RunRegistry::Shutdown), and new submissions are refused. Does not block
  // on the runs' threads.
  void BeginShutdown();

  grpc::Status SubmitRun(grpc::ServerContext* context, const v1::SubmitRunRequest* request,
                         v1::SubmitRunResponse* response) override;
  grpc::Status GetRun(grpc::ServerContext* context, const v1::GetRunRequest* request,
                      v1::GetRunResponse* response) override;
  grpc::Status WatchRun(grpc::ServerContext* context, const v1::WatchRunRequest* request,
                        grpc::ServerWriter<v1::RunUpdate>* writer) override;
  grpc::Status CancelRun(grpc::ServerContext* context, const v1::CancelRunRequest* request,
                         v1::CancelRunResponse* response) override;
  grpc::Status ListRuns(grpc::ServerContext* context, const v1::ListRunsRequest* request,
                        v1::ListRunsResponse* response) override;
  grpc::Status LeasePrompts(grpc::ServerContext* context, const v1::LeasePromptsRequest* request,
                            v1::LeasePromptsResponse* response) override;
  grpc::Status ReportRolloutProgress(grpc::ServerContext* context,
                                     const v1::ReportRolloutProgressRequest* request,
                                     v1::ReportRolloutProgressResponse* response) override;
  grpc::Status ReportTrainerProgress(grpc::ServerContext* context,
                                     const v1::ReportTrainerProgressRequest* request,
                                     v1::ReportTrainerProgressResponse* response) override;
  grpc::Status WorkerHeartbeat(grpc::ServerContext* context,
                               const v1::WorkerHeartbeatRequest* request,
                               v1::WorkerHeartbeatResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status ReportServiceFailure(grpc::ServerContext* context,
                                    const v1::ReportServiceFailureRequest* request,
                                    v1::ReportServiceFailureResponse* response) override;

 private:
  RunRegistry* const registry_;
  const absl::Duration watch_poll_interval_;
  std::atomic<bool> shutting_down_{false};
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_CONTROLLER_SERVICE_H_
