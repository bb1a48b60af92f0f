#include "tests/netns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace sluice::testing {
namespace {

TEST(NetnsNamesTest, NamesCarryTheOwnersPid) {
  EXPECT_EQ(NamespaceName(1234, "worker-a"), "sluice-1234-worker-a");
  EXPECT_EQ(NamespaceOwner(NamespaceName(1234, "worker-a")), 1234);
  EXPECT_EQ(NamespaceOwner(NamespaceName(7, "switch")), 7);
  EXPECT_EQ(UplinkName(4194304), "sluice4194304");
  EXPECT_LE(UplinkName(4194304).size(), 15u);  // IFNAMSIZ - 1.
  EXPECT_EQ(UplinkOwner(UplinkName(99)), 99);
}

TEST(NetnsNamesTest, OtherNamesAreNotOurs) {
  for (const char* name : {"", "sluice-", "sluice-12", "sluice-12-", "sluice-x1-host",
                           "sluice--host", "sluice-0-host", "other-12-host", "cni-1234"}) {
    EXPECT_FALSE(NamespaceOwner(name).has_value()) << name;
  }
  for (const char* name : {"", "sluice", "sluice0", "sluicex", "sluice12a", "sl12", "eth0"}) {
    EXPECT_FALSE(UplinkOwner(name).has_value()) << name;
  }
}

TEST(NetnsNamesTest, ParsesIpNetnsList) {
  EXPECT_EQ(ParseNetnsList("sluice-1-a (id: 3)\nsluice-1-switch (id: 2)\nplain\n\n"),
            (std::vector<std::string>{"sluice-1-a", "sluice-1-switch", "plain"}));
  EXPECT_TRUE(ParseNetnsList("").empty());
}

TEST(TestNetworkTest, RejectsBadHostNames) {
  for (const std::vector<std::string>& hosts : std::vector<std::vector<std::string>>{
           {}, {"Upper"}, {"switch"}, {"a", "a"}, {"far-too-long-name"}, {"a b"}}) {
    absl::StatusOr<std::unique_ptr<TestNetwork>> network = TestNetwork::Create(hosts);
    EXPECT_EQ(network.status().code(), absl::StatusCode::kInvalidArgument) << network.status();
  }
}

// A socket of the namespace `ns`: made on a thread that entered it, so the
// test's own threads never change namespace.
int SocketIn(const std::string& ns) {
  int fd = -1;
  std::thread([&] {
    const int ns_fd = open(("/var/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0) return;
    if (setns(ns_fd, CLONE_NEWNET) == 0) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    close(ns_fd);
  }).join();
  return fd;
}

sockaddr_in Ipv4(const std::string& address, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  return addr;
}

// A listening socket on `address` inside `ns`; returns its port (0 on error).
int Listen(int fd, const std::string& address) {
  sockaddr_in addr = Ipv4(address, 0);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return 0;
  if (listen(fd, 16) != 0) return 0;
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

// Whether a TCP connection from `fd` (a fresh socket; closed here) to
// address:port is established within `timeout`.
bool Connects(int fd, const std::string& address, int port, absl::Duration timeout) {
  if (fd < 0) return false;
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  sockaddr_in addr = Ipv4(address, port);
  bool connected = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    connected = true;
  } else if (errno == EINPROGRESS) {
    pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) == 1) {
      int error = 0;
      socklen_t len = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
      connected = error == 0;
    }
  }
  close(fd);
  return connected;
}

int TestSocket() { return socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }

TEST(TestNetworkTest, HostsReachEachOtherAndADisconnectedHostIsCutOffUntilReconnected) {
  absl::StatusOr<std::unique_ptr<TestNetwork>> made = TestNetwork::Create({"alpha", "beta"});
  if (absl::IsFailedPrecondition(made.status()) && std::getenv("SLUICE_REQUIRE_NETNS") == nullptr) {
    GTEST_SKIP() << "network namespaces cannot be made here: " << made.status();
  }
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<TestNetwork> network = std::move(*made);
  const std::string alpha = network->Address("alpha");
  const std::string beta = network->Address("beta");
  EXPECT_NE(alpha, beta);
  EXPECT_TRUE(absl::StartsWith(network->subnet(), "10.231."));
  const std::string alpha_ns = network->Namespace("alpha");
  const std::string beta_ns = network->Namespace("beta");
  const std::string uplink = UplinkName(getpid());
  EXPECT_TRUE(std::filesystem::exists("/var/run/netns/" + alpha_ns));
  EXPECT_TRUE(std::filesystem::exists("/sys/class/net/" + uplink));

  const int server = SocketIn(alpha_ns);
  ASSERT_GE(server, 0);
  const int port = Listen(server, alpha);
  ASSERT_GT(port, 0);
  // Loopback inside the host is up.
  const int loopback_server = SocketIn(alpha_ns);
  EXPECT_TRUE(Connects(SocketIn(alpha_ns), "127.0.0.1", Listen(loopback_server, "127.0.0.1"),
                       absl::Seconds(5)));
  close(loopback_server);
  EXPECT_TRUE(Connects(TestSocket(), alpha, port, absl::Seconds(5)));
  EXPECT_TRUE(Connects(SocketIn(beta_ns), alpha, port, absl::Seconds(5)));

  ASSERT_TRUE(network->Disconnect("alpha").ok());
  EXPECT_FALSE(Connects(TestSocket(), alpha, port, absl::Milliseconds(500)));
  EXPECT_FALSE(Connects(SocketIn(beta_ns), alpha, port, absl::Milliseconds(500)));

  ASSERT_TRUE(network->Reconnect("alpha").ok());
  // A failed neighbour lookup during the partition can refuse at once for a
  // moment: try until the deadline.
  bool back = false;
  for (const absl::Time deadline = absl::Now() + absl::Seconds(10);
       !back && absl::Now() < deadline;) {
    back = Connects(TestSocket(), alpha, port, absl::Seconds(1));
    if (!back) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(back);
  EXPECT_TRUE(Connects(SocketIn(beta_ns), alpha, port, absl::Seconds(5)));
  close(server);

  network.reset();
  EXPECT_FALSE(std::filesystem::exists("/var/run/netns/" + alpha_ns));
  EXPECT_FALSE(std::filesystem::exists("/var/run/netns/" + NamespaceName(getpid(), "switch")));
  EXPECT_FALSE(std::filesystem::exists("/sys/class/net/" + uplink));
}

}  // namespace
}  // namespace sluice::testing
