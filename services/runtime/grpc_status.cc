#include "services/runtime/grpc_status.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace sluice::runtime {
namespace {

constexpr std::array<absl::string_view, 17> kCodeNames = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  // absl allows codes outside gRPC's range; gRPC does not.
  const auto grpc_code = code > 0 && code < static_cast<int>(kCodeNames.size())
                             ? static_cast<grpc::StatusCode>(code)
                             : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

absl::Status FromGrpcStatus(
    const grpc::Status& status,
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailing_metadata) {
  absl::Status converted = FromGrpcStatus(status);
  if (converted.ok()) return converted;
  const auto it = trailing_metadata.find(
      grpc::string_ref(kRetryPushbackMetadataKey.data(), kRetryPushbackMetadataKey.size()));
  if (it == trailing_metadata.end()) return converted;
  const std::optional<absl::Duration> after =
      ParseRetryPushback(absl::string_view(it->second.data(), it->second.size()));
  return after.has_value() ? WithRetryAfter(std::move(converted), *after) : converted;
}

absl::string_view StatusCodeName(int code) {
  if (code >= 0 && code < static_cast<int>(kCodeNames.size())) return kCodeNames[code];
  return "UNKNOWN_CODE";
}

}  // namespace sluice::runtime
