#include "replay_buffer/durability/record_format.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "replay_buffer/durability/file_io.h"

namespace sluice::replay_buffer::durability {
namespace {

constexpr uint32_t kCrcMaskDelta = 0xa282ead8u;
// Read-ahead size; larger payloads are read in one piece.
constexpr size_t kReadAheadBytes = 1 << 20;
constexpr size_t kHeaderCrcOffset = 20;

}  // namespace

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kCrcMaskDelta; }

void EncodeFixed32(char* dst, uint32_t value) {
  for (int i = 0; i < 4; ++i) dst[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

void EncodeFixed64(char* dst, uint64_t value) {
  for (int i = 0; i < 8; ++i) dst[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint32_t DecodeFixed32(const char* src) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<unsigned char>(src[i])} << (8 * i);
  return value;
}

uint64_t DecodeFixed64(const char* src) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= uint64_t{static_cast<unsigned char>(src[i])} << (8 * i);
  return value;
}

void EncodeRecordHeader(uint32_t magic, uint64_t sequence, uint32_t payload_length,
                        uint32_t payload_crc, char* header) {
  EncodeFixed32(header, magic);
  EncodeFixed32(header + 4, payload_length);
  EncodeFixed64(header + 8, sequence);
  EncodeFixed32(header + 16, MaskCrc(payload_crc));
  EncodeFixed32(header + kHeaderCrcOffset,
                MaskCrc(Crc32c(absl::string_view(header, kHeaderCrcOffset))));
}

RecordReader::RecordReader(int fd, std::string path, uint32_t magic, uint64_t limit)
    : fd_(fd), path_(std::move(path)), magic_(magic), limit_(limit) {}

absl::Status RecordReader::View(uint64_t offset, size_t size, absl::string_view* view) {
  if (offset < buffer_offset_ || offset + size > buffer_offset_ + buffer_.size()) {
    const size_t want =
        static_cast<size_t>(std::min<uint64_t>(std::max(size, kReadAheadBytes), limit_ - offset));
    buffer_.resize(want);
    buffer_offset_ = offset;
    const absl::Status status = PreadFully(fd_, buffer_.data(), want, offset, path_);
    if (!status.ok()) {
      buffer_.clear();
      return status;
    }
  }
  *view = absl::string_view(buffer_.data() + (offset - buffer_offset_), size);
  return absl::OkStatus();
}

absl::StatusOr<bool> RecordReader::RestIsZero(uint64_t offset) {
  while (offset < limit_) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kReadAheadBytes, limit_ - offset));
    absl::string_view bytes;
    RETURN_IF_ERROR(View(offset, chunk, &bytes));
    if (std::any_of(bytes.begin(), bytes.end(), [](char c) { return c != 0; })) return false;
    offset += chunk;
  }
  return true;
}

absl::StatusOr<RecordReadResult> RecordReader::Next() {
  RecordReadResult result;
  result.offset = offset_;
  const uint64_t left = limit_ - offset_;
  if (left == 0) {
    result.kind = RecordReadResult::Kind::kEnd;
    return result;
  }
  if (left < kRecordHeaderBytes) {
    result.kind = RecordReadResult::Kind::kTornTail;
    result.problem =
        absl::StrCat("incomplete record header (", left, " of ", kRecordHeaderBytes, " bytes)");
    return result;
  }

  absl::string_view header;
  RETURN_IF_ERROR(View(offset_, kRecordHeaderBytes, &header));
  const uint32_t magic = DecodeFixed32(header.data());
  const uint32_t length = DecodeFixed32(header.data() + 4);
  const uint64_t sequence = DecodeFixed64(header.data() + 8);
  const uint32_t stored_payload_crc = DecodeFixed32(header.data() + 16);
  const uint32_t stored_header_crc = DecodeFixed32(header.data() + kHeaderCrcOffset);

  std::string header_problem;
  if (magic != magic_) {
    header_problem = absl::StrCat("bad record magic 0x", absl::Hex(magic), " (expected 0x",
                                  absl::Hex(magic_), ")");
  } else if (MaskCrc(Crc32c(header.substr(0, kHeaderCrcOffset))) != stored_header_crc) {
    header_problem = "record header CRC mismatch";
  } else if (length > kMaxRecordPayloadBytes) {
    // Unreachable for files this code wrote (the header CRC passed).
    header_problem =
        absl::StrCat("record length ", length, " exceeds the maximum ", kMaxRecordPayloadBytes);
  }
  if (!header_problem.empty()) {
    ASSIGN_OR_RETURN(const bool zero_tail, RestIsZero(offset_));
    if (zero_tail) {
      result.kind = RecordReadResult::Kind::kTornTail;
      result.problem = absl::StrCat("zero-filled tail of ", left, " bytes");
    } else {
      result.kind = RecordReadResult::Kind::kCorrupt;
      result.problem = std::move(header_problem);
    }
    return result;
  }

  if (length > left - kRecordHeaderBytes) {
    result.kind = RecordReadResult::Kind::kTornTail;
    result.problem = absl::StrCat("incomplete record payload (", left - kRecordHeaderBytes, " of ",
                                  length, " bytes)");
    return result;
  }

  // View() may move the buffer, so take both views from one read.
  absl::string_view record;
  RETURN_IF_ERROR(View(offset_, kRecordHeaderBytes + length, &record));
  const absl::string_view payload = record.substr(kRecordHeaderBytes);
  if (MaskCrc(Crc32c(payload)) != stored_payload_crc) {
    const bool at_end = length == left - kRecordHeaderBytes;
    result.kind = at_end ? RecordReadResult::Kind::kTornTail : RecordReadResult::Kind::kCorrupt;
    result.problem = absl::StrCat("payload CRC mismatch in record ", sequence, " of ", length,
                                  " bytes", at_end ? " (the last record)" : "");
    return result;
  }

  result.kind = RecordReadResult::Kind::kRecord;
  result.sequence = sequence;
  result.header = record.substr(0, kRecordHeaderBytes);
  result.payload = payload;
  offset_ += kRecordHeaderBytes + length;
  return result;
}

}  // namespace sluice::replay_buffer::durability
