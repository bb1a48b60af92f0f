#include "common/cuda/ipc_buffer.h"

#include <cuda.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace sluice {
namespace {

constexpr char kMagic[4] = {'S', 'I', 'P', 'C'};
static_assert(sizeof(cudaIpcMemHandle_t) == 64);

void PutU64(std::string& out, size_t at, uint64_t value) {
  for (int b = 0; b < 8; ++b) out[at + b] = static_cast<char>((value >> (8 * b)) & 0xFF);
}

uint64_t GetU64(absl::string_view in, size_t at) {
  uint64_t value = 0;
  for (int b = 0; b < 8; ++b) value |= uint64_t{static_cast<unsigned char>(in[at + b])} << (8 * b);
  return value;
}

// Makes `device` current for a scope and restores the previous one.
class ScopedDevice {
 public:
  static absl::StatusOr<ScopedDevice> Enter(int device) {
    int previous = 0;
    SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDevice(&previous), "reading the current CUDA device");
    if (previous != device) {
      SLUICE_RETURN_IF_CUDA_ERROR(cudaSetDevice(device),
                                  absl::StrCat("making CUDA device ", device, " current"));
    }
    return ScopedDevice(previous, previous != device);
  }
  ScopedDevice(ScopedDevice&& other) noexcept
      : previous_(other.previous_), restore_(std::exchange(other.restore_, false)) {}
  ScopedDevice& operator=(ScopedDevice&&) = delete;
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  ScopedDevice(int previous, bool restore) : previous_(previous), restore_(restore) {}
  int previous_;
  bool restore_;
};

// cuMemGetAddressRange, the one driver-API call needed (the runtime has no
// equivalent), fetched through the runtime so that nothing links libcuda.
using MemGetAddressRangeFn = CUresult (*)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr);

absl::StatusOr<MemGetAddressRangeFn> GetMemGetAddressRange() {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &function,
                                                               12000, cudaEnableDefault, &found),
                              "looking up cuMemGetAddressRange in the CUDA driver");
  if (found != cudaDriverEntryPointSuccess || function == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("the CUDA driver has no cuMemGetAddressRange (query result ",
                     static_cast<int>(found), ")"));
  }
  return reinterpret_cast<MemGetAddressRangeFn>(function);
}

}  // namespace

std::string IpcHandleMessage::Serialize() const {
  std::string out(kSerializedBytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  out[4] = static_cast<char>(kVersion);
  std::memcpy(out.data() + 8, &handle, sizeof(handle));
  PutU64(out, 72, offset);
  PutU64(out, 80, bytes);
  std::memcpy(out.data() + 88, device_uuid.data(), device_uuid.size());
  PutU64(out, 104, exporter_pid);
  return out;
}

absl::StatusOr<IpcHandleMessage> IpcHandleMessage::Parse(absl::string_view serialized) {
  if (serialized.size() < 5 || std::memcmp(serialized.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a Sluice CUDA IPC handle (", serialized.size(),
                     " bytes, expected the magic \"SIPC\" and ", kSerializedBytes, ")"));
  }
  const int version = static_cast<unsigned char>(serialized[4]);
  if (version != kVersion) {
    return absl::UnimplementedError(
        absl::StrCat("CUDA IPC handle version ", version, "; this build reads version ", kVersion));
  }
  if (serialized.size() != kSerializedBytes) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC handle of ", serialized.size(),
                                                   " bytes; version 1 has ", kSerializedBytes));
  }
  IpcHandleMessage message;
  std::memcpy(&message.handle, serialized.data() + 8, sizeof(message.handle));
  message.offset = GetU64(serialized, 72);
  message.bytes = GetU64(serialized, 80);
  std::memcpy(message.device_uuid.data(), serialized.data() + 88, message.device_uuid.size());
  message.exporter_pid = GetU64(serialized, 104);
  return message;
}

