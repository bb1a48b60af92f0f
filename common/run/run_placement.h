#ifndef SLUICE_COMMON_RUN_RUN_PLACEMENT_H_
#define SLUICE_COMMON_RUN_RUN_PLACEMENT_H_

// Where a run's model goes on this process, from its spec's model.device and
// model.dtype. Header-only: it needs LibTorch (ModelPlacement), which
// sluice_run_inputs does not link, and only the trainer and the rollout
// worker (both torch binaries) include it.

#include <optional>

#include "absl/status/statusor.h"
#include "common/model/device_spec.h"
#include "common/model/transformer.h"
#include "sluice/v1/common.pb.h"

namespace sluice::run {

// model.dtype as the model code names it; nullopt when unspecified.
inline std::optional<model::DType> RunModelDType(const v1::ModelConfig& model) {
  switch (model.dtype()) {
    case v1::DTYPE_FLOAT32:
      return model::DType::kF32;
    case v1::DTYPE_BFLOAT16:
      return model::DType::kBF16;
    case v1::DTYPE_FLOAT16:
      return model::DType::kF16;
    default:
      return std::nullopt;
  }
}

// PlacementFor the spec: `training` for the trainer (float32 masters on a
// GPU), false for a rollout worker. INVALID_ARGUMENT for a device this
// binary cannot use (a CPU-only LibTorch asked for cuda, a missing GPU).
inline absl::StatusOr<model::ModelPlacement> RunModelPlacement(const v1::ModelConfig& model,
                                                               bool training) {
  absl::StatusOr<model::DeviceSpec> device = model::ParseDeviceSpec(model.device());
  if (!device.ok()) return device.status();
  return model::PlacementFor(*device, RunModelDType(model), training);
}

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_PLACEMENT_H_
