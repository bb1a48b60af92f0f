#ifndef SLUICE_SERVICES_WEIGHTS_WEIGHT_DTYPE_H_
#define SLUICE_SERVICES_WEIGHTS_WEIGHT_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/common.pb.h"

namespace sluice::weights {

// The dtypes a weight version may be published and travel in
// (WeightSyncConfig.dtype), and conversions between their bytes and
// float32's, without LibTorch: the trainer publishes with them, the rollout
// worker and the trainer's rollout verifier load with them, so both read the
// same rounded weights. Little-endian bytes, row-major, as on the wire.

// Bytes per element of a weight dtype: 4 for FLOAT32, 2 for BFLOAT16 and
// FLOAT16; 0 for any other (not a weight transfer dtype).
int WeightDtypeSize(v1::DType dtype);

// float32 bytes rounded to `dtype` (FLOAT32: a copy), round-to-nearest-even
// as torch's `.to(torch::kBFloat16)` / `.to(torch::kHalf)` do; NaN stays NaN.
// INVALID_ARGUMENT when the byte count is not a multiple of 4, `dtype` is not
// a weight dtype, or a finite value would become infinite (a weight beyond
// float16's 65504). O(n).
absl::StatusOr<std::string> Float32BytesTo(v1::DType dtype, absl::string_view float32_bytes);

// `bytes` of `dtype` widened to float32 bytes (exact). INVALID_ARGUMENT when
// the byte count is not a multiple of the element size or `dtype` is not a
// weight dtype. O(n).
absl::StatusOr<std::string> BytesToFloat32(v1::DType dtype, absl::string_view bytes);

// One element, for tests and callers that convert values.
uint16_t Float32ToBfloat16(float value);
uint16_t Float32ToFloat16(float value);
float Bfloat16ToFloat32(uint16_t value);
float Float16ToFloat32(uint16_t value);

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_WEIGHT_DTYPE_H_
