#ifndef SLUICE_SERVICES_RUNTIME_METRICS_HTTP_SERVER_H_
#define SLUICE_SERVICES_RUNTIME_METRICS_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace sluice::runtime {

// Serves GET /metrics (Prometheus text format 0.0.4) over HTTP/1.x.
//
// Why not prometheus-cpp's Exposer: its civetweb server returns a null
// context in any process that has loaded Debian's libtorch_cpu (reproduced by
// LD_PRELOAD-ing libtorch_cpu.so into a torch-free service), and the trainer
// and rollout worker must export metrics. Prometheus scrapes one small
// document every few seconds, so one thread answering one connection at a
// time, with a per-connection deadline, is all this needs. prometheus-cpp
// still provides the registry and the text serializer.
//
// Thread-safe; the destructor stops the server and joins its thread.
class MetricsHttpServer {
 public:
  // Binds `bind_address` ("127.0.0.1:0", "[::1]:9090", or a bare port for
  // all interfaces) and starts serving. `render` is called on the server
  // thread for every scrape. An error (never a crash) when the port is taken.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& bind_address, std::function<std::string()> render);

  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int stop_fd, int port, std::function<std::string()> render);
  void Serve();
  void HandleConnection(int fd);

  const int listen_fd_;
  const int stop_fd_;  // eventfd; readable once the destructor asks to stop.
  const int port_;
  const std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_METRICS_HTTP_SERVER_H_