absl::StatusOr<std::string> ExportIpcHandle(const void* device_ptr, size_t bytes) {
  if (device_ptr == nullptr) return absl::InvalidArgumentError("ExportIpcHandle: null pointer");
  cudaPointerAttributes attributes{};
  SLUICE_RETURN_IF_CUDA_ERROR(cudaPointerGetAttributes(&attributes, device_ptr),
                              "ExportIpcHandle: reading the pointer's attributes");
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportIpcHandle: 0x", absl::Hex(reinterpret_cast<uintptr_t>(device_ptr)),
                     " is not device memory (cudaMemoryType ", attributes.type, ")"));
  }
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(attributes.device));
  ASSIGN_OR_RETURN(MemGetAddressRangeFn get_address_range, GetMemGetAddressRange());
  CUdeviceptr base = 0;
  size_t allocation_bytes = 0;
  const CUresult range_result =
      get_address_range(&base, &allocation_bytes, reinterpret_cast<CUdeviceptr>(device_ptr));
  if (range_result != CUDA_SUCCESS) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportIpcHandle: cuMemGetAddressRange failed with CUresult ",
                     static_cast<int>(range_result), " for 0x",
                     absl::Hex(reinterpret_cast<uintptr_t>(device_ptr))));
  }
  const uint64_t offset = reinterpret_cast<CUdeviceptr>(device_ptr) - base;
  if (offset + bytes > allocation_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("ExportIpcHandle: ", bytes, " bytes at offset ",
                                                   offset, " run past the end of their ",
                                                   allocation_bytes, "-byte allocation"));
  }
  IpcHandleMessage message;
  SLUICE_RETURN_IF_CUDA_ERROR(
      cudaIpcGetMemHandle(&message.handle, reinterpret_cast<void*>(base)),
      "ExportIpcHandle: cudaIpcGetMemHandle (memory from cudaMallocAsync pools or cuMemCreate "
      "cannot be exported this way)");
  cudaDeviceProp properties{};
  SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&properties, attributes.device),
                              "ExportIpcHandle: reading the device's UUID");
  std::memcpy(message.device_uuid.data(), properties.uuid.bytes, message.device_uuid.size());
  message.offset = offset;
  message.bytes = bytes;
  message.exporter_pid = static_cast<uint64_t>(getpid());
  return message.Serialize();
}

absl::StatusOr<ImportedIpcBuffer> ImportedIpcBuffer::Open(absl::string_view serialized) {
  ASSIGN_OR_RETURN(IpcHandleMessage message, IpcHandleMessage::Parse(serialized));
  if (message.exporter_pid == static_cast<uint64_t>(getpid())) {
    return absl::FailedPreconditionError(
        "CUDA IPC handle exported by this very process: CUDA cannot open it here; use the "
        "pointer directly");
  }
  int device_count = 0;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDeviceCount(&device_count),
                              "opening a CUDA IPC handle: counting devices");
  int device = -1;
  for (int d = 0; d < device_count && device < 0; ++d) {
    cudaDeviceProp properties{};
    SLUICE_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&properties, d),
                                "opening a CUDA IPC handle: reading device UUIDs");
    if (std::memcmp(properties.uuid.bytes, message.device_uuid.data(), 16) == 0) device = d;
  }
  if (device < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the GPU holding the exported buffer (UUID ",
                     absl::BytesToHexString(absl::string_view(
                         reinterpret_cast<const char*>(message.device_uuid.data()), 16)),
                     ") is not visible to this process (", device_count,
                     " visible; check CUDA_VISIBLE_DEVICES)"));
  }
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device));
  void* base = nullptr;
  SLUICE_RETURN_IF_CUDA_ERROR(
      cudaIpcOpenMemHandle(&base, message.handle, cudaIpcMemLazyEnablePeerAccess),
      absl::StrCat("cudaIpcOpenMemHandle of a buffer of process ", message.exporter_pid,
                   " on device ", device));
  return ImportedIpcBuffer(base, static_cast<char*>(base) + message.offset,
                           static_cast<size_t>(message.bytes), device);
}

ImportedIpcBuffer::ImportedIpcBuffer(ImportedIpcBuffer&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

ImportedIpcBuffer& ImportedIpcBuffer::operator=(ImportedIpcBuffer&& other) noexcept {
  if (this != &other) {
    Close().IgnoreError();
    base_ = std::exchange(other.base_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

ImportedIpcBuffer::~ImportedIpcBuffer() {
  const absl::Status status = Close();
  if (!status.ok())
    log::Warning("closing an imported CUDA IPC buffer failed", {{"error", status.ToString()}});
}

absl::Status ImportedIpcBuffer::Close() {
  if (base_ == nullptr) return absl::OkStatus();
  void* base = std::exchange(base_, nullptr);
  data_ = nullptr;
  size_ = 0;
  ASSIGN_OR_RETURN(ScopedDevice scoped, ScopedDevice::Enter(device_));
  return CudaStatus(cudaIpcCloseMemHandle(base), "cudaIpcCloseMemHandle");
}

}  // namespace sluice
