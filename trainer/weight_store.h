#ifndef SLUICE_TRAINER_WEIGHT_STORE_H_
#define SLUICE_TRAINER_WEIGHT_STORE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sluice/v1/common.pb.h"
#include "trainer/weight_publisher.h"

namespace sluice::trainer {

// A published version as a sparse delta against the version published
// before it (services/weights/weight_delta.h), encoded once when the version
// is published and served to every worker that holds that base
// (StreamWeightsRequest.base_version), rather than once per stream.
struct VersionDelta {
  int64_t base_version = -1;
  // Parallel to PublishedVersion::tensors: each with its encoding and
  // encoded_size_bytes; crc32c and size_bytes are the version's own.
  std::vector<v1::TensorSpec> tensors;
  // The SPARSE_DELTA encodings; empty for a FULL tensor (its bytes are the
  // version's).
  std::vector<std::string> encoded;
  // What a delta stream carries: the sum of encoded_size_bytes.
  int64_t encoded_bytes = 0;
  double encode_seconds = 0;
};

// One published weight version: its metadata, the tensor specs in manifest
// order and each tensor's bytes, in the run's weight_sync.dtype (float32,
// or bf16 / f16 rounded from the trainer's float32 weights). Immutable once
// published, so a weight stream can pin it (shared_ptr) while the trainer
// moves on.
struct PublishedVersion {
  v1::PolicyVersionInfo info;
  std::vector<v1::TensorSpec> tensors;
  std::vector<std::string> bytes;  // parallel to tensors
  // Against the previous published version; null when deltas are off or
  // there was none to compare with.
  std::shared_ptr<const VersionDelta> delta;
};

// The delta of `version` against `base`; null when they do not line up
// (other tensors, dtypes or sizes) or their dtype is not a 2-byte one.
// O(bytes); pure.
std::shared_ptr<const VersionDelta> EncodeVersionDelta(const PublishedVersion& base,
                                                       const PublishedVersion& version);

// A published tensor's bytes as float32 (a copy when they are bf16 / f16):
// what the rollout worker and the rollout verifier load, so both see the
// same rounded weights. INVALID_ARGUMENT for a dtype weights do not travel in.
absl::StatusOr<std::string> PublishedFloat32Bytes(const v1::TensorSpec& spec,
                                                  const std::string& bytes);

// The versions a trainer serves to rollout workers for its current run: the
// gRPC transport's publisher (weight_publisher.h), which StreamWeights serves
// from. Keeps the newest `retain` versions (older ones answer NOT_FOUND;
// workers ask for the latest). Thread-safe.
class WeightStore final : public WeightPublisher {
 public:
  explicit WeightStore(int retain = 4) : retain_(retain) {}

  // Makes `version` the latest (versions must increase) and wakes watchers.
  void Publish(std::shared_ptr<const PublishedVersion> version) override ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets everything (a new run starts); watchers of the old run wake up
  // and get NOT_FOUND / CANCELLED.
  void Reset(const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);

  // The latest version, or NOT_FOUND naming the run when none is published.
  absl::StatusOr<std::shared_ptr<const PublishedVersion>> Latest(const std::string& run_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // A retained version; NOT_FOUND when unknown or no longer retained.
  absl::StatusOr<std::shared_ptr<const PublishedVersion>> Get(const std::string& run_id,
                                                              int64_t version) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until a version newer than `after_version` exists (returns the
  // latest), `deadline` passes (DEADLINE_EXCEEDED), or Close()/Reset() is
  // called (CANCELLED).
  absl::StatusOr<std::shared_ptr<const PublishedVersion>> WaitForNewer(
      const std::string& run_id, int64_t after_version, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every waiter for good (server shutdown).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  bool RunMatches(const std::string& run_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int retain_;
  mutable absl::Mutex mu_;
  std::string run_id_ ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<const PublishedVersion>> versions_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by Reset
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_WEIGHT_STORE_H_
