#include "reward_server/sandbox/zygote_channel.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "reward_server/sandbox/sandbox_internal.h"

namespace sluice::reward_server::sandbox {

using internal::ErrnoError;

absl::Status SendAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("sending to the sandbox slot");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Sends the 4-byte length of `header` with `fds` attached.
absl::Status SendLengthWithFds(int socket_fd, uint32_t length, const int* fds, int count) {
  unsigned char bytes[4] = {
      static_cast<unsigned char>(length), static_cast<unsigned char>(length >> 8),
      static_cast<unsigned char>(length >> 16), static_cast<unsigned char>(length >> 24)};
  iovec iov = {bytes, sizeof(bytes)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr message = {};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = CMSG_SPACE(sizeof(int) * count);
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(sizeof(int) * count);
  memcpy(CMSG_DATA(header), fds, sizeof(int) * count);
  while (true) {
    const ssize_t n = sendmsg(socket_fd, &message, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof(bytes))) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("sending to the sandbox slot");
    return absl::InternalError("short send to the sandbox slot");
  }
}

// Reads what the control socket has; false at EOF or on error.
bool ReadControl(int fd, std::string& buffer) {
  char chunk[4096];
  const ssize_t n = recv(fd, chunk, sizeof(chunk), MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  buffer.append(chunk, static_cast<size_t>(n));
  return buffer.size() <= kControlBytesKept;
}

// Takes the next complete line out of `buffer`.
std::optional<std::string> NextLine(std::string& buffer) {
  const size_t newline = buffer.find('\n');
  if (newline == std::string::npos) return std::nullopt;
  std::string line = buffer.substr(0, newline);
  buffer.erase(0, newline + 1);
  return line;
}

// Drains `fd` (non-blocking) into the end of `kept`.
void DrainLog(int fd, std::string& kept) {
  char chunk[4096];
  while (true) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) return;
    kept.append(chunk, static_cast<size_t>(n));
    if (kept.size() > 2 * kLogBytesKept) kept.erase(0, kept.size() - kLogBytesKept);
  }
}

bool Readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

}  // namespace sluice::reward_server::sandbox
