#ifndef SLUICE_SERVICES_CLIENTS_RETRYING_CLIENTS_H_
#define SLUICE_SERVICES_CLIENTS_RETRYING_CLIENTS_H_

#include <atomic>
#include <memory>
#include <string>

#include "services/clients/clients.h"
#include "services/clients/retrier.h"

// Decorators that make the clients of clients.h ride out a service's restart
// (kill -9, then its supervisor starting it again at the same address; the
// gRPC channels reconnect by themselves): each call is retried per the table
// below with the backoff, deadline and cancellation of RetryOptions
// (retrier.h). A call still failing when its retry deadline passes returns its
// last error marked IsRetriesExhausted and naming the service and how long it
// was away, which the caller treats as final (a rollout worker fails its run).
//
// What each method retries, and why that is safe:
//
//   service        method                  retries on   why
//   -------------  ----------------------  -----------  ---------------------------
//   reward_server  ScoreBatch              transient,   pure: scoring twice is harmless;
//                                          and hinted   RESOURCE_EXHAUSTED with a retry
//                                                       hint when its sandbox pool is
//                                                       full (see below)
//   replay_buffer  AcquireGenerationSlots  UNAVAILABLE  not idempotent, but a slot
//                                                       lease granted to a lost answer
//                                                       only leaks until it expires
//                  ReleaseGenerationSlots  transient    releasing a released lease is a
//                                                       no-op
//                  InsertGroups            not retried  GroupInserter retries it, per
//                                                       group, under idempotency keys;
//                                                       it counts its sends to tell a
//                                                       DUPLICATE of its own lost ack
//                                                       from another generation's group,
//                                                       which retries under it would hide
//                  Sample                  UNAVAILABLE; the stream is reopened by the
//                                          transient    inner client; with request.step
//                                          with a step  set the buffer answers a repeated
//                                                       step with the same batch, so any
//                                                       transient failure is retried.
//                                                       Without a step, a batch taken
//                                                       by a stream that then broke
//                                                       is not handed out again.
//                                                       Never after CancelSample.
//                  UpdatePolicyVersion     transient    monotonic: repeating it is a no-op
//                  GetStats                transient    a read
//                  CommitTrainedSteps      transient    monotonic (a repeat is a no-op)
//   controller     LeasePrompts            UNAVAILABLE  not idempotent, but prompt leases
//                                                       expire and their prompts are
//                                                       handed out again
//                  ReportRolloutProgress   UNAVAILABLE  counters in the report would be
//                  ReportTrainerProgress   UNAVAILABLE  added twice if a processed call
//                                                       were repeated
//   trainer        GetLatestVersion        transient    a read
//                  WaitForVersionAfter     UNAVAILABLE  a read whose normal "nothing new"
//                                                       answer is DEADLINE_EXCEEDED; its
//                                                       retries stay within its own
//                                                       timeout and are never final
//                  FetchWeights            transient    a read
//                  GetWeightSource         transient    a placement in a fan-out tree;
//                                                       a repeat re-places the worker
//                                                       (weight streams are not retried
//                                                       here: the relay fetcher resumes
//                                                       them from another source)
//
// "transient": UNAVAILABLE until the deadline, and DEADLINE_EXCEEDED, ABORTED,
// INTERNAL, UNKNOWN, CANCELLED up to RetryOptions::max_ambiguous_retries
// (RetryOn::kTransient). Every other code (INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION, RESOURCE_EXHAUSTED, ...) returns at once, unless it
// carries a retry hint.
//
// "hinted", for every method retried here whatever its column says (so all
// but InsertGroups; within its own timeout for WaitForVersionAfter): a
// failure that carries a retry hint (the server's grpc-retry-pushback-ms
// trailing metadata, read by the gRPC clients into RetryAfter) is
// retried until the deadline, after waiting at least the hint (plus up to
// RetryOptions::jitter of it, at most until the deadline), and does not
// count against max_ambiguous_retries. A server sends one only with a refusal of a
// call it did not process (the reward server's RESOURCE_EXHAUSTED when its
// code-sandbox pool is full: backpressure), so repeating the call is safe even
// where it must not run twice; without a hint RESOURCE_EXHAUSTED stays final
// (other services use it for quotas no retry cures).
//
// At worst, then, when a connection is cut after the server processed a call
// but before its answer arrived: a slot lease or a prompt lease granted to the
// lost answer is leaked until it expires, and a progress report is applied
// twice (its prompt ids are idempotent for the controller; the counters it
// carries, tokens and groups, are added again).
//
// A decorator is as thread-safe as the client it wraps. Adding a method to an
// interface means one forwarding method here that picks its RetryOn.
namespace sluice::clients {

class RetryingRewardClient final : public RewardClient {
 public:
  RetryingRewardClient(std::unique_ptr<RewardClient> inner, RetryOptions options);
  // Borrows `inner`, which must outlive the decorator.
  RetryingRewardClient(RewardClient& inner, RetryOptions options);

  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration timeout) override;

