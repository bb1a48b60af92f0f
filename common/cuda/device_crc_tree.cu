#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/cuda/crc32c_combine.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/device_crc_tree.h"
#include "common/cuda/weight_digest.h"

namespace sluice {
namespace {

constexpr int kThreadsPerBlock = 256;
constexpr int kTreeLevels = 8;                                           // log2(kThreadsPerBlock)
constexpr uint32_t kPieceBytes = kCrcTreeChunkBytes / kThreadsPerBlock;  // 4 KiB
static_assert(kPieceBytes * kThreadsPerBlock == kCrcTreeChunkBytes);
static_assert((1 << kTreeLevels) == kThreadsPerBlock);
// Blocks per SM in the grid-stride launch: 8 x 256 threads fill an SM, and
// the ~10 KiB of shared memory per block fit 8 times over.
constexpr int kBlocksPerSm = 8;

// x^(8 * kPieceBytes * 2^level) mod P: the shift past a full right subtree
// at each level of a block's tree, so full chunks never compute one.
struct TreeShifts {
  uint32_t by_level[kTreeLevels];
};

TreeShifts ComputeTreeShifts() {
  TreeShifts shifts;
  for (int level = 0; level < kTreeLevels; ++level) {
    shifts.by_level[level] = crc32c_math::XPow8nModP(uint64_t{kPieceBytes} << level);
  }
  return shifts;
}

__device__ __forceinline__ size_t MinSize(size_t a, size_t b) { return a < b ? a : b; }

// Slicing-by-8 over one 8-byte little-endian word (lo, hi), as crc32c.cc's
// portable path.
__device__ __forceinline__ uint32_t Step8(const uint32_t (*table)[256], uint32_t crc, uint32_t lo,
                                          uint32_t hi) {
  lo ^= crc;
  return table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^
         table[4][lo >> 24] ^ table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^
         table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
}

__device__ __forceinline__ uint32_t Step1(const uint32_t (*table)[256], uint32_t crc,
                                          unsigned char byte) {
  return table[0][(crc ^ byte) & 0xFF] ^ (crc >> 8);
}

// One block per chunk at a time (grid-stride over chunks). kAligned16: the
// buffer starts 16-byte aligned, so each piece (at a multiple of 4 KiB) can
// be read as uint4.
template <bool kAligned16>
__global__ void __launch_bounds__(kThreadsPerBlock)
    ChunkCrcKernel(const unsigned char* __restrict__ data, size_t bytes,
                   uint32_t* __restrict__ chunk_crcs, size_t chunk_count, TreeShifts shifts) {
  __shared__ uint32_t table[8][256];
  __shared__ uint32_t piece_crc[kThreadsPerBlock];
  __shared__ uint32_t piece_length[kThreadsPerBlock];
  const int thread = threadIdx.x;

  // The tables, built once per block: 8 dependent rounds of 256 entries.
  {
    uint32_t c = thread;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ crc32c_math::kPolynomial : c >> 1;
    table[0][thread] = c;
  }
  __syncthreads();
  for (int s = 1; s < 8; ++s) {
    const uint32_t previous = table[s - 1][thread];
    table[s][thread] = (previous >> 8) ^ table[0][previous & 0xFF];
    __syncthreads();
  }

  for (size_t chunk = blockIdx.x; chunk < chunk_count; chunk += gridDim.x) {
    const size_t chunk_begin = chunk * kCrcTreeChunkBytes;
    const size_t chunk_length = MinSize(kCrcTreeChunkBytes, bytes - chunk_begin);
    const size_t piece_begin = size_t{kPieceBytes} * thread;
    const uint32_t length =
        chunk_length > piece_begin
            ? static_cast<uint32_t>(MinSize(kPieceBytes, chunk_length - piece_begin))
            : 0;
    const unsigned char* piece = data + chunk_begin + piece_begin;

    uint32_t crc = ~0u;
    uint32_t done = 0;
    if (kAligned16) {
      // 64 bytes (two full 32-byte sectors) per iteration: the four loads go
      // out together, and the sectors' other halves hit L1.
      const uint4* words = reinterpret_cast<const uint4*>(piece);
      const uint32_t groups = length / 64;
      for (uint32_t g = 0; g < groups; ++g) {
        uint4 v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = words[4 * g + k];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          crc = Step8(table, crc, v[k].x, v[k].y);
          crc = Step8(table, crc, v[k].z, v[k].w);
        }
      }
      done = groups * 64;
    }
    for (; done < length; ++done) crc = Step1(table, crc, piece[done]);
    crc = ~crc;

    // The block's tree: at each level, a left subtree absorbs its right
    // neighbour, shifted past the neighbour's length.
    __syncthreads();  // The previous chunk's tree is done with the arrays.
    piece_crc[thread] = crc;
    piece_length[thread] = length;
    __syncthreads();
    for (int level = 0; level < kTreeLevels; ++level) {
      const int stride = 1 << level;
      if ((thread & (2 * stride - 1)) == 0) {
        const uint32_t right_length = piece_length[thread + stride];
        const uint32_t shift = right_length == (kPieceBytes << level)
                                   ? shifts.by_level[level]
                                   : crc32c_math::XPow8nModP(right_length);
        piece_crc[thread] =
            crc32c_math::CombineWithShift(piece_crc[thread], piece_crc[thread + stride], shift);
        piece_length[thread] += right_length;
      }
      __syncthreads();
    }
    if (thread == 0) chunk_crcs[chunk] = piece_crc[0];
  }
}

}  // namespace

