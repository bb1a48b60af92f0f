#include "services/weights/weight_relay_service.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "services/runtime/auth.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/request_limits.h"
#include "services/weights/weight_stream_server.h"

namespace sluice::weights {

WeightRelayServiceImpl::WeightRelayServiceImpl(std::shared_ptr<RelayCache> cache,
                                               prometheus::Registry& registry,
                                               WeightRelayOptions options)
    : cache_(std::move(cache)),
      options_(options),
      bytes_sent_(prometheus::BuildCounter()
                      .Name("sluice_weight_relay_bytes_sent_total")
                      .Help("Weight bytes this worker relayed to other workers")
                      .Register(registry)
                      .Add({})),
      streams_(prometheus::BuildCounter()
                   .Name("sluice_weight_relay_streams_total")
                   .Help("Weight streams this worker served to other workers")
                   .Register(registry)
                   .Add({})),
      streams_failed_(prometheus::BuildCounter()
                          .Name("sluice_weight_relay_streams_failed_total")
                          .Help("Relayed weight streams that ended early: this worker's own "
                                "source failed or stalled, or it did not have the version")
                          .Register(registry)
                          .Add({})),
      streams_active_(prometheus::BuildGauge()
                          .Name("sluice_weight_relay_streams_active")
                          .Help("Weight streams this worker is relaying now")
                          .Register(registry)
                          .Add({})) {}

grpc::Status WeightRelayServiceImpl::StreamWeights(grpc::ServerContext* context,
                                                   const v1::StreamWeightsRequest* request,
                                                   grpc::ServerWriter<v1::WeightsChunk>* writer) {
  runtime::StreamGate::Slot stream_slot;
  if (grpc::Status admitted = AdmitWeightStream(context, *request, &stream_slot); !admitted.ok()) {
    return admitted;
  }
  streams_.Increment();
  streams_active_.Increment();
  absl::Cleanup done = [this] { streams_active_.Decrement(); };
  auto fail = [this](grpc::StatusCode code, std::string message) {
    streams_failed_.Increment();
    return grpc::Status(code, std::move(message));
  };
  if (!request->tensor_names().empty()) {
    return fail(grpc::StatusCode::INVALID_ARGUMENT,
                "tensor_names: a weight relay serves whole versions only");
  }
  auto stream = cache_->Find(request->run_id(), request->has_version() ? request->version() : -1,
                             absl::Now() + options_.wait_for_version);
  if (!stream.ok()) return fail(grpc::StatusCode::NOT_FOUND, std::string(stream.status().message()));
  auto manifest = (*stream)->WaitManifest(absl::Now() + options_.stall);
  if (!manifest.ok()) {
    return fail(grpc::StatusCode::UNAVAILABLE, std::string(manifest.status().message()));
  }
  if (!writer->Write(ManifestChunk((*stream)->version(), std::move(*manifest)))) {
    return grpc::Status::OK;
  }
  for (int64_t i = request->start_chunk();; ++i) {
    if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "client cancelled"};
    auto chunk = (*stream)->WaitChunk(i, absl::Now() + options_.stall);
    if (!chunk.ok()) return fail(grpc::StatusCode::UNAVAILABLE, std::string(chunk.status().message()));
    if (*chunk == nullptr) break;
    if (!writer->Write(**chunk)) return grpc::Status::OK;
    bytes_sent_.Increment(static_cast<double>((*chunk)->data().size()));
  }
  return grpc::Status::OK;
}

}  // namespace sluice::weights
