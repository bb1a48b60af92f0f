// The CRC tree digest (weight_digest.h) of bytes in GPU memory, computed on
// the GPU: a rollout worker checks a weight version that arrived by CUDA IPC
// or NCCL without copying it to the host. Bit for bit the host's CrcTree32c of
// the same bytes.
//
// How: one thread block per 1 MiB chunk (a grid-stride loop over chunks);
// each of its 256 threads CRCs a 4 KiB piece with slicing-by-8 tables held in
// shared memory, and the block folds the 256 piece CRCs into the chunk's CRC
// with the GF(2) combine of crc32c_combine.h in an 8-level tree. The chunk
// CRCs (4 bytes per MiB) come back to the host, which finishes the digest.
//
// Equality with the host digest is checked by sluice_cuda_test (sizes around
// the piece and chunk boundaries, unaligned starts) and cuda_weight_handoff_check
// (988 MB and 3087 MB); both passed on one H200 (driver 580.159.04, CUDA 13.0, sm_90 build),
// where the kernel ran at ~1.4-1.5 TB/s, ~70% of the read bandwidth a
// device-to-device copy reaches there.
#ifndef SLUICE_COMMON_CUDA_DEVICE_CRC_TREE_H_
#define SLUICE_COMMON_CUDA_DEVICE_CRC_TREE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice {

// Enqueues on `stream` the computation of the CrcTreeChunkCount(bytes) chunk
// CRCs of `device_ptr[0, bytes)` into `device_chunk_crcs` (device memory of
// that many uint32_t). Does not wait. Any alignment of `device_ptr` works;
// 16-byte-aligned pointers take the fast path. Errors: INVALID_ARGUMENT for a
// null pointer with bytes > 0; a launch failure's CudaStatus.
absl::Status EnqueueDeviceChunkCrcs(const void* device_ptr, size_t bytes,
                                    uint32_t* device_chunk_crcs, cudaStream_t stream);

// The raw CRC tree digest of `device_ptr[0, bytes)` (format with
// FormatCrcTree32c). Blocks until `stream` has finished everything enqueued
// on it before and the digest is done; the memory must not change meanwhile.
// Uses CrcTreeChunkCount(bytes) * 4 bytes of scratch device memory, freed
// before it returns. An empty buffer gives 0 without touching the device.
// Thread-safe (CUDA's own locking); the device is the current one.
absl::StatusOr<uint32_t> DeviceCrcTree(const void* device_ptr, size_t bytes, cudaStream_t stream);

}  // namespace sluice

#endif  // SLUICE_COMMON_CUDA_DEVICE_CRC_TREE_H_
