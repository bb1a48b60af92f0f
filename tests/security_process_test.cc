// `sluice up --tls` as a user runs it: a short run submitted with the
// operator token; the same calls without credentials, in plaintext, against
// the wrong CA, with the read-only token and with an unknown token refused
// with the code that says which; every RPC of every service closed to a
// caller without credentials, health open; a worker cannot speak for another.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/auth.h"
#include "services/runtime/health_client.h"
#include "services/runtime/local_pki.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.pb.h"
#include "sluice/v1/reward_server.pb.h"
#include "sluice/v1/rollout_worker.pb.h"
#include "sluice/v1/trainer.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Time Soon() { return absl::Now() + absl::Seconds(120); }

struct Credentials {
  std::string ca;         // empty = plaintext
  std::string token;      // the token itself; empty = none
  std::string cert, key;  // client certificate; empty = none
};

std::shared_ptr<grpc::Channel> Dial(const std::string& target, const Credentials& credentials) {
  if (credentials.ca.empty()) {
    return grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  }
  using grpc::experimental::FileWatcherCertificateProvider;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider =
      credentials.cert.empty() ? std::make_shared<FileWatcherCertificateProvider>(credentials.ca, 1)
                               : std::make_shared<FileWatcherCertificateProvider>(
                                     credentials.key, credentials.cert, credentials.ca, 1);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!credentials.cert.empty()) options.watch_identity_key_cert_pairs();
  return grpc::CreateChannel(target, grpc::experimental::TlsCredentials(options));
}

void Authorize(grpc::ClientContext& context, const Credentials& credentials) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  if (!credentials.token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", credentials.token));
  }
}

grpc::Status ListRuns(const std::string& target, const Credentials& credentials) {
  auto stub = v1::ControllerService::NewStub(Dial(target, credentials));
  grpc::ClientContext context;
  Authorize(context, credentials);
  v1::ListRunsResponse response;
  return stub->ListRuns(&context, v1::ListRunsRequest(), &response);
}

// Calls `method` with an empty request (one message, then half-close: what
// any of the four kinds of RPC accepts on the wire).
grpc::Status CallEmpty(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const Credentials& credentials) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  Authorize(context, credentials);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);  // An empty message, not a missing one.
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  return done.get_future().get();
}

// What each kind of service serves.
std::vector<std::string> ServicesOf(const std::string& kind) {
  if (kind == "controller") return {"sluice.v1.ControllerService"};
  if (kind == "replay_buffer") return {"sluice.v1.ReplayBufferService"};
  if (kind == "reward_server") return {"sluice.v1.RewardService"};
  if (kind == "trainer") return {"sluice.v1.TrainerService"};
  return {"sluice.v1.RolloutWorkerService", "sluice.v1.WeightRelay"};
}

std::string Kind(const std::string& name) { return name.substr(0, name.find('-')); }

class SecureStackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("tls");
    log_ = dir_ + "/up.log";
    auto process = Subprocess::Start({.argv = {testing::BinDir() + "/sluice", "up", "--tls",
                                               "--state-dir", dir_ + "/state", "--ready-fd=3"},
                                      .log_path = log_,
                                      .ready_pipe = true});
    ASSERT_TRUE(process.ok()) << process.status();
    up_ = std::move(*process);
    absl::StatusOr<std::string> ready = up_->WaitReady(Soon());
    ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(log_);
    endpoints_ = nlohmann::json::parse(testing::ReadFile(*ready));
    tls_ = dir_ + "/state/tls";
    controller_ = endpoints_["services"]["controller"]["grpc"];
  }
  void TearDown() override {
    if (up_ != nullptr) {
      (void)up_->Signal(SIGTERM);
      (void)up_->Wait(Soon());
    }
  }
  std::string Token(const std::string& name) const {
    std::string token = testing::ReadFile(tls_ + "/" + name + ".token");
    while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
    return token;
  }
  Credentials Operator() const { return {tls_ + "/ca.pem", Token("operator"), "", ""}; }
  Credentials Viewer() const { return {tls_ + "/ca.pem", Token("viewer"), "", ""}; }

  std::string dir_, log_, tls_, controller_;
  std::unique_ptr<Subprocess> up_;
  nlohmann::json endpoints_;
};

