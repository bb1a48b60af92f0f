#ifndef SLUICE_REPLAY_BUFFER_WIRE_H_
#define SLUICE_REPLAY_BUFFER_WIRE_H_

// Hand-written protobuf framing for the journal and snapshot records that
// embed a whole group: the group is serialized straight into the record's
// bytes instead of being copied into a wrapper message first (64 KB per
// group on the insert path). The result parses as the wrapper message.

#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message_lite.h"

namespace sluice::replay_buffer::wire {

inline void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// The tag and length of a length-delimited field of `length` bytes.
inline void AppendFieldHeader(int field, size_t length, std::string* out) {
  AppendVarint((static_cast<uint64_t>(field) << 3) | 2, out);
  AppendVarint(length, out);
}

// Bytes AppendFieldHeader writes.
inline size_t FieldHeaderSize(int field, size_t length) {
  using google::protobuf::io::CodedOutputStream;
  return CodedOutputStream::VarintSize64((static_cast<uint64_t>(field) << 3) | 2) +
         CodedOutputStream::VarintSize64(length);
}

// Appends `message` as field `field` of the enclosing message, nested in
// `outer_field` of its parent when outer_field > 0:
//   outer_field { field { message } }
// `extra` (serialized fields of the middle message) follows `message`
// inside outer_field.
inline void AppendNested(int outer_field, int field, const google::protobuf::MessageLite& message,
                         const std::string& extra, std::string* out) {
  const size_t size = message.ByteSizeLong();
  const size_t inner = FieldHeaderSize(field, size) + size + extra.size();
  out->reserve(out->size() + FieldHeaderSize(outer_field, inner) + inner);
  AppendFieldHeader(outer_field, inner, out);
  AppendFieldHeader(field, size, out);
  message.AppendPartialToString(out);
  out->append(extra);
}

}  // namespace sluice::replay_buffer::wire

#endif  // SLUICE_REPLAY_BUFFER_WIRE_H_
