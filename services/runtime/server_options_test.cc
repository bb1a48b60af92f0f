#include "services/runtime/server_options.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

ServerOptions Valid() {
  ServerOptions options;
  options.listen_address = "127.0.0.1:0";
  return options;
}

TEST(ServerOptionsTest, DefaultsWithAnAddressAreValid) { EXPECT_TRUE(Valid().Validate().ok()); }

TEST(ServerOptionsTest, ParsesIpv4Ipv6AndNames) {
  EXPECT_EQ(ParseHostPort("127.0.0.1:50051", "x")->port, 50051);
  EXPECT_EQ(ParseHostPort("[::]:7", "x")->host, "[::]");
  EXPECT_EQ(ParseHostPort("localhost:0", "x")->host, "localhost");
}

TEST(ServerOptionsTest, RejectsMalformedAddressesNamingTheField) {
  for (const char* bad : {"50051", ":50051", "host:port", "host:70000", "::1:5", "[::1:5"}) {
    ServerOptions options = Valid();
    options.listen_address = bad;
    absl::Status status = options.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()), HasSubstr("listen_address")) << bad;
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad)) << bad;
  }
}

TEST(ServerOptionsTest, ReportsEveryProblemAtOnce) {
  ServerOptions options = Valid();
  options.metrics_port = 70000;
  options.max_message_size_bytes = 10;
  options.shutdown_deadline_ms = -1;
  options.log_level = "loud";
  options.log_format = "xml";
  const std::string message(options.Validate().message());
  EXPECT_THAT(message, HasSubstr("metrics_port must be in [0, 65535], or -1 to disable; got 70000"));
  EXPECT_THAT(message, HasSubstr("max_message_size_bytes"));
  EXPECT_THAT(message, HasSubstr("shutdown_deadline_ms must be in [0, 600000]; got -1"));
  EXPECT_THAT(message, HasSubstr("'loud'"));
  EXPECT_THAT(message, HasSubstr("'xml'"));
}

TEST(ServerOptionsTest, MetricsBindsOnTheListenHost) {
  ServerOptions options = Valid();
  options.metrics_port = 9091;
  EXPECT_EQ(options.MetricsBindAddress(), "127.0.0.1:9091");
  options.listen_address = "0.0.0.0:50051";
  EXPECT_EQ(options.MetricsBindAddress(), "9091");
}

TEST(ServerOptionsTest, AdvertisesNamedHostsAsIsAndLoopbackAsLoopback) {
  EXPECT_EQ(DefaultAdvertiseAddress("10.1.2.3:50052", 50052), "10.1.2.3:50052");
  EXPECT_EQ(DefaultAdvertiseAddress("127.0.0.1:0", 41000), "127.0.0.1:41000");
  EXPECT_EQ(DefaultAdvertiseAddress("localhost:0", 41000), "127.0.0.1:41000");
}

TEST(ServerOptionsTest, WildcardAdvertisesTheHostnamesAddressOrLoopback) {
  // "localhost" resolves only to loopback: no address for others.
  EXPECT_EQ(NonLoopbackAddressOf("localhost"), "");
  EXPECT_EQ(NonLoopbackAddressOf(""), "");
  EXPECT_EQ(NonLoopbackAddressOf("no-such-host.invalid"), "");
  // A numeric host resolves to itself.
  EXPECT_EQ(NonLoopbackAddressOf("10.20.30.40"), "10.20.30.40");
  EXPECT_EQ(NonLoopbackAddressOf("127.0.1.1"), "");
  // Whatever this machine's hostname resolves to, the wildcard's address is
  // that (a container's own) or loopback, with the bound port.
  const std::string advertised = DefaultAdvertiseAddress("0.0.0.0:0", 43210);
  EXPECT_THAT(advertised, ::testing::EndsWith(":43210"));
  EXPECT_NE(advertised.rfind("0.0.0.0", 0), 0u) << advertised;
  EXPECT_EQ(DefaultAdvertiseAddress("[::]:0", 43210), advertised);
}

}  // namespace
}  // namespace sluice::runtime
