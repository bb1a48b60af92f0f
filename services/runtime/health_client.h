#ifndef SLUICE_SERVICES_RUNTIME_HEALTH_CLIENT_H_
#define SLUICE_SERVICES_RUNTIME_HEALTH_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::runtime {

// Asks `target` ("host:port") for the grpc.health.v1 status of `service` (""
// for the whole server) and returns its name: "SERVING", "NOT_SERVING",
// "UNKNOWN" or "SERVICE_UNKNOWN". Blocks for at most `timeout`; an
// unreachable server is UNAVAILABLE or DEADLINE_EXCEEDED.
absl::StatusOr<std::string> CheckHealth(const std::string& target, const std::string& service,
                                        absl::Duration timeout);

// A plain HTTP/1.0 GET of an http:// URL with a deadline; returns the body of
// a 200 response, an error for anything else. Enough to read /metrics without
// another dependency.
absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout);

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_HEALTH_CLIENT_H_
