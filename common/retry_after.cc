#include "common/retry_after.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

// The absl::Status payload of WithRetryAfter: decimal milliseconds. Named in
// the style of clients' type.sluice.dev/sluice.RetriesExhausted.
constexpr absl::string_view kRetryAfterUrl = "type.sluice.dev/sluice.RetryAfter";

}  // namespace

std::optional<absl::Duration> ParseRetryPushback(absl::string_view milliseconds) {
  if (milliseconds.empty()) return std::nullopt;
  for (const char c : milliseconds) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  // Digits only: parse without overflow, stopping once past the cap.
  const int64_t cap = absl::ToInt64Milliseconds(kMaxRetryAfter);
  int64_t ms = 0;
  for (const char c : milliseconds) {
    ms = ms * 10 + (c - '0');
    if (ms > cap) return kMaxRetryAfter;
  }
  return absl::Milliseconds(ms);
}

absl::Status WithRetryAfter(absl::Status status, absl::Duration after) {
  if (status.ok()) return status;
  const absl::Duration clamped = std::clamp(after, absl::ZeroDuration(), kMaxRetryAfter);
  status.SetPayload(kRetryAfterUrl, absl::Cord(absl::StrCat(absl::ToInt64Milliseconds(clamped))));
  return status;
}

std::optional<absl::Duration> RetryAfter(const absl::Status& status) {
  if (status.ok()) return std::nullopt;
  const auto payload = status.GetPayload(kRetryAfterUrl);  // an absl::optional
  if (!payload.has_value()) return std::nullopt;
  return ParseRetryPushback(std::string(*payload));
}

absl::Status WithoutRetryAfter(absl::Status status) {
  status.ErasePayload(kRetryAfterUrl);
  return status;
}

}  // namespace sluice
