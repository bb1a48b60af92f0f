#include "common/run/run_weight_sync.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace sluice::run {
namespace {

std::vector<std::string> Problems(const v1::RunSpec& spec) {
  std::vector<std::string> problems;
  ValidateWeightSync(spec, &problems);
  return problems;
}

TEST(RunWeightSyncTest, DefaultsFollowTheDevice) {
  v1::RunSpec spec;
  WeightSync sync = ResolveWeightSync(spec);
  EXPECT_EQ(sync.transport, v1::WEIGHT_TRANSPORT_GRPC);
  EXPECT_EQ(sync.dtype, v1::DTYPE_FLOAT32);
  EXPECT_FALSE(sync.delta);
  spec.mutable_model()->set_device("cuda:1");
  sync = ResolveWeightSync(spec);
  EXPECT_EQ(sync.dtype, v1::DTYPE_BFLOAT16);
  EXPECT_TRUE(sync.delta);
  spec.mutable_model()->set_device("cpu");
  spec.mutable_weight_sync()->set_dtype(v1::DTYPE_FLOAT16);
  EXPECT_TRUE(ResolveWeightSync(spec).delta);
  spec.mutable_weight_sync()->set_delta(false);
  EXPECT_FALSE(ResolveWeightSync(spec).delta);
  EXPECT_TRUE(Problems(spec).empty());
}

TEST(RunWeightSyncTest, GpuTransportsOnCpuAreRefusedWithWhatToDo) {
  v1::RunSpec spec;
  spec.mutable_weight_sync()->set_transport(v1::WEIGHT_TRANSPORT_CUDA_IPC);
  std::vector<std::string> problems = Problems(spec);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(problems[0], "weight_sync.transport: cuda_ipc moves weights"))
      << problems[0];
  EXPECT_TRUE(absl::StrContains(problems[0], "model.device is \"cpu\" (use grpc, or run on cuda)"))
      << problems[0];
  spec.mutable_weight_sync()->set_transport(v1::WEIGHT_TRANSPORT_NCCL);
  spec.mutable_model()->set_device("cpu");
  ASSERT_EQ(Problems(spec).size(), 1u);
  EXPECT_TRUE(absl::StrContains(Problems(spec)[0], "nccl"));
  // On cuda they are refused too, saying so, until the services use them
  // (not silently sent over gRPC).
  spec.mutable_model()->set_device("cuda");
  ASSERT_EQ(Problems(spec).size(), 1u);
  EXPECT_TRUE(absl::StrContains(Problems(spec)[0], "nccl is not wired into the trainer"))
      << Problems(spec)[0];
  spec.mutable_weight_sync()->set_transport(v1::WEIGHT_TRANSPORT_GRPC);
  EXPECT_TRUE(Problems(spec).empty());
  EXPECT_EQ(WeightTransportLabel(v1::WEIGHT_TRANSPORT_NCCL), "nccl");
  EXPECT_EQ(WeightTransportLabel(v1::WEIGHT_TRANSPORT_GRPC, true), "grpc_delta");
  EXPECT_EQ(WeightTransportLabel(v1::WEIGHT_TRANSPORT_UNSPECIFIED), "grpc");
}

TEST(RunWeightSyncTest, DeltasInFloat32AndOtherDtypesAreRefused) {
  v1::RunSpec spec;
  spec.mutable_weight_sync()->set_delta(true);
  std::vector<std::string> problems = Problems(spec);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(problems[0], "weight_sync.delta: ")) << problems[0];
  EXPECT_TRUE(absl::StrContains(problems[0], "bfloat16")) << problems[0];
  spec.mutable_weight_sync()->set_dtype(v1::DTYPE_BFLOAT16);
  EXPECT_TRUE(Problems(spec).empty());
  spec.mutable_weight_sync()->set_dtype(v1::DTYPE_INT8);
  problems = Problems(spec);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_TRUE(absl::StartsWith(problems[0], "weight_sync.dtype: ")) << problems[0];
}

}  // namespace
}  // namespace sluice::run
