#include "controller/spec_yaml.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/depthguard.h"
#include "yaml-cpp/yaml.h"

namespace sluice::controller {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using nlohmann::json;

// The offset of the first byte of `text` that does not belong to a valid
// UTF-8 sequence (overlong forms, surrogates and code points past U+10FFFF
// included), or npos. O(n).
size_t FirstInvalidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = static_cast<unsigned char>(text[i]);
    size_t length;
    unsigned char low = 0x80, high = 0xbf;  // The second byte's range.
    if (lead < 0x80) {
      ++i;
      continue;
    } else if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      if (lead == 0xe0) low = 0xa0;   // overlong
      if (lead == 0xed) high = 0x9f;  // surrogates
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      if (lead == 0xf0) low = 0x90;   // overlong
      if (lead == 0xf4) high = 0x8f;  // past U+10FFFF
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    for (size_t k = 1; k < length; ++k) {
      const unsigned char byte = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (byte < low || byte > high) : (byte < 0x80 || byte > 0xbf)) return i;
    }
    i += length;
  }
  return absl::string_view::npos;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The common "OBJECTIVE_" of OBJECTIVE_UNSPECIFIED, OBJECTIVE_GRPO, ...
std::string EnumPrefix(const EnumDescriptor& type) {
  if (type.value_count() < 2) return "";
  std::string prefix = type.value(0)->name();
  for (int i = 1; i < type.value_count(); ++i) {
    const std::string& name = type.value(i)->name();
    size_t n = 0;
    while (n < prefix.size() && n < name.size() && prefix[n] == name[n]) ++n;
    prefix.resize(n);
  }
  const size_t underscore = prefix.rfind('_');
  return underscore == std::string::npos ? "" : prefix.substr(0, underscore + 1);
}

std::string ShortEnumName(const std::string& full, const std::string& prefix) {
  return absl::AsciiStrToLower(full.substr(prefix.size()));
}

class Converter {
 public:
  explicit Converter(std::string source) : source_(std::move(source)) {}

