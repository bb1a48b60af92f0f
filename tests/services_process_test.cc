// Starts every service binary as a separate process and checks what an
// operator relies on: --help/--version, health, reflection, /metrics, clear
// errors for bad flags, bad configs and taken ports, and a clean SIGTERM.
#include <signal.h>

#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/client_context.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/health_client.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

struct ServiceCase {
  std::string binary;
  std::string grpc_service;
};

void PrintTo(const ServiceCase& c, std::ostream* os) { *os << c.binary; }

absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

struct Started {
  std::unique_ptr<Subprocess> process;
  std::string grpc;
  std::string metrics;
  std::string log_path;
};

Started StartService(const std::string& binary, const std::string& dir,
                     std::vector<std::string> extra = {},
                     const std::string& listen = "127.0.0.1:0") {
  Started started;
  started.log_path = dir + "/" + binary + ".log";
  SubprocessOptions options;
  options.argv = {testing::BinDir() + "/" + binary, "--listen=" + listen, "--metrics-port=0",
                  "--ready-fd=3"};
  for (auto& arg : extra) options.argv.push_back(std::move(arg));
  options.log_path = started.log_path;
  options.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return started;
  started.process = std::move(*process);
  absl::StatusOr<std::string> ready = started.process->WaitReady(Soon());
  EXPECT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(started.log_path);
  if (!ready.ok()) return started;
  const nlohmann::json info = nlohmann::json::parse(*ready);
  started.grpc = info["grpc"];
  started.metrics = info["metrics"];
  return started;
}

// Runs a binary to completion, returning its exit status and output.
std::pair<ExitStatus, std::string> RunToExit(std::vector<std::string> argv,
                                             const std::string& dir) {
  const std::string log = dir + "/run.log";
  std::ofstream(log, std::ios::trunc);
  auto process = Subprocess::Start({.argv = std::move(argv), .log_path = log});
  EXPECT_TRUE(process.ok()) << process.status();
  absl::StatusOr<ExitStatus> exit = (*process)->Wait(Soon());
  EXPECT_TRUE(exit.ok());
  return {*exit, testing::ReadFile(log)};
}

// Lists services through gRPC server reflection (what grpcurl does), with
// hand-encoded protos: ServerReflectionRequest{list_services: "*"}.
std::string ListServicesByReflection(const std::string& target) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::internal::RpcMethod method(
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), method, &context));
  const std::string request("\x3a\x01*", 3);  // field 7 (list_services), "*".
  grpc::Slice slice(request);
  grpc::ByteBuffer buffer(&slice, 1);
  if (!stream->Write(buffer)) return "";
  stream->WritesDone();
  grpc::ByteBuffer response;
  std::string text;
  while (stream->Read(&response)) {
    grpc::Slice all;
    if (response.DumpToSingleSlice(&all).ok()) {
      text.append(reinterpret_cast<const char*>(all.begin()), all.size());
    }
  }
  stream->Finish().ok();
  return text;
}

class ServiceProcessTest : public ::testing::TestWithParam<ServiceCase> {};

TEST_P(ServiceProcessTest, ServesHealthReflectionAndMetricsThenStopsOnSigterm) {
  const std::string dir = testing::MakeTempDir(GetParam().binary);
  Started service = StartService(GetParam().binary, dir);
  ASSERT_NE(service.process, nullptr);

  absl::StatusOr<std::string> overall = runtime::CheckHealth(service.grpc, "", absl::Seconds(20));
  ASSERT_TRUE(overall.ok()) << overall.status();
  EXPECT_EQ(*overall, "SERVING");
  absl::StatusOr<std::string> named =
      runtime::CheckHealth(service.grpc, GetParam().grpc_service, absl::Seconds(20));
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(*named, "SERVING");

  const std::string services = ListServicesByReflection(service.grpc);
  EXPECT_THAT(services, HasSubstr(GetParam().grpc_service));
  EXPECT_THAT(services, HasSubstr("grpc.health.v1.Health"));

  absl::StatusOr<std::string> metrics = runtime::HttpGet(service.metrics, absl::Seconds(20));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("sluice_build_info{component="));
  // The health checks above were counted, per method and status code.
  EXPECT_THAT(*metrics, HasSubstr("grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Check\","
                                  "grpc_service=\"grpc.health.v1.Health\",grpc_type=\"unary\"} 2"));
  EXPECT_THAT(*metrics, HasSubstr("grpc_server_handling_seconds_bucket{grpc_code=\"OK\","
                                  "grpc_method=\"Check\""));

  ASSERT_TRUE(service.process->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> exit = service.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_TRUE(exit->success()) << exit->ToString() << "\n" << testing::ReadFile(service.log_path);
  const std::string log = testing::ReadFile(service.log_path);
  EXPECT_THAT(log, HasSubstr("shutting down"));
  EXPECT_THAT(log, HasSubstr("stopped"));
  // Every process says which BLAS it got at start-up.
  EXPECT_THAT(log, HasSubstr("blas="));
  // On loopback, no warning about open RPCs.
  EXPECT_THAT(log, ::testing::Not(HasSubstr("every interface")));
}

