#ifndef SLUICE_REWARD_SERVER_SANDBOX_ZYGOTE_CHANNEL_H_
#define SLUICE_REWARD_SERVER_SANDBOX_ZYGOTE_CHANNEL_H_

// The pool's end of a slot's zygote (zygote.py): its control socket, which
// carries each request as a 4-byte length with the program's descriptors
// attached (SCM_RIGHTS) and then the request's bytes, and brings back one JSON
// event per line; and its log pipe, of which the tail is kept. Plain socket
// and pipe helpers, no policy: SandboxPool decides what is sent and when.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sluice::reward_server::sandbox {

// Of a slot's log, the tail kept (a little more in between).
inline constexpr size_t kLogBytesKept = 8192;
// Unread control bytes beyond this end the slot (a zygote that writes
// without newlines).
inline constexpr size_t kControlBytesKept = 1 << 16;

// Writes all of `data` to the socket `fd` (no SIGPIPE; EINTR retried).
absl::Status SendAll(int fd, absl::string_view data);

// Sends `length` as 4 little-endian bytes with `count` (<= 4) descriptors
// `fds` attached.
absl::Status SendLengthWithFds(int socket_fd, uint32_t length, const int* fds, int count);

// Appends what the control socket `fd` has now (non-blocking) to `buffer`;
// false at EOF, on an error, or once `buffer` is over kControlBytesKept.
bool ReadControl(int fd, std::string& buffer);

// Takes the next complete line (without its newline) out of `buffer`.
std::optional<std::string> NextLine(std::string& buffer);

// Drains `fd` (non-blocking) into the end of `kept`, keeping about its last
// kLogBytesKept bytes.
void DrainLog(int fd, std::string& kept);

// `fd` has something to read (or is at EOF) now.
bool Readable(int fd);

}  // namespace sluice::reward_server::sandbox

#endif  // SLUICE_REWARD_SERVER_SANDBOX_ZYGOTE_CHANNEL_H_
