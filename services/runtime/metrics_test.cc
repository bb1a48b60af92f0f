#include "services/runtime/metrics.h"

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/runtime/health_client.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, RecordsRpcCountsAndLatencyPerMethodAndCode) {
  Metrics metrics("replay_buffer");
  metrics.rpc().Started("/sluice.v1.ReplayBufferService/Sample", "bidi_stream");
  metrics.rpc().Handled("/sluice.v1.ReplayBufferService/Sample", "bidi_stream", 0, 0.002);
  metrics.rpc().Handled("/sluice.v1.ReplayBufferService/Sample", "bidi_stream", 4, 1.5);
  metrics.rpc().Handled("/sluice.v1.ReplayBufferService/Sample", "bidi_stream", 4, 1.5);
  const std::string text = metrics.Serialize();
  EXPECT_THAT(text, HasSubstr("grpc_server_started_total{grpc_method=\"Sample\","
                              "grpc_service=\"sluice.v1.ReplayBufferService\","
                              "grpc_type=\"bidi_stream\"} 1"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Sample\","
                              "grpc_service=\"sluice.v1.ReplayBufferService\","
                              "grpc_type=\"bidi_stream\"} 1"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handled_total{grpc_code=\"DEADLINE_EXCEEDED\","
                              "grpc_method=\"Sample\",grpc_service=\"sluice.v1.ReplayBufferService\","
                              "grpc_type=\"bidi_stream\"} 2"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handling_seconds_count{grpc_code=\"DEADLINE_EXCEEDED\","
                              "grpc_method=\"Sample\",grpc_service=\"sluice.v1.ReplayBufferService\","
                              "grpc_type=\"bidi_stream\"} 2"));
  EXPECT_THAT(text, HasSubstr("grpc_server_handling_seconds_sum{grpc_code=\"DEADLINE_EXCEEDED\","
                              "grpc_method=\"Sample\",grpc_service=\"sluice.v1.ReplayBufferService\","
                              "grpc_type=\"bidi_stream\"} 3"));
}

TEST(MetricsTest, ExportsBuildInfo) {
  Metrics metrics("trainer");
  EXPECT_THAT(metrics.Serialize(), HasSubstr("sluice_build_info{component=\"trainer\""));
}

TEST(MetricsTest, CollectHooksRunBeforeEveryScrape) {
  Metrics metrics("reward_server");
  prometheus::Gauge& depth =
      prometheus::BuildGauge().Name("queue_depth").Help("test").Register(metrics.registry()).Add({});
  int depth_now = 3;
  metrics.OnCollect([&] { depth.Set(depth_now); });
  EXPECT_THAT(metrics.Serialize(), HasSubstr("queue_depth 3"));
  depth_now = 7;
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  absl::StatusOr<std::string> body =
      HttpGet("http://127.0.0.1:" + std::to_string(*port) + "/metrics", absl::Seconds(10));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("queue_depth 7"));
}

TEST(MetricsTest, ServesOverHttpOnAFreePort) {
  Metrics metrics("controller");
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  absl::StatusOr<std::string> body =
      HttpGet("http://127.0.0.1:" + std::to_string(*port) + "/metrics", absl::Seconds(10));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("sluice_build_info"));
}

TEST(MetricsTest, PortInUseIsAnErrorNotACrash) {
  Metrics first("a");
  absl::StatusOr<int> port = first.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok());
  Metrics second("b");
  absl::StatusOr<int> clash = second.Serve("127.0.0.1:" + std::to_string(*port));
  ASSERT_FALSE(clash.ok());
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("port in use"));
}

}  // namespace
}  // namespace sluice::runtime

namespace sluice::runtime {
namespace {

TEST(MetricsHttpServerTest, UnknownPathsAre404AndTheServerKeepsServing) {
  Metrics metrics("reward_server");
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok());
  const std::string base = "http://127.0.0.1:" + std::to_string(*port);
  absl::StatusOr<std::string> missing = HttpGet(base + "/nope", absl::Seconds(10));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("HTTP 404"));
  EXPECT_TRUE(HttpGet(base + "/metrics", absl::Seconds(10)).ok());
}

TEST(MetricsHttpServerTest, StopServingReleasesThePort) {
  Metrics metrics("a");
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok());
  metrics.StopServing();
  Metrics again("b");
  EXPECT_TRUE(again.Serve("127.0.0.1:" + std::to_string(*port)).ok());
}

}  // namespace
}  // namespace sluice::runtime
