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

}  // namespace
}  // namespace sluice
