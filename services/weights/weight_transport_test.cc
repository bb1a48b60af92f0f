// The weight transport seam: which receiver a transport gets, and the gRPC
// stream receiver's choice of source against an in-memory trainer (its
// relays and deltas against real servers: relay_fetcher_test.cc and the
// rollout worker's tests).
#include "services/weights/weight_transport.h"

#include <memory>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/weights/relay_fetcher.h"

namespace sluice::weights {
namespace {

using ::testing::HasSubstr;

// A trainer that has one version of two tensors and no fan-out tree
// (GetWeightSource: UNIMPLEMENTED, as an older trainer answers).
class FakeTrainer final : public clients::TrainerClient {
 public:
  absl::StatusOr<v1::PolicyVersionInfo> GetLatestVersion(const std::string&) override {
    return v1::PolicyVersionInfo();
  }
  absl::StatusOr<v1::PolicyVersionInfo> WaitForVersionAfter(const std::string&, int64_t,
                                                            absl::Duration) override {
    return v1::PolicyVersionInfo();
  }
  absl::StatusOr<clients::FetchedWeights> FetchWeights(const std::string& run_id,
                                                       int64_t version) override {
    ++fetches;
    last_run_id = run_id;
    last_version = version;
    clients::FetchedWeights weights;
    weights.manifest.mutable_version()->set_version(7);
    weights.tensor_bytes = {"abcd", "ef"};
    return weights;
  }
  absl::StatusOr<v1::GetWeightSourceResponse> GetWeightSource(
      const v1::GetWeightSourceRequest&) override {
    ++placements;
    return absl::UnimplementedError("no fan-out tree");
  }

  int fetches = 0;
  int placements = 0;
  std::string last_run_id;
  int64_t last_version = 0;
};

TEST(NewWeightReceiverTest, GrpcAndUnspecifiedGetTheStreamReceiver) {
  FakeTrainer trainer;
  for (v1::WeightTransport transport :
       {v1::WEIGHT_TRANSPORT_GRPC, v1::WEIGHT_TRANSPORT_UNSPECIFIED}) {
    WeightReceiverDeps deps;
    deps.trainer = &trainer;
    absl::StatusOr<std::unique_ptr<WeightReceiver>> receiver =
        NewWeightReceiver(transport, /*delta=*/false, std::move(deps));
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    EXPECT_NE(*receiver, nullptr);
  }
}

TEST(NewWeightReceiverTest, ATransportThisBuildCannotReceiveWithIsUnimplementedNamingIt) {
  FakeTrainer trainer;
  for (v1::WeightTransport transport : {v1::WEIGHT_TRANSPORT_CUDA_IPC, v1::WEIGHT_TRANSPORT_NCCL}) {
    WeightReceiverDeps deps;
    deps.trainer = &trainer;
    absl::StatusOr<std::unique_ptr<WeightReceiver>> receiver =
        NewWeightReceiver(transport, false, std::move(deps));
    EXPECT_TRUE(absl::IsUnimplemented(receiver.status())) << receiver.status();
    EXPECT_THAT(receiver.status().message(), HasSubstr(v1::WeightTransport_Name(transport)));
  }
}

TEST(NewWeightReceiverTest, WithoutATrainerItSaysSo) {
  absl::StatusOr<std::unique_ptr<WeightReceiver>> receiver =
      NewWeightReceiver(v1::WEIGHT_TRANSPORT_GRPC, false, WeightReceiverDeps());
  EXPECT_TRUE(absl::IsInvalidArgument(receiver.status())) << receiver.status();
}

TEST(GrpcStreamReceiverTest, WithoutARelayFetcherTheLatestComesFromTheTrainerInFull) {
  FakeTrainer trainer;
  WeightReceiverDeps deps;
  deps.trainer = &trainer;
  std::unique_ptr<WeightReceiver> receiver =
      *NewWeightReceiver(v1::WEIGHT_TRANSPORT_GRPC, /*delta=*/true, std::move(deps));
  clients::FetchedWeights held;
  absl::StatusOr<ReceivedWeights> received = receiver->ReceiveLatest("run-1", &held);
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->transport, "grpc");
  EXPECT_EQ(received->wire_bytes, 6);
  EXPECT_EQ(received->full_bytes, 6);
  EXPECT_EQ(received->weights.manifest.version().version(), 7);
  EXPECT_EQ(trainer.fetches, 1);
  EXPECT_EQ(trainer.last_run_id, "run-1");
  EXPECT_EQ(trainer.last_version, -1);  // the latest
}

TEST(GrpcStreamReceiverTest, ATrainerWithoutAFanOutTreeIsAskedDirectlyAndNotPlacedAgain) {
  FakeTrainer trainer;
  WeightReceiverDeps deps;
  deps.trainer = &trainer;
  deps.relay_fetcher = std::make_shared<RelayFetcher>(
      trainer, [](const std::string&) { return std::unique_ptr<clients::WeightSource>(); },
      /*cache=*/nullptr, RelayFetcherOptions());
  std::unique_ptr<WeightReceiver> receiver =
      *NewWeightReceiver(v1::WEIGHT_TRANSPORT_GRPC, false, std::move(deps));
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<ReceivedWeights> received = receiver->ReceiveLatest("run-1", nullptr);
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->transport, "grpc");
  }
  EXPECT_EQ(trainer.placements, 1);
  EXPECT_EQ(trainer.fetches, 3);
}

}  // namespace
}  // namespace sluice::weights
