#include "reward_server/length_verifier.h"

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::reward_server {
namespace {

// Code points of UTF-8 `text`: every byte that does not continue a sequence.
// Invalid bytes count as one character each.
int64_t CountCodePoints(absl::string_view text) {
  int64_t count = 0;
  for (unsigned char c : text) count += (c & 0xC0) != 0x80;
  return count;
}

// metadata[key] as an integer, `fallback` when absent; INVALID_ARGUMENT naming
// the key when present but not an integer.
absl::StatusOr<int64_t> IntParam(const VerifyRequest& request, const std::string& key,
                                 std::optional<int64_t> fallback) {
  const auto it = request.metadata.find(key);
  if (it == request.metadata.end() || it->second.empty()) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat("length: metadata ", key, " is required"));
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("length: metadata ", key, " must be an integer, got \"", it->second, "\""));
  }
  return value;
}

}  // namespace

LengthVerifier::LengthVerifier()
    : Verifier({
          .name = "length",
          .description = "Length penalty in [0, 1]: 1 up to max_length - length_cache, a linear "
                         "ramp to 0 at max_length (DAPO's soft overlong punishment).",
          .default_timeout = absl::Milliseconds(1000),
          .max_timeout = absl::Seconds(60),
          .required_fields = {"max_length"},
      }) {}

VerifyOutcome LengthVerifier::Verify(const VerifyRequest& request) const {
  const auto invalid = [](const absl::Status& status) {
    return VerifyOutcome::Error(VerifierErrorKind::kInvalidInput, std::string(status.message()));
  };
  absl::StatusOr<int64_t> max_length = IntParam(request, "max_length", std::nullopt);
  if (!max_length.ok()) return invalid(max_length.status());
  if (*max_length <= 0) {
    return invalid(absl::InvalidArgumentError(
        absl::StrCat("length: max_length must be > 0, got ", *max_length)));
  }
  absl::StatusOr<int64_t> cache = IntParam(request, "length_cache", 0);
  if (!cache.ok()) return invalid(cache.status());
  if (*cache < 0 || *cache > *max_length) {
    return invalid(absl::InvalidArgumentError(absl::StrCat(
        "length: length_cache must be in [0, max_length=", *max_length, "], got ", *cache)));
  }
  const auto unit_it = request.metadata.find("length_unit");
  const std::string unit = unit_it == request.metadata.end() ? "auto" : unit_it->second;
  const bool has_tokens = request.metadata.count("completion_tokens") > 0;
  bool tokens = false;
  if (unit == "tokens") {
    if (!has_tokens) {
      return invalid(absl::InvalidArgumentError(
          "length: length_unit is tokens but the item has no completion_tokens metadata"));
    }
    tokens = true;
  } else if (unit == "auto" || unit.empty()) {
    tokens = has_tokens;
  } else if (unit != "chars") {
    return invalid(absl::InvalidArgumentError(
        absl::StrCat("length: length_unit must be tokens, chars or auto, got \"", unit, "\"")));
  }
  int64_t length = 0;
  if (tokens) {
    absl::StatusOr<int64_t> count = IntParam(request, "completion_tokens", std::nullopt);
    if (!count.ok()) return invalid(count.status());
    if (*count < 0) {
      return invalid(absl::InvalidArgumentError(
          absl::StrCat("length: completion_tokens must be >= 0, got ", *count)));
    }
    length = *count;
  } else {
    length = CountCodePoints(request.response);
  }

  VerifyOutcome outcome;
  const int64_t free_up_to = *max_length - *cache;
  if (length <= free_up_to) {
    outcome.reward = 1.0;
  } else if (length <= *max_length) {
    outcome.reward = static_cast<double>(*max_length - length) / static_cast<double>(*cache);
  } else {
    outcome.reward = 0.0;
  }
  outcome.extracted_answer = absl::StrCat(length, tokens ? " tokens" : " chars");
  outcome.detail = absl::StrFormat("length %d %s; full reward up to %d, 0 past %d", length,
                                   tokens ? "tokens" : "chars", free_up_to, *max_length);
  return outcome;
}

}  // namespace sluice::reward_server
