#include "replay_buffer/durability/record_format.h"

#include <fcntl.h>

#include <string>
#include <vector>

#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/durability/file_io.h"
#include "replay_buffer/durability/test_util.h"

namespace sluice::replay_buffer::durability {
namespace {

using ::testing::HasSubstr;
using testing_util::TempDirectory;

std::string Frame(uint64_t sequence, const std::string& payload) {
  std::string record(kRecordHeaderBytes, '\0');
  EncodeRecordHeader(kWalRecordMagic, sequence, static_cast<uint32_t>(payload.size()),
                     Crc32c(payload), record.data());
  return record + payload;
}

// Reads `content` (written to a file) until the first non-record.
std::vector<RecordReadResult> ReadAll(const TempDirectory& dir, const std::string& content) {
  const std::string path = dir.Sub("records");
  testing_util::WriteFileOrDie(path, content);
  absl::StatusOr<ScopedFd> fd = OpenFile(path, O_RDONLY);
  EXPECT_TRUE(fd.ok()) << fd.status();
  RecordReader reader(fd->get(), path, kWalRecordMagic, content.size());
  std::vector<RecordReadResult> results;
  while (true) {
    absl::StatusOr<RecordReadResult> result = reader.Next();
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    results.push_back(*result);
    if (result->kind != RecordReadResult::Kind::kRecord) break;
    // The views die with the next call.
    results.back().payload = {};
    results.back().header = {};
  }
  return results;
}

TEST(RecordFormatTest, FixedIntegersAreLittleEndian) {
  char bytes[8];
  EncodeFixed64(bytes, 0x0102030405060708ull);
  EXPECT_EQ(bytes[0], 0x08);
  EXPECT_EQ(bytes[7], 0x01);
  EXPECT_EQ(DecodeFixed64(bytes), 0x0102030405060708ull);
  EncodeFixed32(bytes, 0xdeadbeef);
  EXPECT_EQ(DecodeFixed32(bytes), 0xdeadbeefu);
}

TEST(RecordFormatTest, MaskedCrcOfZerosIsNotZero) {
  EXPECT_NE(MaskCrc(0), 0u);
  EXPECT_NE(MaskCrc(Crc32c(std::string(20, '\0'))), 0u);
}

TEST(RecordFormatTest, ReadsBackFramedRecords) {
  TempDirectory dir;
  const std::string content = Frame(7, "alpha") + Frame(8, "") + Frame(9, std::string(3000, 'x'));
  const std::vector<RecordReadResult> results = ReadAll(dir, content);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].sequence, 7u);
  EXPECT_EQ(results[2].sequence, 9u);
  EXPECT_EQ(results[2].offset, 2 * kRecordHeaderBytes + 5);
  EXPECT_EQ(results[3].kind, RecordReadResult::Kind::kEnd);
  EXPECT_EQ(results[3].offset, content.size());
}

TEST(RecordFormatTest, ClassifiesTornTailsAndCorruption) {
  TempDirectory dir;
  const std::string first = Frame(1, "first payload");
  const std::string last = Frame(2, "last payload");

  // An incomplete header, an incomplete payload: torn.
  for (size_t cut : {size_t{5}, kRecordHeaderBytes + 3}) {
    const auto results = ReadAll(dir, first + last.substr(0, cut));
    EXPECT_EQ(results.back().kind, RecordReadResult::Kind::kTornTail) << cut;
    EXPECT_EQ(results.back().offset, first.size());
  }
  // A zero-filled tail (power loss after the size was extended): torn.
  auto results = ReadAll(dir, first + std::string(100, '\0'));
  EXPECT_EQ(results.back().kind, RecordReadResult::Kind::kTornTail);
  EXPECT_THAT(results.back().problem, HasSubstr("zero-filled"));

  // A bad payload in the final record: torn; anywhere before: corrupt.
  std::string damaged_last = first + last;
  damaged_last[damaged_last.size() - 1] ^= 1;
  EXPECT_EQ(ReadAll(dir, damaged_last).back().kind, RecordReadResult::Kind::kTornTail);
  std::string damaged_first = first + last;
  damaged_first[kRecordHeaderBytes + 2] ^= 1;
  results = ReadAll(dir, damaged_first);
  EXPECT_EQ(results.back().kind, RecordReadResult::Kind::kCorrupt);
  EXPECT_EQ(results.back().offset, 0u);
  EXPECT_THAT(results.back().problem, HasSubstr("payload CRC mismatch"));

  // A damaged length is caught by the header CRC, not trusted.
  std::string damaged_length = first + last;
  damaged_length[first.size() + 5] ^= 0x10;
  results = ReadAll(dir, damaged_length + first);
  EXPECT_EQ(results.back().kind, RecordReadResult::Kind::kCorrupt);
  EXPECT_THAT(results.back().problem, HasSubstr("header CRC"));
}

TEST(RecordFormatTest, OtherFileKindsMagicIsCorruption) {
  TempDirectory dir;
  std::string record(kRecordHeaderBytes, '\0');
  EncodeRecordHeader(kSnapshotRecordMagic, 0, 1, Crc32c("x"), record.data());
  const auto results = ReadAll(dir, record + "x" + Frame(1, "y"));
  EXPECT_EQ(results.back().kind, RecordReadResult::Kind::kCorrupt);
  EXPECT_THAT(results.back().problem, HasSubstr("magic"));
}

}  // namespace
}  // namespace sluice::replay_buffer::durability
