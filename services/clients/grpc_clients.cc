#include "services/clients/grpc_clients.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "services/clients/clients.h"
#include "services/clients/retrier.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/transport_security.h"
#include "services/runtime/unary_call.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/reward_server.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"

namespace sluice::clients {
namespace {

using runtime::FromGrpcStatus;

// Weight chunks can be up to 16 MiB; groups of long completions are large too.
constexpr int kMaxMessageBytes = 64 << 20;
constexpr absl::Duration kUnaryTimeout = absl::Seconds(30);

// gRPC's reconnect backoff after a lost connection grows to 120 s by default:
// a service restarted after a minute away would then wait up to two more
// minutes for its clients to come back. Connecting to a closed port is cheap,
// so reconnect attempts are kept at most this far apart.
constexpr int kMaxReconnectBackoffMs = 2000;
constexpr int kInitialReconnectBackoffMs = 200;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kInitialReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kInitialReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  return runtime::CreateChannel(target, args);
}

using runtime::SetDeadline;

// `status` as an absl::Status whose message names the call and its target,
// payloads kept.
absl::Status Annotate(absl::Status status, absl::string_view what, const std::string& target) {
  return PrefixMessage(status, absl::StrCat(what, " on ", target));
}
absl::Status Annotate(const grpc::Status& status, absl::string_view what,
                      const std::string& target) {
  return Annotate(FromGrpcStatus(status), what, target);
}
// Same for a finished call made with `context`, with the retry hint
// (RetryAfter) of a server that sent one in its trailing metadata:
// a server that is full (the reward server's sandbox pool) says when to come
// back, and the retrying clients wait that long.
absl::Status Annotate(const grpc::Status& status, const grpc::ClientContext& context,
                      absl::string_view what, const std::string& target) {
  return Annotate(FromGrpcStatus(status, context.GetServerTrailingMetadata()), what, target);
}

// runtime::UnaryCall, its error naming the call and its target.
template <typename Response, typename Call>
absl::StatusOr<Response> Unary(absl::string_view what, const std::string& target,
                               absl::Duration timeout, Call call) {
  absl::StatusOr<Response> response = runtime::UnaryCall<Response>(timeout, std::move(call));
  if (!response.ok()) return Annotate(response.status(), what, target);
  return response;
}

class GrpcRewardClient final : public RewardClient {
 public:
  explicit GrpcRewardClient(std::string target)
      : target_(std::move(target)), stub_(v1::RewardService::NewStub(MakeChannel(target_))) {}

  absl::StatusOr<v1::ScoreBatchResponse> ScoreBatch(const v1::ScoreBatchRequest& request,
                                                    absl::Duration timeout) override {
    return Unary<v1::ScoreBatchResponse>(
        "reward_server ScoreBatch", target_, timeout,
        [&](grpc::ClientContext* c, v1::ScoreBatchResponse* r) {
          return stub_->ScoreBatch(c, request, r);
        });
  }

 private:
  const std::string target_;
  std::unique_ptr<v1::RewardService::Stub> stub_;
};

class GrpcReplayBufferClient final : public ReplayBufferClient {
 public:
  explicit GrpcReplayBufferClient(std::string target)
      : target_(std::move(target)),
        stub_(v1::ReplayBufferService::NewStub(MakeChannel(target_))) {}

