#include "common/run/verifier_params.h"

#include <cstdint>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "re2/re2.h"

namespace sluice::run {
namespace {

absl::Status Bad(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(key, ": ", why));
}

absl::Status CheckKeys(absl::string_view verifier, const std::map<std::string, std::string>& params,
                       const std::set<std::string>& known) {
  for (const auto& [key, value] : params) {
    if (known.count(key) == 0) {
      return Bad(key, absl::StrCat("not a parameter of \"", verifier, "\" (it reads ",
                                   known.empty() ? "none" : absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInt(const std::map<std::string, std::string>& params, const std::string& key,
                      int64_t min, int64_t max, bool required, int64_t* out) {
  auto it = params.find(key);
  if (it == params.end()) {
    if (required) return Bad(key, "required");
    return absl::OkStatus();
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return Bad(key, absl::StrCat("must be an integer, got \"", it->second, "\""));
  }
  if (value < min || value > max) {
    return Bad(key, absl::StrCat("must be in [", min, ", ", max, "], got ", value));
  }
  if (out != nullptr) *out = value;
  return absl::OkStatus();
}

absl::Status CheckBool(const std::map<std::string, std::string>& params, const std::string& key) {
  auto it = params.find(key);
  if (it == params.end()) return absl::OkStatus();
  bool ok = false;
  ParseBoolParam(it->second, &ok);
  if (!ok) return Bad(key, absl::StrCat("must be true or false, got \"", it->second, "\""));
  return absl::OkStatus();
}

absl::Status CheckOneOf(const std::map<std::string, std::string>& params, const std::string& key,
                        const std::set<std::string>& values) {
  auto it = params.find(key);
  if (it == params.end() || values.count(it->second) > 0) return absl::OkStatus();
  return Bad(key, absl::StrCat("must be one of ", absl::StrJoin(values, ", "), ", got \"",
                               it->second, "\""));
}

}  // namespace

const std::vector<std::string>& BuiltinVerifierNames() {
  static const std::vector<std::string>* const names =
      new std::vector<std::string>{"code", "exact_match", "format", "length", "math"};
  return *names;
}

bool ParseBoolParam(absl::string_view value, bool* ok) {
  const std::string lower = absl::AsciiStrToLower(value);
  *ok = true;
  if (lower == "true" || lower == "1" || lower == "yes") return true;
  if (lower == "false" || lower == "0" || lower == "no") return false;
  *ok = false;
  return false;
}

absl::Status ValidateVerifierParams(absl::string_view verifier,
                                    const std::map<std::string, std::string>& params) {
  if (verifier == "format") {
    if (absl::Status s = CheckKeys(verifier, params, {"format_regex", "format_full_match", "format"});
        !s.ok()) {
      return s;
    }
    if (auto it = params.find("format_regex"); it != params.end()) {
      if (it->second.size() > 4096) return Bad("format_regex", "longer than 4096 bytes");
      RE2::Options options;
      options.set_log_errors(false);
      RE2 re(it->second, options);
      if (!re.ok()) return Bad("format_regex", absl::StrCat("not a valid RE2 pattern: ", re.error()));
    }
    if (absl::Status s = CheckBool(params, "format_full_match"); !s.ok()) return s;
    return CheckOneOf(params, "format", {"answer_marker", "boxed", "think_answer"});
  }
  if (verifier == "length") {
    if (absl::Status s =
            CheckKeys(verifier, params, {"max_length", "length_cache", "length_unit"});
        !s.ok()) {
      return s;
    }
    int64_t max_length = 0;
    if (absl::Status s = CheckInt(params, "max_length", 1, int64_t{1} << 40, true, &max_length);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckInt(params, "length_cache", 0, max_length, false, nullptr); !s.ok()) {
      return s;
    }
    return CheckOneOf(params, "length_unit", {"tokens", "chars", "auto"});
  }
  if (verifier == "math") {
    if (absl::Status s = CheckKeys(verifier, params, {"precision", "strict"}); !s.ok()) return s;
    if (absl::Status s = CheckInt(params, "precision", 0, 15, false, nullptr); !s.ok()) return s;
    return CheckBool(params, "strict");
  }
  if (verifier == "code" || verifier == "exact_match") return CheckKeys(verifier, params, {});
  return absl::OkStatus();
}

}  // namespace sluice::run
