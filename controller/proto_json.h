#ifndef SLUICE_CONTROLLER_PROTO_JSON_H_
#define SLUICE_CONTROLLER_PROTO_JSON_H_

#include <string>

#include "google/protobuf/message.h"

namespace sluice::controller {

// The JSON of Sluice's files and CLI output: proto JSON
// (google::protobuf::util::MessageToJsonString) with snake_case field names
// and default values printed, except that 64-bit integers are JSON numbers
// rather than the proto mapping's strings, so that jq, Python and pandas
// read `"steps": 12` as the number it is. (Well-known types such as
// Timestamp keep their proto JSON form.) `pretty` = indented by two spaces;
// otherwise one line. Fields keep the proto order; a map's entries are
// sorted by key. O(n log n) in the message's size (a spec with 500,000
// labels takes about a second, not minutes). Thread-safe.
std::string ProtoToJson(const google::protobuf::Message& message, bool pretty);

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_PROTO_JSON_H_
