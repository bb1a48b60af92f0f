#ifndef SLUICE_COMMON_RUN_RUN_WEIGHT_SYNC_H_
#define SLUICE_COMMON_RUN_RUN_WEIGHT_SYNC_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "sluice/v1/common.pb.h"

// What a run spec's `weight_sync` section resolves to: the transport, the
// dtype versions travel in and whether they travel as sparse deltas. The
// controller validates with it; the trainer publishes and the rollout
// workers fetch with it, so that the three agree whatever defaults the
// spec left unset.
namespace sluice::run {

struct WeightSync {
  v1::WeightTransport transport = v1::WEIGHT_TRANSPORT_GRPC;
  // FLOAT32, BFLOAT16 or FLOAT16.
  v1::DType dtype = v1::DTYPE_FLOAT32;
  bool delta = false;
};

// model.device names a CUDA device ("cuda", "cuda:N").
bool IsCudaDevice(absl::string_view device);

// The spec's weight_sync with its defaults: transport GRPC; dtype FLOAT32
// on cpu, BFLOAT16 on cuda; delta on for a 16-bit dtype. A spec that
// ValidateWeightSync refuses resolves to something (deltas never for
// float32), but should not be run.
WeightSync ResolveWeightSync(const v1::RunSpec& spec);

// "path: problem" lines for weight_sync: a GPU transport on a cpu model, a
// dtype weights cannot travel in, deltas asked for float32.
void ValidateWeightSync(const v1::RunSpec& spec, std::vector<std::string>* problems);

// The metrics label of a transport: "grpc", "cuda_ipc", "nccl"; with
// `delta`, "grpc_delta" for a version that went as a sparse delta.
std::string WeightTransportLabel(v1::WeightTransport transport, bool delta = false);

// A resolved weight_sync.dtype as summaries and logs name it: "float32",
// "bfloat16" or "float16".
std::string WeightSyncDTypeName(v1::DType dtype);

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_WEIGHT_SYNC_H_
