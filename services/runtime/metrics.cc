#include "services/runtime/metrics.h"

#include <chrono>
#include <exception>

#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "prometheus/text_serializer.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/metrics_http_server.h"

namespace sluice::runtime {
namespace {

// "/sluice.v1.Foo/Bar" -> {"sluice.v1.Foo", "Bar"}.
std::pair<std::string, std::string> SplitMethod(absl::string_view full_method) {
  if (!full_method.empty() && full_method.front() == '/') full_method.remove_prefix(1);
  const size_t slash = full_method.find('/');
  if (slash == absl::string_view::npos) return {"unknown", std::string(full_method)};
  return {std::string(full_method.substr(0, slash)), std::string(full_method.substr(slash + 1))};
}

}  // namespace

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = 1e-4; b < 120; b *= 2.5) bounds.push_back(b);
  return bounds;
}

RpcMetrics::RpcMetrics(prometheus::Registry& registry)
    : started_(prometheus::BuildCounter()
                   .Name("grpc_server_started_total")
                   .Help("RPCs started on the server.")
                   .Register(registry)),
      handled_(prometheus::BuildCounter()
                   .Name("grpc_server_handled_total")
                   .Help("RPCs completed on the server, by status code.")
                   .Register(registry)),
      handling_seconds_(prometheus::BuildHistogram()
                            .Name("grpc_server_handling_seconds")
                            .Help("Time from the start of an RPC to its status, by status code.")
                            .Register(registry)) {}

void RpcMetrics::Started(absl::string_view full_method, absl::string_view type) {
  auto [service, method] = SplitMethod(full_method);
  started_
      .Add({{"grpc_service", service}, {"grpc_method", method}, {"grpc_type", std::string(type)}})
      .Increment();
}

void RpcMetrics::Handled(absl::string_view full_method, absl::string_view type, int code,
                         double seconds) {
  auto [service, method] = SplitMethod(full_method);
  const prometheus::Labels labels = {{"grpc_service", service},
                                     {"grpc_method", method},
                                     {"grpc_type", std::string(type)},
                                     {"grpc_code", std::string(StatusCodeName(code))}};
  handled_.Add(labels).Increment();
  handling_seconds_.Add(labels, LatencyBucketsSeconds()).Observe(seconds);
}

Metrics::Metrics(absl::string_view component)
    : registry_(std::make_shared<prometheus::Registry>()),
      rpc_(std::make_unique<RpcMetrics>(*registry_)) {
  prometheus::BuildGauge()
      .Name("sluice_build_info")
      .Help("Always 1; labels say which component and version this process is.")
      .Register(*registry_)
      .Add({{"component", std::string(component)}, {"version", kVersion}})
      .Set(1);
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  prometheus::BuildGauge()
      .Name("process_start_time_seconds")
      .Help("Start time of the process since the Unix epoch, in seconds.")
      .Register(*registry_)
      .Add({})
      .Set(now);
}

Metrics::~Metrics() { StopServing(); }

absl::StatusOr<int> Metrics::Serve(const std::string& bind_address) {
  if (http_ != nullptr) return absl::FailedPreconditionError("metrics already served");
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(bind_address, [this] { return Serialize(); });
  if (!server.ok()) return server.status();
  http_ = std::move(*server);
  return http_->port();
}

void Metrics::StopServing() { http_.reset(); }

void Metrics::OnCollect(std::function<void()> hook) {
  absl::MutexLock lock(&hooks_mu_);
  collect_hooks_.push_back(std::move(hook));
}

std::string Metrics::Serialize() const {
  {
    absl::MutexLock lock(&hooks_mu_);
    for (const std::function<void()>& hook : collect_hooks_) hook();
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace sluice::runtime
