#include "common/crc32c.h"

#include <string>

#include "gtest/gtest.h"

namespace sluice {
namespace {

TEST(Crc32cTest, MatchesPublishedCheckValues) {
  // RFC 3720 (iSCSI) appendix B.4 and the common "123456789" check value.
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, ExtendsARunningValue) {
  const std::string text = "The quick brown fox jumps over the lazy dog, many times over.";
  for (size_t split = 0; split <= text.size(); ++split) {
    const uint32_t first = Crc32c(absl::string_view(text).substr(0, split));
    EXPECT_EQ(Crc32c(absl::string_view(text).substr(split), first), Crc32c(text)) << split;
  }
}

TEST(Crc32cTest, HardwareAndTablesAgreeOnEveryLengthAndAlignment) {
  std::string data(4096 + 64, '\0');
  uint32_t x = 12345;
  for (char& c : data) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 16);
  }
  EXPECT_EQ(Crc32cPortable("123456789"), 0xE3069283u);
  for (size_t offset = 0; offset < 9; ++offset) {
    for (size_t length : {0, 1, 7, 8, 9, 15, 16, 63, 64, 65, 1000, 4096}) {
      absl::string_view piece = absl::string_view(data).substr(offset, length);
      EXPECT_EQ(Crc32c(piece), Crc32cPortable(piece)) << offset << " " << length;
      EXPECT_EQ(Crc32c(piece, 0xdeadbeef), Crc32cPortable(piece, 0xdeadbeef));
    }
  }
}

}  // namespace
}  // namespace sluice
