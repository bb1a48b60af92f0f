#include "services/runtime/config_file.h"

#include <fstream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "yaml-cpp/yaml.h"

namespace sluice::runtime {
namespace {

std::string KnownKeys(const CLI::App& app) {
  std::vector<std::string> keys;
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      if (name == "help" || name == "version" || name == "config") continue;
      keys.push_back(absl::StrReplaceAll(name, {{"-", "_"}}));
    }
  }
  return absl::StrJoin(keys, ", ");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ConfigFileToArgs(const std::string& path,
                                                          const CLI::App& app) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read config file '", path, "': ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config file '", path, "' is not valid YAML: ", e.what()));
  }
  if (root.IsNull()) return std::vector<std::string>{};
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file '", path, "' must be a mapping of option names to values"));
  }

  std::vector<std::string> args;
  for (const auto& entry : root) {
    const std::string key = entry.first.as<std::string>();
    const std::string flag = absl::StrReplaceAll(key, {{"_", "-"}});
    if (flag == "config" || flag == "help" || flag == "version" ||
        app.get_option_no_throw("--" + flag) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("config file '", path, "': unknown key '",
                                                     key, "' (known keys: ", KnownKeys(app),
                                                     ")"));
    }
    const YAML::Node& value = entry.second;
    const auto scalar = [&](const YAML::Node& node) -> absl::StatusOr<std::string> {
      if (!node.IsScalar()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "config file '", path, "': key '", key, "' must be a scalar or a list of scalars"));
      }
      return node.Scalar();
    };
    if (value.IsSequence()) {
      for (const auto& item : value) {
        absl::StatusOr<std::string> s = scalar(item);
        if (!s.ok()) return s.status();
        args.push_back(absl::StrCat("--", flag, "=", *s));
      }
    } else {
      absl::StatusOr<std::string> s = scalar(value);
      if (!s.ok()) return s.status();
      args.push_back(absl::StrCat("--", flag, "=", *s));
    }
  }
  return args;
}

std::string FindConfigFlag(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg(argv[i]);
    if (arg == "--") break;
    if (arg == "--config" && i + 1 < argc) return argv[i + 1];
    if (arg.rfind("--config=", 0) == 0) return std::string(arg.substr(9));
  }
  return "";
}

}  // namespace sluice::runtime
