#include "services/weights/relay_fetcher.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/weights/delta_stream.h"

namespace sluice::weights {

RelayFetcher::RelayFetcher(clients::TrainerClient& trainer, SourceFactory source_for,
                           std::shared_ptr<RelayCache> cache, RelayFetcherOptions options)
    : trainer_(trainer),
      source_for_(std::move(source_for)),
      cache_(cache != nullptr ? std::move(cache) : std::make_shared<RelayCache>()),
      options_(std::move(options)) {}

clients::WeightSource& RelayFetcher::Source(const std::string& address) {
  auto& source = sources_[address];
  if (source == nullptr) source = source_for_(address);
  // Relays come and go with versions; keep the channels of a few.
  if (sources_.size() > 16) {
    for (auto it = sources_.begin(); it != sources_.end();) {
      it = (it->first.empty() || it->first == address) ? std::next(it) : sources_.erase(it);
    }
  }
  return *sources_[address];
}

absl::StatusOr<RelayFetchResult> RelayFetcher::FetchLatest(const std::string& run_id) {
  v1::GetWeightSourceRequest ask;
  ask.set_run_id(run_id);
  ask.set_worker_id(options_.worker_id);
  ask.set_relay_address(options_.relay_address);
  std::shared_ptr<VersionStream> stream;
  RelayFetchResult result;
  absl::Status last = absl::UnavailableError("no source tried");
  for (int attempt = 1; attempt <= std::max(1, options_.max_attempts); ++attempt) {
    absl::StatusOr<v1::GetWeightSourceResponse> placed = trainer_.GetWeightSource(ask);
    if (!placed.ok()) {
      if (stream != nullptr) stream->Fail(placed.status());
      return placed.status();
    }
    if (stream == nullptr) {
      // The version is fixed by the first answer, so that every later
      // source resumes the same bytes.
      ask.set_version(placed->version().version());
      stream = cache_->Begin(run_id, placed->version());
      result.version = placed->version().version();
    }
    const std::string& address = placed->source_address();
    result.depth = placed->depth();
    result.source = address;
    result.attempts = attempt;
    v1::StreamWeightsRequest request;
    request.set_run_id(run_id);
    request.set_version(result.version);
    request.set_start_chunk(stream->chunks());
    request.set_chunk_size_bytes(options_.chunk_size_bytes);
    bool manifest_seen = false;
    last = Source(address).StreamWeights(
        request, options_.stall, [&](v1::WeightsChunk& chunk) -> absl::Status {
          if (!manifest_seen) {
            if (!chunk.has_manifest()) {
              return absl::DataLossError("weight stream did not start with a manifest");
            }
            manifest_seen = true;
            return stream->SetManifest(chunk.manifest());
          }
          result.bytes_received += static_cast<int64_t>(chunk.data().size());
          return stream->Append(std::move(chunk));
        });
    if (last.ok()) {
      absl::StatusOr<clients::FetchedWeights> weights = stream->Complete();
      if (weights.ok()) {
        cache_->Trim(run_id);
        result.weights = std::move(*weights);
        for (const std::string& bytes : result.weights.tensor_bytes) {
          result.full_bytes += static_cast<int64_t>(bytes.size());
        }
        return result;
      }
      // Every chunk passed its CRC but the whole does not: a relay that
      // altered bytes and recomputed CRCs. Start over, elsewhere.
      last = weights.status();
      stream = cache_->Begin(run_id, placed->version());
    }
    log::Warning("weight source failed; asking for another",
                 {{"run_id", run_id},
                  {"version", result.version},
                  {"source", address.empty() ? std::string("trainer") : address},
                  {"resume_at_chunk", stream->chunks()},
                  {"error", std::string(last.message())}});
    if (address.empty()) {
      // The trainer itself: restarting, or the version was dropped.
      if (absl::IsNotFound(last)) break;
      absl::SleepFor(options_.trainer_backoff);
    } else {
      ask.add_failed_sources(address);
    }
  }
  if (stream != nullptr) stream->Fail(last);
  return last;
}

absl::StatusOr<RelayFetchResult> RelayFetcher::FetchDelta(const std::string& run_id,
                                                           const clients::FetchedWeights& base) {
  DeltaStream stream(base);
  RelayFetchResult result;
  result.delta = true;
  absl::Status last = absl::UnavailableError("no stream tried");
  for (int attempt = 1; attempt <= std::max(1, options_.max_attempts); ++attempt) {
    v1::StreamWeightsRequest request;
    request.set_run_id(run_id);
    // The first stream takes the latest; a resume asks for the same version
    // (and base), whose chunking is the same.
    if (stream.version() >= 0) request.set_version(stream.version());
    request.set_base_version(base.manifest.version().version());
    request.set_start_chunk(stream.chunks());
    request.set_chunk_size_bytes(options_.chunk_size_bytes);
    result.attempts = attempt;
    bool manifest_seen = false;
    last = Source("").StreamWeights(
        request, options_.stall, [&](v1::WeightsChunk& chunk) -> absl::Status {
          if (!manifest_seen) {
            if (!chunk.has_manifest()) {
              return absl::DataLossError("weight stream did not start with a manifest");
            }
            manifest_seen = true;
            return stream.SetManifest(chunk.manifest());
          }
          return stream.Append(chunk);
        });
    if (last.ok()) {
      absl::StatusOr<clients::FetchedWeights> weights = stream.Complete();
      if (!weights.ok()) return weights.status();
      result.version = stream.version();
      result.bytes_received = stream.wire_bytes();
      result.full_bytes = stream.full_bytes();
      result.weights = std::move(*weights);
      return result;
    }
    // A full version, bad data, or a version no longer retained: no retry
    // helps; the caller fetches the full version.
    if (absl::IsFailedPrecondition(last) || absl::IsDataLoss(last) || absl::IsNotFound(last)) {
      return last;
    }
    log::Warning("delta weight stream failed; resuming",
                 {{"run_id", run_id},
                  {"version", stream.version()},
                  {"resume_at_chunk", stream.chunks()},
                  {"error", std::string(last.message())}});
    absl::SleepFor(options_.trainer_backoff);
  }
  return last;
}

}  // namespace sluice::weights