TEST_F(SecureStackTest, AShortRunSucceedsAndEveryWrongCallerIsRefusedWithTheRightCode) {
  // endpoints.json names the CA and the operator token, 0600.
  ASSERT_TRUE(endpoints_["security"].is_object()) << endpoints_.dump(2);
  EXPECT_EQ(endpoints_["security"]["tls_ca"], tls_ + "/ca.pem");
  EXPECT_EQ(
      std::filesystem::status(tls_ + "/operator.token").permissions() & std::filesystem::perms::all,
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_THAT(testing::ReadFile(tls_ + "/tokens.yaml"), Not(HasSubstr(Token("operator"))));

  // A short run, submitted and watched by the CLI with the operator token.
  const std::string spec = dir_ + "/short.yaml";
  std::ofstream(spec) << R"(name: tls-test
seed: 3
model: {builtin: micro}
task:
  arithmetic: {max_operand: 9, operators: ["+"], num_prompts: 40}
  eval_split_size: 10
warm_start: {sft_steps: 5, learning_rate: 3.0e-3, batch_size: 16}
algorithm: {objective: grpo, group_size: 4, batch_size_groups: 2, max_staleness: 1,
            learning_rate: 1.0e-3, total_steps: 3}
rollout: {sampling: {max_new_tokens: 3}}
)";
  const std::string submit_log = dir_ + "/submit.log";
  auto submit = Subprocess::Start(
      {.argv = {testing::BinDir() + "/sluice", "submit", spec, "--watch", "--target", controller_,
                "--tls-ca", tls_ + "/ca.pem", "--token-file", tls_ + "/operator.token"},
       .log_path = submit_log});
  ASSERT_TRUE(submit.ok()) << submit.status();
  absl::StatusOr<ExitStatus> submitted = (*submit)->Wait(absl::Now() + absl::Minutes(5));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  EXPECT_TRUE(submitted->success()) << testing::ReadFile(submit_log) << "\n"
                                    << testing::ReadFile(dir_ + "/state/logs/controller.log");
  EXPECT_THAT(testing::ReadFile(submit_log), HasSubstr("SUCCEEDED"));

  // The operator reads; so does the viewer.
  EXPECT_TRUE(ListRuns(controller_, Operator()).ok());
  EXPECT_TRUE(ListRuns(controller_, Viewer()).ok());

  // No credentials over TLS: UNAUTHENTICATED, saying what is missing.
  grpc::Status none = ListRuns(controller_, {tls_ + "/ca.pem", "", "", ""});
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED) << none.error_message();
  EXPECT_THAT(none.error_message(), HasSubstr("missing credentials"));
  // An unknown token: UNAUTHENTICATED.
  grpc::Status unknown = ListRuns(controller_, {tls_ + "/ca.pem", "slc_not-a-token", "", ""});
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(unknown.error_message(), HasSubstr("unknown bearer token"));
  // Plaintext against TLS: no connection.
  grpc::Status plaintext = ListRuns(controller_, {"", Token("operator"), "", ""});
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE);
  // A CA that did not sign the server's certificate: the handshake fails.
  ASSERT_TRUE(runtime::WriteLocalPki(dir_ + "/other", {}, absl::Hours(1), "Other CA").ok());
  grpc::Status wrong_ca =
      ListRuns(controller_, {dir_ + "/other/ca.pem", Token("operator"), "", ""});
  EXPECT_EQ(wrong_ca.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(wrong_ca.error_message(), HasSubstr("certificate verify failed"));

  // The viewer may not submit or cancel: PERMISSION_DENIED naming the role.
  {
    auto stub = v1::ControllerService::NewStub(Dial(controller_, Viewer()));
    grpc::ClientContext context;
    Authorize(context, Viewer());
    v1::CancelRunRequest request;
    request.set_run_id("any");
    v1::CancelRunResponse response;
    grpc::Status cancel = stub->CancelRun(&context, request, &response);
    EXPECT_EQ(cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(cancel.error_message(), HasSubstr("needs role operator"));
  }
  grpc::Status viewer_submit =
      CallEmpty(Dial(controller_, Viewer()), "/sluice.v1.ControllerService/SubmitRun", Viewer());
  EXPECT_EQ(viewer_submit.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // The CLI says which, and exits non-zero.
  const std::string cli_log = dir_ + "/cli.log";
  auto cancel = Subprocess::Start(
      {.argv = {testing::BinDir() + "/sluice", "runs", "cancel", "any", "--target", controller_,
                "--tls-ca", tls_ + "/ca.pem", "--token-file", tls_ + "/viewer.token"},
       .log_path = cli_log});
  ASSERT_TRUE(cancel.ok());
  absl::StatusOr<ExitStatus> cancelled = (*cancel)->Wait(Soon());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_FALSE(cancelled->success());
  EXPECT_THAT(testing::ReadFile(cli_log), HasSubstr("may not call"));
}

TEST_F(SecureStackTest, EveryRpcNeedsCredentialsAndHealthDoesNot) {
  // Links each service's descriptors into the generated pool.
  (void)v1::GetStatsRequest::descriptor();
  (void)v1::ScoreBatchRequest::descriptor();
  (void)v1::StartRolloutsRequest::descriptor();
  (void)v1::StartTrainingRequest::descriptor();
  const Credentials anonymous{tls_ + "/ca.pem", "", "", ""};
  int methods = 0;
  for (const auto& [name, service] : endpoints_["services"].items()) {
    const std::string target = service["grpc"];
    const std::shared_ptr<grpc::Channel> channel = Dial(target, anonymous);
    // Health stays open to probes, over TLS without credentials.
    grpc::health::v1::HealthCheckRequest request;
    auto health = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    Authorize(context, anonymous);
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status checked = health->Check(&context, request, &response);
    EXPECT_TRUE(checked.ok()) << name << ": " << checked.error_message();
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING) << name;

    for (const std::string& full_name : ServicesOf(Kind(name))) {
      const google::protobuf::ServiceDescriptor* descriptor =
          google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(full_name);
      ASSERT_NE(descriptor, nullptr) << full_name;
      for (int i = 0; i < descriptor->method_count(); ++i) {
        const std::string method = absl::StrCat("/", full_name, "/", descriptor->method(i)->name());
        grpc::Status status = CallEmpty(channel, method, anonymous);
        EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
            << name << " " << method << ": " << status.error_message();
        ++methods;
      }
    }
  }
  EXPECT_EQ(methods, 33);  // Every RPC of the five services (relay included).
}

TEST_F(SecureStackTest, AWorkerCannotSpeakForAnother) {
  // rollout_worker-0's own certificate (worker:worker-0) claiming worker-9.
  const Credentials worker0{tls_ + "/ca.pem", "", tls_ + "/rollout_worker-0.pem",
                            tls_ + "/rollout_worker-0.key"};
  auto stub = v1::ControllerService::NewStub(Dial(controller_, worker0));
  grpc::ClientContext context;
  Authorize(context, worker0);
  v1::WorkerHeartbeatRequest request;
  request.set_worker_id("worker-9");
  request.set_incarnation(1);
  v1::WorkerHeartbeatResponse response;
  grpc::Status status = stub->WorkerHeartbeat(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("names worker 'worker-9' but the caller is "
                                                "worker 'worker-0'"));
  // And a worker may not submit runs.
  grpc::Status submit =
      CallEmpty(Dial(controller_, worker0), "/sluice.v1.ControllerService/SubmitRun", worker0);
  EXPECT_EQ(submit.error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

}  // namespace
}  // namespace sluice
