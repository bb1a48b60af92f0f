#include "services/runtime/metrics_http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice::runtime {
namespace {

constexpr int kConnectionDeadlineMs = 5000;
constexpr size_t kMaxRequestBytes = 16 << 10;

bool SendAll(int fd, const std::string& data, std::chrono::steady_clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      struct pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& bind_address, std::function<std::string()> render) {
  std::string host;
  std::string port_text = bind_address;
  const size_t colon = bind_address.rfind(':');
  if (colon != std::string::npos) {
    host = bind_address.substr(0, colon);
    port_text = bind_address.substr(colon + 1);
  }
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  int port = -1;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics bind address must be [host:]port; got '", bind_address, "'"));
  }

  struct addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* addresses = nullptr;
  const std::string service = absl::StrCat(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints,
                           &addresses);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve metrics host '", host, "': ", gai_strerror(rc)));
  }
  // With no host, prefer the IPv6 wildcard (dual-stack) when the machine has it.
  struct addrinfo* chosen = addresses;
  for (struct addrinfo* a = addresses; host.empty() && a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET6) chosen = a;
  }
  const int fd = socket(chosen->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(addresses);
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (chosen->ai_family == AF_INET6) {
    const int zero = 0;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  const int bound = bind(fd, chosen->ai_addr, chosen->ai_addrlen);
  freeaddrinfo(addresses);
  if (bound != 0 || listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", bind_address,
                                               " (port in use or address unavailable): ",
                                               strerror(err)));
  }
  struct sockaddr_storage local = {};
  socklen_t length = sizeof(local);
  getsockname(fd, reinterpret_cast<struct sockaddr*>(&local), &length);
  const int bound_port =
      local.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&local)->sin6_port)
          : ntohs(reinterpret_cast<struct sockaddr_in*>(&local)->sin_port);
  const int stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", strerror(errno)));
  }
  return std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, stop_fd, bound_port, std::move(render)));
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int stop_fd, int port,
                                     std::function<std::string()> render)
    : listen_fd_(listen_fd), stop_fd_(stop_fd), port_(port), render_(std::move(render)) {
  thread_ = std::thread([this] { Serve(); });
}

MetricsHttpServer::~MetricsHttpServer() {
  const uint64_t one = 1;
  ssize_t ignored = write(stop_fd_, &one, sizeof(one));
  (void)ignored;
  thread_.join();
  close(listen_fd_);
  close(stop_fd_);
}

void MetricsHttpServer::Serve() {
  while (true) {
    struct pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents & POLLIN) return;
    if (!(fds[0].revents & POLLIN)) continue;
    const int connection = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) continue;
    HandleConnection(connection);
    close(connection);
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kConnectionDeadlineMs);
  std::string request;
  char buffer[4096];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    if (request.size() > kMaxRequestBytes) return;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      request.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return;
    if (errno != EAGAIN && errno != EINTR) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    struct pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, static_cast<int>(left.count())) <= 0 || (fds[1].revents & POLLIN)) return;
  }
  const size_t line_end = request.find_first_of("\r\n");
  const std::string request_line = request.substr(0, line_end);
  std::string status = "200 OK";
  std::string content_type = "text/plain; version=0.0.4; charset=utf-8";
  std::string body;
  const bool is_get = absl::StartsWith(request_line, "GET ");
  const bool is_head = absl::StartsWith(request_line, "HEAD ");
  const size_t path_start = request_line.find(' ');
  const size_t path_end = request_line.find(' ', path_start + 1);
  std::string path = path_start == std::string::npos
                         ? ""
                         : request_line.substr(path_start + 1, path_end - path_start - 1);
  path = path.substr(0, path.find('?'));
  if (!is_get && !is_head) {
    status = "405 Method Not Allowed";
    content_type = "text/plain";
    body = "only GET /metrics is served here\n";
  } else if (path != "/metrics" && path != "/") {
    status = "404 Not Found";
    content_type = "text/plain";
    body = "only /metrics is served here\n";
  } else {
    body = render_();
  }
  std::string response = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                                      "\r\nContent-Length: ", body.size(),
                                      "\r\nConnection: close\r\n\r\n");
  if (!is_head) response += body;
  SendAll(fd, response, deadline);
}

}  // namespace sluice::runtime
