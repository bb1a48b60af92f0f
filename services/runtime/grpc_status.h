#ifndef SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_
#define SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_

#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/retry_after.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/string_ref.h"

namespace sluice::runtime {

// The one place where absl::Status and grpc::Status meet. Core libraries
// return absl::Status; services convert at the edge. The canonical codes are
// numerically identical in both, so the code always survives the round trip,
// and so does the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Retry hints (WithRetryAfter, RetryAfter, ...) are plain absl::Status
// payloads: common/retry_after.h. A server sends one in this trailing
// metadata key, whose value is a decimal number of milliseconds. The name is
// gRPC's own (gRFC A6, "retry pushback"): were a retryPolicy ever set in a
// channel's service config, gRPC's built-in retries would honour the same hint.
inline constexpr absl::string_view kRetryPushbackMetadataKey = "grpc-retry-pushback-ms";

// FromGrpcStatus, with the server's hint in `trailing_metadata`
// (grpc::ClientContext::GetServerTrailingMetadata(), read after the call
// finished) attached by WithRetryAfter when the call failed.
absl::Status FromGrpcStatus(
    const grpc::Status& status,
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailing_metadata);

// "OK", "CANCELLED", ..., "UNAUTHENTICATED"; "UNKNOWN_CODE_<n>" outside the
// canonical range. Used as the grpc_code metrics label.
absl::string_view StatusCodeName(int code);

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_
