#ifndef SLUICE_SERVICES_RUNTIME_SERVICE_MAIN_H_
#define SLUICE_SERVICES_RUNTIME_SERVICE_MAIN_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/runtime/server_options.h"

namespace CLI {
class App;
}
namespace grpc {
class HealthCheckServiceInterface;
class Service;
}
namespace prometheus {
class Registry;
}

namespace sluice::runtime {

// What a service binary is, for --help, logs and metrics.
struct ServiceInfo {
  std::string component;    // "replay_buffer": log and metric label.
  std::string binary;       // "sluice-replay-buffer".
  std::string description;  // One paragraph for --help.
  int default_port = 0;     // gRPC port when --listen-address is not given.
  int default_metrics_port = 0;
};

// What grpc.health.v1 reports for each registered service while the server
// runs. A service that is alive but cannot do its work (a replay buffer that
// cannot write its data directory) reports its own name NOT_SERVING while
// the whole server ("") stays SERVING: a readiness check that asks for the
// service sees it, and a liveness probe does not restart a process that a
// restart would not mend. Everything is NOT_SERVING once shutdown begins.
// Thread-safe; held by shared_ptr so that a service's threads may keep it
// past the server.
class ServiceHealth {
 public:
  // SERVING (true) or NOT_SERVING for `full_name` (as given to AddService).
  // Before the server starts, it is what the server starts with; after
  // shutdown began, ignored.
  void SetServing(const std::string& full_name, bool serving) ABSL_LOCKS_EXCLUDED(mu_);
  // What SetServing last said for `full_name` (true when never called).
  bool serving(const std::string& full_name) const ABSL_LOCKS_EXCLUDED(mu_);

  // ServiceMain: the server's health service, once it runs (applies what was
  // set so far to `names`); then Detach when shutdown begins.
  void Attach(grpc::HealthCheckServiceInterface* health, const std::vector<std::string>& names)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  grpc::HealthCheckServiceInterface* health_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
};

// Handed to a service's setup function: where it registers its gRPC services,
// its metrics and what must happen when the process is asked to stop.
class ServiceContext {
 public:
  explicit ServiceContext(const ServerOptions& options, prometheus::Registry& registry)
      : options_(options), registry_(registry) {}

  const ServerOptions& options() const { return options_; }

  // For the component's own metrics; served on /metrics with the RPC metrics.
  prometheus::Registry& metrics_registry() { return registry_; }

  // Registers `service` (kept alive until the server has stopped). Health
  // reports `full_name` (e.g. "sluice.v1.ReplayBufferService") SERVING while
  // the server runs (unless health() says otherwise), NOT_SERVING once
  // shutdown begins.
  void AddService(std::shared_ptr<grpc::Service> service, std::string full_name) {
    services_.emplace_back(std::move(service), std::move(full_name));
  }

  // Where a service says it cannot do its work for now (ServiceHealth).
  const std::shared_ptr<ServiceHealth>& health() const { return health_; }

  // Runs once when shutdown begins, after health turns NOT_SERVING and before
  // in-flight calls are drained: the place to wake calls blocked on a
  // condition (a long-poll sample, a watch) so that they can return in time.
  void OnShutdown(std::function<void()> callback) {
    shutdown_callbacks_.push_back(std::move(callback));
  }

  // Runs once the gRPC server is up and SERVING, before the ready fd is
  // written, with the port it bound (what --listen-address port 0 picked):
  // the place for a service that must tell others its own address.
  void OnStarted(std::function<void(int bound_port)> callback) {
    started_callbacks_.push_back(std::move(callback));
  }

  // Runs before every scrape of /metrics (Metrics::OnCollect): for gauges
  // that read state, such as a queue's depth.
  void OnMetricsCollect(std::function<void()> hook) { collect_hooks_.push_back(std::move(hook)); }

  const std::vector<std::function<void()>>& collect_hooks() const { return collect_hooks_; }
  const std::vector<std::pair<std::shared_ptr<grpc::Service>, std::string>>& services() const {
    return services_;
  }
  const std::vector<std::function<void(int)>>& started_callbacks() const {
    return started_callbacks_;
  }
  const std::vector<std::function<void()>>& shutdown_callbacks() const {
    return shutdown_callbacks_;
  }

 private:
  const ServerOptions& options_;
  prometheus::Registry& registry_;
  const std::shared_ptr<ServiceHealth> health_ = std::make_shared<ServiceHealth>();
  std::vector<std::pair<std::shared_ptr<grpc::Service>, std::string>> services_;
  std::vector<std::function<void()>> shutdown_callbacks_;
  std::vector<std::function<void(int)>> started_callbacks_;
  std::vector<std::function<void()>> collect_hooks_;
};

// Adds --tls-cert, --tls-key, --tls-ca, --tls-require-client-cert,
// --tls-server-name, --auth-tokens and --token-file to `app` (every service
// binary has them; the CLI shares the client half).
void AddSecurityFlags(CLI::App& app, ServerOptions& options);

// The main() of every Sluice service: flags and YAML config, validation,
// structured logs, start-up report (version, BLAS, threads), gRPC server with
// health, reflection, RPC metrics and a message-size limit, Prometheus
// /metrics, and a graceful stop on SIGTERM/SIGINT (stop accepting, drain
// in-flight calls within --shutdown-deadline-ms, cancel the rest; a second
// signal exits at once).
//
//   int main(int argc, char** argv) {
//     ServiceMain main({...});
//     main.app().add_option("--data-dir", data_dir, "...");
//     return main.Run(argc, argv, [&](ServiceContext& ctx) { ...; return absl::OkStatus(); });
//   }
//
// Exit codes: 0 after a clean stop or --help/--version; 2 for a bad flag, an
// unreadable or invalid config (the message says which field and why); 1 when
// the service cannot start (port in use) or fails.
class ServiceMain {
 public:
  using Setup = std::function<absl::Status(ServiceContext&)>;

  explicit ServiceMain(ServiceInfo info);
  ~ServiceMain();

  // Add the component's own flags here before Run(); each is also a key of
  // the YAML config file.
  CLI::App& app() { return *app_; }

  // Blocks until the service has stopped; returns the process exit code.
  // `setup` runs after flags are parsed and logging is up, before the server
  // starts; an error from it stops the process (exit 2 for INVALID_ARGUMENT,
  // else 1).
  int Run(int argc, char** argv, const Setup& setup);

 private:
  ServiceInfo info_;
  ServerOptions options_;
  std::unique_ptr<CLI::App> app_;
};

// Blocks SIGTERM and SIGINT in the calling thread and in every thread it
// starts afterwards, so that they are taken only by sigwait. Call first thing
// in main, before any library starts a thread.
void BlockTerminationSignals();

// Logs version, pid, CPUs and which BLAS this process loaded with its thread
// count. Every Sluice process calls it at start-up.
void LogStartupReport(const std::string& binary);

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_SERVICE_MAIN_H_
