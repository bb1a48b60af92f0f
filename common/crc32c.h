#ifndef SLUICE_COMMON_CRC32C_H_
#define SLUICE_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace sluice {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as used by the weight
// stream's per-chunk checksums. Debian's Abseil (20220623) predates
// absl::crc32c, so this is our own: the SSE4.2 crc32 instruction where the
// CPU has it (~8 GB/s; every receiver of a weight version checks each byte,
// so at the rate of a loopback transfer the ~1.5 GB/s of tables would be
// the bottleneck), else a slicing-by-8 table. Extend a running value by
// passing it as `crc`: Crc32c(b, Crc32c(a)) == Crc32c(a + b).
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

// The table implementation, whatever the CPU (for tests and comparison).
uint32_t Crc32cPortable(absl::string_view data, uint32_t crc = 0);

}  // namespace sluice

#endif  // SLUICE_COMMON_CRC32C_H_
