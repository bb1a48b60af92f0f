#include "controller/proto_json.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace sluice::controller {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::json;

// Writes proto JSON, as parsed into `json` (whose objects are sorted maps:
// O(log n) per key, where nlohmann's ordered_json looks every key up in a
// list, O(n^2) for a map field of n entries), back out in the message's own
// field order, turning 64-bit integers from strings into numbers on the way.
// Scalars are printed by nlohmann itself, so that the text is what
// ordered_json::dump printed before: the same spacing, escaping and numbers.
class Writer {
 public:
  explicit Writer(bool pretty) : pretty_(pretty) {}

  void Message(const json& object, const Descriptor& type, int depth) {
    if (!object.is_object()) return Value(object, depth);
    // google.protobuf.* types (Timestamp, Duration, Struct, ...) have their
    // own JSON form: written as they are.
    if (absl::StartsWith(type.file()->name(), "google/protobuf/")) return Value(object, depth);
    if (object.empty()) return Append("{}");
    Append("{");
    bool first = true;
    std::set<std::string> written;
    for (int i = 0; i < type.field_count(); ++i) {
      const FieldDescriptor& field = *type.field(i);
      auto it = object.find(field.name());
      if (it == object.end()) continue;
      written.insert(field.name());
      Key(it.key(), depth + 1, &first);
      Field(*it, field, depth + 1);
    }
    for (auto it = object.begin(); it != object.end(); ++it) {  // None expected.
      if (written.count(it.key()) > 0) continue;
      Key(it.key(), depth + 1, &first);
      Value(*it, depth + 1);
    }
    Close('}', depth);
  }

  std::string Take() { return std::move(out_); }

 private:
  void Field(const json& value, const FieldDescriptor& field, int depth) {
    if (field.is_map()) {
      if (!value.is_object()) return Value(value, depth);
      const FieldDescriptor& value_field = *field.message_type()->map_value();
      if (value.empty()) return Append("{}");
      Append("{");
      bool first = true;
      for (auto it = value.begin(); it != value.end(); ++it) {
        Key(it.key(), depth + 1, &first);
        Singular(*it, value_field, depth + 1);
      }
      return Close('}', depth);
    }
    if (field.is_repeated()) {
      if (!value.is_array()) return Value(value, depth);
      if (value.empty()) return Append("[]");
      Append("[");
      bool first = true;
      for (const json& element : value) {
        Separator(depth + 1, &first);
        Singular(element, field, depth + 1);
      }
      return Close(']', depth);
    }
    Singular(value, field, depth);
  }

  void Singular(const json& value, const FieldDescriptor& field, int depth) {
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return Message(value, *field.message_type(), depth);
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t number = 0;
        if (value.is_string() && absl::SimpleAtoi(value.get<std::string>(), &number)) {
          return Append(json(number).dump());
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t number = 0;
        if (value.is_string() && absl::SimpleAtoi(value.get<std::string>(), &number)) {
          return Append(json(number).dump());
        }
        break;
      }
      default:
        break;
    }
    Value(value, depth);
  }

  // Any JSON value as nlohmann prints it at this depth.
  void Value(const json& value, int depth) {
    if (!pretty_ || !value.is_structured() || value.empty()) return Append(value.dump());
    // Indented as if it began at `depth` (nlohmann indents from 0).
    const std::string text = value.dump(2);
    const std::string indent(2 * depth, ' ');
    for (char c : text) {
      out_ += c;
      if (c == '\n') out_ += indent;
    }
  }

  void Key(const std::string& key, int depth, bool* first) {
    Separator(depth, first);
    out_ += json(key).dump();
    out_ += pretty_ ? ": " : ":";
  }

  void Separator(int depth, bool* first) {
    if (!*first) out_ += ',';
    *first = false;
    if (pretty_) {
      out_ += '\n';
      out_.append(2 * depth, ' ');
    }
  }

  void Close(char bracket, int depth) {
    if (pretty_) {
      out_ += '\n';
      out_.append(2 * depth, ' ');
    }
    out_ += bracket;
  }

  void Append(const std::string& text) { out_ += text; }

  const bool pretty_;
  std::string out_;
};

}  // namespace

std::string ProtoToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  // Fails only for Any fields with unknown types; Sluice's messages have none.
  (void)google::protobuf::util::MessageToJsonString(message, &text, options);
  const json document = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return text;
  Writer writer(pretty);
  writer.Message(document, *message.GetDescriptor(), 0);
  return writer.Take();
}

}  // namespace sluice::controller
