#ifndef SLUICE_COMMON_RETRY_AFTER_H_
#define SLUICE_COMMON_RETRY_AFTER_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sluice {

// A server that refuses a call it did not process because it is full (the
// reward server when its code-sandbox pool is, with RESOURCE_EXHAUSTED) says
// when to come back; on the wire that is gRPC's retry pushback trailing
// metadata (services/runtime/grpc_status.h), in a core library an
// absl::Status payload. No gRPC here, so the clients' retry logic and the
// services' cores use it without linking gRPC.

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
// A retry pushback value (decimal milliseconds) as a duration, capped at
// kMaxRetryAfter; nullopt unless it is a non-negative decimal integer. (gRFC A6: a negative
// or malformed pushback means "do not retry"; here it means "no hint", which
// leaves the failure to the ordinary rules of its code.)
std::optional<absl::Duration> ParseRetryPushback(absl::string_view milliseconds);

}  // namespace sluice

#endif  // SLUICE_COMMON_RETRY_AFTER_H_
