#ifndef SLUICE_SERVICES_RUNTIME_METRICS_H_
#define SLUICE_SERVICES_RUNTIME_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace sluice::runtime {

class MetricsHttpServer;

// Per-RPC metrics, named as go-grpc-prometheus names them so that existing
// Grafana dashboards and alerts work unchanged:
//
//   grpc_server_started_total{grpc_service, grpc_method, grpc_type}
//   grpc_server_handled_total{grpc_service, grpc_method, grpc_type, grpc_code}
//   grpc_server_handling_seconds{grpc_service, grpc_method, grpc_type, grpc_code}  (histogram)
//
// Thread-safe.
class RpcMetrics {
 public:
  explicit RpcMetrics(prometheus::Registry& registry);

  // `full_method` is gRPC's "/package.Service/Method"; `type` one of "unary",
  // "client_stream", "server_stream", "bidi_stream".
  void Started(absl::string_view full_method, absl::string_view type);
  void Handled(absl::string_view full_method, absl::string_view type, int code, double seconds);

 private:
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>& handling_seconds_;
};

// A process's metrics: one registry, the RPC metrics, build info, and the
// HTTP endpoint that serves them as Prometheus text on /metrics.
class Metrics {
 public:
  // Registers sluice_build_info{component, version} and
  // process_start_time_seconds.
  explicit Metrics(absl::string_view component);
  ~Metrics();

  // For component metrics; outlives every Family registered on it.
  prometheus::Registry& registry() { return *registry_; }
  RpcMetrics& rpc() { return *rpc_; }

  // Starts serving /metrics on `bind_address` ("127.0.0.1:0", "9090" for all
  // interfaces).
  // Returns the bound port; an error (never a crash) when the port is taken.
  absl::StatusOr<int> Serve(const std::string& bind_address);

  // Stops the HTTP endpoint; idempotent.
  void StopServing();

  // The text exposition format, as /metrics would serve it. Runs the
  // OnCollect hooks first.
  std::string Serialize() const;

  // `hook` runs before every collection (each scrape of /metrics): the place
  // to set gauges that read a component's state (a queue's depth) rather
  // than follow its events. Must be cheap and thread-safe.
  void OnCollect(std::function<void()> hook);

 private:
  mutable absl::Mutex hooks_mu_;
  std::vector<std::function<void()>> collect_hooks_ ABSL_GUARDED_BY(hooks_mu_);
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RpcMetrics> rpc_;
  std::unique_ptr<MetricsHttpServer> http_;
};

// Histogram buckets for latencies from 100 µs to ~100 s.
prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds();

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_METRICS_H_
