#include "services/runtime/health_client.h"

#include <netdb.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/string_view.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/transport_security.h"

namespace sluice::runtime {

absl::StatusOr<std::string> CheckHealth(const std::string& target, const std::string& service,
                                        absl::Duration timeout) {
  auto channel = CreateChannel(target);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(timeout));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    absl::Status error = FromGrpcStatus(status);
    return absl::Status(error.code(),
                        absl::StrCat("health check of ", target, " failed: ", error.message()));
  }
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

namespace {

class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }

 private:
  int fd_;
};

int RemainingMs(absl::Time deadline) {
  return static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  constexpr absl::string_view kScheme = "http://";
  if (!absl::StartsWith(url, kScheme)) {
    return absl::InvalidArgumentError(absl::StrCat("only http:// URLs are supported: ", url));
  }
  std::string rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  const size_t colon = authority.rfind(':');
  std::string host = colon == std::string::npos ? authority : authority.substr(0, colon);
  const std::string port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);

  struct addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* addresses = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &addresses); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  const int fd = socket(addresses->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    freeaddrinfo(addresses);
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  }
  FdCloser closer(fd);
  const int rc = connect(fd, addresses->ai_addr, addresses->ai_addrlen);
  freeaddrinfo(addresses);
  if (rc != 0 && errno != EINPROGRESS) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", authority, ": ", strerror(errno)));
  }
  struct pollfd pfd = {fd, POLLOUT, 0};
  if (poll(&pfd, 1, RemainingMs(deadline)) <= 0) {
    return absl::DeadlineExceededError(absl::StrCat("connecting to ", authority, " timed out"));
  }
  int so_error = 0;
  socklen_t len = sizeof(so_error);
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
  if (so_error != 0) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ", authority, ": ", strerror(so_error)));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", authority, "\r\nConnection: close\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pfd = {fd, POLLOUT, 0};
      if (poll(&pfd, 1, RemainingMs(deadline)) <= 0) return absl::DeadlineExceededError("send timed out");
      continue;
    }
    if (n < 0) return absl::UnavailableError(absl::StrCat("send: ", strerror(errno)));
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buffer[16384];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n > 0) {
      response.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;
    if (errno == EAGAIN || errno == EINTR) {
      pfd = {fd, POLLIN, 0};
      if (poll(&pfd, 1, RemainingMs(deadline)) <= 0) {
        return absl::DeadlineExceededError(absl::StrCat("reading ", url, " timed out"));
      }
      continue;
    }
    return absl::UnavailableError(absl::StrCat("recv: ", strerror(errno)));
  }
  const size_t header_end = response.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("malformed HTTP response from ", url));
  }
  // "HTTP/1.1 200 OK"
  const size_t space = response.find(' ');
  int code = 0;
  if (space == std::string::npos || !absl::SimpleAtoi(response.substr(space + 1, 3), &code)) {
    return absl::DataLossError(absl::StrCat("malformed HTTP status line from ", url));
  }
  if (code != 200) {
    return absl::UnavailableError(absl::StrCat("GET ", url, " returned HTTP ", code));
  }
  return response.substr(header_end + 4);
}

}  // namespace sluice::runtime
