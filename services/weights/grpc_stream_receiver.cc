#include "services/weights/grpc_stream_receiver.h"

#include <utility>

#include "common/logging.h"

namespace sluice::weights {

GrpcStreamReceiver::GrpcStreamReceiver(bool delta, WeightReceiverDeps deps)
    : delta_(delta), deps_(std::move(deps)) {}

absl::StatusOr<ReceivedWeights> GrpcStreamReceiver::ReceiveLatest(
    const std::string& run_id, const clients::FetchedWeights* held) {
  ReceivedWeights received;
  received.transport = "grpc";
  if (delta_ && held != nullptr && deps_.relay_fetcher != nullptr) {
    auto delta = deps_.relay_fetcher->FetchDelta(run_id, *held);
    if (delta.ok()) {
      received.transport = "grpc_delta";
      received.wire_bytes = delta->bytes_received;
      received.full_bytes = delta->full_bytes;
      received.weights = std::move(delta->weights);
      return received;
    }
    // The trainer has no delta of the latest against the version held (this
    // worker skipped one): the full version, the usual way, quietly.
    if (!absl::IsFailedPrecondition(delta.status())) {
      log::Warning("weight delta failed; fetching the full version",
                   {{"run_id", run_id},
                    {"held_version", held->manifest.version().version()},
                    {"error", std::string(delta.status().message())}});
      if (deps_.on_delta_fallback) {
        deps_.on_delta_fallback(absl::IsDataLoss(delta.status()) ? "data_loss" : "unavailable");
      }
    }
  }
  absl::StatusOr<clients::FetchedWeights> full = ReceiveFull(run_id);
  if (!full.ok()) return full.status();
  for (const std::string& bytes : full->tensor_bytes) {
    received.wire_bytes += static_cast<int64_t>(bytes.size());
  }
  received.full_bytes = received.wire_bytes;
  received.weights = *std::move(full);
  return received;
}

absl::StatusOr<clients::FetchedWeights> GrpcStreamReceiver::ReceiveFull(const std::string& run_id) {
  if (deps_.relay_fetcher != nullptr && !relay_unsupported_) {
    auto relayed = deps_.relay_fetcher->FetchLatest(run_id);
    if (relayed.ok()) {
      if (relayed->depth > 1 || relayed->attempts > 1) {
        log::Debug("weights relayed", {{"run_id", run_id},
                                       {"version", relayed->version},
                                       {"depth", relayed->depth},
                                       {"source", relayed->source},
                                       {"attempts", relayed->attempts}});
      }
      return std::move(relayed->weights);
    }
    if (!absl::IsUnimplemented(relayed.status())) return relayed.status();
    log::Info("the trainer does not place weight downloads; fetching from it directly",
              {{"run_id", run_id}});
    relay_unsupported_ = true;
  }
  return deps_.trainer->FetchWeights(run_id, /*version=*/-1);
}

}  // namespace sluice::weights