// Nothing authenticates a call yet: a service on every interface says so at
// start (issue: TLS and tokens).
TEST_P(ServiceProcessTest, AWildcardListenAddressWarnsThatEveryRpcIsOpen) {
  const std::string dir = testing::MakeTempDir(GetParam().binary);
  Started service = StartService(GetParam().binary, dir, {}, "0.0.0.0:0");
  ASSERT_NE(service.process, nullptr);
  // Clients are told to dial loopback.
  EXPECT_THAT(service.grpc, ::testing::StartsWith("127.0.0.1:"));
  absl::StatusOr<std::string> overall = runtime::CheckHealth(service.grpc, "", absl::Seconds(20));
  ASSERT_TRUE(overall.ok()) << overall.status();
  ASSERT_TRUE(service.process->Signal(SIGTERM).ok());
  ASSERT_TRUE(service.process->Wait(Soon()).ok());
  const std::string log = testing::ReadFile(service.log_path);
  EXPECT_THAT(log, HasSubstr("listening on every interface in plaintext and without "
                             "authentication"));
  EXPECT_THAT(log, HasSubstr("0.0.0.0:0"));
}

TEST_P(ServiceProcessTest, HelpAndVersionExitZero) {
  const std::string dir = testing::MakeTempDir("help");
  auto [help, help_text] = RunToExit({testing::BinDir() + "/" + GetParam().binary, "--help"}, dir);
  EXPECT_TRUE(help.success());
  EXPECT_THAT(help_text, HasSubstr("--listen"));
  EXPECT_THAT(help_text, HasSubstr("--metrics-port"));
  auto [version, version_text] =
      RunToExit({testing::BinDir() + "/" + GetParam().binary, "--version"}, dir);
  EXPECT_TRUE(version.success());
  EXPECT_THAT(version_text, HasSubstr(GetParam().binary + " 0."));
}

TEST_P(ServiceProcessTest, BadFlagValueExitsTwoNamingTheField) {
  const std::string dir = testing::MakeTempDir("bad");
  auto [exit, text] = RunToExit(
      {testing::BinDir() + "/" + GetParam().binary, "--listen=nowhere", "--metrics-port=-1"}, dir);
  EXPECT_EQ(exit.code, 2) << exit.ToString();
  EXPECT_THAT(text, HasSubstr("listen_address must be host:port"));
  EXPECT_THAT(text, HasSubstr("'nowhere'"));
}

INSTANTIATE_TEST_SUITE_P(
    AllServices, ServiceProcessTest,
    ::testing::Values(ServiceCase{"sluice-controller", "sluice.v1.ControllerService"},
                      ServiceCase{"sluice-rollout-worker", "sluice.v1.RolloutWorkerService"},
                      ServiceCase{"sluice-reward-server", "sluice.v1.RewardService"},
                      ServiceCase{"sluice-replay-buffer", "sluice.v1.ReplayBufferService"},
                      ServiceCase{"sluice-trainer", "sluice.v1.TrainerService"}),
    [](const ::testing::TestParamInfo<ServiceCase>& info) {
      std::string name = info.param.binary.substr(7);
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return name;
    });

// --memory-budget on the services that hold a run's memory: the same flag,
// checked the same way, and a config file's memory_budget key is the flag.
class MemoryBudgetFlagTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MemoryBudgetFlagTest, ABadValueExitsTwoNamingTheFlag) {
  const std::string dir = testing::MakeTempDir("budget");
  for (const std::string value : {"lots", "0", "120%", "-4GiB"}) {
    auto [exit, text] = RunToExit(
        {testing::BinDir() + "/" + GetParam(), "--memory-budget=" + value}, dir);
    EXPECT_EQ(exit.code, 2) << value << ": " << exit.ToString();
    EXPECT_THAT(text, HasSubstr("--memory-budget")) << value;
    EXPECT_THAT(text, HasSubstr("'" + value + "'")) << value;
  }
}

TEST_P(MemoryBudgetFlagTest, TheConfigFilesBudgetIsExportedOnMetrics) {
  const std::string dir = testing::MakeTempDir("budget");
  std::ofstream(dir + "/c.yaml") << "memory_budget: 3GiB\n";
  Started service = StartService(GetParam(), dir, {"--config=" + dir + "/c.yaml"});
  ASSERT_NE(service.process, nullptr);
  absl::StatusOr<std::string> metrics = runtime::HttpGet(service.metrics, absl::Seconds(20));
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  const size_t at = metrics->find("\nsluice_memory_budget_bytes ");
  ASSERT_NE(at, std::string::npos) << *metrics;
  const std::string line = metrics->substr(at + 1, metrics->find('\n', at + 1) - at - 1);
  EXPECT_EQ(std::stod(line.substr(line.rfind(' ') + 1)), 3.0 * (1 << 30)) << line;
  service.process->Stop(absl::Seconds(30));
}

