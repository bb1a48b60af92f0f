#include "trainer/weight_store.h"

#include <torch/torch.h>

#include <cstring>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/model/transformer.h"
#include "gtest/gtest.h"
#include "services/weights/weight_dtype.h"
#include "trainer/weight_publisher.h"

namespace sluice::trainer {
namespace {

std::shared_ptr<const PublishedVersion> Version(const std::string& run, int64_t v) {
  auto p = std::make_shared<PublishedVersion>();
  p->info.set_run_id(run);
  p->info.set_version(v);
  return p;
}

TEST(WeightPublisherForTest, TheGrpcStreamPublishesIntoTheStoreItServesFrom) {
  WeightStore store;
  store.Reset("r");
  for (v1::WeightTransport transport :
       {v1::WEIGHT_TRANSPORT_UNSPECIFIED, v1::WEIGHT_TRANSPORT_GRPC}) {
    absl::StatusOr<WeightPublisher*> publisher = WeightPublisherFor(transport, &store);
    ASSERT_TRUE(publisher.ok()) << publisher.status();
    (*publisher)->Publish(Version("r", transport));
    EXPECT_EQ((*store.Latest("r"))->info.version(), transport);
  }
}

TEST(WeightPublisherForTest, ATransportThisBuildCannotPublishWithIsUnimplementedNamingIt) {
  WeightStore store;
  for (v1::WeightTransport transport : {v1::WEIGHT_TRANSPORT_CUDA_IPC, v1::WEIGHT_TRANSPORT_NCCL}) {
    absl::StatusOr<WeightPublisher*> publisher = WeightPublisherFor(transport, &store);
    EXPECT_EQ(publisher.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(publisher.status().message().find(v1::WeightTransport_Name(transport)),
              std::string::npos);
  }
}

TEST(WeightStoreTest, ServesLatestAndRetainedVersions) {
  WeightStore store(/*retain=*/2);
  store.Reset("r");
  EXPECT_EQ(store.Latest("r").status().code(), absl::StatusCode::kNotFound);
  for (int v = 0; v < 3; ++v) store.Publish(Version("r", v));
  EXPECT_EQ((*store.Latest("r"))->info.version(), 2);
  EXPECT_EQ((*store.Latest(""))->info.version(), 2);
  EXPECT_TRUE(store.Get("r", 1).ok());
  EXPECT_EQ(store.Get("r", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Latest("other").status().code(), absl::StatusCode::kNotFound);
}

TEST(WeightStoreTest, WaitForNewerBlocksUntilPublished) {
  WeightStore store;
  store.Reset("r");
  store.Publish(Version("r", 0));
  absl::Notification done;
  int64_t got = -1;
  std::thread waiter([&] {
    auto v = store.WaitForNewer("r", 0, absl::Now() + absl::Seconds(30));
    if (v.ok()) got = (*v)->info.version();
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  store.Publish(Version("r", 1));
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_EQ(got, 1);
}

TEST(WeightStoreTest, WaitTimesOutAndCloseWakesWaiters) {
  WeightStore store;
  store.Reset("r");
  EXPECT_EQ(store.WaitForNewer("r", 5, absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::Notification done;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::thread waiter([&] {
    code = store.WaitForNewer("r", 0, absl::InfiniteFuture()).status().code();
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  store.Close();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_EQ(code, absl::StatusCode::kCancelled);
}

// The trainer rounds published versions with weights::Float32BytesTo (no
// torch in the codec); it must round as torch does, so that a version is
// what `.to(torch::kBFloat16)` of the weights would give.
TEST(PublishedDtypeTest, RoundingMatchesTorchBitForBit) {
  torch::manual_seed(5);
  torch::Tensor values = torch::cat({torch::randn({100000}) * 0.05,
                                     torch::randn({1000}) * 1e4,
                                     torch::randn({1000}) * 1e-6});
  // Ties: floats exactly halfway between two bf16 / f16 neighbours.
  std::vector<float> halfway(2000);
  for (uint32_t i = 0; i < halfway.size(); ++i) {
    const uint32_t bits = ((0x3F80u + i) << 16) | 0x8000u;  // bf16 ties around 1..2^15
    std::memcpy(&halfway[i], &bits, 4);
  }
  torch::Tensor ties = torch::from_blob(halfway.data(), {2000}, torch::kFloat32).clone();
  values = torch::cat({values, ties});
  const std::string float32 = model::TensorBytes(values);
  for (const auto& [dtype, torch_dtype] :
       {std::pair{v1::DTYPE_BFLOAT16, torch::kBFloat16},
        std::pair{v1::DTYPE_FLOAT16, torch::kHalf}}) {
    torch::Tensor in_range = dtype == v1::DTYPE_FLOAT16 ? values.clamp(-65000, 65000) : values;
    absl::StatusOr<std::string> ours = weights::Float32BytesTo(dtype, model::TensorBytes(in_range));
    ASSERT_TRUE(ours.ok()) << ours.status();
    const std::string theirs = model::TensorBytes(in_range.to(torch_dtype));
    EXPECT_TRUE(*ours == theirs) << v1::DType_Name(dtype);
    // And back: exact widening.
    absl::StatusOr<std::string> widened = weights::BytesToFloat32(dtype, *ours);
    ASSERT_TRUE(widened.ok());
    EXPECT_TRUE(*widened == model::TensorBytes(in_range.to(torch_dtype).to(torch::kFloat32)));
  }
}

TEST(PublishedDtypeTest, DeltasOnlyBetweenVersionsThatLineUp) {
  PublishedVersion a, b;
  for (PublishedVersion* v : {&a, &b}) {
    v1::TensorSpec spec;
    spec.set_name("w");
    spec.set_dtype(v1::DTYPE_BFLOAT16);
    spec.set_size_bytes(8);
    v->tensors.push_back(spec);
    v->bytes.push_back(std::string(8, '\1'));
  }
  a.info.set_version(1);
  b.bytes[0][2] = 7;
  std::shared_ptr<const VersionDelta> delta = EncodeVersionDelta(a, b);
  ASSERT_NE(delta, nullptr);
  EXPECT_EQ(delta->base_version, 1);
  EXPECT_EQ(delta->tensors[0].encoding(), v1::TENSOR_ENCODING_FULL) << "8 bytes: a delta is larger";
  b.tensors[0].set_name("v");
  EXPECT_EQ(EncodeVersionDelta(a, b), nullptr);
  b.tensors[0].set_name("w");
  a.tensors[0].set_dtype(v1::DTYPE_FLOAT32);
  b.tensors[0].set_dtype(v1::DTYPE_FLOAT32);
  EXPECT_EQ(EncodeVersionDelta(a, b), nullptr) << "float32: no deltas";
}

}  // namespace
}  // namespace sluice::trainer
