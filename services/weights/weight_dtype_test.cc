#include "services/weights/weight_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice::weights {
namespace {

std::string Float32Bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * 4, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(WeightDtypeTest, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(Float32ToBfloat16(1.0f), 0x3F80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to even.
  EXPECT_EQ(Float32ToBfloat16(1.0f + 0x1.0p-8f), 0x3F80);
  EXPECT_EQ(Float32ToBfloat16(1.0f + 3 * 0x1.0p-8f), 0x3F82);
  EXPECT_EQ(Float32ToBfloat16(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3F81);
  EXPECT_TRUE(std::isnan(Bfloat16ToFloat32(Float32ToBfloat16(std::nanf("")))));
  EXPECT_EQ(Bfloat16ToFloat32(Float32ToBfloat16(-2.5f)), -2.5f);
}

TEST(WeightDtypeTest, Float16RoundsToNearestEvenWithSubnormals) {
  EXPECT_EQ(Float32ToFloat16(1.0f), 0x3C00);
  EXPECT_EQ(Float32ToFloat16(1.0f + 0x1.0p-11f), 0x3C00);  // a tie: even
  EXPECT_EQ(Float32ToFloat16(1.0f + 3 * 0x1.0p-11f), 0x3C02);
  EXPECT_EQ(Float32ToFloat16(65504.0f), 0x7BFF);
  EXPECT_EQ(Float32ToFloat16(0x1.0p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(Float16ToFloat32(0x0001), 0x1.0p-24f);
  EXPECT_EQ(Float16ToFloat32(0xC000), -2.0f);
  for (float x : {0.0f, -0.0f, 0.1f, -3.75f, 1e-6f, 1234.5f}) {
    const float back = Float16ToFloat32(Float32ToFloat16(x));
    EXPECT_NEAR(back, x, std::fabs(x) * 0x1.0p-11f + 0x1.0p-25f) << x;
  }
}

TEST(WeightDtypeTest, ConvertsWholeTensorsBothWays) {
  const std::vector<float> values = {0.0f, 1.0f, -0.015625f, 3.0e-3f, 100.0f};
  for (v1::DType dtype : {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16, v1::DTYPE_FLOAT32}) {
    absl::StatusOr<std::string> narrow = Float32BytesTo(dtype, Float32Bytes(values));
    ASSERT_TRUE(narrow.ok()) << narrow.status();
    EXPECT_EQ(narrow->size(), values.size() * WeightDtypeSize(dtype));
    absl::StatusOr<std::string> wide = BytesToFloat32(dtype, *narrow);
    ASSERT_TRUE(wide.ok());
    ASSERT_EQ(wide->size(), values.size() * 4);
    std::vector<float> back(values.size());
    std::memcpy(back.data(), wide->data(), wide->size());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_NEAR(back[i], values[i], std::fabs(values[i]) / 128) << v1::DType_Name(dtype);
    }
  }
}

TEST(WeightDtypeTest, RefusesOverflowWrongSizesAndOtherDtypes) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      Float32BytesTo(v1::DTYPE_FLOAT16, Float32Bytes({1.0f, 70000.0f})).status()));
  EXPECT_TRUE(Float32BytesTo(v1::DTYPE_BFLOAT16, Float32Bytes({70000.0f})).ok());
  // Infinity in, infinity out (the trainer refuses non-finite weights first).
  EXPECT_TRUE(
      Float32BytesTo(v1::DTYPE_FLOAT16, Float32Bytes({std::numeric_limits<float>::infinity()}))
          .ok());
  EXPECT_TRUE(absl::IsInvalidArgument(Float32BytesTo(v1::DTYPE_BFLOAT16, "abc").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Float32BytesTo(v1::DTYPE_INT8, "abcd").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BytesToFloat32(v1::DTYPE_BFLOAT16, "abc").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BytesToFloat32(v1::DTYPE_INT64, "abcdefgh").status()));
  EXPECT_EQ(WeightDtypeSize(v1::DTYPE_INT32), 0);
}

}  // namespace
}  // namespace sluice::weights
