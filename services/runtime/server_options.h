#ifndef SLUICE_SERVICES_RUNTIME_SERVER_OPTIONS_H_
#define SLUICE_SERVICES_RUNTIME_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/runtime/request_limits.h"
#include "services/runtime/transport_security.h"

namespace sluice::runtime {

// "host:port" split; IPv6 hosts keep their brackets ("[::1]").
struct HostPort {
  std::string host;
  int port = 0;
};

// Parses "127.0.0.1:50051", "0.0.0.0:0", "[::]:50051", "localhost:9000".
// The error names `what` (e.g. "listen_address") and the offending value.
absl::StatusOr<HostPort> ParseHostPort(const std::string& value, const std::string& what);

// How other services reach a server listening on `listen_address` and bound
// to `port`: <host>:<port> for a named host; 127.0.0.1:<port> for loopback;
// for a wildcard host (0.0.0.0, [::]) the IPv4 address this machine's
// hostname resolves to (a container's or a Kubernetes pod's own address,
// from /etc/hosts), or 127.0.0.1 where it resolves only to loopback (a
// workstation). --advertise-address overrides it.
std::string DefaultAdvertiseAddress(const std::string& listen_address, int port);

// The first non-loopback IPv4 address `hostname` resolves to, or "" when
// it resolves to none (only loopback, or not at all).
std::string NonLoopbackAddressOf(const std::string& hostname);

// What every Sluice service needs to serve: where, how big, how to stop, how
// to log. Filled from flags and/or a YAML file (see config_file.h) and checked
// once by Validate() before anything starts.
struct ServerOptions {
  static constexpr int64_t kDefaultMaxMessageSizeBytes = 64 << 20;
  static constexpr int kMetricsDisabled = -1;

  // gRPC listen address, "host:port"; port 0 picks a free port (reported on
  // the ready fd and in the log).
  std::string listen_address;
  // Prometheus /metrics HTTP port, bound on the listen address's host; 0 picks
  // a free port, -1 disables the endpoint.
  int metrics_port = 0;
  // Largest gRPC message accepted or sent.
  int64_t max_message_size_bytes = kDefaultMaxMessageSizeBytes;
  // On SIGTERM/SIGINT: stop accepting at once, let in-flight calls finish for
  // at most this long, then cancel what is left.
  int64_t shutdown_deadline_ms = 10000;
  std::string log_level = "info";
  std::string log_format = "text";
  // When >= 0, one JSON line {"grpc": "...", "metrics": "...", "pid": N} is
  // written to this inherited file descriptor once serving, then it is closed.
  // Used by `sluice up` to learn the ports a child bound.
  int ready_fd = -1;

  // Binds /metrics to its own "host:port" (e.g. a pod-internal or loopback
  // address while gRPC listens publicly); overrides metrics_port. Empty =
  // metrics_port on the listen address's host.
  std::string metrics_listen_address;

  // Transport security and callers (transport_security.h, auth.h).
  ServerTls tls;
  // Accepted bearer tokens (YAML, hashed); empty = tokens not required.
  std::string auth_tokens_file;
  // How this service dials others: tls_ca, tls_cert/key as its client
  // certificate, token_file, tls_server_name.
  ClientSecurity client;

  // What one request may ask (request_limits.h).
  RequestLimits limits;

  // Every problem at once, one per line, each naming the field and value.
  absl::Status Validate() const;

  // "host:port" for the metrics endpoint. Requires Validate().
  std::string MetricsBindAddress() const;
};

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_SERVER_OPTIONS_H_
