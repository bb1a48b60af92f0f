// CUDA runtime errors as absl::Status: the CUDA code of Sluice reports every
// failure as a value naming what it was doing and CUDA's own words, and never
// aborts (a rollout worker whose IPC open fails falls back to the gRPC path).
//
// Built without a GPU; its callers ran on one H200 (driver 580.159.04, CUDA 13.0, sm_90 build).
#ifndef SLUICE_COMMON_CUDA_CUDA_STATUS_H_
#define SLUICE_COMMON_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sluice {

// OK for cudaSuccess; otherwise "<what>: <cudaGetErrorName> (<cudaGetErrorString>)"
// with a code a caller can act on: RESOURCE_EXHAUSTED for out-of-memory,
// INVALID_ARGUMENT for bad values / pointers / handles, UNAVAILABLE for no
// device or driver, INTERNAL otherwise. Note that a sticky error (a kernel
// fault) poisons the context: every later call fails with it too.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace sluice

// Returns the CudaStatus of a CUDA call that failed, from a function that
// returns absl::Status or absl::StatusOr.
#define SLUICE_RETURN_IF_CUDA_ERROR(call, what)                \
  do {                                                         \
    const cudaError_t sluice_cuda_error_ = (call);             \
    if (sluice_cuda_error_ != cudaSuccess) {                   \
      return ::sluice::CudaStatus(sluice_cuda_error_, (what)); \
    }                                                          \
  } while (false)

#endif  // SLUICE_COMMON_CUDA_CUDA_STATUS_H_