  ~GrpcReplayBufferClient() override {
    CancelSample();
    CloseSampleStream();
  }

  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest& request) override {
    return Unary<v1::AcquireGenerationSlotsResponse>(
        "replay_buffer AcquireGenerationSlots", target_,
        kUnaryTimeout + absl::Milliseconds(request.wait_timeout_ms()),
        [&](grpc::ClientContext* c, v1::AcquireGenerationSlotsResponse* r) {
          return stub_->AcquireGenerationSlots(c, request, r);
        });
  }

  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest& request) override {
    return Unary<v1::ReleaseGenerationSlotsResponse>(
        "replay_buffer ReleaseGenerationSlots", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::ReleaseGenerationSlotsResponse* r) {
          return stub_->ReleaseGenerationSlots(c, request, r);
        });
  }

  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(
      const v1::InsertGroupsRequest& request) override {
    grpc::ClientContext context;
    SetDeadline(context, kUnaryTimeout);
    auto stream = stub_->InsertGroups(&context);
    v1::InsertGroupsResponse response;
    const bool wrote = stream->Write(request);
    const bool read = wrote && stream->Read(&response);
    stream->WritesDone();
    grpc::Status status = stream->Finish();
    if (!status.ok()) return Annotate(status, context, "replay_buffer InsertGroups", target_);
    if (!read) {
      return absl::UnavailableError(
          absl::StrCat("replay_buffer InsertGroups on ", target_, ": stream ended without a reply"));
    }
    return response;
  }

  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request) override {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("sampling cancelled");
      if (sample_stream_ == nullptr) {
        sample_context_ = std::make_unique<grpc::ClientContext>();
        sample_stream_ = stub_->Sample(sample_context_.get());
      }
    }
    v1::SampleResponse response;
    if (sample_stream_->Write(request) && sample_stream_->Read(&response)) return response;
    // The stream broke: collect the status and start afresh next time.
    grpc::Status status = CloseSampleStream();
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("sampling cancelled");
    }
    if (status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("replay_buffer Sample on ", target_, ": stream ended"));
    }
    return Annotate(status, "replay_buffer Sample", target_);
  }

  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest& request) override {
    return Unary<v1::UpdatePolicyVersionResponse>(
        "replay_buffer UpdatePolicyVersion", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::UpdatePolicyVersionResponse* r) {
          return stub_->UpdatePolicyVersion(c, request, r);
        });
  }

  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest& request) override {
    return Unary<v1::GetStatsResponse>(
        "replay_buffer GetStats", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::GetStatsResponse* r) {
          return stub_->GetStats(c, request, r);
        });
  }

  void CancelSample() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (sample_context_ != nullptr) sample_context_->TryCancel();
  }

  absl::StatusOr<v1::CommitTrainedStepsResponse> CommitTrainedSteps(
      const v1::CommitTrainedStepsRequest& request) override {
    return Unary<v1::CommitTrainedStepsResponse>(
        "replay_buffer CommitTrainedSteps", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::CommitTrainedStepsResponse* r) {
          return stub_->CommitTrainedSteps(c, request, r);
        });
  }

 private:
  grpc::Status CloseSampleStream() {
    std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> stream;
    std::unique_ptr<grpc::ClientContext> context;
    {
      absl::MutexLock lock(&mu_);
      stream = std::move(sample_stream_);
      context = std::move(sample_context_);
    }
    if (stream == nullptr) return grpc::Status::OK;
    stream->WritesDone();
    return stream->Finish();
  }

  const std::string target_;
  std::unique_ptr<v1::ReplayBufferService::Stub> stub_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::ClientContext> sample_context_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> sample_stream_;
};

class GrpcControllerClient final : public ControllerClient {
 public:
  explicit GrpcControllerClient(std::string target)
      : target_(std::move(target)),
        stub_(v1::ControllerService::NewStub(MakeChannel(target_))) {}

  absl::StatusOr<v1::LeasePromptsResponse> LeasePrompts(
      const v1::LeasePromptsRequest& request) override {
    return Unary<v1::LeasePromptsResponse>(
        "controller LeasePrompts", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::LeasePromptsResponse* r) {
          return stub_->LeasePrompts(c, request, r);
        });
  }
  absl::StatusOr<v1::ReportRolloutProgressResponse> ReportRolloutProgress(
      const v1::ReportRolloutProgressRequest& request) override {
    return Unary<v1::ReportRolloutProgressResponse>(
        "controller ReportRolloutProgress", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::ReportRolloutProgressResponse* r) {
          return stub_->ReportRolloutProgress(c, request, r);
        });
  }
  absl::StatusOr<v1::ReportTrainerProgressResponse> ReportTrainerProgress(
      const v1::ReportTrainerProgressRequest& request) override {
    return Unary<v1::ReportTrainerProgressResponse>(
        "controller ReportTrainerProgress", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::ReportTrainerProgressResponse* r) {
          return stub_->ReportTrainerProgress(c, request, r);
        });
  }

 private:
  const std::string target_;
  std::unique_ptr<v1::ControllerService::Stub> stub_;
};

