#ifndef SLUICE_SERVICES_RUNTIME_MESSAGE_BOUNDS_H_
#define SLUICE_SERVICES_RUNTIME_MESSAGE_BOUNDS_H_

// What one request message may cost a service, checked on its wire bytes
// before it is parsed.
//
// Protobuf's parsed objects are far larger than their wire form: an empty
// repeated submessage is 2 bytes on the wire ("0a 00") and 100-300 bytes once
// parsed, so a 4 MiB request of empty items once cost a service ~470 MB
// before its handler could count them. CheckMessageBounds walks the
// serialized message with the type's descriptor, without allocating any of
// it, and refuses it when
//   - any one repeated message, string or bytes field (a map's entries
//     included) holds more elements than allowed, at any depth (counted per
//     parent message: each group's trajectories, not all of them);
//   - the estimated size of the parsed message exceeds its bound;
//   - it nests deeper than allowed, or is not a well-formed message of the
//     type (truncated, a bad tag, a deprecated group).
// Parsing a message that passed costs at most bounds.max_parsed_bytes (an
// estimate from the generated types' sizes, slack for repeated fields'
// growth included), plus the wire bytes themselves.
//
// Pure: no gRPC; thread-safe (a call keeps its state on the stack).

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace google::protobuf {
class Descriptor;
namespace io {
class ZeroCopyInputStream;
}
}  // namespace google::protobuf

namespace sluice::runtime {

struct MessageBounds {
  // The serialized message, bytes.
  int64_t max_bytes = 4 << 20;
  // Elements of any one repeated message, string or bytes field (map entries
  // included), per parent message. Packed and unpacked scalars are not
  // counted here: their parsed size is at most 8 bytes per wire byte and
  // falls under max_parsed_bytes.
  int64_t max_elements_per_field = 4096;
  // Fields whose own element limit differs (e.g. the reward server's
  // --max-batch-items for "sluice.v1.ScoreBatchRequest.items"), by full
  // name, with what raises it.
  struct FieldLimit {
    int64_t max_elements = 0;
    std::string flag;
  };
  absl::flat_hash_map<std::string, FieldLimit> field_max_elements;
  // The parsed message, bytes (estimate; see above).
  int64_t max_parsed_bytes = 16 << 20;
  // Nesting of submessages below the root.
  int max_depth = 32;
  // What a user changes to raise max_elements_per_field, for the message
  // ("--max-items-per-request").
  std::string elements_flag = "--max-items-per-request";
};

// The words of a refusal for too many elements ("<path>: <n> items, at most
// <limit> per request (<flag>)"), which tells it from a malformed message.
inline constexpr char kTooManyItemsText[] = " items, at most ";

// What the walk found.
struct WireCost {
  int64_t bytes = 0;
  // Submessages below the root (map entries included).
  int64_t messages = 0;
  // Estimated bytes of the parsed message (the root object included).
  int64_t parsed_bytes = 0;
};

// Walks `wire`, a serialized message of `type`, and returns what parsing it
// would cost, or:
//   - INVALID_ARGUMENT "<path>: <n> items, at most <limit> per request
//   (<flag>)"
//     naming the field's path ("groups[3].trajectories") for too many
//     elements, and for a malformed message ("not a valid <Type> message:
//     ...");
//   - RESOURCE_EXHAUSTED "<Type> of <n> bytes ..." for a message over
//     max_bytes or whose parse would exceed max_parsed_bytes, naming the
//     bound.
// O(wire bytes); allocates only the path of an error. `type` must be a
// generated message type (its prototype sizes the estimate).
absl::StatusOr<WireCost> CheckMessageBounds(const google::protobuf::Descriptor &type,
                                            google::protobuf::io::ZeroCopyInputStream &wire,
                                            int64_t wire_bytes, const MessageBounds &bounds);
absl::StatusOr<WireCost> CheckMessageBounds(const google::protobuf::Descriptor &type,
                                            absl::string_view wire, const MessageBounds &bounds);

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_MESSAGE_BOUNDS_H_
