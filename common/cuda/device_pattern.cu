#include <algorithm>

#include "common/cuda/cuda_status.h"
#include "common/cuda/device_pattern.h"

namespace sluice {
namespace {

__host__ __device__ inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Word w covers bytes [8w, 8w + 8) of the buffer (whatever its alignment).
__global__ void FillPatternKernel(unsigned char* data, size_t bytes, uint64_t seed, bool aligned8) {
  const size_t words = (bytes + 7) / 8;
  for (size_t w = blockIdx.x * size_t{blockDim.x} + threadIdx.x; w < words;
       w += size_t{gridDim.x} * blockDim.x) {
    const uint64_t value = SplitMix64(seed + w);
    const size_t begin = w * 8;
    if (aligned8 && begin + 8 <= bytes) {
      reinterpret_cast<uint64_t*>(data)[w] = value;
    } else {
      for (size_t i = begin; i < bytes && i < begin + 8; ++i) {
        data[i] = static_cast<unsigned char>(value >> (8 * (i - begin)));
      }
    }
  }
}

}  // namespace

absl::Status EnqueueFillPattern(void* device_ptr, size_t bytes, uint64_t seed,
                                cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  if (device_ptr == nullptr) return absl::InvalidArgumentError("EnqueueFillPattern: null pointer");
  constexpr unsigned kThreads = 256;
  // Enough blocks to fill any GPU; the grid-stride loop does the rest.
  const size_t words = (bytes + 7) / 8;
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>((words + kThreads - 1) / kThreads, 65536));
  FillPatternKernel<<<blocks, kThreads, 0, stream>>>(
      static_cast<unsigned char*>(device_ptr), bytes, seed,
      reinterpret_cast<uintptr_t>(device_ptr) % 8 == 0);
  return CudaStatus(cudaGetLastError(), "filling a device buffer with the test pattern");
}

unsigned char PatternByte(uint64_t seed, uint64_t index) {
  return static_cast<unsigned char>(SplitMix64(seed + index / 8) >> (8 * (index % 8)));
}

}  // namespace sluice
