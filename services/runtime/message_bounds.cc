#include "services/runtime/message_bounds.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/wire_format_lite.h"

namespace sluice::runtime {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::io::CodedInputStream;
using WireType = google::protobuf::internal::WireFormatLite::WireType;
using google::protobuf::internal::WireFormatLite;

// malloc's overhead per allocation, and a repeated field's slack: it grows
// by doubling, so its storage is at most twice its elements.
constexpr int64_t kAllocationOverhead = 16;
constexpr int64_t kGrowthSlack = 2;
// A std::string object allocated by a message (ArenaStringPtr) and a field
// of an UnknownFieldSet.
constexpr int64_t kStringObjectBytes = 32;
constexpr int64_t kUnknownFieldBytes = 16;
// A repeated field's first allocation, charged once per field per message
// it appears in: a scalar field's is 16 bytes (its 8-byte header and 8 of
// elements), a message or string field's 40 (header and 4 pointers), a map's
// 64 (8 buckets), the unknown fields' 24 (their vector). Per element, the
// slack above covers the doubling after it.
constexpr int64_t kFirstAllocationBytes = 64;

// What a parsed string of `length` bytes holds on the heap. libstdc++ keeps
// up to 15 bytes in the object itself and grows a longer one to at least
// twice the 15 it had (so 16-29 bytes take 30); protobuf reserves a string's
// length up to 50,000,000 bytes and appends the rest, which may double it.
int64_t StringHeapBytes(int64_t length) {
  constexpr int64_t kInlineBytes = 15;
  constexpr int64_t kReservedAtOnce = 50'000'000;
  if (length <= kInlineBytes) return 0;
  const int64_t capacity =
      length > kReservedAtOnce ? kGrowthSlack * length : std::max(length, 2 * kInlineBytes);
  return capacity + 1 + kAllocationOverhead;  // Its terminating NUL.
}

// One level of the walk, for an error's path: "groups[3].trajectories".
struct Frame {
  const Frame *parent = nullptr;
  const FieldDescriptor *field = nullptr;
  int64_t index = -1;  // Element index in a repeated field; -1 for a singular one.
};

std::string PathOf(const Frame *frame) {
  std::vector<const Frame *> frames;
  for (; frame != nullptr && frame->field != nullptr; frame = frame->parent) {
    frames.push_back(frame);
  }
  std::string path;
  for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
    if (!path.empty()) path += '.';
    path += (*it)->field->name();
    if ((*it)->index >= 0) absl::StrAppend(&path, "[", (*it)->index, "]");
  }
  return path;
}

// Bytes one element of a scalar field takes once parsed.
int64_t ScalarBytes(const FieldDescriptor &field) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return 1;
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_ENUM:
      return 4;
    default:
      return 8;
  }
}

bool IsVarintType(const FieldDescriptor &field) {
  return WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(
             field.type())) == WireFormatLite::WIRETYPE_VARINT;
}

class Walker {
 public:
  Walker(const MessageBounds &bounds, int64_t wire_bytes) : bounds_(bounds) {
    cost_.bytes = wire_bytes;
  }

