#include "trainer/trainer_service.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unistd.h>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "replay_buffer/replay_buffer_service.h"
#include "services/weights/relay_fetcher.h"
#include "services/weights/version_stream.h"
#include "services/weights/weight_dtype.h"
#include "sluice/v1/reward_server.grpc.pb.h"

namespace sluice::trainer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The real service on an in-process channel, with a 256 MiB budget.
class TrainerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<TrainerServiceImpl>(registry_, int64_t{256} << 20);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::TrainerService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  void TearDown() override {
    service_->Shutdown();
    server_->Shutdown();
  }

  v1::TrainerStatus Status() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::GetTrainerStatusResponse response;
    EXPECT_TRUE(stub_->GetTrainerStatus(&context, {}, &response).ok());
    return response.status();
  }

  prometheus::Registry registry_;
  std::unique_ptr<TrainerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
};

// What the controller checks at submit, the trainer checks itself: a client
// that asks it directly to train a run too big for its budget is refused,
// with the estimate, the budget and the fields to lower.
TEST_F(TrainerServiceTest, StartTrainingOverTheMemoryBudgetIsResourceExhausted) {
  EXPECT_EQ(Status().memory_budget_bytes(), int64_t{256} << 20);
  v1::StartTrainingRequest request;
  request.set_run_id("run-1");
  request.mutable_spec()->mutable_model()->set_builtin("tiny");
  request.mutable_spec()->mutable_algorithm()->set_group_size(64);
  request.mutable_spec()->mutable_algorithm()->set_batch_size_groups(4096);
  request.mutable_spec()->mutable_algorithm()->set_minibatches_per_batch(1);
  request.set_max_prompt_tokens(16);
  request.mutable_endpoints()->set_replay_buffer_address("127.0.0.1:1");
  request.mutable_endpoints()->set_reward_server_address("127.0.0.1:1");
  grpc::ClientContext context;
  v1::StartTrainingResponse response;
  const grpc::Status status = stub_->StartTraining(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("trainer: the run needs about"),
                    HasSubstr("256.0 MiB budget of this trainer's --memory-budget"),
                    HasSubstr("algorithm.batch_size_groups")));
  EXPECT_EQ(Status().state(), v1::TRAINER_STATE_IDLE);
  EXPECT_TRUE(Status().run_id().empty());
}

