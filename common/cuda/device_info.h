// Facts about a GPU and its measured device-memory bandwidth, for the
// roofline figures of the weight hand-off checks: a device-to-device copy is
// the ceiling of any on-GPU hand-off, and the figures say how close the CUDA
// IPC copy and the CRC tree come to it.
//
// Ran on one H200 (driver 580.159.04, CUDA 13.0, sm_90 build): 4.25 TB/s read + write.
#ifndef SLUICE_COMMON_CUDA_DEVICE_INFO_H_
#define SLUICE_COMMON_CUDA_DEVICE_INFO_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace sluice {

struct CudaDeviceInfo {
  int device = 0;  // Ordinal in this process.
  std::string name;
  std::string uuid;        // 32 hex digits.
  std::string pci_bus_id;  // "0000:19:00.0"
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int multiprocessor_count = 0;
  uint64_t total_memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
  // 2 x memory clock x bus width, as the device reports them (0 if it does
  // not): the datasheet ceiling that MeasureDeviceBandwidth approaches.
  double theoretical_memory_bandwidth_gb_per_s = 0;
  int driver_version = 0;   // cudaDriverGetVersion: 13000 for 13.0.
  int runtime_version = 0;  // cudaRuntimeGetVersion.
};

// The facts of `device` (creates its context: ~100 ms the first time).
// UNAVAILABLE without a driver or device; INVALID_ARGUMENT for a bad ordinal.
absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int device);

struct DeviceBandwidth {
  size_t copy_bytes = 0;
  int repetitions = 0;
  double best_ms = 0;  // The fastest copy.
  double mean_ms = 0;
  // Bytes read plus bytes written per second, of the fastest copy, in 1e9/s.
  double best_gb_per_s = 0;
};

// Times `repetitions` device-to-device cudaMemcpyAsync of `copy_bytes` (after
// one untimed warm-up) with CUDA events on the current device. Allocates two
// buffers of `copy_bytes` (freed before it returns). Blocks ~ repetitions x
// 2 x copy_bytes / bandwidth. RESOURCE_EXHAUSTED if they do not fit.
absl::StatusOr<DeviceBandwidth> MeasureDeviceBandwidth(size_t copy_bytes, int repetitions = 5);

}  // namespace sluice

#endif  // SLUICE_COMMON_CUDA_DEVICE_INFO_H_
