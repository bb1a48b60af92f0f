#ifndef SLUICE_SERVICES_WEIGHTS_RELAY_FETCHER_H_
#define SLUICE_SERVICES_WEIGHTS_RELAY_FETCHER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/clients/clients.h"
#include "services/weights/version_stream.h"

namespace sluice::weights {

struct RelayFetcherOptions {
  std::string worker_id;
  // Where this worker's WeightRelay serves what it receives; empty = it does
  // not relay (a leaf).
  std::string relay_address;
  // Sources tried for one version before the download fails (the caller
  // tries again at the next announcement).
  int max_attempts = 6;
  // A source silent this long is left for another (see WeightSource).
  absl::Duration stall = absl::Seconds(10);
  // Data bytes per chunk asked of the trainer (relays forward its chunks as
  // they are); 0 = the trainer's default (1 MiB).
  int64_t chunk_size_bytes = 0;
  // Pause before asking again after the trainer itself failed a stream.
  absl::Duration trainer_backoff = absl::Milliseconds(200);
};

struct RelayFetchResult {
  clients::FetchedWeights weights;
  int64_t version = -1;
  int depth = 1;            // hops from the trainer of the source that finished it
  std::string source;       // its address; empty = the trainer
  int attempts = 1;         // sources used (1 = no failover)
  int64_t bytes_received = 0;
  // A sparse delta against the version the worker held (FetchDelta).
  bool delta = false;
  // What the version takes in full (the bytes a full stream would carry).
  int64_t full_bytes = 0;
};

// Downloads weight versions through the trainer's fan-out tree: asks the
// trainer where to get the latest version (GetWeightSource), streams it
// from there into this worker's RelayCache (so that its own children get
// each chunk as it arrives), and when a source fails, stalls or sends bad
// data, reports it and resumes from the chunk it stopped at, from the source
// the trainer names next. The finished version is checked against the
// trainer's checksum. Not thread-safe: one fetch at a time (a worker's
// weight follower).
class RelayFetcher {
 public:
  // `source_for(address)` opens a stream source: "" = the trainer.
  using SourceFactory = std::function<std::unique_ptr<clients::WeightSource>(const std::string&)>;

  // `cache` may be null: the fetcher then keeps its own (nothing relays).
  RelayFetcher(clients::TrainerClient& trainer, SourceFactory source_for,
               std::shared_ptr<RelayCache> cache, RelayFetcherOptions options);

  // The latest version of `run_id`. UNIMPLEMENTED when the trainer has no
  // GetWeightSource (an older trainer): download from it directly.
  absl::StatusOr<RelayFetchResult> FetchLatest(const std::string& run_id);

  // The latest version as a sparse delta against `base` (the version this
  // worker holds, whole), straight from the trainer: deltas are small, so
  // they need no fan-out tree, and this worker does not relay a version it
  // got as a delta (its RelayCache never sees it). Resumes a cut stream from
  // the chunk it stopped at (start_chunk), up to max_attempts streams.
  //  - FAILED_PRECONDITION: the trainer sends the latest version in full
  //    (deltas off, or it has no delta of it against `base`, e.g. the worker
  //    skipped a version); nothing past its manifest was read: use
  //    FetchLatest.
  //  - DATA_LOSS: the delta does not apply to `base` or the result fails a
  //    CRC32C or the version checksum: use FetchLatest.
  absl::StatusOr<RelayFetchResult> FetchDelta(const std::string& run_id,
                                              const clients::FetchedWeights& base);

 private:
  clients::WeightSource& Source(const std::string& address);

  clients::TrainerClient& trainer_;
  const SourceFactory source_for_;
  const std::shared_ptr<RelayCache> cache_;
  const RelayFetcherOptions options_;
  std::map<std::string, std::unique_ptr<clients::WeightSource>> sources_;
};

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_RELAY_FETCHER_H_