// Scores every item 0 and counts the calls (each evaluation makes some).
class CountingReward final : public v1::RewardService::Service {
 public:
  grpc::Status ScoreBatch(grpc::ServerContext*, const v1::ScoreBatchRequest* request,
                          v1::ScoreBatchResponse* response) override {
    calls.fetch_add(1);
    for (const auto& item : request->items()) {
      v1::ScoreResult* result = response->add_results();
      result->set_item_id(item.item_id());
      result->mutable_result()->set_error_kind(v1::VERIFIER_ERROR_NONE);
    }
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
};

// The trainer service with a real replay buffer service and a reward
// service beside it, on loopback ports, as a controller would address them.
class TrainerServiceRestartTest : public TrainerServiceTest {
 protected:
  void SetUp() override {
    TrainerServiceTest::SetUp();
    absl::StatusOr<std::unique_ptr<replay_buffer::ReplayBuffer>> buffer =
        replay_buffer::ReplayBuffer::Create();
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    buffer_service_ = std::make_shared<replay_buffer::ReplayBufferServiceImpl>(
        std::move(buffer).value(), buffer_registry_);
    grpc::ServerBuilder builder;
    builder.RegisterService(buffer_service_.get());
    builder.RegisterService(&reward_);
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    services_ = builder.BuildAndStart();
    ASSERT_NE(services_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    buffer_stub_ = v1::ReplayBufferService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    TrainerServiceTest::TearDown();  // the run first: it talks to the services
    buffer_service_->Shutdown();
    services_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  // The run's table, at `version` (> 0: the run trained that far before).
  void ConfigureBuffer(int64_t version) {
    grpc::ClientContext context;
    v1::ConfigureRunRequest configure;
    configure.set_run_id("run-r");
    configure.set_batch_size_groups(2);
    configure.set_max_staleness(1);
    configure.set_group_size(4);
    v1::ConfigureRunResponse configured;
    ASSERT_TRUE(buffer_stub_->ConfigureRun(&context, configure, &configured).ok());
    if (version == 0) return;
    grpc::ClientContext update_context;
    v1::UpdatePolicyVersionRequest update;
    update.set_run_id("run-r");
    update.set_policy_version(version);
    v1::UpdatePolicyVersionResponse updated;
    ASSERT_TRUE(buffer_stub_->UpdatePolicyVersion(&update_context, update, &updated).ok());
  }

  v1::StartTrainingRequest Request(const std::string& checkpoint_dir) {
    v1::StartTrainingRequest request;
    request.set_run_id("run-r");
    v1::RunSpec& spec = *request.mutable_spec();
    spec.set_seed(3);
    spec.mutable_model()->set_builtin("micro");
    auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
    arithmetic->set_max_operand(9);
    arithmetic->add_operators("+");
    arithmetic->set_num_prompts(20);
    arithmetic->set_num_operands(2);
    spec.mutable_task()->set_eval_split_size(4);
    spec.mutable_algorithm()->set_group_size(4);
    spec.mutable_algorithm()->set_batch_size_groups(2);
    spec.mutable_algorithm()->set_max_staleness(1);
    spec.mutable_algorithm()->set_total_steps(5);
    spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(3);
    spec.mutable_checkpoint()->set_dir(checkpoint_dir);
    spec.mutable_checkpoint()->set_every_n_steps(2);
    request.set_max_prompt_tokens(8);
    request.mutable_endpoints()->set_replay_buffer_address(address_);
    request.mutable_endpoints()->set_reward_server_address(address_);
    return request;
  }

  grpc::Status StartTraining(const v1::StartTrainingRequest& request,
                             v1::StartTrainingResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub_->StartTraining(&context, request, response);
  }

  static std::string ScratchDir(const std::string& name) {
    const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                      (name + "." + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir.string();
  }

  prometheus::Registry buffer_registry_;
  std::shared_ptr<replay_buffer::ReplayBufferServiceImpl> buffer_service_;
  CountingReward reward_;
  std::unique_ptr<grpc::Server> services_;
  std::string address_;
  std::unique_ptr<v1::ReplayBufferService::Stub> buffer_stub_;
};

// A trainer restarted with no checkpoint of a run the buffer says was
// trained to version 3 refuses it at once, to the caller, saying why.
TEST_F(TrainerServiceRestartTest, StartTrainingARunThatCannotResumeIsFailedPrecondition) {
  ConfigureBuffer(3);
  const std::string dir = ScratchDir("no_checkpoint");
  v1::StartTrainingResponse response;
  const grpc::Status status = StartTraining(Request(dir), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(),
              AllOf(HasSubstr("cannot resume losslessly: no checkpoint of run run-r in " + dir),
                    HasSubstr("the replay buffer is at version 3")));
  EXPECT_EQ(Status().state(), v1::TRAINER_STATE_IDLE);
  EXPECT_TRUE(Status().run_id().empty());
}

// A controller that restarted sends StartTraining again for the run the
// trainer is training: the answer is its status, and nothing restarts (no
// second "before" evaluation, the same incarnation).
TEST_F(TrainerServiceRestartTest, StartTrainingTheRunInProgressIsIdempotent) {
  ConfigureBuffer(0);
  const v1::StartTrainingRequest request = Request(ScratchDir("idempotent"));
  v1::StartTrainingResponse first;
  ASSERT_TRUE(StartTraining(request, &first).ok());
  EXPECT_EQ(first.status().resumed_from_step(), -1);
  EXPECT_NE(first.status().incarnation(), 0u);
  // Published version 0 and waits for data the buffer will not have.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (Status().state() != v1::TRAINER_STATE_WAITING_FOR_DATA && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Status().state(), v1::TRAINER_STATE_WAITING_FOR_DATA);
  const int evaluation_calls = reward_.calls.load();
  ASSERT_GT(evaluation_calls, 0);

  v1::StartTrainingResponse again;
  ASSERT_TRUE(StartTraining(request, &again).ok());
  EXPECT_EQ(again.status().run_id(), "run-r");
  EXPECT_EQ(again.status().state(), v1::TRAINER_STATE_WAITING_FOR_DATA);
  EXPECT_EQ(again.status().policy_version(), 0);
  EXPECT_EQ(again.status().incarnation(), first.status().incarnation());
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(reward_.calls.load(), evaluation_calls);  // no second "before" evaluation
  EXPECT_EQ(Status().state(), v1::TRAINER_STATE_WAITING_FOR_DATA);
}

// The controller confines a spec's paths at submit; the trainer confines
// them again for whoever calls it directly, before it opens anything.
TEST(TrainerServicePathTest, StartTrainingWithPathsOutsideTheRootsIsInvalidArgument) {
  const std::filesystem::path dir =
      std::filesystem::weakly_canonical(::testing::TempDir()) /
      ("trainer-paths-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "root");
  std::filesystem::create_directories(dir / "outside");
  std::filesystem::create_directory_symlink(dir / "outside", dir / "root" / "escape");
  prometheus::Registry registry;
  TrainerServiceImpl service(registry, 0, {}, *PathPolicy::Create({(dir / "root").string()}));
  for (const std::string& checkpoint_dir :
       {std::string("/etc/sluice-evil"), (dir / "root" / ".." / "outside").string(),
        (dir / "root" / "escape" / "ckpt").string()}) {
    v1::StartTrainingRequest request;
    request.set_run_id("run-1");
    request.mutable_spec()->mutable_model()->set_builtin("tiny");
    request.mutable_spec()->mutable_checkpoint()->set_dir(checkpoint_dir);
    request.mutable_endpoints()->set_replay_buffer_address("127.0.0.1:1");
    request.mutable_endpoints()->set_reward_server_address("127.0.0.1:1");
    grpc::ServerContext context;
    v1::StartTrainingResponse response;
    const grpc::Status status = service.StartTraining(&context, &request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << checkpoint_dir;
    EXPECT_EQ(status.error_message(),
              "spec on this trainer: checkpoint.dir '" + checkpoint_dir +
                  "' is outside the allowed roots [" + (dir / "root").string() +
                  "]; add its parent to --allowed-path-roots");
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir / "outside"));
  std::filesystem::remove_all(dir);
}

TEST(TrainerServiceIncarnationTest, EachServiceHasItsOwnIncarnation) {
  prometheus::Registry registry;
  TrainerServiceImpl first(registry);
  prometheus::Registry other;
  absl::SleepFor(absl::Microseconds(10));
  TrainerServiceImpl second(other);
  grpc::ServerContext context;
  v1::GetTrainerStatusResponse a;
  v1::GetTrainerStatusResponse b;
  ASSERT_TRUE(first.GetTrainerStatus(&context, nullptr, &a).ok());
  ASSERT_TRUE(second.GetTrainerStatus(&context, nullptr, &b).ok());
  EXPECT_NE(a.status().incarnation(), 0u);
  EXPECT_LT(a.status().incarnation(), b.status().incarnation());
}

// ---- sparse weight deltas (weight_sync.delta) ------------------------------

// A bf16 version of two tensors as Publish makes it: `scale` moves the
// weights of the first tensor so that a few of its bf16 values change
// between versions; the second tensor is new random bytes at every version
// (a delta would not pay: it goes FULL).
std::shared_ptr<PublishedVersion> Bf16Version(int64_t version, float scale) {
  auto published = std::make_shared<PublishedVersion>();
  uint32_t checksum = 0;
  int64_t total = 0;
  for (int t = 0; t < 2; ++t) {
    const int64_t n = t == 0 ? 300000 : 20000;
    std::string float32(static_cast<size_t>(4 * n), '\0');
    for (int64_t i = 0; i < n; ++i) {
      float w = t == 0 ? 0.02f * std::sin(0.37f * i) * (1 + scale * (i % 97 == 0))
                       : 0.01f * std::cos(1.3f * i + version);
      std::memcpy(float32.data() + 4 * i, &w, 4);
    }
    std::string bytes = *weights::Float32BytesTo(v1::DTYPE_BFLOAT16, float32);
    v1::TensorSpec spec;
    spec.set_name(t == 0 ? "layers.0.mlp.up.weight" : "embed.weight");
    spec.set_dtype(v1::DTYPE_BFLOAT16);
    spec.add_shape(n);
    spec.set_size_bytes(static_cast<int64_t>(bytes.size()));
    spec.set_crc32c(Crc32c(bytes));
    checksum = Crc32c(bytes, checksum);
    total += static_cast<int64_t>(bytes.size());
    published->tensors.push_back(std::move(spec));
    published->bytes.push_back(std::move(bytes));
  }
  published->info.set_run_id("run-d");
  published->info.set_version(version);
  published->info.set_total_size_bytes(total);
  published->info.set_tensor_count(2);
  published->info.set_checksum(absl::StrFormat("crc32c:%08x", checksum));
  return published;
}

clients::FetchedWeights AsFetched(const PublishedVersion& v) {
  clients::FetchedWeights fetched;
  *fetched.manifest.mutable_version() = v.info;
  for (const auto& spec : v.tensors) *fetched.manifest.add_tensors() = spec;
  fetched.tensor_bytes = v.bytes;
  return fetched;
}

// The trainer's StreamWeights over the in-process channel, as a worker's
// fetcher sees it.
class StubWeightSource final : public clients::WeightSource {
 public:
  explicit StubWeightSource(v1::TrainerService::Stub* stub) : stub_(stub) {}
  absl::Status StreamWeights(
      const v1::StreamWeightsRequest& request, absl::Duration,
      const std::function<absl::Status(v1::WeightsChunk&)>& on_chunk) override {
    requests.push_back(request);
    grpc::ClientContext context;
    auto reader = stub_->StreamWeights(&context, request);
    v1::WeightsChunk chunk;
    absl::Status problem;
    while (problem.ok() && reader->Read(&chunk)) {
      if (chunk.has_manifest()) manifests.push_back(chunk.manifest());
      wire_bytes += static_cast<int64_t>(chunk.data().size());
      problem = on_chunk(chunk);
      if (!problem.ok()) context.TryCancel();
    }
    const grpc::Status status = reader->Finish();
    if (!problem.ok()) return problem;
    if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                          status.error_message());
    return absl::OkStatus();
  }
  std::vector<v1::StreamWeightsRequest> requests;
  std::vector<v1::WeightsManifest> manifests;
  int64_t wire_bytes = 0;

 private:
  v1::TrainerService::Stub* stub_;
};

// GetWeightSource straight from the store: every download from the trainer.
class StoreTrainerClient final : public clients::TrainerClient {
 public:
  explicit StoreTrainerClient(WeightStore& store) : store_(store) {}
  absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string&) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string&, int64_t,
                                                            absl::Duration) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<clients::FetchedWeights> FetchWeights(const std::string&, int64_t) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<v1::GetWeightSourceResponse> GetWeightSource(
      const v1::GetWeightSourceRequest& request) override {
    ASSIGN_OR_RETURN(std::shared_ptr<const PublishedVersion> latest,
                     store_.Latest(request.run_id()));
    v1::GetWeightSourceResponse response;
    *response.mutable_version() = latest->info;
    response.set_depth(1);
    return response;
  }

 private:
  WeightStore& store_;
};

class TrainerServiceDeltaTest : public TrainerServiceTest {
 protected:
  void SetUp() override {
    TrainerServiceTest::SetUp();
    v1_ = Bf16Version(1, 0.0f);
    v2_ = Bf16Version(2, 0.5f);
    v2_->delta = EncodeVersionDelta(*v1_, *v2_);
    ASSERT_NE(v2_->delta, nullptr);
    service_->weight_store().Reset("run-d");
    service_->weight_store().Publish(v1_);
  }

