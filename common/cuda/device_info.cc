#include "common/cuda/device_info.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"

namespace sluice {
namespace {

// Frees on every path out of MeasureDeviceBandwidth.
struct DeviceAllocation {
  void* ptr = nullptr;
  ~DeviceAllocation() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

struct Event {
  cudaEvent_t event = nullptr;
  ~Event() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

}  // namespace

absl::StatusOr<CudaDeviceInfo> GetCudaDeviceInfo(int device) {
  CudaDeviceInfo info;
  info.device = device;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaDriverGetVersion(&info.driver_version),
                              "reading the CUDA driver version");
  SLUICE_RETURN_IF_CUDA_ERROR(cudaRuntimeGetVersion(&info.runtime_version),
                              "reading the CUDA runtime version");
  cudaDeviceProp properties{};
  SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&properties, device),
                              absl::StrCat("reading the properties of CUDA device ", device));
  info.name = properties.name;
  info.uuid = absl::BytesToHexString(absl::string_view(properties.uuid.bytes, 16));
  char bus_id[32] = {};
  SLUICE_RETURN_IF_CUDA_ERROR(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device),
                              "reading the device's PCI bus id");
  info.pci_bus_id = bus_id;
  info.compute_capability_major = properties.major;
  info.compute_capability_minor = properties.minor;
  info.multiprocessor_count = properties.multiProcessorCount;
  info.total_memory_bytes = properties.totalGlobalMem;
  int memory_clock_khz = 0;
  int bus_width_bits = 0;
  if (cudaDeviceGetAttribute(&memory_clock_khz, cudaDevAttrMemoryClockRate, device) ==
          cudaSuccess &&
      cudaDeviceGetAttribute(&bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, device) ==
          cudaSuccess) {
    info.theoretical_memory_bandwidth_gb_per_s =
        2.0 * memory_clock_khz * 1e3 * (bus_width_bits / 8.0) / 1e9;
  }
  int previous = 0;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDevice(&previous), "reading the current CUDA device");
  SLUICE_RETURN_IF_CUDA_ERROR(cudaSetDevice(device), "making the device current");
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const cudaError_t info_error = cudaMemGetInfo(&free_bytes, &total_bytes);
  cudaSetDevice(previous);
  SLUICE_RETURN_IF_CUDA_ERROR(info_error, "reading the device's free memory");
  info.free_memory_bytes = free_bytes;
  return info;
}

absl::StatusOr<DeviceBandwidth> MeasureDeviceBandwidth(size_t copy_bytes, int repetitions) {
  if (copy_bytes == 0 || repetitions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MeasureDeviceBandwidth needs copy_bytes > 0 and repetitions >= 1, got ",
                     copy_bytes, " and ", repetitions));
  }
  DeviceAllocation source;
  DeviceAllocation destination;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaMalloc(&source.ptr, copy_bytes),
                              "bandwidth: allocating the source buffer");
  SLUICE_RETURN_IF_CUDA_ERROR(cudaMalloc(&destination.ptr, copy_bytes),
                              "bandwidth: allocating the destination buffer");
  SLUICE_RETURN_IF_CUDA_ERROR(cudaMemset(source.ptr, 0x5A, copy_bytes),
                              "bandwidth: initialising the source");
  Event start;
  Event stop;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaEventCreate(&start.event), "bandwidth: creating an event");
  SLUICE_RETURN_IF_CUDA_ERROR(cudaEventCreate(&stop.event), "bandwidth: creating an event");
  SLUICE_RETURN_IF_CUDA_ERROR(
      cudaMemcpy(destination.ptr, source.ptr, copy_bytes, cudaMemcpyDeviceToDevice),
      "bandwidth: warm-up copy");
  DeviceBandwidth result;
  result.copy_bytes = copy_bytes;
  result.repetitions = repetitions;
  double total_ms = 0;
  for (int i = 0; i < repetitions; ++i) {
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventRecord(start.event), "bandwidth: recording an event");
    SLUICE_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(destination.ptr, source.ptr, copy_bytes, cudaMemcpyDeviceToDevice),
        "bandwidth: timed copy");
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventRecord(stop.event), "bandwidth: recording an event");
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(stop.event), "bandwidth: waiting");
    float ms = 0;
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, start.event, stop.event),
                                "bandwidth: reading the events");
    total_ms += ms;
    result.best_ms = i == 0 ? ms : std::min<double>(result.best_ms, ms);
  }
  result.mean_ms = total_ms / repetitions;
  result.best_gb_per_s = 2.0 * static_cast<double>(copy_bytes) / (result.best_ms * 1e-3) / 1e9;
  return result;
}

}  // namespace sluice
