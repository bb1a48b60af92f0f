#include "services/clients/retrying_clients.h"

#include <algorithm>
#include <utility>

namespace sluice::clients {

// ---- reward server ---------------------------------------------------------

RetryingRewardClient::RetryingRewardClient(std::unique_ptr<RewardClient> inner,
                                           RetryOptions options)
    : owned_(std::move(inner)), inner_(*owned_), retrier_("reward_server", std::move(options)) {}

RetryingRewardClient::RetryingRewardClient(RewardClient& inner, RetryOptions options)
    : inner_(inner), retrier_("reward_server", std::move(options)) {}

absl::StatusOr<v1::ScoreBatchResponse> RetryingRewardClient::ScoreBatch(
    const v1::ScoreBatchRequest& request, absl::Duration timeout) {
  return retrier_.Call<v1::ScoreBatchResponse>("ScoreBatch", RetryOn::kTransient,
                                               [&] { return inner_.ScoreBatch(request, timeout); });
}

// ---- replay buffer ---------------------------------------------------------

RetryingReplayBufferClient::RetryingReplayBufferClient(std::unique_ptr<ReplayBufferClient> inner,
                                                       RetryOptions options)
    : owned_(std::move(inner)), inner_(*owned_), retrier_("replay_buffer", std::move(options)) {}

RetryingReplayBufferClient::RetryingReplayBufferClient(ReplayBufferClient& inner,
                                                       RetryOptions options)
    : inner_(inner), retrier_("replay_buffer", std::move(options)) {}

absl::StatusOr<v1::AcquireGenerationSlotsResponse>
RetryingReplayBufferClient::AcquireGenerationSlots(
    const v1::AcquireGenerationSlotsRequest& request) {
  return retrier_.Call<v1::AcquireGenerationSlotsResponse>(
      "AcquireGenerationSlots", RetryOn::kUnavailable,
      [&] { return inner_.AcquireGenerationSlots(request); });
}

absl::StatusOr<v1::ReleaseGenerationSlotsResponse>
RetryingReplayBufferClient::ReleaseGenerationSlots(
    const v1::ReleaseGenerationSlotsRequest& request) {
  return retrier_.Call<v1::ReleaseGenerationSlotsResponse>(
      "ReleaseGenerationSlots", RetryOn::kTransient,
      [&] { return inner_.ReleaseGenerationSlots(request); });
}

absl::StatusOr<v1::InsertGroupsResponse> RetryingReplayBufferClient::InsertGroups(
    const v1::InsertGroupsRequest& request) {
  // Not retried here: see the table in the header (GroupInserter does it).
  return inner_.InsertGroups(request);
}

absl::StatusOr<v1::SampleResponse> RetryingReplayBufferClient::Sample(
    const v1::SampleRequest& request) {
  if (sample_cancelled_.load()) return inner_.Sample(request);
  CallLimits limits;
  limits.stop = &sample_cancelled_;
  return retrier_.Call<v1::SampleResponse>(
      "Sample", request.step() > 0 ? RetryOn::kTransient : RetryOn::kUnavailable,
      [&] { return inner_.Sample(request); }, limits);
}

absl::StatusOr<v1::UpdatePolicyVersionResponse> RetryingReplayBufferClient::UpdatePolicyVersion(
    const v1::UpdatePolicyVersionRequest& request) {
  return retrier_.Call<v1::UpdatePolicyVersionResponse>(
      "UpdatePolicyVersion", RetryOn::kTransient,
      [&] { return inner_.UpdatePolicyVersion(request); });
}

absl::StatusOr<v1::GetStatsResponse> RetryingReplayBufferClient::GetStats(
    const v1::GetStatsRequest& request) {
  return retrier_.Call<v1::GetStatsResponse>("GetStats", RetryOn::kTransient,
                                             [&] { return inner_.GetStats(request); });
}

absl::StatusOr<v1::CommitTrainedStepsResponse> RetryingReplayBufferClient::CommitTrainedSteps(
    const v1::CommitTrainedStepsRequest& request) {
  return retrier_.Call<v1::CommitTrainedStepsResponse>(
      "CommitTrainedSteps", RetryOn::kTransient, [&] { return inner_.CommitTrainedSteps(request); });
}

void RetryingReplayBufferClient::CancelSample() {
  sample_cancelled_.store(true);
  retrier_.cancellation().Wake();
  inner_.CancelSample();
}

// ---- controller ------------------------------------------------------------

RetryingControllerClient::RetryingControllerClient(std::unique_ptr<ControllerClient> inner,
                                                   RetryOptions options)
    : owned_(std::move(inner)), inner_(*owned_), retrier_("controller", std::move(options)) {}

RetryingControllerClient::RetryingControllerClient(ControllerClient& inner, RetryOptions options)
    : inner_(inner), retrier_("controller", std::move(options)) {}

absl::StatusOr<v1::LeasePromptsResponse> RetryingControllerClient::LeasePrompts(
    const v1::LeasePromptsRequest& request) {
  return retrier_.Call<v1::LeasePromptsResponse>("LeasePrompts", RetryOn::kUnavailable,
                                                 [&] { return inner_.LeasePrompts(request); });
}

absl::StatusOr<v1::ReportRolloutProgressResponse> RetryingControllerClient::ReportRolloutProgress(
    const v1::ReportRolloutProgressRequest& request) {
  return retrier_.Call<v1::ReportRolloutProgressResponse>(
      "ReportRolloutProgress", RetryOn::kUnavailable,
      [&] { return inner_.ReportRolloutProgress(request); });
}

absl::StatusOr<v1::ReportTrainerProgressResponse> RetryingControllerClient::ReportTrainerProgress(
    const v1::ReportTrainerProgressRequest& request) {
  return retrier_.Call<v1::ReportTrainerProgressResponse>(
      "ReportTrainerProgress", RetryOn::kUnavailable,
      [&] { return inner_.ReportTrainerProgress(request); });
}

// ---- trainer ---------------------------------------------------------------

RetryingTrainerClient::RetryingTrainerClient(std::unique_ptr<TrainerClient> inner,
                                             RetryOptions options)
    : owned_(std::move(inner)), inner_(*owned_), retrier_("trainer", std::move(options)) {}

RetryingTrainerClient::RetryingTrainerClient(TrainerClient& inner, RetryOptions options)
    : inner_(inner), retrier_("trainer", std::move(options)) {}

absl::StatusOr<v1::PolicyVersionInfo> RetryingTrainerClient::GetLatestVersion(
    const std::string& run_id) {
  return retrier_.Call<v1::PolicyVersionInfo>("GetLatestVersion", RetryOn::kTransient,
                                              [&] { return inner_.GetLatestVersion(run_id); });
}

absl::StatusOr<v1::PolicyVersionInfo> RetryingTrainerClient::WaitForVersionAfter(
    const std::string& run_id, int64_t after_version, absl::Duration timeout) {
  // The caller's timeout bounds the whole call, retries included; each
  // attempt waits for what is left of it.
  const absl::Time end = retrier_.Now() + timeout;
  CallLimits limits;
  limits.deadline = timeout;
  limits.exhausted_is_final = false;
  absl::Status last;  // of the previous attempt
  return retrier_.Call<v1::PolicyVersionInfo>(
      "WaitForVersionAfter", RetryOn::kUnavailable,
      [&]() -> absl::StatusOr<v1::PolicyVersionInfo> {
        const absl::Duration left = end - retrier_.Now();
        // The backoff used up the timeout: say why the wait was fruitless.
        if (left <= absl::ZeroDuration() && !last.ok()) return last;
        absl::StatusOr<v1::PolicyVersionInfo> version =
            inner_.WaitForVersionAfter(run_id, after_version, std::max(left, absl::ZeroDuration()));
        last = version.status();
        return version;
      },
      limits);
}

absl::StatusOr<FetchedWeights> RetryingTrainerClient::FetchWeights(const std::string& run_id,
                                                                   int64_t version) {
  return retrier_.Call<FetchedWeights>("FetchWeights", RetryOn::kTransient,
                                       [&] { return inner_.FetchWeights(run_id, version); });
}

absl::StatusOr<v1::GetWeightSourceResponse> RetryingTrainerClient::GetWeightSource(
    const v1::GetWeightSourceRequest& request) {
  return retrier_.Call<v1::GetWeightSourceResponse>(
      "GetWeightSource", RetryOn::kTransient, [&] { return inner_.GetWeightSource(request); });
}

// ---- factories -------------------------------------------------------------

std::unique_ptr<RewardClient> WithRetries(std::unique_ptr<RewardClient> inner,
                                          RetryOptions options) {
  return std::make_unique<RetryingRewardClient>(std::move(inner), std::move(options));
}
std::unique_ptr<ReplayBufferClient> WithRetries(std::unique_ptr<ReplayBufferClient> inner,
                                                RetryOptions options) {
  return std::make_unique<RetryingReplayBufferClient>(std::move(inner), std::move(options));
}
std::unique_ptr<ControllerClient> WithRetries(std::unique_ptr<ControllerClient> inner,
                                              RetryOptions options) {
  return std::make_unique<RetryingControllerClient>(std::move(inner), std::move(options));
}
std::unique_ptr<TrainerClient> WithRetries(std::unique_ptr<TrainerClient> inner,
                                           RetryOptions options) {
  return std::make_unique<RetryingTrainerClient>(std::move(inner), std::move(options));
}

}  // namespace sluice::clients
