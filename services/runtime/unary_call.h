#ifndef SLUICE_SERVICES_RUNTIME_UNARY_CALL_H_
#define SLUICE_SERVICES_RUNTIME_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/runtime/grpc_status.h"

// The one way a Sluice gRPC client makes a unary call (the controller's
// clients of the services, services/clients' clients of each other): a
// context with a deadline, the call, and the outcome as an absl::StatusOr
// whose error keeps the code, the message and the server's retry hint.
namespace sluice::runtime {

// `context`'s deadline, `timeout` from now.
inline void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// `call(&context, &response)` (a stub's unary method bound to its request)
// with a deadline `timeout` from now. The response, or the call's status as
// an absl::Status with the retry hint a server sent in its trailing metadata
// (FromGrpcStatus, RetryAfter).
template <typename Response, typename Call>
absl::StatusOr<Response> UnaryCall(absl::Duration timeout, Call call) {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  Response response;
  const grpc::Status status = call(&context, &response);
  if (!status.ok()) return FromGrpcStatus(status, context.GetServerTrailingMetadata());
  return response;
}

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_UNARY_CALL_H_
