// NCCL broadcast of a weight version from the trainer's GPU to the rollout
// workers' GPUs: the device-to-device path for workers on other GPUs (of this
// host over NVLink, or of other hosts over InfiniBand/RoCE), where CUDA IPC
// (ipc_buffer.h) reaches only the same host.
//
// Rendezvous: NCCL needs every rank to start from the same ncclUniqueId,
// which the root (rank 0, the trainer) creates with NewUniqueId() and the
// others receive out of band. In Sluice that band is our own gRPC contracts:
// the id is an opaque byte string (version byte + the 128 bytes of
// ncclUniqueId, which embed the root's bootstrap socket address) that the
// trainer hands to each worker with its rank and the rank count; nothing here
// knows gRPC. A new id is needed for every new communicator (for example
// after a worker joins or dies).
//
// A one-rank communicator is exercised by cuda_weight_handoff_check and passed
// on one H200 (driver 580.159.04, CUDA 13.0, sm_90 build) (with PyTorch's libnccl.so.2);
// 2+ ranks await a machine with two GPUs.
#ifndef SLUICE_COMMON_CUDA_NCCL_BROADCASTER_H_
#define SLUICE_COMMON_CUDA_NCCL_BROADCASTER_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace sluice {

// A span of device memory; for a tensor, {data_ptr(), nbytes()}.
struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

// One NCCL communicator of `nranks` GPUs, one rank per process.
// Thread-compatible: calls on one communicator must come from one thread at
// a time (NCCL's rule), in the same order on every rank.
class NcclBroadcaster {
 public:
  static constexpr unsigned char kUniqueIdVersion = 1;
  static constexpr size_t kSerializedUniqueIdBytes = 1 + NCCL_UNIQUE_ID_BYTES;

  // A fresh rendezvous id, serialized. Called once, by the root. Opens the
  // root's bootstrap listener (a socket, NCCL_SOCKET_IFNAME picks the
  // interface): the other ranks must be able to reach it.
  static absl::StatusOr<std::string> NewUniqueId();

  // Joins the communicator of `unique_id` (from NewUniqueId) as `rank` of
  // `nranks` on CUDA device `device` (made current for this thread). BLOCKS
  // until all `nranks` ranks have called Create with the same id; NCCL has no
  // deadline here, so a rank that never comes hangs the others: callers run
  // it under their own watchdog (the nonblocking ncclCommInitRankConfig is
  // the way to add one). INVALID_ARGUMENT for a malformed id or rank;
  // NCCL's error (with ncclGetErrorString and ncclGetLastError) otherwise.
  static absl::StatusOr<std::unique_ptr<NcclBroadcaster>> Create(absl::string_view unique_id,
                                                                 int rank, int nranks, int device);

  ~NcclBroadcaster();  // ncclCommDestroy: collective work must be finished.
  NcclBroadcaster(const NcclBroadcaster&) = delete;
  NcclBroadcaster& operator=(const NcclBroadcaster&) = delete;

  // In place: on `root`, `buffers` are sent; on every other rank they are
  // overwritten with the root's bytes. Every rank passes the same number of
  // buffers with the same sizes in the same order. One ncclBroadcast per
  // buffer, grouped (ncclGroupStart/End) so NCCL launches them as one.
  // Enqueues on `stream` and returns: the bytes are there once `stream` has
  // run past it. Errors: INVALID_ARGUMENT for a bad root or a null buffer;
  // NCCL's error (the communicator may then be unusable: destroy it and
  // rendezvous again).
  absl::Status Broadcast(absl::Span<const DeviceBuffer> buffers, int root, cudaStream_t stream);

  // Out of place: the root sends `sources[i]`; every rank (the root too)
  // receives into `destinations[i]`. `sources` is ignored on other ranks
  // (pass the destinations or empty buffers of the same sizes).
  absl::Status BroadcastOutOfPlace(absl::Span<const DeviceBuffer> sources,
                                   absl::Span<const DeviceBuffer> destinations, int root,
                                   cudaStream_t stream);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int device() const { return device_; }

 private:
  NcclBroadcaster(ncclComm_t comm, int rank, int nranks, int device)
      : comm_(comm), rank_(rank), nranks_(nranks), device_(device) {}

  ncclComm_t comm_;
  int rank_;
  int nranks_;
  int device_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_CUDA_NCCL_BROADCASTER_H_
