#include "services/weights/weight_dtype.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace sluice::weights {

namespace {

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

}  // namespace

int WeightDtypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_BFLOAT16:
    case v1::DTYPE_FLOAT16:
      return 2;
    default:
      return 0;
  }
}

// As c10::BFloat16's round_to_nearest_even.
uint16_t Float32ToBfloat16(float value) {
  if (std::isnan(value)) return 0x7FC0;
  const uint32_t bits = Bits(value);
  const uint32_t rounding_bias = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float Bfloat16ToFloat32(uint16_t value) { return FromBits(static_cast<uint32_t>(value) << 16); }

// As c10::detail::fp16_ieee_from_fp32_value (from Maratyszcza's FP16):
// rounding done by the FPU's float32 addition, which rounds to nearest even.
uint16_t Float32ToFloat16(float value) {
  constexpr float kScaleToInf = 0x1.0p+112f;
  constexpr float kScaleToZero = 0x1.0p-110f;
  float base = (std::fabs(value) * kScaleToInf) * kScaleToZero;
  const uint32_t w = Bits(value);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = Bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

// As c10::detail::fp16_ieee_to_fp32_value.
float Float16ToFloat32(uint16_t value) {
  const uint32_t w = static_cast<uint32_t>(value) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  constexpr uint32_t kExpOffset = 0xE0u << 23;
  constexpr float kExpScale = 0x1.0p-112f;
  const float normalized = FromBits((two_w >> 4) + kExpOffset) * kExpScale;
  constexpr uint32_t kMagicMask = 126u << 23;
  constexpr float kMagicBias = 0.5f;
  const float denormalized = FromBits((two_w >> 17) | kMagicMask) - kMagicBias;
  constexpr uint32_t kDenormalizedCutoff = 1u << 27;
  return FromBits(sign | (two_w < kDenormalizedCutoff ? Bits(denormalized) : Bits(normalized)));
}

absl::StatusOr<std::string> Float32BytesTo(v1::DType dtype, absl::string_view float32_bytes) {
  if (float32_bytes.size() % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(float32_bytes.size(), " bytes are not a whole number of float32 values"));
  }
  if (dtype == v1::DTYPE_FLOAT32) return std::string(float32_bytes);
  if (dtype != v1::DTYPE_BFLOAT16 && dtype != v1::DTYPE_FLOAT16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights do not travel as ", v1::DType_Name(dtype), " (FLOAT32, BFLOAT16 or FLOAT16)"));
  }
  const size_t n = float32_bytes.size() / 4;
  std::string out(n * 2, '\0');
  const bool bf16 = dtype == v1::DTYPE_BFLOAT16;
  for (size_t i = 0; i < n; ++i) {
    float value;
    std::memcpy(&value, float32_bytes.data() + 4 * i, 4);
    const uint16_t half = bf16 ? Float32ToBfloat16(value) : Float32ToFloat16(value);
    if (std::isfinite(value)) {
      // An infinite result: the exponent field is all ones, the mantissa 0.
      const bool overflow = bf16 ? (half & 0x7FFF) == 0x7F80 : (half & 0x7FFF) == 0x7C00;
      if (overflow) {
        return absl::InvalidArgumentError(absl::StrCat(
            "element ", i, " (", value, ") is beyond the range of ", v1::DType_Name(dtype)));
      }
    }
    std::memcpy(out.data() + 2 * i, &half, 2);
  }
  return out;
}

absl::StatusOr<std::string> BytesToFloat32(v1::DType dtype, absl::string_view bytes) {
  const int size = WeightDtypeSize(dtype);
  if (size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights do not travel as ", v1::DType_Name(dtype), " (FLOAT32, BFLOAT16 or FLOAT16)"));
  }
  if (bytes.size() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        bytes.size(), " bytes are not a whole number of ", v1::DType_Name(dtype), " values"));
  }
  if (dtype == v1::DTYPE_FLOAT32) return std::string(bytes);
  const size_t n = bytes.size() / 2;
  std::string out(n * 4, '\0');
  const bool bf16 = dtype == v1::DTYPE_BFLOAT16;
  for (size_t i = 0; i < n; ++i) {
    uint16_t half;
    std::memcpy(&half, bytes.data() + 2 * i, 2);
    const float value = bf16 ? Bfloat16ToFloat32(half) : Float16ToFloat32(half);
    std::memcpy(out.data() + 4 * i, &value, 4);
  }
  return out;
}

}  // namespace sluice::weights
