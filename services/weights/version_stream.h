#ifndef SLUICE_SERVICES_WEIGHTS_VERSION_STREAM_H_
#define SLUICE_SERVICES_WEIGHTS_VERSION_STREAM_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/clients/clients.h"
#include "sluice/v1/trainer.pb.h"

namespace sluice::weights {

// One weight version as a worker receives it, chunk by chunk, and serves it
// to other workers at the same time (cut-through relay). Every chunk is
// checked on arrival (CRC32C, version, tensor order, contiguous offsets), so
// a relay never forwards what it would not load itself; the trainer's chunks
// and CRCs are kept unchanged, so every hop checks the same bytes. The
// whole version is checked against the trainer's checksum at Complete().
// Thread-safe: one writer, any number of readers.
class VersionStream {
 public:
  // `info` is the trainer's record of the version (GetWeightSource): its
  // number and checksum.
  VersionStream(std::string run_id, v1::PolicyVersionInfo info);

  const std::string& run_id() const { return run_id_; }
  int64_t version() const { return info_.version(); }

  // ---- receiving ---------------------------------------------------------
  // The manifest, from each source in turn: the first sets it, later ones
  // (a resume from another source) must list the same tensors.
  absl::Status SetManifest(const v1::WeightsManifest& manifest) ABSL_LOCKS_EXCLUDED(mu_);
  // The next data chunk; DATA_LOSS (and nothing kept) when it does not fit.
  absl::Status Append(v1::WeightsChunk chunk) ABSL_LOCKS_EXCLUDED(mu_);
  // Data chunks received so far: where a resume starts (start_chunk).
  int64_t chunks() const ABSL_LOCKS_EXCLUDED(mu_);
  // Ends receiving: checks every tensor is whole and the version's checksum
  // (or, without one, each tensor's CRC32C), and returns the version as the
  // model loads it.
  // DATA_LOSS on a mismatch (the stream is failed).
  absl::StatusOr<clients::FetchedWeights> Complete() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends receiving with an error: readers get UNAVAILABLE (they ask the
  // trainer for another source and resume there).
  void Fail(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);
  bool failed() const ABSL_LOCKS_EXCLUDED(mu_);
  bool complete() const ABSL_LOCKS_EXCLUDED(mu_);

  // ---- serving -----------------------------------------------------------
  // Blocks until the manifest is known; UNAVAILABLE when the stream failed
  // or `deadline` passed first.
  absl::StatusOr<v1::WeightsManifest> WaitManifest(absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until data chunk `index` is here and returns it; nullptr when the
  // stream holds every byte in fewer chunks (the end); UNAVAILABLE when it failed
  // or `deadline` passed first.
  absl::StatusOr<std::shared_ptr<const v1::WeightsChunk>> WaitChunk(int64_t index,
                                                                    absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The received chunks, assembled and checked (one copy of the bytes).
  absl::StatusOr<clients::FetchedWeights> Assemble() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every tensor of the manifest received in full.
  bool Whole() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string run_id_;
  const v1::PolicyVersionInfo info_;
  mutable absl::Mutex mu_;
  bool have_manifest_ ABSL_GUARDED_BY(mu_) = false;
  v1::WeightsManifest manifest_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<const v1::WeightsChunk>> chunks_ ABSL_GUARDED_BY(mu_);
  std::vector<int> chunk_tensors_ ABSL_GUARDED_BY(mu_);  // manifest index, parallel to chunks_
  int tensor_index_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t tensor_received_ ABSL_GUARDED_BY(mu_) = 0;  // bytes of the current tensor
  uint32_t running_crc_ ABSL_GUARDED_BY(mu_) = 0;     // over all data so far
  bool complete_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
};

// The versions a worker holds or is receiving, by run, for its WeightRelay
// service. Keeps the newest `keep_complete` complete versions of a run and
// any newer one being received; older ones are dropped (their readers keep
// the stream they hold). Thread-safe.
class RelayCache {
 public:
  explicit RelayCache(int keep_complete = 1) : keep_complete_(keep_complete) {}

  // The stream to receive `info`'s version into: the one already here when
  // it has not failed (a resume), else a new one.
  std::shared_ptr<VersionStream> Begin(const std::string& run_id, const v1::PolicyVersionInfo& info)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops what is older than the newest complete versions (call after a
  // stream completes).
  void Trim(const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The stream of `version` (< 0: the newest) of `run_id`, waiting until
  // `deadline` for it to appear (a child may ask before its parent has
  // started receiving); NOT_FOUND when it does not.
  absl::StatusOr<std::shared_ptr<VersionStream>> Find(const std::string& run_id, int64_t version,
                                                      absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets a run (it ended on this worker).
  void Forget(const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int keep_complete_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<int64_t, std::shared_ptr<VersionStream>>> runs_
      ABSL_GUARDED_BY(mu_);
};

// crc32c over the tensors' bytes in order, as the trainer writes
// PolicyVersionInfo.checksum ("crc32c:%08x").
std::string VersionChecksum(const std::vector<std::string>& tensor_bytes);

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_VERSION_STREAM_H_
