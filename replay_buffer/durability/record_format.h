#ifndef SLUICE_REPLAY_BUFFER_DURABILITY_RECORD_FORMAT_H_
#define SLUICE_REPLAY_BUFFER_DURABILITY_RECORD_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// The record framing shared by WAL segments and snapshot files.
//
// A file is a sequence of records, each a fixed 24-byte header and then the
// payload. All integers are little-endian:
//
//   offset  size  field
//        0     4  magic           (which kind of file: WAL or snapshot)
//        4     4  payload length  (bytes, <= kMaxRecordPayloadBytes)
//        8     8  sequence        (the LSN in the WAL; the record index,
//                                  0, 1, 2, ..., in a snapshot)
//       16     4  masked CRC32C of the payload
//       20     4  masked CRC32C of bytes [0, 20) of this header
//
// The header has its own checksum so that a damaged length is caught before
// it is trusted (otherwise one flipped bit in a length would make the reader
// skip, or claim to be missing, arbitrary amounts of data). CRCs are masked
// as in LevelDB: a CRC of data that itself contains CRCs is weak, and a
// zero-filled region must never checksum to zero.
//
// Torn tails versus corruption. A process killed mid-write(2) leaves a
// *prefix* of what it wrote; after power loss a file system may also leave
// the end of a file zero-filled or with stale pages. The reader therefore
// calls damage a *torn tail* only when it could be the unfinished last write:
//   - fewer than 24 bytes left (an incomplete header);
//   - a valid header whose payload runs past the end (an incomplete payload);
//   - a valid header whose payload CRC fails and which ends exactly at the
//     end of the readable range (a last record whose pages did not all land);
//   - a bad header followed only by zero bytes (a zero-filled tail).
// Anything else (a bad record followed by more data) is *corruption*.
// Whether a torn tail is acceptable is the caller's decision: it is in the
// last WAL segment, never in a snapshot.

namespace sluice::replay_buffer::durability {

inline constexpr size_t kRecordHeaderBytes = 24;
// Bigger payloads are refused by writers (INVALID_ARGUMENT) and readers
// (corruption); the replay buffer's records are far smaller.
inline constexpr uint32_t kMaxRecordPayloadBytes = 1u << 30;

// Magic numbers of each file kind, so that a snapshot record is never read
// as a WAL record and vice versa.
inline constexpr uint32_t kWalRecordMagic = 0x9A7C1E57;
inline constexpr uint32_t kSnapshotRecordMagic = 0x5E3B0D61;

// LevelDB's CRC mask: rotate right by 15 bits and add a constant.
uint32_t MaskCrc(uint32_t crc);

void EncodeFixed32(char* dst, uint32_t value);
void EncodeFixed64(char* dst, uint64_t value);
uint32_t DecodeFixed32(const char* src);
uint64_t DecodeFixed64(const char* src);

// Fills `header` (kRecordHeaderBytes) for a record whose payload has
// (unmasked) CRC32C `payload_crc`. Computing the payload CRC apart lets a
// writer do it outside its lock.
void EncodeRecordHeader(uint32_t magic, uint64_t sequence, uint32_t payload_length,
                        uint32_t payload_crc, char* header);

// What RecordReader::Next found.
struct RecordReadResult {
  enum class Kind {
    kRecord,    // a valid record: sequence, payload, header are set
    kEnd,       // clean end: the readable range ends at a record boundary
    kTornTail,  // damage that may be an unfinished last write (see above)
    kCorrupt,   // damage with more data after it
  };
  Kind kind = Kind::kEnd;
  // Byte offset of this record, or of the damage, in the file.
  uint64_t offset = 0;
  uint64_t sequence = 0;
  // Valid until the next call to Next().
  absl::string_view payload;
  absl::string_view header;
  // For kTornTail and kCorrupt: what is wrong, e.g. "payload CRC mismatch".
  std::string problem;
};

// Reads records sequentially from bytes [0, limit) of an open file, with a
// read-ahead buffer (records of a few hundred bytes cost no syscall each).
// Not thread-safe. Does not own `fd`.
class RecordReader {
 public:
  // `path` is for messages. `limit` is normally the file size; a snapshot
  // passes the offset of its trailer.
  RecordReader(int fd, std::string path, uint32_t magic, uint64_t limit);

  // The next record or the reason there is none. Errors (non-OK) are only
  // I/O failures of read(2); damage is reported in the result, never as an
  // error and never by crashing.
  absl::StatusOr<RecordReadResult> Next();

  // Offset of the next record: after kEnd, the readable range's size; after
  // kTornTail or kCorrupt, where the damage starts (the valid prefix's end).
  uint64_t offset() const { return offset_; }

 private:
  // Points `*view` at bytes [offset, offset + size), reading them if needed.
  // Requires offset + size <= limit_.
  absl::Status View(uint64_t offset, size_t size, absl::string_view* view);
  // Whether every byte in [offset, limit_) is zero.
  absl::StatusOr<bool> RestIsZero(uint64_t offset);

  int fd_;
  std::string path_;
  uint32_t magic_;
  uint64_t limit_;
  uint64_t offset_ = 0;
  std::string buffer_;
  uint64_t buffer_offset_ = 0;
};

}  // namespace sluice::replay_buffer::durability

#endif  // SLUICE_REPLAY_BUFFER_DURABILITY_RECORD_FORMAT_H_
