#ifndef SLUICE_COMMON_TORCH_COMPAT_H_
#define SLUICE_COMMON_TORCH_COMPAT_H_

// The one place where Sluice meets the differences between the LibTorch
// versions it builds with: Debian's 1.13.1 (CPU only) and a current 2.x
// with CUDA (the one inside a PyTorch install, -DSLUICE_TORCH_CUDA=ON; see
// docs/gpu.md). Code elsewhere calls these and never tests a version.
//
// What differs, and how it is met:
// - CUDA: a CPU-only LibTorch ships no c10/cuda headers and its
//   torch::cuda::is_available() is false; whether the build has CUDA is the
//   compile definition SLUICE_TORCH_CUDA (set by cmake/SluiceTorch.cmake
//   when the LibTorch found has CUDA), read here only.
// - Device synchronisation for timing: torch::cuda::synchronize exists in
//   both (1.13 added it); a CPU build never needs it.
// - Everything else the model, the engine and the trainer use (tensor ops,
//   torch::optim::Adam, torch::serialize, InferenceMode, CPU generators) has
//   the same spelling in 1.13 and 2.x.

#include <torch/cuda.h>
#include <torch/version.h>

#include <string>

namespace sluice {

// True when this binary's LibTorch was built with CUDA.
constexpr bool TorchHasCuda() {
#ifdef SLUICE_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

// "LibTorch 1.13.0 (CPU only)" / "LibTorch 2.11.0 (CUDA)".
inline std::string TorchBuildName() {
  return std::string("LibTorch ") + TORCH_VERSION + (TorchHasCuda() ? " (CUDA)" : " (CPU only)");
}

// Waits for the work queued on `device` (a no-op for the CPU), so that a
// wall-clock timer measures work done, not work queued.
inline void SynchronizeDevice(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.has_index() ? device.index() : -1);
}

}  // namespace sluice

#endif  // SLUICE_COMMON_TORCH_COMPAT_H_