class GrpcTrainerClient final : public TrainerClient {
 public:
  explicit GrpcTrainerClient(std::string target)
      : target_(std::move(target)), stub_(v1::TrainerService::NewStub(MakeChannel(target_))) {}

  absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string& run_id) override {
    v1::GetLatestVersionRequest request;
    request.set_run_id(run_id);
    auto response = Unary<v1::GetLatestVersionResponse>(
        "trainer GetLatestVersion", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::GetLatestVersionResponse* r) {
          return stub_->GetLatestVersion(c, request, r);
        });
    if (!response.ok()) return response.status();
    return response->version();
  }

  absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string& run_id,
                                                            int64_t after_version,
                                                            absl::Duration timeout) override {
    grpc::ClientContext context;
    SetDeadline(context, timeout);
    v1::WatchVersionsRequest request;
    request.set_run_id(run_id);
    request.set_after_version(after_version);
    auto reader = stub_->WatchVersions(&context, request);
    v1::VersionAnnouncement announcement;
    if (reader->Read(&announcement)) {
      context.TryCancel();
      reader->Finish();
      return announcement.version();
    }
    grpc::Status status = reader->Finish();
    if (status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("trainer WatchVersions on ", target_, ": stream ended without a version"));
    }
    return Annotate(status, context, "trainer WatchVersions", target_);
  }

  absl::StatusOr<FetchedWeights> FetchWeights(const std::string& run_id,
                                              int64_t version) override {
    grpc::ClientContext context;
    SetDeadline(context, absl::Minutes(10));
    v1::StreamWeightsRequest request;
    request.set_run_id(run_id);
    if (version >= 0) request.set_version(version);
    auto reader = stub_->StreamWeights(&context, request);
    FetchedWeights fetched;
    v1::WeightsChunk chunk;
    bool have_manifest = false;
    int tensor_index = -1;
    absl::Status problem;
    while (problem.ok() && reader->Read(&chunk)) {
      if (!have_manifest) {
        if (!chunk.has_manifest()) {
          problem = absl::DataLossError("weight stream did not start with a manifest");
          break;
        }
        fetched.manifest = chunk.manifest();
        fetched.tensor_bytes.resize(fetched.manifest.tensors_size());
        have_manifest = true;
        continue;
      }
      if (Crc32c(chunk.data()) != chunk.crc32c()) {
        problem = absl::DataLossError(absl::StrCat("CRC32C mismatch in tensor ", chunk.tensor_name(),
                                                   " at offset ", chunk.offset_bytes()));
        break;
      }
      if (chunk.offset_bytes() == 0) ++tensor_index;
      if (tensor_index < 0 || tensor_index >= fetched.manifest.tensors_size() ||
          fetched.manifest.tensors(tensor_index).name() != chunk.tensor_name()) {
        problem = absl::DataLossError(
            absl::StrCat("unexpected chunk of tensor ", chunk.tensor_name(), " in weight stream"));
        break;
      }
      std::string& bytes = fetched.tensor_bytes[tensor_index];
      if (static_cast<int64_t>(bytes.size()) != chunk.offset_bytes()) {
        problem = absl::DataLossError(absl::StrCat("chunk of ", chunk.tensor_name(), " at offset ",
                                                   chunk.offset_bytes(), " but ", bytes.size(),
                                                   " bytes received"));
        break;
      }
      bytes.append(chunk.data());
    }
    if (!problem.ok()) {
      context.TryCancel();
      reader->Finish();
      return problem;
    }
    grpc::Status status = reader->Finish();
    if (!status.ok()) return Annotate(status, context, "trainer StreamWeights", target_);
    if (!have_manifest) return absl::DataLossError("weight stream ended before its manifest");
    for (int i = 0; i < fetched.manifest.tensors_size(); ++i) {
      const auto& spec = fetched.manifest.tensors(i);
      if (static_cast<int64_t>(fetched.tensor_bytes[i].size()) != spec.size_bytes()) {
        return absl::DataLossError(absl::StrCat("tensor ", spec.name(), ": received ",
                                                fetched.tensor_bytes[i].size(), " of ",
                                                spec.size_bytes(), " bytes"));
      }
    }
    return fetched;
  }

  absl::StatusOr<v1::GetWeightSourceResponse> GetWeightSource(
      const v1::GetWeightSourceRequest& request) override {
    return Unary<v1::GetWeightSourceResponse>(
        "trainer GetWeightSource", target_, kUnaryTimeout,
        [&](grpc::ClientContext* c, v1::GetWeightSourceResponse* r) {
          return stub_->GetWeightSource(c, request, r);
        });
  }

 private:
  const std::string target_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
};