  void PublishV2() { service_->weight_store().Publish(v2_); }

  std::unique_ptr<weights::RelayFetcher> Fetcher(clients::TrainerClient& trainer,
                                                 StubWeightSource** source) {
    auto owned = std::make_unique<StubWeightSource>(stub_.get());
    *source = owned.get();
    weights::RelayFetcherOptions options;
    options.worker_id = "w0";
    options.chunk_size_bytes = 64 << 10;
    options.trainer_backoff = absl::Milliseconds(1);
    auto shared = std::make_shared<std::unique_ptr<StubWeightSource>>(std::move(owned));
    return std::make_unique<weights::RelayFetcher>(
        trainer, [shared](const std::string&) -> std::unique_ptr<clients::WeightSource> {
          // One source, handed over once (the fetcher keeps it).
          return std::move(*shared);
        },
        nullptr, options);
  }

  std::shared_ptr<PublishedVersion> v1_, v2_;
};

TEST_F(TrainerServiceDeltaTest, ADeltaStreamIsSmallAndRebuildsTheVersionsExactBytes) {
  PublishV2();
  StoreTrainerClient trainer(service_->weight_store());
  StubWeightSource* source = nullptr;
  std::unique_ptr<weights::RelayFetcher> fetcher = Fetcher(trainer, &source);
  const clients::FetchedWeights held = AsFetched(*v1_);
  absl::StatusOr<weights::RelayFetchResult> fetched = fetcher->FetchDelta("run-d", held);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_TRUE(fetched->delta);
  EXPECT_EQ(fetched->version, 2);
  EXPECT_TRUE(fetched->weights.tensor_bytes == v2_->bytes);
  EXPECT_EQ(fetched->full_bytes, v2_->info.total_size_bytes());
  // The first tensor travels as ~1/97 of its elements, the second in full.
  ASSERT_EQ(source->manifests.size(), 1u);
  const v1::WeightsManifest& manifest = source->manifests[0];
  EXPECT_EQ(manifest.delta_base_version(), 1);
  EXPECT_EQ(manifest.tensors(0).encoding(), v1::TENSOR_ENCODING_SPARSE_DELTA);
  EXPECT_EQ(manifest.tensors(1).encoding(), v1::TENSOR_ENCODING_FULL);
  EXPECT_EQ(manifest.tensors(0).crc32c(), Crc32c(v2_->bytes[0]));
  EXPECT_LT(manifest.tensors(0).encoded_size_bytes(), v2_->tensors[0].size_bytes() / 20);
  EXPECT_EQ(fetched->bytes_received, v2_->delta->encoded_bytes);
  EXPECT_LT(fetched->bytes_received, v2_->info.total_size_bytes() / 5);
  std::printf("delta stream: %lld bytes on the wire for a %lld-byte version\n",
              static_cast<long long>(fetched->bytes_received),
              static_cast<long long>(v2_->info.total_size_bytes()));
  // Metrics: the stream is labelled grpc_delta, with its full-size equivalent.
  bool wire = false, full = false;
  for (const auto& family : registry_.Collect()) {
    for (const auto& metric : family.metric) {
      if (metric.label.empty() || metric.label[0].value != "grpc_delta") continue;
      if (family.name == "sluice_trainer_weight_sync_wire_bytes_total") {
        wire = metric.counter.value == static_cast<double>(v2_->delta->encoded_bytes);
      }
      if (family.name == "sluice_trainer_weight_sync_full_bytes_total") {
        full = std::abs(metric.counter.value - v2_->info.total_size_bytes()) < 1;
      }
    }
  }
  EXPECT_TRUE(wire && full);
}

TEST_F(TrainerServiceDeltaTest, ADeltaStreamResumesFromAnyChunk) {
  PublishV2();
  const clients::FetchedWeights held = AsFetched(*v1_);
  // The same chunks from 0 and, in a second stream, from chunk 1 on.
  std::vector<v1::WeightsChunk> chunks[2];
  for (int start : {0, 1}) {
    grpc::ClientContext context;
    v1::StreamWeightsRequest request;
    request.set_run_id("run-d");
    request.set_version(2);
    request.set_base_version(1);
    request.set_chunk_size_bytes(64 << 10);
    request.set_start_chunk(start);
    auto reader = stub_->StreamWeights(&context, request);
    v1::WeightsChunk chunk;
    while (reader->Read(&chunk)) {
      if (!chunk.has_manifest()) chunks[start].push_back(chunk);
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  ASSERT_GE(chunks[0].size(), 2u);
  ASSERT_EQ(chunks[1].size(), chunks[0].size() - 1);
  for (size_t i = 1; i < chunks[0].size(); ++i) {
    EXPECT_EQ(chunks[0][i].SerializeAsString(), chunks[1][i - 1].SerializeAsString());
  }
}

TEST_F(TrainerServiceDeltaTest, WithoutTheBaseTheStreamIsTheFullVersionAndSaysWhy) {
  PublishV2();
  const auto manifest_for = [&](std::optional<int64_t> base, int64_t* data_bytes) {
    grpc::ClientContext context;
    v1::StreamWeightsRequest request;
    request.set_run_id("run-d");
    request.set_version(2);
    if (base.has_value()) request.set_base_version(*base);
    auto reader = stub_->StreamWeights(&context, request);
    v1::WeightsChunk chunk;
    v1::WeightsManifest manifest;
    *data_bytes = 0;
    while (reader->Read(&chunk)) {
      if (chunk.has_manifest()) manifest = chunk.manifest();
      *data_bytes += static_cast<int64_t>(chunk.data().size());
    }
    EXPECT_TRUE(reader->Finish().ok());
    return manifest;
  };
  int64_t bytes = 0;
  // A base the trainer has no delta against (the worker skipped a version).
  v1::WeightsManifest manifest = manifest_for(0, &bytes);
  EXPECT_FALSE(manifest.has_delta_base_version());
  EXPECT_THAT(manifest.full_reason(), HasSubstr("delta against version 1 only, not against 0"));
  EXPECT_EQ(bytes, v2_->info.total_size_bytes());
  EXPECT_EQ(manifest.tensors(0).encoding(), v1::TENSOR_ENCODING_UNSPECIFIED);
  // No base asked: full, as always, and no reason to give.
  manifest = manifest_for(std::nullopt, &bytes);
  EXPECT_FALSE(manifest.has_delta_base_version());
  EXPECT_TRUE(manifest.full_reason().empty());
  EXPECT_EQ(bytes, v2_->info.total_size_bytes());
  // A version without a delta (the first, or deltas off): full, saying so.
  int64_t v1_bytes = 0;
  grpc::ClientContext context;
  v1::StreamWeightsRequest request;
  request.set_run_id("run-d");
  request.set_version(1);
  request.set_base_version(0);
  auto reader = stub_->StreamWeights(&context, request);
  v1::WeightsChunk chunk;
  ASSERT_TRUE(reader->Read(&chunk));
  EXPECT_THAT(chunk.manifest().full_reason(), HasSubstr("has no delta"));
  while (reader->Read(&chunk)) v1_bytes += static_cast<int64_t>(chunk.data().size());
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(v1_bytes, v1_->info.total_size_bytes());

  // At the worker: FetchDelta reports FAILED_PRECONDITION after reading only
  // the manifest, and the full download follows.
  StoreTrainerClient trainer(service_->weight_store());
  StubWeightSource* source = nullptr;
  std::unique_ptr<weights::RelayFetcher> fetcher = Fetcher(trainer, &source);
  clients::FetchedWeights old = AsFetched(*v1_);
  old.manifest.mutable_version()->set_version(0);
  const absl::Status status = fetcher->FetchDelta("run-d", old).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_LT(source->wire_bytes, 64 << 10) << "at most the first chunk arrived before the cancel";
}

TEST_F(TrainerServiceDeltaTest, ACorruptDeltaIsDataLossAndTheWorkerFallsBackToTheFullVersion) {
  // v2's delta made against other bytes than v1's (a trainer bug, a
  // republished base): every chunk's CRC is right, the result is not.
  auto skewed = std::make_shared<PublishedVersion>(*v1_);
  skewed->bytes[0][1000] ^= 0x01;
  v2_->delta = EncodeVersionDelta(*skewed, *v2_);
  PublishV2();
  StoreTrainerClient trainer(service_->weight_store());
  StubWeightSource* source = nullptr;
  std::unique_ptr<weights::RelayFetcher> fetcher = Fetcher(trainer, &source);
  const clients::FetchedWeights held = AsFetched(*v1_);
  absl::StatusOr<weights::RelayFetchResult> delta = fetcher->FetchDelta("run-d", held);
  ASSERT_TRUE(absl::IsDataLoss(delta.status())) << delta.status();
  EXPECT_THAT(std::string(delta.status().message()), HasSubstr("wrong base"));
  // The fallback, as the worker's follower takes it: the full version.
  absl::StatusOr<weights::RelayFetchResult> full = fetcher->FetchLatest("run-d");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_FALSE(full->delta);
  EXPECT_TRUE(full->weights.tensor_bytes == v2_->bytes);
  EXPECT_EQ(full->full_bytes, v2_->info.total_size_bytes());
  ASSERT_EQ(source->requests.size(), 2u);
  EXPECT_FALSE(source->requests[1].has_base_version());
}

}  // namespace
}  // namespace sluice::trainer