absl::Status EnqueueDeviceChunkCrcs(const void* device_ptr, size_t bytes,
                                    uint32_t* device_chunk_crcs, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  if (device_ptr == nullptr || device_chunk_crcs == nullptr) {
    return absl::InvalidArgumentError("EnqueueDeviceChunkCrcs: null device pointer");
  }
  static const TreeShifts shifts = ComputeTreeShifts();
  int device = 0;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device), "device CRC tree: cudaGetDevice");
  int sm_count = 0;
  SLUICE_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device),
      "device CRC tree: reading the SM count");
  const size_t chunk_count = CrcTreeChunkCount(bytes);
  const unsigned blocks = static_cast<unsigned>(
      std::min<size_t>(chunk_count, static_cast<size_t>(std::max(sm_count, 1)) * kBlocksPerSm));
  const auto* data = static_cast<const unsigned char*>(device_ptr);
  if (reinterpret_cast<uintptr_t>(device_ptr) % 16 == 0) {
    ChunkCrcKernel<true><<<blocks, kThreadsPerBlock, 0, stream>>>(data, bytes, device_chunk_crcs,
                                                                  chunk_count, shifts);
  } else {
    ChunkCrcKernel<false><<<blocks, kThreadsPerBlock, 0, stream>>>(data, bytes, device_chunk_crcs,
                                                                   chunk_count, shifts);
  }
  return CudaStatus(cudaGetLastError(), "device CRC tree: launching the chunk kernel");
}

absl::StatusOr<uint32_t> DeviceCrcTree(const void* device_ptr, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return CrcTree32cFromChunkCrcs({});
  const size_t chunk_count = CrcTreeChunkCount(bytes);
  uint32_t* device_chunk_crcs = nullptr;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaMallocAsync(reinterpret_cast<void**>(&device_chunk_crcs),
                                              chunk_count * sizeof(uint32_t), stream),
                              "device CRC tree: allocating the chunk CRCs");
  std::vector<uint32_t> chunk_crcs(chunk_count);
  const absl::Status enqueue_status =
      EnqueueDeviceChunkCrcs(device_ptr, bytes, device_chunk_crcs, stream);
  // (Fresh variables rather than reassigning a Status: nvcc's front end warns
  // on the assignment of an ABSL_MUST_USE_RESULT type.)
  const absl::Status copy_status =
      enqueue_status.ok() ? CudaStatus(cudaMemcpyAsync(chunk_crcs.data(), device_chunk_crcs,
                                                       chunk_count * sizeof(uint32_t),
                                                       cudaMemcpyDeviceToHost, stream),
                                       "device CRC tree: copying the chunk CRCs to the host")
                          : enqueue_status;
  // Freed in stream order whatever happened above, then waited for.
  const absl::Status free_status =
      CudaStatus(cudaFreeAsync(device_chunk_crcs, stream), "device CRC tree: freeing scratch");
  const absl::Status sync_status =
      CudaStatus(cudaStreamSynchronize(stream), "device CRC tree: waiting for the stream");
  if (!copy_status.ok()) return copy_status;
  if (!free_status.ok()) return free_status;
  if (!sync_status.ok()) return sync_status;
  return CrcTree32cFromChunkCrcs(chunk_crcs);
}

}  // namespace sluice