  absl::Status WalkRoot(const Descriptor &type, CodedInputStream &in) {
    cost_.parsed_bytes += ObjectBytes(type);
    const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(cost_.bytes));
    absl::Status status = WalkMessage(type, in, nullptr, 0);
    in.PopLimit(limit);
    return status;
  }

  const WireCost &cost() const { return cost_; }

 private:
  // Counts of the repeated message, string and bytes fields of one message.
  using Counts = absl::InlinedVector<std::pair<const FieldDescriptor *, int64_t>, 4>;
  // The repeated fields of one message seen so far, and null once it has
  // an unknown field (its set of them is a vector too).
  using Started = absl::InlinedVector<const FieldDescriptor *, 8>;

  // Charges `field`'s first allocation (null: the unknown fields') the first
  // time it is seen in this message.
  void Start(Started &started, const FieldDescriptor *field) {
    for (const FieldDescriptor *f : started) {
      if (f == field) return;
    }
    started.push_back(field);
    cost_.parsed_bytes += kFirstAllocationBytes;
  }

  // Charges `elements` more scalars of repeated `field`: they grow it by
  // doubling, whether added one by one (varints, unpacked elements) or
  // reserved a run at a time (packed fixed-width ones: the parser reserves
  // each piece of the input it has, and a ByteBuffer comes in slices).
  void ChargeScalars(Started &started, const FieldDescriptor &field, int64_t elements) {
    Start(started, &field);
    cost_.parsed_bytes += kGrowthSlack * elements * ScalarBytes(field);
  }

  int64_t &CountOf(Counts &counts, const FieldDescriptor *field) {
    for (auto &[f, n] : counts) {
      if (f == field) return n;
    }
    counts.emplace_back(field, 0);
    return counts.back().second;
  }

  const MessageBounds::FieldLimit *OwnLimit(const FieldDescriptor &field) const {
    if (bounds_.field_max_elements.empty()) return nullptr;
    auto it = bounds_.field_max_elements.find(field.full_name());
    return it == bounds_.field_max_elements.end() ? nullptr : &it->second;
  }
  int64_t LimitOf(const FieldDescriptor &field) const {
    const MessageBounds::FieldLimit *own = OwnLimit(field);
    return own != nullptr ? own->max_elements : bounds_.max_elements_per_field;
  }
  const std::string &FlagOf(const FieldDescriptor &field) const {
    const MessageBounds::FieldLimit *own = OwnLimit(field);
    return own != nullptr && !own->flag.empty() ? own->flag : bounds_.elements_flag;
  }

  int64_t ObjectBytes(const Descriptor &type) {
    auto it = object_bytes_.find(&type);
    if (it != object_bytes_.end()) return it->second;
    const google::protobuf::Message *prototype =
        google::protobuf::MessageFactory::generated_factory()->GetPrototype(&type);
    const int64_t bytes =
        (prototype != nullptr ? static_cast<int64_t>(prototype->SpaceUsedLong()) : 256) +
        kAllocationOverhead;
    object_bytes_.emplace(&type, bytes);
    return bytes;
  }

  absl::Status Malformed(const Descriptor &type, const Frame *frame, absl::string_view what) {
    const std::string path = PathOf(frame);
    return absl::InvalidArgumentError(absl::StrCat("not a valid ", type.full_name(), " message",
                                                   path.empty() ? "" : " at ", path, ": ", what));
  }

  absl::Status CheckParsedBytes() const {
    if (cost_.parsed_bytes <= bounds_.max_parsed_bytes) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "this request of ", cost_.bytes, " bytes would take more than ", bounds_.max_parsed_bytes,
        " bytes once parsed (at most ", bounds_.max_parsed_bytes,
        " for this method): send fewer or smaller items per request"));
  }

  // Walks the fields of one message up to the current limit. `frame` is the
  // field this message is an element of (null for the root).
  absl::Status WalkMessage(const Descriptor &type, CodedInputStream &in, const Frame *frame,
                           int depth) {
    Counts counts;
    Started started;
    // The first field whose element count went over its limit: its elements
    // are still counted (for the message) but no longer walked.
    const FieldDescriptor *over = nullptr;
    while (true) {
      const uint32_t tag = in.ReadTag();
      if (tag == 0) break;
      const int number = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
      const WireType wire_type = WireFormatLite::GetTagWireType(tag);
      if (number == 0) return Malformed(type, frame, "field number 0");
      const FieldDescriptor *field = type.FindFieldByNumber(number);
      if (wire_type == WireFormatLite::WIRETYPE_START_GROUP ||
          wire_type == WireFormatLite::WIRETYPE_END_GROUP) {
        return Malformed(type, frame, absl::StrCat("field ", number, " uses a group"));
      }
      if (wire_type != WireFormatLite::WIRETYPE_VARINT &&
          wire_type != WireFormatLite::WIRETYPE_FIXED64 &&
          wire_type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
          wire_type != WireFormatLite::WIRETYPE_FIXED32) {
        return Malformed(
            type, frame,
            absl::StrCat("field ", number, " has wire type ", static_cast<int>(wire_type)));
      }
      // The wire type a known field of this type would have, unpacked.
      const bool known = field != nullptr &&
                         (wire_type == WireFormatLite::WireTypeForFieldType(
                                           static_cast<WireFormatLite::FieldType>(field->type())) ||
                          (wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED &&
                           field->is_repeated() && field->is_packable()));
      if (wire_type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        bool read = false;
        if (wire_type == WireFormatLite::WIRETYPE_VARINT) {
          uint64_t value = 0;
          read = in.ReadVarint64(&value);
        } else if (wire_type == WireFormatLite::WIRETYPE_FIXED64) {
          uint64_t value = 0;
          read = in.ReadLittleEndian64(&value);
        } else {
          uint32_t value = 0;
          read = in.ReadLittleEndian32(&value);
        }
        if (!read) return Malformed(type, frame, absl::StrCat("field ", number, " is truncated"));
        if (!known) {
          Start(started, nullptr);
          cost_.parsed_bytes += kGrowthSlack * kUnknownFieldBytes;
        } else if (field->is_repeated()) {
          ChargeScalars(started, *field, 1);
        }
        RETURN_IF_ERROR(CheckParsedBytes());
        continue;
      }
      uint32_t length = 0;
      if (!in.ReadVarint32(&length) || length > static_cast<uint32_t>(in.BytesUntilLimit())) {
        return Malformed(type, frame, absl::StrCat("field ", number, " is truncated"));
      }
      if (!known) {
        Start(started, nullptr);
        cost_.parsed_bytes +=
            kGrowthSlack * kUnknownFieldBytes + kStringObjectBytes + StringHeapBytes(length);
        RETURN_IF_ERROR(CheckParsedBytes());
        if (!in.Skip(static_cast<int>(length))) {
          return Malformed(type, frame, absl::StrCat("field ", number, " is truncated"));
        }
        continue;
      }
      if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE &&
          field->cpp_type() != FieldDescriptor::CPPTYPE_STRING) {
        // A packed run of scalars.
        RETURN_IF_ERROR(WalkPacked(type, *field, length, in, frame, started));
        continue;
      }
      int64_t index = -1;
      if (field->is_repeated()) {
        int64_t &count = CountOf(counts, field);
        index = count++;
        if (over == nullptr && count > LimitOf(*field)) over = field;
        if (over != nullptr) {
          // Only counted from here on: the request is refused at the end of
          // this message, saying how many there were.
          if (!in.Skip(static_cast<int>(length))) {
            return Malformed(type, frame, absl::StrCat("field ", number, " is truncated"));
          }
          continue;
        }
        Start(started, field);
        cost_.parsed_bytes += kGrowthSlack * 8;  // The element's pointer slot.
      }
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
        cost_.parsed_bytes += kStringObjectBytes + kAllocationOverhead + StringHeapBytes(length);
        RETURN_IF_ERROR(CheckParsedBytes());
        if (!in.Skip(static_cast<int>(length))) {
          return Malformed(type, frame, absl::StrCat("field ", number, " is truncated"));
        }
        continue;
      }
      // A submessage (a map entry included).
      const Frame child{frame, field, index};
      if (depth + 1 > bounds_.max_depth) {
        return Malformed(type, &child, absl::StrCat("nested deeper than ", bounds_.max_depth));
      }
      ++cost_.messages;
      cost_.parsed_bytes += ObjectBytes(*field->message_type());
      RETURN_IF_ERROR(CheckParsedBytes());
      const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
      RETURN_IF_ERROR(WalkMessage(*field->message_type(), in, &child, depth + 1));
      in.PopLimit(limit);
    }
    if (in.BytesUntilLimit() != 0) {
      return Malformed(type, frame, absl::StrCat(in.BytesUntilLimit(), " bytes cannot be read"));
    }
    if (over != nullptr) {
      const Frame field_frame{frame, over, -1};
      return absl::InvalidArgumentError(
          absl::StrCat(PathOf(&field_frame), ": ", CountOf(counts, over), " items, at most ",
                       LimitOf(*over), " per request (", FlagOf(*over), ")"));
    }
    return absl::OkStatus();
  }

  absl::Status WalkPacked(const Descriptor &type, const FieldDescriptor &field, uint32_t length,
                          CodedInputStream &in, const Frame *frame, Started &started) {
    int64_t elements = 0;
    if (IsVarintType(field)) {
      // One element ends at each byte without the continuation bit.
      char chunk[4096];
      uint32_t left = length;
      while (left > 0) {
        const int n = static_cast<int>(std::min<uint32_t>(left, sizeof(chunk)));
        if (!in.ReadRaw(chunk, n)) {
          return Malformed(type, frame, absl::StrCat("field ", field.name(), " is truncated"));
        }
        for (int i = 0; i < n; ++i) elements += (static_cast<uint8_t>(chunk[i]) & 0x80) == 0;
        left -= static_cast<uint32_t>(n);
      }
    } else {
      const int64_t width = WireFormatLite::WireTypeForFieldType(
                                static_cast<WireFormatLite::FieldType>(field.type())) ==
                                    WireFormatLite::WIRETYPE_FIXED64
                                ? 8
                                : 4;
      if (length % width != 0) {
        return Malformed(type, frame,
                         absl::StrCat("packed field ", field.name(), " has ", length,
                                      " bytes, not a multiple of ", width));
      }
      elements = length / width;
      if (!in.Skip(static_cast<int>(length))) {
        return Malformed(type, frame, absl::StrCat("field ", field.name(), " is truncated"));
      }
    }
    ChargeScalars(started, field, elements);
    return CheckParsedBytes();
  }

  const MessageBounds &bounds_;
  WireCost cost_;
  absl::flat_hash_map<const Descriptor *, int64_t> object_bytes_;
};

}  // namespace

absl::StatusOr<WireCost> CheckMessageBounds(const Descriptor &type,
                                            google::protobuf::io::ZeroCopyInputStream &wire,
                                            int64_t wire_bytes, const MessageBounds &bounds) {
  if (wire_bytes > bounds.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("a ", type.name(), " of ", wire_bytes,
                                                     " bytes is larger than the ", bounds.max_bytes,
                                                     " bytes this method accepts"));
  }
  CodedInputStream in(&wire);
  Walker walker(bounds, wire_bytes);
  if (absl::Status status = walker.WalkRoot(type, in); !status.ok()) return status;
  return walker.cost();
}

absl::StatusOr<WireCost> CheckMessageBounds(const Descriptor &type, absl::string_view wire,
                                            const MessageBounds &bounds) {
  google::protobuf::io::ArrayInputStream stream(wire.data(), static_cast<int>(wire.size()));
  return CheckMessageBounds(type, stream, static_cast<int64_t>(wire.size()), bounds);
}

}  // namespace sluice::runtime
