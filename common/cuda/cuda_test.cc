// Tests of sluice_cuda. The ones about serialization and error mapping run
// anywhere cudart loads; the ones that need a GPU skip themselves without one
// (as on the CPU-only development machine; they passed on an H200).
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/device_crc_tree.h"
#include "common/cuda/device_info.h"
#include "common/cuda/device_pattern.h"
#include "common/cuda/ipc_buffer.h"
#include "common/cuda/weight_digest.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

TEST(CudaStatusTest, MapsErrorsToActionableCodes) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  const absl::Status oom = CudaStatus(cudaErrorMemoryAllocation, "allocating 3 GB");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("allocating 3 GB: cudaErrorMemoryAllocation"), std::string::npos)
      << oom;
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CudaStatus(cudaErrorLaunchFailure, "x").code(), absl::StatusCode::kInternal);
}

IpcHandleMessage SampleMessage() {
  IpcHandleMessage message;
  for (int i = 0; i < 64; ++i) message.handle.reserved[i] = static_cast<char>(i * 3 + 1);
  message.offset = 0x1234500;
  message.bytes = 988ull << 20;
  for (int i = 0; i < 16; ++i) message.device_uuid[i] = static_cast<unsigned char>(0xF0 + i);
  message.exporter_pid = 4242;
  return message;
}

TEST(IpcHandleMessageTest, RoundTripsEveryField) {
  const IpcHandleMessage message = SampleMessage();
  const std::string serialized = message.Serialize();
  ASSERT_EQ(serialized.size(), IpcHandleMessage::kSerializedBytes);
  EXPECT_EQ(serialized.substr(0, 4), "SIPC");
  EXPECT_EQ(serialized[4], 1);
  auto parsed = IpcHandleMessage::Parse(serialized);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(std::string(parsed->handle.reserved, 64), std::string(message.handle.reserved, 64));
  EXPECT_EQ(parsed->offset, message.offset);
  EXPECT_EQ(parsed->bytes, message.bytes);
  EXPECT_EQ(parsed->device_uuid, message.device_uuid);
  EXPECT_EQ(parsed->exporter_pid, 4242u);
}

TEST(IpcHandleMessageTest, IsLittleEndianOnTheWire) {
  const std::string serialized = SampleMessage().Serialize();
  EXPECT_EQ(static_cast<unsigned char>(serialized[72]), 0x00);
  EXPECT_EQ(static_cast<unsigned char>(serialized[73]), 0x45);
  EXPECT_EQ(static_cast<unsigned char>(serialized[74]), 0x23);
  EXPECT_EQ(static_cast<unsigned char>(serialized[104]), 4242 & 0xFF);
}

TEST(IpcHandleMessageTest, RejectsGarbageTruncationAndNewerVersions) {
  std::string serialized = SampleMessage().Serialize();
  EXPECT_EQ(IpcHandleMessage::Parse("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IpcHandleMessage::Parse(std::string(112, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IpcHandleMessage::Parse(serialized.substr(0, 111)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IpcHandleMessage::Parse(serialized + "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  serialized[4] = 2;
  EXPECT_EQ(IpcHandleMessage::Parse(serialized).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(ImportedIpcBufferTest, RefusesAHandleOfThisProcessBeforeAnyCudaCall) {
  IpcHandleMessage message = SampleMessage();
  message.exporter_pid = static_cast<uint64_t>(getpid());
  auto opened = ImportedIpcBuffer::Open(message.Serialize());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition) << opened.status();
}

TEST(DeviceCrcTreeTest, EmptyBufferNeedsNoDevice) {
  auto digest = DeviceCrcTree(nullptr, 0, nullptr);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, 0u);
}

// On a GPU: the device digest equals the host digest of the same bytes, for
// sizes around the chunk and piece boundaries and for an unaligned start.
TEST(DeviceCrcTreeTest, EqualsHostDigestOnTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here";
  const size_t capacity = 3 * kCrcTreeChunkBytes + 4096 + 64;
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, capacity), cudaSuccess);
  ASSERT_TRUE(EnqueueFillPattern(device, capacity, 7, nullptr).ok());
  std::vector<char> host(capacity);
  ASSERT_EQ(cudaMemcpy(host.data(), device, capacity, cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint64_t i = 0; i < 4096; ++i)
    ASSERT_EQ(static_cast<unsigned char>(host[i]), PatternByte(7, i));
  for (size_t start : {size_t{0}, size_t{1}, size_t{16}}) {
    for (size_t size :
         {size_t{1}, size_t{63}, size_t{4096}, size_t{4097}, kCrcTreeChunkBytes - 1,
          kCrcTreeChunkBytes, kCrcTreeChunkBytes + 1, 3 * kCrcTreeChunkBytes + 4096}) {
      auto digest = DeviceCrcTree(static_cast<char*>(device) + start, size, nullptr);
      ASSERT_TRUE(digest.ok()) << digest.status();
      EXPECT_EQ(*digest, CrcTree32c(absl::string_view(host.data() + start, size)))
          << "start " << start << " size " << size;
    }
  }
  cudaFree(device);
}

TEST(DeviceInfoTest, ReportsTheGpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here";
  auto info = GetCudaDeviceInfo(0);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->name.empty());
  EXPECT_GT(info->multiprocessor_count, 0);
  EXPECT_EQ(info->uuid.size(), 32u);
  auto bandwidth = MeasureDeviceBandwidth(64 << 20, 2);
  ASSERT_TRUE(bandwidth.ok()) << bandwidth.status();
  EXPECT_GT(bandwidth->best_gb_per_s, 0);
}

TEST(ExportIpcHandleTest, RecordsTheOffsetWithinTheAllocation) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here";
  void* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 1 << 20), cudaSuccess);
  auto handle = ExportIpcHandle(static_cast<char*>(device) + 4096, 1000);
  ASSERT_TRUE(handle.ok()) << handle.status();
  auto message = IpcHandleMessage::Parse(*handle);
  ASSERT_TRUE(message.ok()) << message.status();
  EXPECT_EQ(message->offset, 4096u);
  EXPECT_EQ(message->bytes, 1000u);
  EXPECT_EQ(ExportIpcHandle(static_cast<char*>(device) + 4096, 1 << 20).status().code(),
            absl::StatusCode::kInvalidArgument);
  cudaFree(device);
}

}  // namespace
}  // namespace sluice
