#include "common/run/run_weight_sync.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace sluice::run {

namespace {

bool Is16Bit(v1::DType dtype) { return dtype == v1::DTYPE_BFLOAT16 || dtype == v1::DTYPE_FLOAT16; }

const char* ShortName(v1::WeightTransport transport) {
  switch (transport) {
    case v1::WEIGHT_TRANSPORT_CUDA_IPC:
      return "cuda_ipc";
    case v1::WEIGHT_TRANSPORT_NCCL:
      return "nccl";
    default:
      return "grpc";
  }
}

}  // namespace

bool IsCudaDevice(absl::string_view device) {
  return device == "cuda" || absl::StartsWith(device, "cuda:");
}

WeightSync ResolveWeightSync(const v1::RunSpec& spec) {
  const v1::WeightSyncConfig& config = spec.weight_sync();
  WeightSync sync;
  if (config.transport() != v1::WEIGHT_TRANSPORT_UNSPECIFIED) sync.transport = config.transport();
  if (config.dtype() == v1::DTYPE_UNSPECIFIED) {
    sync.dtype = IsCudaDevice(spec.model().device()) ? v1::DTYPE_BFLOAT16 : v1::DTYPE_FLOAT32;
  } else if (config.dtype() == v1::DTYPE_FLOAT32 || Is16Bit(config.dtype())) {
    sync.dtype = config.dtype();
  }
  sync.delta = Is16Bit(sync.dtype) && (!config.has_delta() || config.delta());
  return sync;
}

void ValidateWeightSync(const v1::RunSpec& spec, std::vector<std::string>* problems) {
  const v1::WeightSyncConfig& config = spec.weight_sync();
  const std::string& device = spec.model().device();
  const bool cuda = IsCudaDevice(device);
  switch (config.transport()) {
    case v1::WEIGHT_TRANSPORT_UNSPECIFIED:
    case v1::WEIGHT_TRANSPORT_GRPC:
      break;
    case v1::WEIGHT_TRANSPORT_CUDA_IPC:
    case v1::WEIGHT_TRANSPORT_NCCL:
      if (!cuda) {
        const char* what = config.transport() == v1::WEIGHT_TRANSPORT_CUDA_IPC
                               ? "moves weights between GPUs of one host"
                               : "broadcasts weights between GPUs";
        problems->push_back(absl::StrCat("weight_sync.transport: ", ShortName(config.transport()),
                                         " ", what, "; model.device is \"",
                                         device.empty() ? "cpu" : device,
                                         "\" (use grpc, or run on cuda)"));
      } else {
        // The hand-off itself exists and is measured (common/cuda,
        // scripts/gpu-check.sh), but no service publishes or maps a version
        // through it yet: refused rather than silently sent over gRPC.
        problems->push_back(absl::StrCat(
            "weight_sync.transport: ", ShortName(config.transport()),
            " is not wired into the trainer and rollout workers yet (its hand-off is in "
            "common/cuda and measured by scripts/gpu-check.sh, docs/gpu.md); use grpc"));
      }
      break;
    default:
      problems->push_back(absl::StrCat("weight_sync.transport: unknown transport ",
                                       static_cast<int>(config.transport()),
                                       " (grpc, cuda_ipc or nccl)"));
  }
  const v1::DType dtype = config.dtype();
  if (dtype != v1::DTYPE_UNSPECIFIED && dtype != v1::DTYPE_FLOAT32 && !Is16Bit(dtype)) {
    problems->push_back(
        absl::StrCat("weight_sync.dtype: versions travel as float32, bfloat16 or "
                     "float16, got ",
                     v1::DType_Name(dtype)));
    return;
  }
  const WeightSync sync = ResolveWeightSync(spec);
  if (config.has_delta() && config.delta() && !Is16Bit(sync.dtype)) {
    problems->push_back(absl::StrCat(
        "weight_sync.delta: sparse deltas need a 16-bit weight_sync.dtype (bfloat16 or float16); "
        "in float32 every weight changes at every optimizer step, so a delta would be larger "
        "than the version",
        dtype == v1::DTYPE_UNSPECIFIED ? " (the dtype defaults to float32 on cpu)" : "",
        ". Set weight_sync.dtype: bfloat16, or leave delta unset"));
  }
}

std::string WeightTransportLabel(v1::WeightTransport transport, bool delta) {
  if (delta &&
      (transport == v1::WEIGHT_TRANSPORT_GRPC || transport == v1::WEIGHT_TRANSPORT_UNSPECIFIED)) {
    return "grpc_delta";
  }
  return ShortName(transport);
}

std::string WeightSyncDTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_BFLOAT16:
      return "bfloat16";
    default:
      return "float32";
  }
}

}  // namespace sluice::run