  json Message(const YAML::Node& node, const Descriptor& type, const std::string& path) {
    json out = json::object();
    if (node.IsNull()) return out;
    if (!node.IsMap()) {
      Error(node, path.empty() ? "the run spec" : path,
            absl::StrCat("expected a mapping of ", type.name(), " fields, got ", Kind(node)));
      return out;
    }
    std::set<std::string> seen;
    std::set<int> oneofs_seen;
    for (const auto& entry : node) {
      const YAML::Node& key = entry.first;
      if (!key.IsScalar()) {
        Error(key, path.empty() ? "the run spec" : path, "field names must be plain strings");
        continue;
      }
      const std::string name = key.Scalar();
      const FieldDescriptor* field = type.FindFieldByName(name);
      if (field == nullptr) field = type.FindFieldByCamelcaseName(name);
      if (field == nullptr) {
        UnknownField(key, name, type, path);
        continue;
      }
      const std::string field_path = path.empty() ? field->name() : path + "." + field->name();
      if (!seen.insert(field->name()).second) {
        Error(key, field_path, "given more than once");
        continue;
      }
      const YAML::Node& value = entry.second;
      if (value.IsNull()) {
        // `arithmetic:` alone selects the message with its defaults; a null
        // scalar or list is simply unset.
        if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated()) {
          if (!CheckOneof(key, *field, path, oneofs_seen)) continue;
          out[field->name()] = json::object();
        }
        continue;
      }
      if (!CheckOneof(key, *field, path, oneofs_seen)) continue;
      std::optional<json> converted = Field(value, *field, field_path);
      if (converted.has_value()) out[field->name()] = std::move(*converted);
    }
    return out;
  }

  const std::vector<std::string>& errors() const { return errors_; }

 private:
  // False (and an error) when another member of the field's oneof was given.
  bool CheckOneof(const YAML::Node& key, const FieldDescriptor& field, const std::string& path,
                  std::set<int>& oneofs_seen) {
    const auto* oneof = field.real_containing_oneof();
    if (oneof == nullptr || oneofs_seen.insert(oneof->index()).second) return true;
    std::vector<std::string> names;
    for (int i = 0; i < oneof->field_count(); ++i) names.push_back(oneof->field(i)->name());
    Error(key, path.empty() ? "the run spec" : path,
          absl::StrCat("only one of ", absl::StrJoin(names, " or "), " may be set"));
    return false;
  }

  std::optional<json> Field(const YAML::Node& node, const FieldDescriptor& field,
                            const std::string& path) {
    if (field.is_map()) {
      if (!node.IsMap()) {
        Error(node, path, absl::StrCat("expected a mapping, got ", Kind(node)));
        return std::nullopt;
      }
      const FieldDescriptor& key_field = *field.message_type()->map_key();
      const FieldDescriptor& value_field = *field.message_type()->map_value();
      json out = json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) {
          Error(entry.first, path, "map keys must be scalars");
          continue;
        }
        const std::string entry_path = absl::StrCat(path, "[\"", entry.first.Scalar(), "\"]");
        std::optional<json> key = Singular(entry.first, key_field, entry_path);
        std::optional<json> value = Singular(entry.second, value_field, entry_path);
        if (!key.has_value() || !value.has_value()) continue;
        out[key->is_string() ? key->get<std::string>() : key->dump()] = std::move(*value);
      }
      return out;
    }
    if (field.is_repeated()) {
      json out = json::array();
      if (node.IsSequence()) {
        for (size_t i = 0; i < node.size(); ++i) {
          std::optional<json> item = Singular(node[i], field, absl::StrCat(path, "[", i, "]"));
          if (item.has_value()) out.push_back(std::move(*item));
        }
      } else {
        std::optional<json> item = Singular(node, field, path);
        if (item.has_value()) out.push_back(std::move(*item));
      }
      return out;
    }
    return Singular(node, field, path);
  }

  std::optional<json> Singular(const YAML::Node& node, const FieldDescriptor& field,
                               const std::string& path) {
    if (field.cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      return Message(node, *field.message_type(), path);
    }
    if (!node.IsScalar()) {
      Error(node, path, absl::StrCat("expected ", Expected(field), ", got ", Kind(node)));
      return std::nullopt;
    }
    const std::string& text = node.Scalar();
    const auto bad = [&]() -> std::optional<json> {
      Error(node, path, absl::StrCat("expected ", Expected(field), ", got \"", text, "\""));
      return std::nullopt;
    };
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        return json(text);
      case FieldDescriptor::CPPTYPE_BOOL: {
        const std::string lower = absl::AsciiStrToLower(text);
        if (lower == "true" || lower == "yes" || lower == "on") return json(true);
        if (lower == "false" || lower == "no" || lower == "off") return json(false);
        return bad();
      }
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t value = 0;
        if (!absl::SimpleAtoi(text, &value)) return bad();
        if (field.cpp_type() == FieldDescriptor::CPPTYPE_INT32 &&
            (value < std::numeric_limits<int32_t>::min() ||
             value > std::numeric_limits<int32_t>::max())) {
          Error(node, path, absl::StrCat("value ", text, " is out of range for a 32-bit integer"));
          return std::nullopt;
        }
        return json(value);
      }
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t value = 0;
        if (!absl::SimpleAtoi(text, &value)) return bad();
        if (field.cpp_type() == FieldDescriptor::CPPTYPE_UINT32 &&
            value > std::numeric_limits<uint32_t>::max()) {
          Error(node, path, absl::StrCat("value ", text, " is out of range for a 32-bit integer"));
          return std::nullopt;
        }
        return json(value);
      }
      case FieldDescriptor::CPPTYPE_FLOAT:
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        // YAML spells the specials .inf, -.inf and .nan; proto JSON wants
        // "Infinity", "-Infinity" and "NaN".
        const std::string lower = absl::AsciiStrToLower(text);
        if (lower == ".inf" || lower == "+.inf" || lower == "inf") return json("Infinity");
        if (lower == "-.inf" || lower == "-inf") return json("-Infinity");
        if (lower == ".nan" || lower == "nan") return json("NaN");
        double value = 0;
        if (!absl::SimpleAtod(text, &value) || !std::isfinite(value)) return bad();
        return json(value);
      }
      case FieldDescriptor::CPPTYPE_ENUM:
        return Enum(node, *field.enum_type(), path);
      case FieldDescriptor::CPPTYPE_MESSAGE:
        break;
    }
    return bad();
  }

  std::optional<json> Enum(const YAML::Node& node, const EnumDescriptor& type,
                           const std::string& path) {
    const std::string& text = node.Scalar();
    const std::string prefix = EnumPrefix(type);
    const std::string upper = absl::StrReplaceAll(absl::AsciiStrToUpper(text), {{"-", "_"}});
    for (const std::string& candidate : {text, upper, prefix + upper}) {
      if (const auto* value = type.FindValueByName(candidate); value != nullptr) {
        return json(value->name());
      }
    }
    std::vector<std::string> names;
    for (int i = 0; i < type.value_count(); ++i) {
      const std::string& name = type.value(i)->name();
      if (absl::EndsWith(name, "_UNSPECIFIED")) continue;
      names.push_back(ShortEnumName(name, prefix));
    }
    Error(
        node, path,
        absl::StrCat("unknown value \"", text, "\"; expected one of ", absl::StrJoin(names, ", "),
                     " (or the full name, e.g. ",
                     type.value_count() > 1 ? type.value(1)->name() : type.value(0)->name(), ")"));
    return std::nullopt;
  }

  void UnknownField(const YAML::Node& key, const std::string& name, const Descriptor& type,
                    const std::string& path) {
    std::vector<std::string> known;
    for (int i = 0; i < type.field_count(); ++i) known.push_back(type.field(i)->name());
    const std::string where = path.empty() ? "the run spec" : path;
    if (const std::optional<std::string> best = ClosestName(name, known); best.has_value()) {
      ErrorLine(key, absl::StrCat("unknown field \"", name, "\" in ", where, "; did you mean \"",
                                  *best, "\"?"));
    } else {
      ErrorLine(key, absl::StrCat("unknown field \"", name, "\" in ", where,
                                  "; known fields: ", absl::StrJoin(known, ", ")));
    }
  }

  static std::string Expected(const FieldDescriptor& field) {
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        return "a string";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true or false";
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
        return "an integer";
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64:
        return "a non-negative integer";
      case FieldDescriptor::CPPTYPE_FLOAT:
      case FieldDescriptor::CPPTYPE_DOUBLE:
        return "a number";
      case FieldDescriptor::CPPTYPE_ENUM:
        return absl::StrCat("a ", field.enum_type()->name(), " value");
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return absl::StrCat("a mapping of ", field.message_type()->name(), " fields");
    }
    return "a value";
  }

  static std::string Kind(const YAML::Node& node) {
    if (node.IsMap()) return "a mapping";
    if (node.IsSequence()) return "a list";
    if (node.IsScalar()) return absl::StrCat("\"", node.Scalar(), "\"");
    return "nothing";
  }

  void Error(const YAML::Node& node, const std::string& path, const std::string& problem) {
    ErrorLine(node, absl::StrCat(path, ": ", problem));
  }

  void ErrorLine(const YAML::Node& node, const std::string& message) {
    const YAML::Mark mark = node.Mark();
    errors_.push_back(mark.is_null() || mark.line < 0
                          ? absl::StrCat(source_, ": ", message)
                          : absl::StrCat(source_, ":", mark.line + 1, ": ", message));
  }

  std::string source_;
  std::vector<std::string> errors_;
};

}  // namespace

