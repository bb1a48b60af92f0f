#include "services/controller/proto_json.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace sluice::controller {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

void Convert(nlohmann::ordered_json& value, const FieldDescriptor& field);

// Proto JSON spells int64 and uint64 as strings; make them numbers again.
void ConvertMessage(nlohmann::ordered_json& object, const Descriptor& type) {
  if (!object.is_object()) return;
  // google.protobuf.* types (Timestamp, Duration, ...) have their own JSON form.
  if (absl::StartsWith(type.file()->name(), "google/protobuf/")) return;
  for (auto& [key, value] : object.items()) {
    const FieldDescriptor* field = type.FindFieldByName(key);
    if (field == nullptr) continue;
    if (field->is_map()) {
      if (!value.is_object()) continue;
      const FieldDescriptor& value_field = *field->message_type()->map_value();
      for (auto& [map_key, entry] : value.items()) Convert(entry, value_field);
    } else if (field->is_repeated()) {
      if (!value.is_array()) continue;
      for (nlohmann::ordered_json& element : value) Convert(element, *field);
    } else {
      Convert(value, *field);
    }
  }
}

void Convert(nlohmann::ordered_json& value, const FieldDescriptor& field) {
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_MESSAGE:
      ConvertMessage(value, *field.message_type());
      break;
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t number = 0;
      if (value.is_string() && absl::SimpleAtoi(value.get<std::string>(), &number)) value = number;
      break;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      uint64_t number = 0;
      if (value.is_string() && absl::SimpleAtoi(value.get<std::string>(), &number)) value = number;
      break;
    }
    default:
      break;
  }
}

}  // namespace

std::string ProtoToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  // Fails only for Any fields with unknown types; Sluice's messages have none.
  (void)google::protobuf::util::MessageToJsonString(message, &text, options);
  nlohmann::ordered_json document = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return text;
  ConvertMessage(document, *message.GetDescriptor());
  return document.dump(pretty ? 2 : -1);
}

}  // namespace sluice::controller