// A weight stream with a watchdog: gRPC's deadline covers the whole stream
// (minutes), while a source that stops sending (a hung relay, a host cut
// off the network, where TCP would wait for minutes) must be left within
// `stall`.
template <typename Stub>
absl::Status StreamWeightsFrom(Stub& stub, const std::string& target, absl::string_view what,
                               const v1::StreamWeightsRequest& request, absl::Duration stall,
                               const std::function<absl::Status(v1::WeightsChunk&)>& on_chunk) {
  grpc::ClientContext context;
  SetDeadline(context, absl::Minutes(10));
  absl::Mutex mu;
  absl::Time last = absl::Now();
  bool done = false;
  bool stalled = false;
  std::thread watchdog([&] {
    absl::MutexLock lock(&mu);
    while (!done) {
      if (mu.AwaitWithDeadline(absl::Condition(&done), last + stall)) break;
      if (absl::Now() - last >= stall) {
        stalled = true;
        context.TryCancel();
        break;
      }
    }
  });
  auto reader = stub.StreamWeights(&context, request);
  v1::WeightsChunk chunk;
  absl::Status problem;
  while (reader->Read(&chunk)) {
    {
      absl::MutexLock lock(&mu);
      last = absl::Now();
    }
    problem = on_chunk(chunk);
    if (!problem.ok()) {
      context.TryCancel();
      break;
    }
  }
  {
    absl::MutexLock lock(&mu);
    done = true;
  }
  watchdog.join();
  const grpc::Status status = reader->Finish();
  if (!problem.ok()) return problem;
  if (stalled) {
    return absl::UnavailableError(absl::StrCat(what, " at ", target, " sent nothing for ",
                                               absl::FormatDuration(stall)));
  }
  if (!status.ok()) return Annotate(status, context, what, target);
  return absl::OkStatus();
}

template <typename Service>
class GrpcWeightSource final : public WeightSource {
 public:
  GrpcWeightSource(std::string target, std::string what)
      : target_(std::move(target)),
        what_(std::move(what)),
        stub_(Service::NewStub(MakeChannel(target_))) {}

  absl::Status StreamWeights(
      const v1::StreamWeightsRequest& request, absl::Duration stall,
      const std::function<absl::Status(v1::WeightsChunk&)>& on_chunk) override {
    return StreamWeightsFrom(*stub_, target_, what_, request, stall, on_chunk);
  }

 private:
  const std::string target_;
  const std::string what_;
  std::unique_ptr<typename Service::Stub> stub_;
};

}  // namespace

std::unique_ptr<RewardClient> NewGrpcRewardClient(const std::string& target) {
  return std::make_unique<GrpcRewardClient>(target);
}
std::unique_ptr<ReplayBufferClient> NewGrpcReplayBufferClient(const std::string& target) {
  return std::make_unique<GrpcReplayBufferClient>(target);
}
std::unique_ptr<ControllerClient> NewGrpcControllerClient(const std::string& target) {
  return std::make_unique<GrpcControllerClient>(target);
}
std::unique_ptr<TrainerClient> NewGrpcTrainerClient(const std::string& target) {
  return std::make_unique<GrpcTrainerClient>(target);
}
std::unique_ptr<WeightSource> NewGrpcTrainerWeightSource(const std::string& target) {
  return std::make_unique<GrpcWeightSource<v1::TrainerService>>(target, "trainer StreamWeights");
}
std::unique_ptr<WeightSource> NewGrpcRelayWeightSource(const std::string& target) {
  return std::make_unique<GrpcWeightSource<v1::WeightRelay>>(target, "weight relay StreamWeights");
}

}  // namespace sluice::clients
