#ifndef SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_
#define SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace sluice::runtime {

// The one place where absl::Status and grpc::Status meet. Core libraries
// return absl::Status; services convert at the edge. The canonical codes are
// numerically identical in both, so the code always survives the round trip,
// and so does the message.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// "OK", "CANCELLED", ..., "UNAUTHENTICATED"; "UNKNOWN_CODE_<n>" outside the
// canonical range. Used as the grpc_code metrics label.
absl::string_view StatusCodeName(int code);

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_GRPC_STATUS_H_
