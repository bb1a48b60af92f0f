#include "common/cuda/weight_digest.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/crc32c.h"
#include "common/cuda/crc32c_combine.h"
#include "gtest/gtest.h"

namespace sluice {
namespace {

// Byte i of the test pattern; the known answers below were computed from the
// same pattern by an independent bitwise CRC32C in Python.
std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  for (uint64_t i = 0; i < size; ++i) {
    bytes[i] = static_cast<char>((((i * 131 + 7) >> 3) ^ i) & 0xFF);
  }
  return bytes;
}

TEST(WeightDigestTest, KnownAnswers) {
  const std::string bytes = Pattern(kCrcTreeChunkBytes + 1);
  const absl::string_view view = bytes;
  EXPECT_EQ(CrcTree32c(""), 0x00000000u);  // No chunks: Crc32c of nothing.
  EXPECT_EQ(CrcTree32c(view.substr(0, 1)), 0x45727635u);
  EXPECT_EQ(CrcTree32c(view.substr(0, 1000)), 0x5c176a6au);
  EXPECT_EQ(CrcTree32c(view.substr(0, kCrcTreeChunkBytes)), 0x1a88e13du);
  EXPECT_EQ(CrcTree32c(view), 0x3e3c63c8u);
  EXPECT_EQ(CrcTree32c(Pattern(3 * kCrcTreeChunkBytes - 5)), 0x50e3f7b9u);
}

TEST(WeightDigestTest, FormatsWithSchemeAndEightHexDigits) {
  EXPECT_EQ(FormatCrcTree32c(0x1a88e13du), "crctree32c:1a88e13d");
  EXPECT_EQ(FormatCrcTree32c(0x5u), "crctree32c:00000005");
  EXPECT_EQ(CrcTree32cDigest(""), "crctree32c:00000000");
}

TEST(WeightDigestTest, ChunkCountRoundsUp) {
  EXPECT_EQ(CrcTreeChunkCount(0), 0u);
  EXPECT_EQ(CrcTreeChunkCount(1), 1u);
  EXPECT_EQ(CrcTreeChunkCount(kCrcTreeChunkBytes), 1u);
  EXPECT_EQ(CrcTreeChunkCount(kCrcTreeChunkBytes + 1), 2u);
}

TEST(WeightDigestTest, IsTheCrcOfTheLittleEndianChunkCrcs) {
  const std::string bytes = Pattern(2 * kCrcTreeChunkBytes + 17);
  const absl::string_view view = bytes;
  std::vector<uint32_t> chunk_crcs = {Crc32c(view.substr(0, kCrcTreeChunkBytes)),
                                      Crc32c(view.substr(kCrcTreeChunkBytes, kCrcTreeChunkBytes)),
                                      Crc32c(view.substr(2 * kCrcTreeChunkBytes))};
  std::string serialized;
  for (uint32_t crc : chunk_crcs) {
    for (int b = 0; b < 4; ++b) serialized.push_back(static_cast<char>(crc >> (8 * b)));
  }
  EXPECT_EQ(CrcTree32c(view), Crc32c(serialized));
  EXPECT_EQ(CrcTree32cFromChunkCrcs(chunk_crcs), Crc32c(serialized));
}

TEST(WeightDigestTest, OneByteFlipAnywhereChangesTheDigest) {
  std::string bytes = Pattern(2 * kCrcTreeChunkBytes + 3);
  const uint32_t original = CrcTree32c(bytes);
  for (size_t position : {size_t{0}, size_t{1}, kCrcTreeChunkBytes - 1, kCrcTreeChunkBytes,
                          kCrcTreeChunkBytes + 12345, 2 * kCrcTreeChunkBytes, bytes.size() - 1}) {
    for (unsigned char flip : {0x01, 0x80, 0xFF}) {
      bytes[position] = static_cast<char>(bytes[position] ^ flip);
      EXPECT_NE(CrcTree32c(bytes), original) << "position " << position << " flip " << int{flip};
      bytes[position] = static_cast<char>(bytes[position] ^ flip);
    }
  }
  EXPECT_EQ(CrcTree32c(bytes), original);
}

// The combine math that the device CRC tree runs in every thread block.
TEST(Crc32cCombineTest, CombinesToTheCrcOfTheConcatenation) {
  const std::string bytes = Pattern(10000);
  const absl::string_view view = bytes;
  for (size_t split :
       {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{9999}, size_t{10000}}) {
    const absl::string_view a = view.substr(0, split);
    const absl::string_view b = view.substr(split);
    EXPECT_EQ(crc32c_math::Combine(Crc32c(a), Crc32c(b), b.size()), Crc32c(view))
        << "split " << split;
  }
}

TEST(Crc32cCombineTest, FoldOfEqualPiecesWithOneShiftMatchesWholeCrc) {
  // What a thread block does with its 4 KiB pieces, including a short last one.
  const std::string bytes = Pattern(kCrcTreeChunkBytes / 2 + 1234);
  const absl::string_view view = bytes;
  constexpr size_t kPiece = 4096;
  const uint32_t full_shift = crc32c_math::XPow8nModP(kPiece);
  uint32_t crc = 0;
  for (size_t offset = 0; offset < view.size(); offset += kPiece) {
    const absl::string_view piece = view.substr(offset, kPiece);
    crc = piece.size() == kPiece ? crc32c_math::CombineWithShift(crc, Crc32c(piece), full_shift)
                                 : crc32c_math::Combine(crc, Crc32c(piece), piece.size());
  }
  EXPECT_EQ(crc, Crc32c(view));
}

TEST(Crc32cCombineTest, ShiftOperatorsAreConsistent) {
  EXPECT_EQ(crc32c_math::XPow8nModP(0), crc32c_math::kOne);
  EXPECT_EQ(crc32c_math::MultiplyModP(crc32c_math::kOne, 0xdeadbeefu), 0xdeadbeefu);
  EXPECT_EQ(crc32c_math::MultiplyModP(0xdeadbeefu, crc32c_math::kOne), 0xdeadbeefu);
  // x^(8 (m + n)) = x^(8m) * x^(8n).
  EXPECT_EQ(
      crc32c_math::XPow8nModP(4096 + 1000),
      crc32c_math::MultiplyModP(crc32c_math::XPow8nModP(4096), crc32c_math::XPow8nModP(1000)));
  // Shifting past n zero bytes is what Crc32c does to a running value.
  const std::string zeros(777, '\0');
  const uint32_t crc = Crc32c("abc");
  EXPECT_EQ(crc32c_math::Combine(crc, Crc32c(zeros), zeros.size()), Crc32c(zeros, crc));
  // Combining with an empty right part changes nothing.
  EXPECT_EQ(crc32c_math::Combine(crc, 0, 0), crc);
}

}  // namespace
}  // namespace sluice
