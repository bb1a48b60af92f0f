#include "services/weights/weight_delta.h"

#include <cstring>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "services/weights/weight_dtype.h"

namespace sluice::weights {
namespace {

// `n` random bf16 weights around N(0, 0.02), as a model's.
std::string RandomBf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::string bytes(2 * n, '\0');
  for (size_t i = 0; i < n; ++i) {
    const uint16_t v = Float32ToBfloat16(normal(rng));
    std::memcpy(bytes.data() + 2 * i, &v, 2);
  }
  return bytes;
}

// `base` with `fraction` of its elements changed: an Adam-like nudge of a
// few ulps at random positions (each element independently).
std::string Changed(const std::string& base, double fraction, uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution pick(fraction);
  std::string out = base;
  for (size_t i = 0; i < base.size() / 2; ++i) {
    if (!pick(rng)) continue;
    uint16_t v;
    std::memcpy(&v, out.data() + 2 * i, 2);
    v ^= 1 + (rng() % 3);  // a different bit pattern, always
    std::memcpy(out.data() + 2 * i, &v, 2);
  }
  return out;
}

class WeightDeltaRoundTripTest : public ::testing::TestWithParam<double> {};

TEST_P(WeightDeltaRoundTripTest, AppliesToTheExactTargetBytesOrFallsBackToFull) {
  const double fraction = GetParam();
  const std::string base = RandomBf16(100000, 1);
  const std::string target = Changed(base, fraction, 2);
  absl::StatusOr<EncodedTensor> encoded = EncodeTensorDelta(base, target);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  if (fraction <= 0.05) {
    ASSERT_EQ(encoded->encoding, v1::TENSOR_ENCODING_SPARSE_DELTA);
    // 3-4 bytes per scattered change (a 1-2 byte gap and the value) against
    // 2 per element in full.
    EXPECT_LT(encoded->bytes.size(), 64 + 4 * fraction * 100000);
  }
  if (fraction >= 0.5) {
    // Over half of the full size: not worth it.
    EXPECT_EQ(encoded->encoding, v1::TENSOR_ENCODING_FULL);
    EXPECT_TRUE(encoded->bytes.empty());
    return;
  }
  // At 30% changed, adjacent changes share runs: still under half.
  EXPECT_LE(encoded->bytes.size(), target.size() / 2);
  absl::StatusOr<std::string> applied = ApplyTensorDelta(base, encoded->bytes);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_TRUE(*applied == target);
}

INSTANTIATE_TEST_SUITE_P(ChangedFraction, WeightDeltaRoundTripTest,
                         ::testing::Values(0.0, 0.01, 0.05, 0.3, 1.0));

TEST(WeightDeltaTest, RunsOfChangesAndTheEdgesOfTheTensorRoundTrip) {
  const std::string base = RandomBf16(5000, 3);
  std::string target = base;
  // The first and last element, a long run, adjacent runs one apart.
  for (size_t i : {size_t{0}, size_t{4999}}) target[2 * i] ^= 1;
  for (size_t i = 100; i < 1100; ++i) target[2 * i + 1] ^= 0x10;
  target[2 * 1101] ^= 1;
  absl::StatusOr<EncodedTensor> encoded = EncodeTensorDelta(base, target);
  ASSERT_TRUE(encoded.ok());
  ASSERT_EQ(encoded->encoding, v1::TENSOR_ENCODING_SPARSE_DELTA);
  // A run costs ~2 bytes per element, not 3.
  EXPECT_LT(encoded->bytes.size(), 2 * 1003 + 40);
  absl::StatusOr<std::string> applied = ApplyTensorDelta(base, encoded->bytes);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_TRUE(*applied == target);
}

TEST(WeightDeltaTest, EmptyAndUnchangedTensors) {
  absl::StatusOr<EncodedTensor> empty = EncodeTensorDelta("", "");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->encoding, v1::TENSOR_ENCODING_FULL);
  const std::string base = RandomBf16(1000, 4);
  absl::StatusOr<EncodedTensor> same = EncodeTensorDelta(base, base);
  ASSERT_TRUE(same.ok());
  ASSERT_EQ(same->encoding, v1::TENSOR_ENCODING_SPARSE_DELTA);
  EXPECT_LE(same->bytes.size(), 16u);
  EXPECT_TRUE(*ApplyTensorDelta(base, same->bytes) == base);
}

TEST(WeightDeltaTest, RefusesMismatchedOrOddInputs) {
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeTensorDelta("abcd", "abcdef").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeTensorDelta("abc", "abd").status()));
}

class WeightDeltaCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = RandomBf16(20000, 5);
    target_ = Changed(base_, 0.02, 6);
    delta_ = EncodeTensorDelta(base_, target_)->bytes;
    ASSERT_GT(delta_.size(), 100u);
  }
  absl::Status Apply(const std::string& base, const std::string& delta) {
    return ApplyTensorDelta(base, delta).status();
  }
  std::string base_, target_, delta_;
};

TEST_F(WeightDeltaCorruptionTest, EveryTruncationIsRefused) {
  for (size_t n = 0; n < delta_.size(); ++n) {
    const absl::Status status = Apply(base_, delta_.substr(0, n));
    ASSERT_TRUE(absl::IsDataLoss(status)) << n << ": " << status;
  }
  EXPECT_TRUE(absl::IsDataLoss(Apply(base_, delta_ + "x"))) << "trailing bytes";
}

TEST_F(WeightDeltaCorruptionTest, AWrongBaseIsRefusedNamingIt) {
  std::string other = base_;
  other[10] ^= 1;
  const absl::Status status = Apply(other, delta_);
  EXPECT_TRUE(absl::IsDataLoss(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "wrong base")) << status;
  EXPECT_TRUE(absl::IsDataLoss(Apply(base_.substr(0, 2000), delta_))) << "another size";
}

TEST_F(WeightDeltaCorruptionTest, OutOfRangePositionsAreRefused) {
  // Header: magic (3), base CRC (4), then varints n, changed, runs.
  std::string delta(delta_.substr(0, 7));
  delta += std::string("\x0a\x01\x01", 3);  // 10 elements, 1 changed, 1 run
  delta += std::string("\x14", 1);          // gap 10: the element after the last
  delta += "zz";
  std::string base(20, '\0');
  // Make the base CRC match this small base.
  const uint32_t crc = Crc32c(base);
  for (int i = 0; i < 4; ++i) delta[3 + i] = static_cast<char>((crc >> (8 * i)) & 0xff);
  absl::Status status = Apply(base, delta);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "past element")) << status;
  delta[10] = '\x12';  // gap 9: the last element, fits
  EXPECT_TRUE(Apply(base, delta).ok());
  // A long run past the end, and a huge varint.
  delta[10] = '\x11';  // gap 8, long
  delta.insert(11, "\x7f");
  delta[9] = '\x01';
  status = Apply(base, delta);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  std::string huge = delta.substr(0, 10) + std::string(11, '\xff') + "\x01";
  EXPECT_TRUE(absl::IsDataLoss(Apply(base, huge)));
}

TEST_F(WeightDeltaCorruptionTest, RandomByteFlipsNeverCrashAndNeverPassUnnoticed) {
  std::mt19937 rng(7);
  const uint32_t target_crc = Crc32c(target_);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string delta = delta_;
    delta[rng() % delta.size()] ^= static_cast<char>(1 + rng() % 255);
    absl::StatusOr<std::string> applied = ApplyTensorDelta(base_, delta);
    // A flip in the values section applies, and the tensor's CRC32C catches it.
    if (applied.ok()) {
      EXPECT_NE(Crc32c(*applied), target_crc);
    }
  }
}

TEST(WeightDeltaDecodeTest, ChecksTheResultAgainstItsSpec) {
  const std::string base = RandomBf16(3000, 8);
  const std::string target = Changed(base, 0.01, 9);
  v1::TensorSpec spec;
  spec.set_name("layers.0.w");
  spec.set_dtype(v1::DTYPE_BFLOAT16);
  spec.set_size_bytes(static_cast<int64_t>(target.size()));
  spec.set_crc32c(Crc32c(target));
  spec.set_encoding(v1::TENSOR_ENCODING_SPARSE_DELTA);
  const std::string delta = EncodeTensorDelta(base, target)->bytes;
  absl::StatusOr<std::string> decoded = DecodeTensor(spec, base, delta);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_TRUE(*decoded == target);
  spec.set_crc32c(spec.crc32c() ^ 1);
  const absl::Status status = DecodeTensor(spec, base, delta).status();
  EXPECT_TRUE(absl::IsDataLoss(status));
  EXPECT_TRUE(absl::StrContains(status.message(), "layers.0.w")) << status;
  spec.set_encoding(v1::TENSOR_ENCODING_FULL);
  spec.set_crc32c(Crc32c(target));
  EXPECT_TRUE(*DecodeTensor(spec, "", target) == target);
  EXPECT_TRUE(absl::IsDataLoss(DecodeTensor(spec, "", target.substr(2)).status()));
}

}  // namespace
}  // namespace sluice::weights