INSTANTIATE_TEST_SUITE_P(BudgetedServices, MemoryBudgetFlagTest,
                         ::testing::Values("sluice-trainer", "sluice-rollout-worker",
                                           "sluice-replay-buffer"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param.substr(7);
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST(ServiceProcessErrorsTest, UnknownFlagExitsTwo) {
  const std::string dir = testing::MakeTempDir("x");
  auto [exit, text] =
      RunToExit({testing::BinDir() + "/sluice-replay-buffer", "--no-such-flag"}, dir);
  EXPECT_EQ(exit.code, 2);
  EXPECT_THAT(text, HasSubstr("--no-such-flag"));
}

TEST(ServiceProcessErrorsTest, UnreadableConfigExitsTwoNamingTheFile) {
  const std::string dir = testing::MakeTempDir("x");
  auto [exit, text] = RunToExit(
      {testing::BinDir() + "/sluice-reward-server", "--config", dir + "/missing.yaml"}, dir);
  EXPECT_EQ(exit.code, 2);
  EXPECT_THAT(text, HasSubstr("cannot read config file"));
  EXPECT_THAT(text, HasSubstr("missing.yaml"));
}

TEST(ServiceProcessErrorsTest, ConfigWithUnknownKeyExitsTwo) {
  const std::string dir = testing::MakeTempDir("x");
  std::ofstream(dir + "/c.yaml") << "listen_adress: 127.0.0.1:0\n";
  auto [exit, text] =
      RunToExit({testing::BinDir() + "/sluice-trainer", "--config", dir + "/c.yaml"}, dir);
  EXPECT_EQ(exit.code, 2);
  EXPECT_THAT(text, HasSubstr("unknown key 'listen_adress'"));
}

TEST(ServiceProcessErrorsTest, ConfigFileIsAppliedAndFlagsOverrideIt) {
  const std::string dir = testing::MakeTempDir("x");
  std::ofstream(dir + "/c.yaml") << "listen_address: 127.0.0.1:1\nlog_format: json\n";
  // The file's port 1 would fail (privileged or taken); the flag wins.
  Started service =
      StartService("sluice-controller", dir, {"--config=" + dir + "/c.yaml"});
  ASSERT_NE(service.process, nullptr);
  EXPECT_EQ(*runtime::CheckHealth(service.grpc, "", absl::Seconds(20)), "SERVING");
  service.process->Stop(absl::Seconds(30));
  // log_format came from the file: records are JSON lines.
  EXPECT_THAT(testing::ReadFile(service.log_path), HasSubstr("\"msg\":\"serving\""));
}

TEST(ServiceProcessErrorsTest, GrpcPortInUseExitsOneWithAClearError) {
  const std::string dir = testing::MakeTempDir("x");
  Started first = StartService("sluice-replay-buffer", dir);
  ASSERT_NE(first.process, nullptr);
  auto [exit, text] = RunToExit({testing::BinDir() + "/sluice-replay-buffer",
                                 "--listen=" + first.grpc, "--metrics-port=0"},
                                dir);
  EXPECT_EQ(exit.code, 1) << exit.ToString();
  EXPECT_THAT(text, HasSubstr("cannot listen on " + first.grpc));
}

TEST(ServiceProcessErrorsTest, MetricsPortInUseExitsOneWithAClearError) {
  const std::string dir = testing::MakeTempDir("x");
  Started first = StartService("sluice-trainer", dir);
  ASSERT_NE(first.process, nullptr);
  const std::string port = first.metrics.substr(first.metrics.rfind(':') + 1);
  auto [exit, text] =
      RunToExit({testing::BinDir() + "/sluice-trainer", "--listen=127.0.0.1:0",
                 "--metrics-port=" + port.substr(0, port.find('/'))},
                dir);
  EXPECT_EQ(exit.code, 1) << exit.ToString();
  EXPECT_THAT(text, HasSubstr("cannot serve /metrics"));
}

TEST(ServiceProcessErrorsTest, ABadRequestGetsAClearErrorNotACrash) {
  const std::string dir = testing::MakeTempDir("x");
  Started service = StartService("sluice-replay-buffer", dir);
  ASSERT_NE(service.process, nullptr);
  auto channel = grpc::CreateChannel(service.grpc, grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stub = v1::ReplayBufferService::NewStub(channel);
  v1::ConfigureRunRequest request;
  request.set_run_id("r");
  request.set_batch_size_groups(-4);
  request.set_group_size(2);
  request.mutable_config()->set_sampler(static_cast<v1::SamplerKind>(77));
  v1::ConfigureRunResponse response;
  const grpc::Status status = stub->ConfigureRun(&context, request, &response);
  // Negative size, unknown sampler: the answer names both fields, and the
  // process keeps serving.
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("batch_size_groups: must be > 0, got -4"),
            std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("buffer.sampler: unknown sampler kind 77"),
            std::string::npos)
      << status.error_message();
  EXPECT_EQ(*runtime::CheckHealth(service.grpc, "", absl::Seconds(20)), "SERVING");
}

}  // namespace
}  // namespace sluice
