// The fetcher against real WeightRelay servers on loopback and an in-memory
// trainer that places workers with a real RelayTree.
#include "services/weights/relay_fetcher.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/clients/grpc_clients.h"
#include "services/weights/relay_tree.h"
#include "services/weights/test_version.h"
#include "services/weights/weight_relay_service.h"

namespace sluice::weights {
namespace {

using testing::MakeTestVersion;
using testing::TestVersion;

// The trainer's side: GetWeightSource from a RelayTree, StreamWeights from
// memory, counting what it sends; it can hold a stream after some chunks.
class FakeTrainer final : public clients::TrainerClient {
 public:
  FakeTrainer(TestVersion version, RelayTreeOptions options)
      : version_(std::move(version)), tree_(options) {}

  absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string&) override {
    return version_.info;
  }
  absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string&, int64_t,
                                                            absl::Duration) override {
    return version_.info;
  }
  absl::StatusOr<clients::FetchedWeights> FetchWeights(const std::string&, int64_t) override {
    return absl::UnimplementedError("not used");
  }
  absl::StatusOr<v1::GetWeightSourceResponse> GetWeightSource(
      const v1::GetWeightSourceRequest& request) override {
    v1::GetWeightSourceResponse response;
    *response.mutable_version() = version_.info;
    RelayAssignment a = tree_.Assign(
        version_.info.version(), request.worker_id(), request.relay_address(),
        {request.failed_sources().begin(), request.failed_sources().end()});
    response.set_source_address(a.source_address);
    response.set_depth(a.depth);
    return response;
  }

  // StreamWeights as the trainer serves it.
  absl::Status Stream(const v1::StreamWeightsRequest& request,
                      const std::function<absl::Status(v1::WeightsChunk&)>& on_chunk) {
    streams_.fetch_add(1);
    v1::WeightsChunk first;
    first.set_version(version_.info.version());
    *first.mutable_manifest() = version_.manifest;
    if (absl::Status s = on_chunk(first); !s.ok()) return s;
    for (size_t i = static_cast<size_t>(request.start_chunk()); i < version_.chunks.size(); ++i) {
      if (hold_after_ >= 0 && static_cast<int64_t>(i) == hold_after_ && streams_.load() == 1) {
        release_.WaitForNotification();
        return absl::UnavailableError("trainer stream cut");
      }
      v1::WeightsChunk chunk = version_.chunks[i];
      bytes_sent_.fetch_add(static_cast<int64_t>(chunk.data().size()));
      if (absl::Status s = on_chunk(chunk); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The first stream stops after `chunks` data chunks until Release().
  void HoldFirstStreamAfter(int64_t chunks) { hold_after_ = chunks; }
  void Release() { release_.Notify(); }
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  RelayTreeStats stats() const { return tree_.stats(); }

 private:
  const TestVersion version_;
  RelayTree tree_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int> streams_{0};
  int64_t hold_after_ = -1;
  absl::Notification release_;
};

class FakeTrainerSource final : public clients::WeightSource {
 public:
  explicit FakeTrainerSource(FakeTrainer& trainer) : trainer_(trainer) {}
  absl::Status StreamWeights(const v1::StreamWeightsRequest& request, absl::Duration,
                             const std::function<absl::Status(v1::WeightsChunk&)>& on_chunk) override {
    return trainer_.Stream(request, on_chunk);
  }

 private:
  FakeTrainer& trainer_;
};

// A worker: a RelayCache served by a real WeightRelay gRPC server.
struct Worker {
  std::string id;
  std::shared_ptr<RelayCache> cache = std::make_shared<RelayCache>();
  prometheus::Registry registry;
  std::unique_ptr<WeightRelayServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::unique_ptr<RelayFetcher> fetcher;

  Worker(int i, FakeTrainer& trainer, WeightRelayOptions relay, absl::Duration stall) {
    id = absl::StrCat("worker-", i);
    service = std::make_unique<WeightRelayServiceImpl>(cache, registry, relay);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
    RelayFetcherOptions options;
    options.worker_id = id;
    options.relay_address = address;
    options.stall = stall;
    options.trainer_backoff = absl::Milliseconds(10);
    fetcher = std::make_unique<RelayFetcher>(
        trainer,
        [&trainer](const std::string& source) -> std::unique_ptr<clients::WeightSource> {
          if (source.empty()) return std::make_unique<FakeTrainerSource>(trainer);
          return clients::NewGrpcRelayWeightSource(source);
        },
        cache, options);
  }
  ~Worker() { server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1))); }
};