std::optional<std::string> ClosestName(absl::string_view name,
                                       const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (const std::string& candidate : candidates) {
    const size_t distance = EditDistance(name, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = &candidate;
    }
  }
  if (best == nullptr || best_distance > std::max<size_t>(2, name.size() / 3)) return std::nullopt;
  return *best;
}

absl::Status YamlToMessage(absl::string_view yaml_text, absl::string_view source_name,
                           google::protobuf::Message* message) {
  message->Clear();
  const std::string source(source_name);
  // nlohmann::json refuses to print a string that is not UTF-8 (it threw
  // out of here), and a spec's strings go on to protos, which must be UTF-8.
  if (const size_t bad = FirstInvalidUtf8(yaml_text); bad != absl::string_view::npos) {
    const absl::string_view before = yaml_text.substr(0, bad);
    const size_t line_start = before.rfind('\n');
    const size_t column = line_start == absl::string_view::npos ? bad : bad - line_start - 1;
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", std::count(before.begin(), before.end(), '\n') + 1, ":", column + 1,
        ": invalid UTF-8 (byte 0x", absl::Hex(static_cast<unsigned char>(yaml_text[bad]),
                                              absl::kZeroPad2),
        "); a run spec must be UTF-8 text"));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own message for this one is "bad file", which says nothing.
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ":", e.mark.column + 1,
                     ": invalid YAML: nested more than ", e.depth() - 1,
                     " levels deep (lists or mappings inside each other; a run spec nests a few)"));
  } catch (const YAML::ParserException& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": invalid YAML: ", e.msg));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid YAML: ", e.what()));
  }
  Converter converter(source);
  json document = converter.Message(root, *message->GetDescriptor(), "");
  if (!converter.errors().empty()) {
    return absl::InvalidArgumentError(absl::StrJoin(converter.errors(), "\n"));
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(document.dump(), message, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", std::string(status.message().data(), status.message().size())));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RunSpec> ParseRunSpecYaml(absl::string_view yaml_text,
                                             absl::string_view source_name) {
  v1::RunSpec spec;
  if (absl::Status status = YamlToMessage(yaml_text, source_name, &spec); !status.ok()) {
    return status;
  }
  return spec;
}

absl::StatusOr<v1::RunSpec> LoadRunSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return ParseRunSpecYaml(text.str(), path);
}

}  // namespace sluice::controller
