#ifndef SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_SERVICE_H_
#define SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_SERVICE_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"
#include "prometheus/registry.h"
#include "replay_buffer/replay_buffer.h"
#include "replay_buffer/replay_buffer_metrics.h"
#include "services/runtime/bounded_methods.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::replay_buffer {

// The gRPC edge of the replay buffer: converts between protos and the core's
// types (proto_convert.h), maps absl::Status to grpc::Status, caps waits by
// the call's deadline and keeps the metrics. All logic lives in ReplayBuffer
// and RunTable.
//
// Streams:
// - InsertGroups: one InsertGroupsResponse per request, one result per group
//   in request order.
// - Sample: each SampleRequest is answered by exactly one SampleResponse, in
//   order (exactly B groups, or timed_out when the core's wait ran out with
//   DEADLINE_EXCEEDED: the minimum size or the rate limiter); timeout_ms 0 means
//   Options::default_sample_timeout. A request the core refuses (unknown run,
//   bad field) ends the stream with that status, since a SampleResponse
//   cannot carry an error. A batch whose write fails (the trainer went away)
//   is put back into the table, unless it is a trainer step's (SampleRequest.
//   step), which stays recorded for the trainer's retry. A replayed step
//   batch is not observed again in the staleness histogram. The stream ends
//   when the client half-closes or the service shuts down.
//
// Runs on gRPC's synchronous server: a blocked Sample or AcquireGenerationSlots
// holds one server thread while it waits. Thread-safe.
class ReplayBufferServiceImpl final : public sluice::v1::ReplayBufferService::Service,
                                      public runtime::BoundedService {
 public:
  struct Options {
    // Sample wait when a request says timeout_ms = 0.
    absl::Duration default_sample_timeout = absl::Seconds(10);
    // Longest an insert waits for the rate limiter (capped by the call's
    // deadline) before it is answered RETRYABLE_ERROR.
    absl::Duration insert_rate_limit_wait = absl::Seconds(30);
    // How many times a buffer has started on its --data-dir, this start
    // included (CountStart); 0 without one. GetStats reports it, so that the
    // controller counts restarts nobody saw.
    int64_t starts = 0;
  };

  // `registry` must outlive the service (the metrics' families live in it).
  ReplayBufferServiceImpl(std::shared_ptr<ReplayBuffer> buffer, prometheus::Registry& registry,
                          Options options);
  ReplayBufferServiceImpl(std::shared_ptr<ReplayBuffer> buffer, prometheus::Registry& registry)
      : ReplayBufferServiceImpl(std::move(buffer), registry, Options()) {}

  // For ServiceContext::OnShutdown: shuts the buffer down (blocked calls
  // return UNAVAILABLE) and cancels every open stream, so that a stream
  // waiting for the client's next request ends too. Later streams are
  // refused with UNAVAILABLE. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(streams_mu_);

  grpc::Status ConfigureRun(grpc::ServerContext* context, const v1::ConfigureRunRequest* request,
                            v1::ConfigureRunResponse* response) override;
  grpc::Status AcquireGenerationSlots(grpc::ServerContext* context,
                                      const v1::AcquireGenerationSlotsRequest* request,
                                      v1::AcquireGenerationSlotsResponse* response) override;
  grpc::Status ReleaseGenerationSlots(grpc::ServerContext* context,
                                      const v1::ReleaseGenerationSlotsRequest* request,
                                      v1::ReleaseGenerationSlotsResponse* response) override;
  // The streams, as ServiceMain serves them: each message bounded before it
  // is parsed (runtime::BoundedStream).
  grpc::Status InsertGroupsStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriterInterface<v1::InsertGroupsResponse, v1::InsertGroupsRequest>* stream);
  grpc::Status SampleStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriterInterface<v1::SampleResponse, v1::SampleRequest>* stream);
  std::vector<runtime::BoundedStreamMethod> BoundedStreams() override;
  // The generated methods (a server built without ServiceMain) forward to
  // the streams above.
  grpc::Status InsertGroups(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::InsertGroupsResponse, v1::InsertGroupsRequest>* stream) override {
    return InsertGroupsStream(context, stream);
  }
  grpc::Status Sample(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SampleResponse, v1::SampleRequest>* stream) override {
    return SampleStream(context, stream);
  }
  grpc::Status UpdatePolicyVersion(grpc::ServerContext* context,
                                   const v1::UpdatePolicyVersionRequest* request,
                                   v1::UpdatePolicyVersionResponse* response) override;
  grpc::Status UpdatePriorities(grpc::ServerContext* context,
                                const v1::UpdatePrioritiesRequest* request,
                                v1::UpdatePrioritiesResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::GetStatsResponse* response) override;
  grpc::Status CommitTrainedSteps(grpc::ServerContext* context,
                                  const v1::CommitTrainedStepsRequest* request,
                                  v1::CommitTrainedStepsResponse* response) override;

  // GetStatsResponse.incarnation: when this service was created (ns since
  // the epoch), distinct for every start of the process.
  uint64_t incarnation() const { return incarnation_; }

 private:
  // Registers an open stream for Shutdown to cancel; false when shutting down.
  bool OpenStream(grpc::ServerContext* context) ABSL_LOCKS_EXCLUDED(streams_mu_);
  void CloseStream(grpc::ServerContext* context) ABSL_LOCKS_EXCLUDED(streams_mu_);

  const std::shared_ptr<ReplayBuffer> buffer_;
  const Options options_;
  const uint64_t incarnation_;
  ReplayBufferMetrics metrics_;

  absl::Mutex streams_mu_;
  bool shutting_down_ ABSL_GUARDED_BY(streams_mu_) = false;
  absl::flat_hash_set<grpc::ServerContext*> open_streams_ ABSL_GUARDED_BY(streams_mu_);
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_REPLAY_BUFFER_SERVICE_H_
