#include "common/cuda/nccl_broadcaster.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"

namespace sluice {
namespace {

absl::Status NcclStatus(ncclResult_t result, ncclComm_t comm, absl::string_view what) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&message, " (", last, ")");
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

absl::StatusOr<std::string> NcclBroadcaster::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclStatus(result, nullptr, "ncclGetUniqueId");
  std::string serialized(kSerializedUniqueIdBytes, '\0');
  serialized[0] = static_cast<char>(kUniqueIdVersion);
  std::memcpy(serialized.data() + 1, id.internal, NCCL_UNIQUE_ID_BYTES);
  return serialized;
}

absl::StatusOr<std::unique_ptr<NcclBroadcaster>> NcclBroadcaster::Create(
    absl::string_view unique_id, int rank, int nranks, int device) {
  if (unique_id.size() != kSerializedUniqueIdBytes ||
      static_cast<unsigned char>(unique_id[0]) != kUniqueIdVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a serialized NCCL unique id (", unique_id.size(), " bytes; version ",
                     int{kUniqueIdVersion}, " has ", kSerializedUniqueIdBytes, ")"));
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", rank, " of ", nranks, ": need 0 <= rank < nranks"));
  }
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data() + 1, NCCL_UNIQUE_ID_BYTES);
  SLUICE_RETURN_IF_CUDA_ERROR(cudaSetDevice(device),
                              absl::StrCat("NCCL: making CUDA device ", device, " current"));
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRank(&comm, nranks, id, rank);
  if (result != ncclSuccess) {
    return NcclStatus(result, comm,
                      absl::StrCat("ncclCommInitRank (rank ", rank, " of ", nranks, ")"));
  }
  return std::unique_ptr<NcclBroadcaster>(new NcclBroadcaster(comm, rank, nranks, device));
}

NcclBroadcaster::~NcclBroadcaster() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

absl::Status NcclBroadcaster::Broadcast(absl::Span<const DeviceBuffer> buffers, int root,
                                        cudaStream_t stream) {
  return BroadcastOutOfPlace(buffers, buffers, root, stream);
}

absl::Status NcclBroadcaster::BroadcastOutOfPlace(absl::Span<const DeviceBuffer> sources,
                                                  absl::Span<const DeviceBuffer> destinations,
                                                  int root, cudaStream_t stream) {
  if (root < 0 || root >= nranks_) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL broadcast root ", root, " of ", nranks_, " ranks"));
  }
  const bool is_root = rank_ == root;
  if (is_root && sources.size() != destinations.size()) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL broadcast of ", sources.size(),
                                                   " sources into ", destinations.size(),
                                                   " destinations"));
  }
  for (size_t i = 0; i < destinations.size(); ++i) {
    const bool bad_destination = destinations[i].data == nullptr && destinations[i].bytes > 0;
    const bool bad_source = is_root && ((sources[i].data == nullptr && sources[i].bytes > 0) ||
                                        sources[i].bytes != destinations[i].bytes);
    if (bad_destination || bad_source) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NCCL broadcast buffer ", i, ": null pointer or source and destination sizes differ"));
    }
  }
  ncclResult_t result = ncclGroupStart();
  if (result != ncclSuccess) return NcclStatus(result, comm_, "ncclGroupStart");
  ncclResult_t enqueue_result = ncclSuccess;
  size_t failed_at = 0;
  for (size_t i = 0; i < destinations.size() && enqueue_result == ncclSuccess; ++i) {
    const void* send = is_root ? sources[i].data : destinations[i].data;
    enqueue_result = ncclBroadcast(send, destinations[i].data, destinations[i].bytes, ncclUint8,
                                   root, comm_, stream);
    failed_at = i;
  }
  // The group is closed whatever happened, or the next one would nest in it.
  result = ncclGroupEnd();
  if (enqueue_result != ncclSuccess) {
    return NcclStatus(enqueue_result, comm_,
                      absl::StrCat("ncclBroadcast of buffer ", failed_at, " (",
                                   destinations[failed_at].bytes, " bytes)"));
  }
  return NcclStatus(
      result, comm_,
      absl::StrCat("ncclGroupEnd of a broadcast of ", destinations.size(), " buffers"));
}

}  // namespace sluice
