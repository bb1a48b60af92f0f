#ifndef SLUICE_COMMON_MODEL_DEVICE_SPEC_H_
#define SLUICE_COMMON_MODEL_DEVICE_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::model {

// A run's `model.device` (or a service's --device), parsed without LibTorch
// so that the controller can check a spec without loading it. Whether the
// device exists is for the process that places the model there to say
// (ValidatePlacement).
struct DeviceSpec {
  bool cuda = false;
  int index = -1;  // -1 = the default device of its kind ("cuda" = cuda:0)

  // "cpu", "cuda", "cuda:1": what ParseDeviceSpec reads back.
  std::string ToString() const;
  bool operator==(const DeviceSpec& other) const {
    return cuda == other.cuda && index == other.index;
  }
};

// "" and "cpu" are the CPU; "cuda" and "cuda:N" (N in [0, 1023]) a CUDA
// device. Anything else is INVALID_ARGUMENT naming the forms accepted.
absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text);

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_DEVICE_SPEC_H_
