#ifndef SLUICE_CONTROLLER_SPEC_YAML_H_
#define SLUICE_CONTROLLER_SPEC_YAML_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "sluice/v1/common.pb.h"

namespace sluice::controller {

// Run specs are written by people, in YAML, with the proto's snake_case field
// names:
//
//   name: arith-grpo
//   seed: 1
//   task: {arithmetic: {max_operand: 20}}
//   algorithm:
//     objective: grpo            # or OBJECTIVE_GRPO
//     group_size: 8
//   buffer: {sampler: fifo}
//
// The YAML is turned into proto JSON guided by the message's descriptor
// (so that each scalar gets the type of its field: `name: 2024` stays a
// string, `group_size: 8` an integer), then parsed with
// google::protobuf::util::JsonStringToMessage. Enum values may be given by
// their proto name (OBJECTIVE_GRPO) or its short lower-case form without the
// enum's prefix (grpo, decoupled_ppo, fifo). A null value (`key:` or `~`)
// leaves a scalar field unset and selects a message field with its defaults
// (`arithmetic:`). A scalar where a list is expected is a one-element
// list.
//
// Errors name the source, the line, the field path and the problem, and
// every problem is reported at once, one per line:
//
//   spec.yaml:5: unknown field "grup_size" in algorithm; did you mean "group_size"?
//   spec.yaml:7: algorithm.max_staleness: expected an integer, got "four"
//
// Text that is not UTF-8 is an error naming the line and column of the first
// bad byte. The result is not validated beyond types (see ValidateRunSpec).
absl::StatusOr<v1::RunSpec> ParseRunSpecYaml(absl::string_view yaml_text,
                                             absl::string_view source_name);

// Reads and parses a YAML run spec file; errors start with the path.
absl::StatusOr<v1::RunSpec> LoadRunSpecFile(const std::string& path);

// The candidate nearest `name` by edit distance when it is close enough to
// suggest ("did you mean"): within max(2, len/3) edits. nullopt otherwise.
std::optional<std::string> ClosestName(absl::string_view name,
                                       const std::vector<std::string>& candidates);

// The same conversion for any message type: clears `message` and fills it.
// INVALID_ARGUMENT for YAML syntax errors, unknown fields and bad values.
absl::Status YamlToMessage(absl::string_view yaml_text, absl::string_view source_name,
                           google::protobuf::Message* message);

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_SPEC_YAML_H_
