// A deterministic byte pattern written by a kernel at device bandwidth, for
// checks and benchmarks that need gigabytes of known, non-trivial content on
// a GPU (cuda_weight_handoff_check) without a host-to-device copy.
//
// Byte i of the pattern of `seed` is byte (i % 8) of the little-endian
// SplitMix64(seed + i / 8): PatternByte computes it on the host.
//
// Ran on one H200 (driver 580.159.04, CUDA 13.0, sm_90 build).
#ifndef SLUICE_COMMON_CUDA_DEVICE_PATTERN_H_
#define SLUICE_COMMON_CUDA_DEVICE_PATTERN_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace sluice {

// Enqueues the fill of `device_ptr[0, bytes)` on `stream`; does not wait.
// Any alignment works (8-byte-aligned pointers take the fast path).
absl::Status EnqueueFillPattern(void* device_ptr, size_t bytes, uint64_t seed, cudaStream_t stream);

// Byte `index` of the pattern of `seed`, on the host.
unsigned char PatternByte(uint64_t seed, uint64_t index);

}  // namespace sluice

#endif  // SLUICE_COMMON_CUDA_DEVICE_PATTERN_H_
