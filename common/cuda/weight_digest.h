// The "CRC tree" digest of a weight version's bytes, computed the same way on
// the host (here) and on a GPU (device_crc_tree.h), so that a rollout worker
// that received a version over CUDA IPC or NCCL can check it without copying
// it to the host first.
//
// Why a tree and not one CRC32C of the whole buffer: a CRC is a sequential
// fold, so one CRC of 3 GB is one long dependency chain. Cut into fixed 1 MiB
// chunks, every chunk's CRC is independent (one thread block per chunk on a
// GPU, one core per range on a host), and the digest is the CRC32C of the
// chunk CRCs (4 bytes per MiB), which is cheap to finish on the host. The
// chunk size is part of the format: changing it changes every digest, so it
// is fixed here and named in the printed form.
//
// Format (version 1):
//   chunk_i   = Crc32c(bytes[i * 1 MiB, min((i + 1) * 1 MiB, size)))
//   raw       = Crc32c(le32(chunk_0) || le32(chunk_1) || ...)
//   printed   = "crctree32c:" + 8 lowercase hex digits of raw
// An empty buffer has no chunks, so its raw digest is Crc32c("") == 0.
//
// No CUDA here: this library is always built, and the device code links it to
// finish its digests.
#ifndef SLUICE_COMMON_CUDA_WEIGHT_DIGEST_H_
#define SLUICE_COMMON_CUDA_WEIGHT_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace sluice {

// The chunk size of the CRC tree (part of the digest's definition).
inline constexpr size_t kCrcTreeChunkBytes = size_t{1} << 20;

// Number of chunks of a buffer of `bytes` bytes: ceil(bytes / 1 MiB).
constexpr size_t CrcTreeChunkCount(size_t bytes) {
  return (bytes + kCrcTreeChunkBytes - 1) / kCrcTreeChunkBytes;
}

// The raw digest of `bytes`. O(n), at the speed of Crc32c (~8 GB/s with
// SSE4.2) on the calling thread. Thread-safe.
uint32_t CrcTree32c(absl::string_view bytes);

// The last step alone: the digest from the chunk CRCs, in order (what the
// device computes, or what a host computed in parallel). Thread-safe.
uint32_t CrcTree32cFromChunkCrcs(absl::Span<const uint32_t> chunk_crcs);

// "crctree32c:0123abcd".
std::string FormatCrcTree32c(uint32_t digest);

// FormatCrcTree32c(CrcTree32c(bytes)).
std::string CrcTree32cDigest(absl::string_view bytes);

}  // namespace sluice

#endif  // SLUICE_COMMON_CUDA_WEIGHT_DIGEST_H_
