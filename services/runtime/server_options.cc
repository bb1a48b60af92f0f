#include "services/runtime/server_options.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <fstream>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace sluice::runtime {

absl::StatusOr<HostPort> ParseHostPort(const std::string& value, const std::string& what) {
  const auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " must be host:port (e.g. 127.0.0.1:50051 or [::]:50051); got '", value,
        "': ", why));
  };
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos) return error("no port");
  HostPort result;
  result.host = value.substr(0, colon);
  if (result.host.empty()) return error("empty host");
  if (result.host.front() == '[' && result.host.back() != ']') return error("unclosed '['");
  if (result.host.front() != '[' && result.host.find(':') != std::string::npos) {
    return error("IPv6 hosts need brackets");
  }
  const std::string port = value.substr(colon + 1);
  int port_number = -1;
  if (!absl::SimpleAtoi(port, &port_number) || port_number < 0 || port_number > 65535) {
    return error("port must be an integer in [0, 65535]");
  }
  result.port = port_number;
  return result;
}

absl::Status ServerOptions::Validate() const {
  std::vector<std::string> problems;
  if (absl::StatusOr<HostPort> hp = ParseHostPort(listen_address, "listen_address"); !hp.ok()) {
    problems.emplace_back(hp.status().message());
  }
  if (metrics_port < kMetricsDisabled || metrics_port > 65535) {
    problems.push_back(absl::StrCat(
        "metrics_port must be in [0, 65535], or -1 to disable; got ", metrics_port));
  }
  constexpr int64_t kMinMessage = 4 << 10;
  constexpr int64_t kMaxMessage = (int64_t{1} << 31) - 1;  // gRPC's limit is an int.
  if (max_message_size_bytes < kMinMessage || max_message_size_bytes > kMaxMessage) {
    problems.push_back(absl::StrCat("max_message_size_bytes must be in [", kMinMessage, ", ",
                                    kMaxMessage, "]; got ", max_message_size_bytes));
  }
  if (shutdown_deadline_ms < 0 || shutdown_deadline_ms > 600000) {
    problems.push_back(absl::StrCat("shutdown_deadline_ms must be in [0, 600000]; got ",
                                    shutdown_deadline_ms));
  }
  if (absl::StatusOr<log::Level> level = log::ParseLevel(log_level); !level.ok()) {
    problems.emplace_back(level.status().message());
  }
  if (absl::StatusOr<log::Format> format = log::ParseFormat(log_format); !format.ok()) {
    problems.emplace_back(format.status().message());
  }
  if (ready_fd < -1) problems.push_back(absl::StrCat("ready_fd must be >= 0; got ", ready_fd));
  if (!metrics_listen_address.empty()) {
    if (absl::StatusOr<HostPort> hp =
            ParseHostPort(metrics_listen_address, "metrics_listen_address");
        !hp.ok()) {
      problems.emplace_back(hp.status().message());
    }
  }
  if (absl::Status limits_ok = limits.Validate(); !limits_ok.ok()) {
    problems.emplace_back(limits_ok.message());
  }
  const absl::Status tls_ok = tls.Validate();
  if (!tls_ok.ok()) problems.emplace_back(tls_ok.message());
  if (tls.enabled() && tls.ca_file.empty()) {
    problems.emplace_back(
        "tls_cert needs tls_ca too: a service verifies the services it calls with it (and the "
        "client certificates of callers)");
  }
  if (absl::Status client_ok = client.Validate(); !client_ok.ok() && tls_ok.ok()) {
    problems.emplace_back(client_ok.message());
  }
  if (!auth_tokens_file.empty()) {
    std::ifstream in(auth_tokens_file);
    if (!in) {
      problems.push_back(absl::StrCat("auth_tokens: cannot read '", auth_tokens_file, "'"));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

std::string ServerOptions::MetricsBindAddress() const {
  if (!metrics_listen_address.empty()) {
    HostPort hp = *ParseHostPort(metrics_listen_address, "metrics_listen_address");
    if (hp.host == "0.0.0.0" || hp.host == "[::]") return absl::StrCat(hp.port);
    if (hp.host == "localhost") hp.host = "127.0.0.1";
    return absl::StrCat(hp.host, ":", hp.port);
  }
  HostPort hp = *ParseHostPort(listen_address, "listen_address");
  std::string host = hp.host;
  // civetweb wants IPv6 hosts as "[::1]:port" too, but binds every address for
  // a bare port; 0.0.0.0 means "all interfaces" the same way.
  if (host == "0.0.0.0" || host == "[::]") return absl::StrCat(metrics_port);
  if (host == "localhost") host = "127.0.0.1";
  return absl::StrCat(host, ":", metrics_port);
}

std::string NonLoopbackAddressOf(const std::string& hostname) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (hostname.empty() || getaddrinfo(hostname.c_str(), nullptr, &hints, &found) != 0) return "";
  std::string address;
  for (const addrinfo* a = found; a != nullptr && address.empty(); a = a->ai_next) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    // 127.0.0.0/8 (Debian maps the hostname to 127.0.1.1) and 0.0.0.0 are
    // no address another host can use.
    const uint32_t ip = ntohl(in->sin_addr.s_addr);
    if ((ip >> 24) == 127 || ip == 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) address = text;
  }
  freeaddrinfo(found);
  return address;
}

std::string DefaultAdvertiseAddress(const std::string& listen_address, int port) {
  absl::StatusOr<HostPort> listen = ParseHostPort(listen_address, "listen_address");
  const std::string host = listen.ok() ? listen->host : "0.0.0.0";
  if (host == "localhost" || host == "127.0.0.1") return absl::StrCat("127.0.0.1:", port);
  if (host == "0.0.0.0" || host == "[::]") {
    // In a container or a pod the hostname resolves to the address the
    // others reach it at; on a workstation to loopback, which is right there.
    char name[256] = {};
    std::string address;
    if (gethostname(name, sizeof(name) - 1) == 0) address = NonLoopbackAddressOf(name);
    return absl::StrCat(address.empty() ? "127.0.0.1" : address, ":", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace sluice::runtime
