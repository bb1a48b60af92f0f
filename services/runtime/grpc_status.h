#ifndef SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_
#define SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_

#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/string_ref.h"

namespace sluice::runtime {

// The one place where absl::Status and grpc::Status meet. Core libraries
// return absl::Status; services convert at the edge. The canonical codes are
// numerically identical in both, so the code always survives the round trip,
// and so does the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// ---- retry hints (backpressure) ----------------------------------------------
//
// A server that refuses a call it did not process because it is full (the
// reward server when its code-sandbox pool is, with RESOURCE_EXHAUSTED) says
// when to come back in this trailing metadata key, whose value is a decimal
// number of milliseconds. The name is gRPC's own (gRFC A6, "retry pushback"):
// were a retryPolicy ever set in a channel's service config, gRPC's built-in
// retries would honour the same hint.
inline constexpr absl::string_view kRetryPushbackMetadataKey = "grpc-retry-pushback-ms";
// The longest hint believed; a longer one is cut to this (a server's estimate
// of minutes is not one to sleep on, and a bad value must not park a caller).
inline constexpr absl::Duration kMaxRetryAfter = absl::Seconds(60);

// `status` (not OK) carrying the hint "retry after `after`" as an absl::Status
// payload (type.sluice.dev/sluice.RetryAfter, decimal milliseconds), which
// clients::PrefixMessage keeps. `after` is rounded down to milliseconds and
// clamped to [0, kMaxRetryAfter]. An OK status is returned unchanged.
absl::Status WithRetryAfter(absl::Status status, absl::Duration after);
// The hint WithRetryAfter attached, capped at kMaxRetryAfter; nullopt when
// `status` is OK or has none, or the payload is not a non-negative decimal
// number of milliseconds.
std::optional<absl::Duration> RetryAfter(const absl::Status& status);
// `status` without the hint (for an error whose retries are over).
absl::Status WithoutRetryAfter(absl::Status status);
// A kRetryPushbackMetadataKey value as a duration, capped at kMaxRetryAfter;
// nullopt unless it is a non-negative decimal integer. (gRFC A6: a negative
// or malformed pushback means "do not retry"; here it means "no hint", which
// leaves the failure to the ordinary rules of its code.)
std::optional<absl::Duration> ParseRetryPushback(absl::string_view milliseconds);

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
