#include "cli/stack_layout.h"

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::cli {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

ServiceEndpoint Service(const std::string& name, const std::string& kind,
                        const std::string& grpc = "", const std::string& worker_id = "") {
  ServiceEndpoint endpoint;
  endpoint.name = name;
  endpoint.kind = kind;
  endpoint.grpc = grpc;
  endpoint.worker_id = worker_id;
  return endpoint;
}

// A stack whose singletons have started and whose two workers have not.
std::vector<ServiceEndpoint> Stack() {
  return {Service("reward_server", "reward_server", "127.0.0.1:1001"),
          Service("replay_buffer", "replay_buffer", "127.0.0.1:1002"),
          Service("trainer", "trainer", "127.0.0.1:1003"),
          Service("controller", "controller", "127.0.0.1:1004"),
          Service("rollout_worker-0", "rollout_worker", "", "worker-0"),
          Service("rollout_worker-1", "rollout_worker", "", "worker-1")};
}

LocalStackOptions Options() {
  LocalStackOptions options;
  options.bin_dir = "/opt/sluice/bin";
  options.state_dir = "/srv/stack/state";
  options.rollout_workers = 2;
  options.torch_threads = 2;
  return options;
}

TEST(StackLayoutTest, DirectoriesAreAbsoluteAndTheStateAndRunsDirectoriesAreAllowedRoots) {
  LocalStackOptions options = Options();
  const StackLayout layout(options);
  EXPECT_EQ(layout.runs_dir(), "/srv/stack/runs");
  EXPECT_EQ(layout.buffer_data_dir(), "/srv/stack/state/replay_buffer");
  EXPECT_EQ(layout.endpoints_path(), "/srv/stack/state/endpoints.json");
  EXPECT_EQ(layout.log_path("trainer"), "/srv/stack/state/logs/trainer.log");
  EXPECT_EQ(layout.tls_dir(), "/srv/stack/state/tls");
  EXPECT_THAT(layout.allowed_path_roots(),
              ElementsAre(std::filesystem::current_path().lexically_normal().string(),
                          "/srv/stack/state", "/srv/stack/runs"));

  options.allowed_path_roots = {"/srv"};
  options.buffer_data_dir = "none";
  EXPECT_THAT(layout.allowed_path_roots(), ElementsAre("/srv"));  // It holds both.
  EXPECT_EQ(layout.buffer_data_dir(), "");
  options.allowed_path_roots = {"/"};
  EXPECT_THAT(layout.allowed_path_roots(), ElementsAre("/"));
}

TEST(StackLayoutTest, MemoryBudgetsAreTheSharesOfTheServicesThatHoldARunsMemory) {
  LocalStackOptions options = Options();
  const StackLayout layout(options);
  EXPECT_EQ(layout.MemoryBudgetFlag("trainer"), "--memory-budget=40%");
  EXPECT_EQ(layout.MemoryBudgetFlag("rollout_worker"), "--memory-budget=20%");
  EXPECT_EQ(layout.MemoryBudgetFlag("replay_buffer"), "--memory-budget=15%");
  EXPECT_EQ(layout.MemoryBudgetFlag("controller"), "");
  EXPECT_EQ(layout.MemoryBudgetFlag("reward_server"), "");
  options.rollout_workers = 0;
  EXPECT_EQ(layout.MemoryBudgetFlag("rollout_worker"), "");
}

TEST(StackLayoutTest, TheControllerIsToldWhereTheOthersAreAndWhichWorkersAreTheStacksOwn) {
  const LocalStackOptions options = Options();
  const StackLayout layout(options);
  const std::vector<ServiceEndpoint> stack = Stack();
  const std::vector<std::string> flags = layout.FlagsFor(stack[3], stack);
  EXPECT_THAT(flags, Contains("--runs-dir=/srv/stack/runs"));
  EXPECT_THAT(flags, Contains("--trusted-worker-ids=worker-0,worker-1"));
  EXPECT_THAT(flags, Contains("--trainer-address=127.0.0.1:1003"));
  EXPECT_THAT(flags, Contains("--replay-buffer-address=127.0.0.1:1002"));
  EXPECT_THAT(flags, Contains("--reward-server-address=127.0.0.1:1001"));
  EXPECT_THAT(flags, Contains("--allowed-path-roots=/srv/stack/state"));
  EXPECT_THAT(flags, Not(Contains(HasSubstr("--torch-threads"))));
  EXPECT_THAT(flags, Not(Contains(HasSubstr("--memory-budget"))));
}

TEST(StackLayoutTest, EachKindGetsItsOwnFlags) {
  LocalStackOptions options = Options();
  const StackLayout layout(options);
  const std::vector<ServiceEndpoint> stack = Stack();
  EXPECT_THAT(
      layout.FlagsFor(stack[4], stack),
      ElementsAre(
          "--torch-threads=2", "--memory-budget=20%",
          "--allowed-path-roots=" + std::filesystem::current_path().lexically_normal().string(),
          "--allowed-path-roots=/srv/stack/state", "--allowed-path-roots=/srv/stack/runs",
          "--controller-address=127.0.0.1:1004", "--worker-id=worker-0"));
  EXPECT_THAT(layout.FlagsFor(stack[1], stack),
              ElementsAre("--memory-budget=15%", "--data-dir=/srv/stack/state/replay_buffer"));
  EXPECT_THAT(layout.FlagsFor(stack[0], stack), IsEmpty());
  const std::vector<std::string> trainer = layout.FlagsFor(stack[2], stack);
  EXPECT_THAT(trainer, Contains("--torch-threads=2"));
  EXPECT_THAT(trainer, Contains("--memory-budget=40%"));
  options.buffer_data_dir = "";
  EXPECT_THAT(layout.FlagsFor(stack[1], stack), ElementsAre("--memory-budget=15%"));
}

TEST(StackLayoutTest, TheCommandLineStartsWithTheBinaryAndTheCommonFlagsAndEndsWithTls) {
  const LocalStackOptions options = Options();
  const StackLayout layout(options);
  const std::vector<ServiceEndpoint> stack = Stack();
  const std::vector<std::string> plain = layout.Argv(stack[0], "0", 3, stack, std::nullopt);
  EXPECT_THAT(plain,
              ElementsAre("/opt/sluice/bin/sluice-reward-server", "--listen-address=127.0.0.1:0",
                          "--metrics-port=0", "--ready-fd=3", "--log-format=text"));

  StackSecurity security;
  security.dir = "/srv/stack/state/tls";
  security.ca_cert = "/srv/stack/state/tls/ca.pem";
  security.tokens_file = "/srv/stack/state/tls/tokens.yaml";
  const std::vector<std::string> secure = layout.Argv(stack[2], "1003", 3, stack, security);
  EXPECT_EQ(secure[1], "--listen-address=127.0.0.1:1003");
  EXPECT_THAT(std::vector<std::string>(secure.end() - 4, secure.end()),
              ElementsAre("--tls-cert=/srv/stack/state/tls/trainer.pem",
                          "--tls-key=/srv/stack/state/tls/trainer.key",
                          "--tls-ca=/srv/stack/state/tls/ca.pem",
                          "--auth-tokens=/srv/stack/state/tls/tokens.yaml"));
}

}  // namespace
}  // namespace sluice::cli
