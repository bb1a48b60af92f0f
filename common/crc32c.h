#ifndef SLUICE_COMMON_CRC32C_H_
#define SLUICE_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace sluice {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by the weight
// stream's per-chunk checksums. Debian's Abseil (20220623) predates
// absl::crc32c, so this is a small slicing-by-8 table implementation
// (~1 GB/s, far above loopback weight-transfer rates). Extend a running value
// by passing it as `crc`: Crc32c(b, Crc32c(a)) == Crc32c(a + b).
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

}  // namespace sluice

#endif  // SLUICE_COMMON_CRC32C_H_
