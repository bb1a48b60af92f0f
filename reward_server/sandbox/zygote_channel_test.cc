// The pool's end of the zygote's control socket and log pipe, over a real
// socketpair and pipe (no sandbox runs).
#include "reward_server/sandbox/zygote_channel.h"

#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace sluice::reward_server::sandbox {
namespace {

class SocketPair {
 public:
  SocketPair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  ~SocketPair() {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  int pool() const { return fds_[0]; }
  int zygote() const { return fds_[1]; }
  void CloseZygote() {
    close(fds_[1]);
    fds_[1] = -1;
  }

 private:
  int fds_[2] = {-1, -1};
};

TEST(ZygoteChannelTest, ALengthArrivesLittleEndianWithItsDescriptors) {
  SocketPair pair;
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  ASSERT_TRUE(SendLengthWithFds(pair.pool(), 0x01020304u, &pipe_fds[1], 1).ok());

  unsigned char bytes[4] = {};
  iovec iov = {bytes, sizeof(bytes)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message = {};
  message.msg_iov = &iov;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  ASSERT_EQ(recvmsg(pair.zygote(), &message, 0), 4);
  EXPECT_EQ(bytes[0], 0x04);
  EXPECT_EQ(bytes[3], 0x01);
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  ASSERT_NE(header, nullptr);
  ASSERT_EQ(header->cmsg_type, SCM_RIGHTS);
  int received = -1;
  memcpy(&received, CMSG_DATA(header), sizeof(int));
  // The descriptor received writes into the same pipe.
  ASSERT_EQ(write(received, "x", 1), 1);
  char c = 0;
  ASSERT_EQ(read(pipe_fds[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  close(received);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(ZygoteChannelTest, EventsAreReadLineByLineAndEndOfFileEndsTheChannel) {
  SocketPair pair;
  std::string buffer;
  EXPECT_TRUE(ReadControl(pair.pool(), buffer));  // nothing yet: still open
  EXPECT_EQ(NextLine(buffer), std::nullopt);
  ASSERT_TRUE(SendAll(pair.zygote(), "{\"event\":\"ready\"}\n{\"event\":\"ex").ok());
  ASSERT_TRUE(Readable(pair.pool()));
  EXPECT_TRUE(ReadControl(pair.pool(), buffer));
  EXPECT_EQ(NextLine(buffer), "{\"event\":\"ready\"}");
  EXPECT_EQ(NextLine(buffer), std::nullopt);  // the second is not whole yet
  ASSERT_TRUE(SendAll(pair.zygote(), "ited\"}\n").ok());
  EXPECT_TRUE(ReadControl(pair.pool(), buffer));
  EXPECT_EQ(NextLine(buffer), "{\"event\":\"exited\"}");
  pair.CloseZygote();
  EXPECT_FALSE(ReadControl(pair.pool(), buffer));
}

TEST(ZygoteChannelTest, AZygoteThatWritesWithoutNewlinesIsCutOff) {
  SocketPair pair;
  std::string buffer;
  const std::string chunk(4096, 'a');
  bool open = true;
  for (size_t sent = 0; sent <= kControlBytesKept + chunk.size() && open; sent += chunk.size()) {
    ASSERT_TRUE(SendAll(pair.zygote(), chunk).ok());
    open = ReadControl(pair.pool(), buffer);
  }
  EXPECT_FALSE(open);
}

TEST(ZygoteChannelTest, TheLogKeepsItsTail) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  std::string kept;
  for (int i = 0; i < 10; ++i) {
    const std::string line = std::string(2000, static_cast<char>('a' + i)) + "\n";
    ASSERT_EQ(write(fds[1], line.data(), line.size()), static_cast<ssize_t>(line.size()));
    DrainLog(fds[0], kept);
  }
  EXPECT_LE(kept.size(), 2 * kLogBytesKept);
  EXPECT_GE(kept.size(), kLogBytesKept);
  EXPECT_EQ(kept.back(), '\n');
  EXPECT_EQ(kept[kept.size() - 2], 'j');  // the last line written
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace sluice::reward_server::sandbox
