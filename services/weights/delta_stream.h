#ifndef SLUICE_SERVICES_WEIGHTS_DELTA_STREAM_H_
#define SLUICE_SERVICES_WEIGHTS_DELTA_STREAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/clients/clients.h"
#include "sluice/v1/trainer.pb.h"

namespace sluice::weights {

// One weight version received as a sparse delta (weight_delta.h) against the
// version the worker holds, chunk by chunk, possibly over several streams
// (start_chunk resumes). Every chunk is checked on arrival (its CRC32C, the
// version, tensor order, contiguous offsets within the tensor's encoding);
// Complete() applies each tensor to the held base and checks the result
// against the tensor's CRC32C and the version's checksum, so a wrong base, a
// corrupt delta or a trainer bug all end as DATA_LOSS, and the worker then
// fetches the full version. Unlike VersionStream it is never relayed (the
// worker asked the trainer directly). Not thread-safe: one receiver.
class DeltaStream {
 public:
  // `base` is the version the worker holds, whole and verified; it must
  // outlive this object.
  explicit DeltaStream(const clients::FetchedWeights& base);

  // The manifest of each stream in turn. FAILED_PRECONDITION, with the
  // trainer's reason, when the stream is a full version rather than a delta
  // against the base (the caller fetches the version the usual way); later
  // manifests (resumes) must describe the same delta (DATA_LOSS otherwise).
  absl::Status SetManifest(const v1::WeightsManifest& manifest);
  // The next data chunk; DATA_LOSS (nothing kept) when it does not fit.
  absl::Status Append(const v1::WeightsChunk& chunk);
  // Data chunks received: where a resume starts (start_chunk).
  int64_t chunks() const { return chunks_; }
  // The version (after the first manifest), -1 before.
  int64_t version() const { return have_manifest_ ? manifest_.version().version() : -1; }
  // Bytes received on the wire, and what the full version would have taken.
  int64_t wire_bytes() const { return wire_bytes_; }
  int64_t full_bytes() const;

  // Applies the delta: the version as the model loads it (a full manifest,
  // every tensor FULL). DATA_LOSS when a tensor is missing or short, a delta
  // does not apply to the base, or a result fails its CRC32C or the version
  // checksum.
  absl::StatusOr<clients::FetchedWeights> Complete();

 private:
  const clients::FetchedWeights& base_;
  bool have_manifest_ = false;
  v1::WeightsManifest manifest_;
  std::vector<int> base_index_;       // per manifest tensor: its index in base_
  std::vector<std::string> encoded_;  // per manifest tensor, as received
  int tensor_index_ = -1;
  int64_t chunks_ = 0;
  int64_t wire_bytes_ = 0;
};

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_DELTA_STREAM_H_
