#include "common/cuda/weight_digest.h"

#include <vector>

#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace sluice {

uint32_t CrcTree32c(absl::string_view bytes) {
  std::vector<uint32_t> chunk_crcs;
  chunk_crcs.reserve(CrcTreeChunkCount(bytes.size()));
  for (size_t offset = 0; offset < bytes.size(); offset += kCrcTreeChunkBytes) {
    chunk_crcs.push_back(Crc32c(bytes.substr(offset, kCrcTreeChunkBytes)));
  }
  return CrcTree32cFromChunkCrcs(chunk_crcs);
}

uint32_t CrcTree32cFromChunkCrcs(absl::Span<const uint32_t> chunk_crcs) {
  // Little-endian whatever the host, so that the digest is a property of the
  // bytes and not of the machine that computed it.
  std::string serialized(chunk_crcs.size() * 4, '\0');
  for (size_t i = 0; i < chunk_crcs.size(); ++i) {
    for (int b = 0; b < 4; ++b) {
      serialized[i * 4 + b] = static_cast<char>((chunk_crcs[i] >> (8 * b)) & 0xFF);
    }
  }
  return Crc32c(serialized);
}

std::string FormatCrcTree32c(uint32_t digest) { return absl::StrFormat("crctree32c:%08x", digest); }

std::string CrcTree32cDigest(absl::string_view bytes) {
  return FormatCrcTree32c(CrcTree32c(bytes));
}

}  // namespace sluice