 private:
  std::unique_ptr<RewardClient> owned_;
  RewardClient& inner_;
  Retrier retrier_;
};

class RetryingReplayBufferClient final : public ReplayBufferClient {
 public:
  RetryingReplayBufferClient(std::unique_ptr<ReplayBufferClient> inner, RetryOptions options);
  RetryingReplayBufferClient(ReplayBufferClient& inner, RetryOptions options);

  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest& request) override;
  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest& request) override;
  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(
      const v1::InsertGroupsRequest& request) override;
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request) override;
  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest& request) override;
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest& request) override;
  absl::StatusOr<v1::CommitTrainedStepsResponse> CommitTrainedSteps(
      const v1::CommitTrainedStepsRequest& request) override;
  // Also ends a Sample's backoff at once (it returns CANCELLED), and no later
  // Sample is retried.
  void CancelSample() override;

 private:
  std::unique_ptr<ReplayBufferClient> owned_;
  ReplayBufferClient& inner_;
  Retrier retrier_;
  std::atomic<bool> sample_cancelled_{false};
};

class RetryingControllerClient final : public ControllerClient {
 public:
  RetryingControllerClient(std::unique_ptr<ControllerClient> inner, RetryOptions options);
  RetryingControllerClient(ControllerClient& inner, RetryOptions options);

  absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(
      const v1::LeasePromptsRequest& request) override;
  absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest& request) override;
  absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest& request) override;

 private:
  std::unique_ptr<ControllerClient> owned_;
  ControllerClient& inner_;
  Retrier retrier_;
};

class RetryingTrainerClient final : public TrainerClient {
 public:
  RetryingTrainerClient(std::unique_ptr<TrainerClient> inner, RetryOptions options);
  RetryingTrainerClient(TrainerClient& inner, RetryOptions options);

  absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string& run_id) override;
  absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string& run_id,
                                                            int64_t after_version,
                                                            absl::Duration timeout) override;
  absl::StatusOr<FetchedWeights> FetchWeights(const std::string& run_id,
                                              int64_t version) override;
  absl::StatusOr<v1::GetWeightSourceResponse> GetWeightSource(
      const v1::GetWeightSourceRequest& request) override;

 private:
  std::unique_ptr<TrainerClient> owned_;
  TrainerClient& inner_;
  Retrier retrier_;
};

// `inner` wrapped in its retrying decorator; what a service writes where it
// creates its clients:
//   auto buffer = WithRetries(NewGrpcReplayBufferClient(address), options);
std::unique_ptr<RewardClient> WithRetries(std::unique_ptr<RewardClient> inner,
                                          RetryOptions options);
std::unique_ptr<ReplayBufferClient> WithRetries(std::unique_ptr<ReplayBufferClient> inner,
                                                RetryOptions options);
std::unique_ptr<ControllerClient> WithRetries(std::unique_ptr<ControllerClient> inner,
                                              RetryOptions options);
std::unique_ptr<TrainerClient> WithRetries(std::unique_ptr<TrainerClient> inner,
                                           RetryOptions options);

}  // namespace sluice::clients

#endif  // SLUICE_SERVICES_CLIENTS_RETRYING_CLIENTS_H_
