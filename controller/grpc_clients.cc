#include "controller/grpc_clients.h"

#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/transport_security.h"
#include "services/runtime/unary_call.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/reward_server.grpc.pb.h"
#include "sluice/v1/rollout_worker.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"

namespace sluice::controller {
namespace {

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return runtime::CreateChannel(address);
}

constexpr absl::Duration kStopTrainingTimeout = absl::Minutes(5);

using runtime::UnaryCall;

class GrpcTrainerClient final : public TrainerClient {
 public:
  GrpcTrainerClient(std::string address, absl::Duration timeout)
      : address_(std::move(address)),
        timeout_(timeout),
        stub_(v1::TrainerService::NewStub(Channel(address_))) {}
  const std::string& address() const override { return address_; }
  absl::Status StartTraining(const v1::StartTrainingRequest& request) override {
    return UnaryCall<v1::StartTrainingResponse>(timeout_,
                                                [&](auto* context, auto* response) {
                                                  return stub_->StartTraining(context, request,
                                                                              response);
                                                })
        .status();
  }
  absl::Status StopTraining(const v1::StopTrainingRequest& request) override {
    // The trainer answers once its run has stopped, after writing the final
    // checkpoint when asked: that can take minutes for a large model.
    return UnaryCall<v1::StopTrainingResponse>(std::max(timeout_, kStopTrainingTimeout),
                                               [&](auto* context, auto* response) {
                                                 return stub_->StopTraining(context, request,
                                                                            response);
                                               })
        .status();
  }
  absl::StatusOr<v1::TrainerStatus> GetStatus() override {
    absl::StatusOr<v1::GetTrainerStatusResponse> response =
        UnaryCall<v1::GetTrainerStatusResponse>(timeout_, [&](auto* context, auto* response) {
          return stub_->GetTrainerStatus(context, v1::GetTrainerStatusRequest(), response);
        });
    if (!response.ok()) return response.status();
    return std::move(*response->mutable_status());
  }

 private:
  const std::string address_;
  const absl::Duration timeout_;
  const std::unique_ptr<v1::TrainerService::Stub> stub_;
};

class GrpcReplayBufferClient final : public ReplayBufferClient {
 public:
  GrpcReplayBufferClient(std::string address, absl::Duration timeout)
      : address_(std::move(address)),
        timeout_(timeout),
        stub_(v1::ReplayBufferService::NewStub(Channel(address_))) {}
  const std::string& address() const override { return address_; }
  absl::Status ConfigureRun(const v1::ConfigureRunRequest& request) override {
    return UnaryCall<v1::ConfigureRunResponse>(timeout_,
                                               [&](auto* context, auto* response) {
                                                 return stub_->ConfigureRun(context, request,
                                                                            response);
                                               })
        .status();
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& run_id) override {
    v1::GetStatsRequest request;
    request.set_run_id(run_id);
    return UnaryCall<v1::GetStatsResponse>(timeout_, [&](auto* context, auto* response) {
      return stub_->GetStats(context, request, response);
    });
  }
  absl::Status ReleaseWorkerSlots(const std::string& run_id,
                                  const std::string& worker_id) override {
    v1::ReleaseGenerationSlotsRequest request;
    request.set_run_id(run_id);
    request.set_worker_id(worker_id);
    request.set_release_all(true);
    return UnaryCall<v1::ReleaseGenerationSlotsResponse>(timeout_,
                                                         [&](auto* context, auto* response) {
                                                           return stub_->ReleaseGenerationSlots(
                                                               context, request, response);
                                                         })
        .status();
  }
  absl::StatusOr<v1::GetStatsResponse> GetServerStats() override {
    return UnaryCall<v1::GetStatsResponse>(timeout_, [&](auto* context, auto* response) {
      return stub_->GetStats(context, v1::GetStatsRequest(), response);
    });
  }

 private:
  const std::string address_;
  const absl::Duration timeout_;
  const std::unique_ptr<v1::ReplayBufferService::Stub> stub_;
};

class GrpcRewardServerClient final : public RewardServerClient {
 public:
  GrpcRewardServerClient(std::string address, absl::Duration timeout)
      : address_(std::move(address)),
        timeout_(timeout),
        stub_(v1::RewardService::NewStub(Channel(address_))) {}
  const std::string& address() const override { return address_; }
  absl::StatusOr<std::vector<std::string>> ListVerifiers() override {
    absl::StatusOr<v1::ListVerifiersResponse> response = List();
    if (!response.ok()) return response.status();
    std::vector<std::string> names;
    for (const v1::VerifierInfo& verifier : response->verifiers()) names.push_back(verifier.name());
    return names;
  }
  absl::StatusOr<uint64_t> Incarnation() override {
    absl::StatusOr<v1::ListVerifiersResponse> response = List();
    if (!response.ok()) return response.status();
    return response->incarnation();
  }

 private:
  const std::string address_;
  const absl::Duration timeout_;
  absl::StatusOr<v1::ListVerifiersResponse> List() {
    return UnaryCall<v1::ListVerifiersResponse>(timeout_, [&](auto* context, auto* response) {
      return stub_->ListVerifiers(context, v1::ListVerifiersRequest(), response);
    });
  }

  const std::unique_ptr<v1::RewardService::Stub> stub_;
};

// Keeps one channel per address: a check every second must not open a new
// connection every second.
class GrpcHealthChecker final : public HealthChecker {
 public:
  explicit GrpcHealthChecker(absl::Duration timeout) : timeout_(timeout) {}
  absl::Status Check(const std::string& address) override {
    grpc::health::v1::Health::Stub* stub = StubFor(address);
    const absl::StatusOr<grpc::health::v1::HealthCheckResponse> response =
        UnaryCall<grpc::health::v1::HealthCheckResponse>(
            timeout_, [&](auto* context, auto* response) {
              return stub->Check(context, grpc::health::v1::HealthCheckRequest(), response);
            });
    if (!response.ok()) return response.status();
    if (response->status() != grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::UnavailableError(absl::StrCat(
          "health is ",
          grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response->status())));
    }
    return absl::OkStatus();
  }

 private:
  grpc::health::v1::Health::Stub* StubFor(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<grpc::health::v1::Health::Stub>& stub = stubs_[address];
    if (stub == nullptr) stub = grpc::health::v1::Health::NewStub(Channel(address));
    return stub.get();
  }

  const absl::Duration timeout_;
  absl::Mutex mu_;
  // Never erased, so the raw pointers handed out stay valid.
  absl::flat_hash_map<std::string, std::unique_ptr<grpc::health::v1::Health::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

ServiceClients MakeGrpcServiceClients(const ServiceAddresses& addresses,
                                      absl::Duration call_timeout, absl::Duration health_timeout) {
  ServiceClients clients;
  if (!addresses.trainer.empty()) {
    clients.trainer = std::make_shared<GrpcTrainerClient>(addresses.trainer, call_timeout);
  }
  if (!addresses.replay_buffer.empty()) {
    clients.replay_buffer =
        std::make_shared<GrpcReplayBufferClient>(addresses.replay_buffer, call_timeout);
  }
  clients.reward_server_address = addresses.reward_server;
  if (!addresses.reward_server.empty()) {
    clients.reward_server =
        std::make_shared<GrpcRewardServerClient>(addresses.reward_server, call_timeout);
  }
  clients.health = std::make_shared<GrpcHealthChecker>(health_timeout);
  return clients;
}

}  // namespace sluice::controller
