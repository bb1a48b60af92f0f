// CUDA IPC hand-off of a device buffer between processes on one machine: the
// trainer exports the memory of a weight version, a rollout worker on the
// same GPU (or a peer GPU of the same host) maps it and copies it into its
// own buffers at device bandwidth, instead of a device -> host -> socket ->
// host -> device trip through the gRPC weight stream.
//
//   trainer:         ASSIGN_OR_RETURN(std::string handle,
//                                     ExportIpcHandle(tensor.data_ptr(), tensor.nbytes()));
//                    ... send `handle` (bytes) to the worker, keep the tensor alive ...
//   rollout worker:  ASSIGN_OR_RETURN(ImportedIpcBuffer buffer, ImportedIpcBuffer::Open(handle));
//                    cudaMemcpyAsync(mine, buffer.data(), buffer.size(), cudaMemcpyDeviceToDevice,
//                    s);
//
// The serialized handle (IpcHandleMessage, version 1, 112 bytes) carries the
// 64-byte cudaIpcMemHandle_t of the whole allocation plus the offset of the
// exported pointer within it, because a tensor of PyTorch's caching allocator
// usually sits inside a bigger cudaMalloc block and CUDA IPC only exports
// whole allocations. It also names the GPU by UUID (device ordinals differ
// between processes with different CUDA_VISIBLE_DEVICES) and the exporting
// process (which cannot open its own handle).
//
// What the exporter must guarantee: the allocation stays allocated, and the
// bytes unchanged, until every importer has copied and closed it. Memory from
// cudaMallocAsync pools or cuMemCreate (PyTorch's expandable_segments) is not
// exportable this way: ExportIpcHandle fails with CUDA's error for it.
//
// Exercised by cuda_weight_handoff_check (a child process maps, CRCs and copies
// the buffer); passed on one H200 (driver 580.159.04, CUDA 13.0, sm_90 build).
#ifndef SLUICE_COMMON_CUDA_IPC_BUFFER_H_
#define SLUICE_COMMON_CUDA_IPC_BUFFER_H_

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice {

// The wire form of an exported buffer. Little-endian, fixed size:
//   [0, 4)    "SIPC"
//   [4]       version (1)
//   [5, 8)    zero
//   [8, 72)   cudaIpcMemHandle_t of the allocation
//   [72, 80)  offset of the buffer within the allocation
//   [80, 88)  size of the buffer in bytes
//   [88, 104) UUID of the GPU that holds it
//   [104, 112) process id of the exporter
struct IpcHandleMessage {
  static constexpr uint8_t kVersion = 1;
  static constexpr size_t kSerializedBytes = 112;

  cudaIpcMemHandle_t handle{};
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::array<unsigned char, 16> device_uuid{};
  uint64_t exporter_pid = 0;

  std::string Serialize() const;
  // INVALID_ARGUMENT for a wrong size or magic, UNIMPLEMENTED for another
  // version (a newer exporter). Pure: no CUDA call.
  static absl::StatusOr<IpcHandleMessage> Parse(absl::string_view serialized);
};

// Exports `device_ptr[0, bytes)` (device memory of this process, any device)
// as a serialized IpcHandleMessage. Does not copy or synchronize: the caller
// makes sure the bytes are written (stream-synchronized) before an importer
// reads them. ~tens of microseconds. INVALID_ARGUMENT when the pointer is not
// device memory or the range runs past its allocation; CUDA's error (as
// CudaStatus) otherwise. Thread-safe.
absl::StatusOr<std::string> ExportIpcHandle(const void* device_ptr, size_t bytes);

// A buffer of another process mapped into this one (RAII: unmapped by the
// destructor). Move-only; not thread-safe to move while another thread uses
// data(), but the mapped memory itself may be read from any thread/stream.
class ImportedIpcBuffer {
 public:
  // Maps the buffer of `serialized` (from ExportIpcHandle in another process)
  // on the GPU it names, with peer access enabled lazily when that GPU is not
  // the current one. Blocks for the mapping (~ms, driver work; no copy).
  // Errors: Parse's; FAILED_PRECONDITION when the GPU is not visible here or
  // the handle comes from this very process; CUDA's error (for example when
  // the exporter has freed the memory or exited).
  static absl::StatusOr<ImportedIpcBuffer> Open(absl::string_view serialized);

  ImportedIpcBuffer(ImportedIpcBuffer&& other) noexcept;
  ImportedIpcBuffer& operator=(ImportedIpcBuffer&& other) noexcept;
  ImportedIpcBuffer(const ImportedIpcBuffer&) = delete;
  ImportedIpcBuffer& operator=(const ImportedIpcBuffer&) = delete;
  // Close(), with a failure logged rather than returned.
  ~ImportedIpcBuffer();

  // The exported buffer in this process's address space (device memory of
  // device()), or null after Close().
  void* data() const { return data_; }
  size_t size() const { return size_; }
  // The CUDA device ordinal, in this process, of the GPU that holds it.
  int device() const { return device_; }

  // Unmaps the buffer (cudaIpcCloseMemHandle). Work on data() must be
  // finished first. Idempotent.
  absl::Status Close();

 private:
  ImportedIpcBuffer(void* base, void* data, size_t size, int device)
      : base_(base), data_(data), size_(size), device_(device) {}

  void* base_ = nullptr;  // What cudaIpcOpenMemHandle returned (the allocation).
  void* data_ = nullptr;  // base_ + offset.
  size_t size_ = 0;
  int device_ = 0;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_CUDA_IPC_BUFFER_H_