TEST(RelayFetcherTest, EightWorkersGetTheVersionWhileTheTrainerSendsItOnce) {
  const TestVersion v = MakeTestVersion(7, {3 << 20, 1 << 20, 12});
  FakeTrainer trainer(v, {.root_fanout = 1, .fanout = 2});
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < 8; ++i) {
    workers.push_back(std::make_unique<Worker>(i, trainer, WeightRelayOptions{}, absl::Seconds(10)));
  }
  std::vector<absl::StatusOr<RelayFetchResult>> results(workers.size(),
                                                        absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = workers[i]->fetcher->FetchLatest("run-1"); });
  }
  for (auto& t : threads) t.join();
  int max_depth = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok()) << workers[i]->id << ": " << results[i].status();
    EXPECT_EQ(results[i]->version, 7);
    EXPECT_EQ(results[i]->weights.tensor_bytes, v.bytes);
    max_depth = std::max(max_depth, results[i]->depth);
  }
  const int64_t version_bytes = (3 << 20) + (1 << 20) + 12;
  EXPECT_EQ(trainer.bytes_sent(), version_bytes);
  EXPECT_EQ(trainer.stats().direct, 1);
  EXPECT_EQ(trainer.stats().relayed, 7);
  EXPECT_GE(max_depth, 3);
}

TEST(RelayFetcherTest, AChildOfAStalledRelayResumesFromAnotherSource) {
  const TestVersion v = MakeTestVersion(2, {1 << 20});  // 16 chunks
  FakeTrainer trainer(v, {.root_fanout = 1, .fanout = 2});
  trainer.HoldFirstStreamAfter(5);
  WeightRelayOptions relay{.wait_for_version = absl::Seconds(5), .stall = absl::Milliseconds(300)};
  Worker root(0, trainer, relay, absl::Seconds(30));
  Worker child(1, trainer, relay, absl::Seconds(30));
  absl::StatusOr<RelayFetchResult> root_result = absl::UnknownError("not run");
  std::thread root_thread([&] { root_result = root.fetcher->FetchLatest("run-1"); });
  // The root first, so that it is the one the trainer's held stream goes to.
  while (trainer.stats().assignments < 1) absl::SleepFor(absl::Milliseconds(1));
  // The root holds 5 chunks and stalls; the child, placed under it, gets
  // those 5, then the relay gives up on its own source after 300 ms.
  auto child_result = child.fetcher->FetchLatest("run-1");
  trainer.Release();
  root_thread.join();
  ASSERT_TRUE(child_result.ok()) << child_result.status();
  EXPECT_EQ(child_result->weights.tensor_bytes, v.bytes);
  EXPECT_EQ(child_result->attempts, 2);
  EXPECT_EQ(child_result->source, "") << "the trainer serves when no live relay has room";
  // The child resumed at chunk 5: the trainer sent it the rest only.
  EXPECT_EQ(child_result->bytes_received, static_cast<int64_t>(1 << 20));
  EXPECT_EQ(trainer.stats().failed_sources, 1);
  // The root's first stream was cut; it resumed and finished too.
  ASSERT_TRUE(root_result.ok()) << root_result.status();
  EXPECT_EQ(root_result->weights.tensor_bytes, v.bytes);
}

TEST(RelayFetcherTest, AFetcherWithoutRelayTreeSaysUnimplemented) {
  struct OldTrainer final : clients::TrainerClient {
    absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string&) override {
      return absl::NotFoundError("none");
    }
    absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string&, int64_t,
                                                              absl::Duration) override {
      return absl::NotFoundError("none");
    }
    absl::StatusOr<clients::FetchedWeights> FetchWeights(const std::string&, int64_t) override {
      return absl::NotFoundError("none");
    }
  } old;
  RelayFetcher fetcher(old, [](const std::string&) { return nullptr; }, nullptr, {});
  EXPECT_TRUE(absl::IsUnimplemented(fetcher.FetchLatest("run-1").status()));
}

TEST(WeightRelayServiceTest, UnknownVersionIsNotFoundAndFiltersAreRefused) {
  const TestVersion v = MakeTestVersion(2, {1000});
  FakeTrainer trainer(v, {});
  WeightRelayOptions relay{.wait_for_version = absl::Milliseconds(50), .stall = absl::Seconds(1)};
  Worker worker(0, trainer, relay, absl::Seconds(5));
  auto source = clients::NewGrpcRelayWeightSource(worker.address);
  v1::StreamWeightsRequest request;
  request.set_run_id("run-1");
  request.set_version(2);
  auto ignore = [](v1::WeightsChunk&) { return absl::OkStatus(); };
  EXPECT_TRUE(absl::IsNotFound(source->StreamWeights(request, absl::Seconds(5), ignore)));
  request.add_tensor_names("layer0.weight");
  EXPECT_TRUE(absl::IsInvalidArgument(source->StreamWeights(request, absl::Seconds(5), ignore)));
}

}  // namespace
}  // namespace sluice::weights
