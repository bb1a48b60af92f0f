// What one call can make a service spend, measured from outside the process
// (VmRSS and VmHWM in /proc) against the real binaries over TLS with tokens.
//
// The attack: a request made of millions of empty repeated submessages ("0a
// 00" repeated: 2 bytes each on the wire, 100-300 bytes each once parsed).
// Sent without credentials it once cost the reward server ~470 MB before it
// answered UNAUTHENTICATED (kept afterwards); a RunSpec of empty
// `reward.verifiers` did the same to the controller, the trainer and the
// rollout worker. Now:
//   - an unauthenticated caller is refused before its message is read: the
//     service's memory does not move (kUnauthenticatedBound);
//   - an authenticated caller's request is bounded on the wire before it is
//     parsed (too many items, or larger than its method takes): the service
//     spends at most the method's documented worst case (docs/security.md:
//     the wire bytes plus their bounded parse, MethodWorstCase), and resident
//     memory returns to where it was.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/auth.h"
#include "services/runtime/bounded_methods.h"
#include "services/runtime/local_pki.h"
#include "services/runtime/server_options.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/reward_server.grpc.pb.h"
#include "sluice/v1/rollout_worker.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// The hostile requests: ~3 MiB of empty items, under every method's size
// limit so that it is the item count that refuses them.
constexpr int kEmptyItems = 1500000;
// The hostile requests' size on the wire.
constexpr int64_t kHostileBytes = 2 * int64_t{kEmptyItems};
// What a refused-before-reading call may move a service's memory by: the
// bytes gRPC's transport takes in before the call is refused (at most the
// message), twice, and allocator slack; not a parse of the message (before
// it was refused unread, 1.5 million empty items cost ~300 MB).
constexpr int64_t kUnauthenticatedBound = 2 * kHostileBytes + (8 << 20);
// gRPC's transport buffers and allocator slack beside a call's own cost.
constexpr int64_t kSlackBytes = 8 << 20;

struct Memory {
  int64_t rss_bytes = 0;
  int64_t hwm_bytes = 0;
};

Memory ReadMemory(pid_t pid) {
  Memory memory;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int64_t kib = 0;
    const auto value = [&](const std::string& key) {
      if (!absl::StartsWith(line, key)) return false;
      std::string number = line.substr(key.size());
      number = number.substr(0, number.find("kB"));
      return absl::SimpleAtoi(absl::StripAsciiWhitespace(number), &kib);
    };
    if (value("VmRSS:")) memory.rss_bytes = kib << 10;
    if (value("VmHWM:")) memory.hwm_bytes = kib << 10;
  }
  return memory;
}

// The documented worst case of one call to `method` under the default
// message limit: its wire bytes, their bounded parse (bounded_methods.h).
int64_t MethodWorstCase(const std::string& method) {
  const runtime::MessageBounds bounds =
      runtime::BoundsForMethod(method, runtime::ServerOptions::kDefaultMaxMessageSizeBytes);
  return bounds.max_bytes + bounds.max_parsed_bytes;
}

class MemoryBeforeAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("memory-before-auth");
    absl::StatusOr<runtime::PkiFiles> pki =
        runtime::WriteLocalPki(dir_ + "/tls", {{"server", "controller:server"}});
    ASSERT_TRUE(pki.ok()) << pki.status();
    ca_ = testing::ReadFile(pki->ca_cert);
    std::string yaml = "tokens:\n";
    for (const auto& [role, token] : std::vector<std::pair<runtime::Role, std::string>>{
             {runtime::Role::kOperator, kOperator},
             {runtime::Role::kWorker, kWorker},
             {runtime::Role::kController, kController}}) {
      yaml += runtime::TokenEntryYaml(
          {runtime::TokenHash(token), role, std::string(runtime::RoleName(role))});
    }
    const std::string tokens = dir_ + "/tokens.yaml";
    std::ofstream(tokens) << yaml;
    std::filesystem::permissions(
        tokens, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }

  void Start(const std::string& binary) {
    log_path_ = dir_ + "/" + binary + ".log";
    SubprocessOptions options;
    options.argv = {testing::BinDir() + "/" + binary,
                    "--listen=127.0.0.1:0",
                    "--metrics-port=0",
                    "--ready-fd=3",
                    "--tls-cert=" + dir_ + "/tls/server.pem",
                    "--tls-key=" + dir_ + "/tls/server.key",
                    "--tls-ca=" + dir_ + "/tls/ca.pem",
                    "--auth-tokens=" + dir_ + "/tokens.yaml"};
    options.log_path = log_path_;
    options.ready_pipe = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    process_ = std::move(*process);
    absl::StatusOr<std::string> ready = process_->WaitReady(absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(log_path_);
    const std::string address = nlohmann::json::parse(*ready)["grpc"];
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = ca_;
    grpc::ChannelArguments arguments;
    arguments.SetMaxSendMessageSize(64 << 20);
    arguments.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address, grpc::SslCredentials(tls), arguments);
    // What any first caller costs (the TLS session, gRPC's threads and
    // buffers) is paid before anything is measured: a health check, which
    // needs no credentials.
    auto health = grpc::health::v1::Health::NewStub(channel_);
    for (int i = 0; i < 3; ++i) {
      grpc::ClientContext context;
      Prepare(context, "");
      grpc::health::v1::HealthCheckResponse response;
      ASSERT_TRUE(health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok());
    }
  }

  void TearDown() override {
    if (process_ != nullptr) process_->Stop(absl::Seconds(30));
  }

  static void Prepare(grpc::ClientContext& context, const std::string& token) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  }

  // Runs `call` twice (so that what one call keeps would show as growth) and
  // checks its status each time and the service's memory: the peak and what
  // stays resident grew by less than `bound`.
  void ExpectBounded(const std::string& what, int64_t bound,
                     const std::function<grpc::Status()>& call, grpc::StatusCode code,
                     const std::string& says) {
    const Memory before = ReadMemory(process_->pid());
    for (int round = 0; round < 2; ++round) {
      const grpc::Status status = call();
      EXPECT_EQ(status.error_code(), code) << what << ": " << status.error_message();
      EXPECT_THAT(status.error_message(), HasSubstr(says)) << what;
    }
    const Memory after = ReadMemory(process_->pid());
    const int64_t rss_growth = after.rss_bytes - before.rss_bytes;
    const int64_t peak_growth = after.hwm_bytes - before.hwm_bytes;
    std::printf(
        "%s: VmRSS %lld -> %lld KiB (%+lld), VmHWM %lld -> %lld KiB (%+lld); "
        "bound %lld KiB\n",
        what.c_str(), static_cast<long long>(before.rss_bytes >> 10),
        static_cast<long long>(after.rss_bytes >> 10), static_cast<long long>(rss_growth >> 10),
        static_cast<long long>(before.hwm_bytes >> 10),
        static_cast<long long>(after.hwm_bytes >> 10), static_cast<long long>(peak_growth >> 10),
        static_cast<long long>(bound >> 10));
    RecordProperty(what + "_rss_growth_kib", static_cast<int>(rss_growth >> 10));
    RecordProperty(what + "_hwm_growth_kib", static_cast<int>(peak_growth >> 10));
    EXPECT_LT(rss_growth, bound) << what;
    EXPECT_LT(peak_growth, bound) << what;
  }

  // The service answers a normal call with the right token afterwards.
  void ExpectStillAnswers(const std::function<grpc::Status()>& normal) {
    const grpc::Status status = normal();
    EXPECT_TRUE(status.ok()) << status.error_message() << "\n" << testing::ReadFile(log_path_);
  }

  static v1::RunSpec SpecOfEmptyVerifiers() {
    v1::RunSpec spec;
    spec.set_name("hostile");
    for (int i = 0; i < kEmptyItems; ++i) spec.mutable_reward()->add_verifiers();
    return spec;
  }

  const std::string kOperator = "slc_operator-token-for-the-test";
  const std::string kWorker = "slc_worker-token-for-the-test";
  const std::string kController = "slc_controller-token-for-the-test";
  std::string dir_;
  std::string ca_;
  std::string log_path_;
  std::unique_ptr<Subprocess> process_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(MemoryBeforeAuthTest, RewardServer) {
  ASSERT_NO_FATAL_FAILURE(Start("sluice-reward-server"));
  auto stub = v1::RewardService::NewStub(channel_);
  v1::ScoreBatchRequest request;
  for (int i = 0; i < kEmptyItems; ++i) request.add_items();
  const auto score = [&](const std::string& token) {
    grpc::ClientContext context;
    Prepare(context, token);
    v1::ScoreBatchResponse response;
    return stub->ScoreBatch(&context, request, &response);
  };
  ExpectBounded(
      "anonymous", kUnauthenticatedBound, [&] { return score(""); },
      grpc::StatusCode::UNAUTHENTICATED, "");
  ExpectBounded(
      "worker", MethodWorstCase("/sluice.v1.RewardService/ScoreBatch") + kSlackBytes,
      [&] { return score(kWorker); }, grpc::StatusCode::INVALID_ARGUMENT,
      "items: 1500000 items, at most 4096 per request (--max-batch-items)");
  ExpectStillAnswers([&] {
    grpc::ClientContext context;
    Prepare(context, kWorker);
    v1::ListVerifiersResponse response;
    return stub->ListVerifiers(&context, v1::ListVerifiersRequest(), &response);
  });
}

TEST_F(MemoryBeforeAuthTest, Controller) {
  ASSERT_NO_FATAL_FAILURE(Start("sluice-controller"));
  auto stub = v1::ControllerService::NewStub(channel_);
  v1::SubmitRunRequest request;
  *request.mutable_spec() = SpecOfEmptyVerifiers();
  const auto submit = [&](const std::string& token) {
    grpc::ClientContext context;
    Prepare(context, token);
    v1::SubmitRunResponse response;
    return stub->SubmitRun(&context, request, &response);
  };
  ExpectBounded(
      "anonymous", kUnauthenticatedBound, [&] { return submit(""); },
      grpc::StatusCode::UNAUTHENTICATED, "");
  ExpectBounded(
      "operator", MethodWorstCase("/sluice.v1.ControllerService/SubmitRun") + kSlackBytes,
      [&] { return submit(kOperator); }, grpc::StatusCode::INVALID_ARGUMENT,
      "spec.reward.verifiers: 1500000 items, at most 4096 per request");
  ExpectStillAnswers([&] {
    grpc::ClientContext context;
    Prepare(context, kOperator);
    v1::ListRunsResponse response;
    return stub->ListRuns(&context, v1::ListRunsRequest(), &response);
  });
}

TEST_F(MemoryBeforeAuthTest, Trainer) {
  ASSERT_NO_FATAL_FAILURE(Start("sluice-trainer"));
  auto stub = v1::TrainerService::NewStub(channel_);
  v1::StartTrainingRequest request;
  request.set_run_id("r");
  *request.mutable_spec() = SpecOfEmptyVerifiers();
  const auto start = [&](const std::string& token) {
    grpc::ClientContext context;
    Prepare(context, token);
    v1::StartTrainingResponse response;
    return stub->StartTraining(&context, request, &response);
  };
  ExpectBounded(
      "anonymous", kUnauthenticatedBound, [&] { return start(""); },
      grpc::StatusCode::UNAUTHENTICATED, "");
  ExpectBounded(
      "controller", MethodWorstCase("/sluice.v1.TrainerService/StartTraining") + kSlackBytes,
      [&] { return start(kController); }, grpc::StatusCode::INVALID_ARGUMENT,
      "spec.reward.verifiers: 1500000 items, at most 4096 per request");
  ExpectStillAnswers([&] {
    grpc::ClientContext context;
    Prepare(context, kOperator);
    v1::GetTrainerStatusResponse response;
    return stub->GetTrainerStatus(&context, v1::GetTrainerStatusRequest(), &response);
  });
}

TEST_F(MemoryBeforeAuthTest, RolloutWorker) {
  ASSERT_NO_FATAL_FAILURE(Start("sluice-rollout-worker"));
  auto stub = v1::RolloutWorkerService::NewStub(channel_);
  v1::StartRolloutsRequest request;
  request.set_run_id("r");
  *request.mutable_spec() = SpecOfEmptyVerifiers();
  const auto start = [&](const std::string& token) {
    grpc::ClientContext context;
    Prepare(context, token);
    v1::StartRolloutsResponse response;
    return stub->StartRollouts(&context, request, &response);
  };
  ExpectBounded(
      "anonymous", kUnauthenticatedBound, [&] { return start(""); },
      grpc::StatusCode::UNAUTHENTICATED, "");
  ExpectBounded(
      "operator", MethodWorstCase("/sluice.v1.RolloutWorkerService/StartRollouts") + kSlackBytes,
      [&] { return start(kOperator); }, grpc::StatusCode::INVALID_ARGUMENT,
      "spec.reward.verifiers: 1500000 items, at most 4096 per request");
  ExpectStillAnswers([&] {
    grpc::ClientContext context;
    Prepare(context, kOperator);
    v1::GetWorkerStatusResponse response;
    return stub->GetWorkerStatus(&context, v1::GetWorkerStatusRequest(), &response);
  });
}

TEST_F(MemoryBeforeAuthTest, ReplayBuffer) {
  ASSERT_NO_FATAL_FAILURE(Start("sluice-replay-buffer"));
  auto stub = v1::ReplayBufferService::NewStub(channel_);
  v1::InsertGroupsRequest request;
  v1::Group* group = request.add_groups();
  group->set_run_id("r");
  for (int i = 0; i < kEmptyItems; ++i) group->add_trajectories();
  const auto insert = [&](const std::string& token) {
    grpc::ClientContext context;
    Prepare(context, token);
    auto stream = stub->InsertGroups(&context);
    stream->Write(request);
    stream->WritesDone();
    v1::InsertGroupsResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  };
  ExpectBounded(
      "anonymous", kUnauthenticatedBound, [&] { return insert(""); },
      grpc::StatusCode::UNAUTHENTICATED, "");
  ExpectBounded(
      "worker", MethodWorstCase("/sluice.v1.ReplayBufferService/InsertGroups") + kSlackBytes,
      [&] { return insert(kWorker); }, grpc::StatusCode::INVALID_ARGUMENT,
      "groups[0].trajectories: 1500000 items, at most 4096 per request");
  ExpectStillAnswers([&] {
    grpc::ClientContext context;
    Prepare(context, kOperator);
    v1::GetStatsRequest stats;
    stats.set_run_id("r");
    v1::GetStatsResponse response;
    const grpc::Status status = stub->GetStats(&context, stats, &response);
    // No such run: answered, which is what is checked here.
    return status.error_code() == grpc::StatusCode::NOT_FOUND ? grpc::Status::OK : status;
  });
}

// A legitimate large request is parsed and answered, and the memory its
// parse used is handed back: resident memory returns to where it was.
TEST_F(MemoryBeforeAuthTest, MemoryOfALargeRequestIsHandedBack) {
  ASSERT_NO_FATAL_FAILURE(Start("sluice-reward-server"));
  auto stub = v1::RewardService::NewStub(channel_);
  v1::ScoreBatchRequest request;
  for (int i = 0; i < 4096; ++i) {
    v1::ScoreItem* item = request.add_items();
    item->set_item_id(absl::StrCat("item-", i));
    item->set_response(std::string(4000, 'x'));
    item->set_reference_answer("1");
    item->set_verifier("exact_match");
  }
  const Memory before = ReadMemory(process_->pid());
  for (int round = 0; round < 3; ++round) {
    grpc::ClientContext context;
    Prepare(context, kWorker);
    v1::ScoreBatchResponse response;
    const grpc::Status status = stub->ScoreBatch(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.results_size(), 4096);
  }
  // The service hands the memory back once it has answered: wait for it.
  // Three rounds of ~16 MiB requests leave less than one behind.
  constexpr int64_t kLeftBehind = 16 << 20;
  Memory after = ReadMemory(process_->pid());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (after.rss_bytes - before.rss_bytes >= kLeftBehind && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
    after = ReadMemory(process_->pid());
  }
  std::printf("large requests: VmRSS %lld -> %lld KiB, VmHWM %lld -> %lld KiB\n",
              static_cast<long long>(before.rss_bytes >> 10),
              static_cast<long long>(after.rss_bytes >> 10),
              static_cast<long long>(before.hwm_bytes >> 10),
              static_cast<long long>(after.hwm_bytes >> 10));
  EXPECT_LT(after.rss_bytes - before.rss_bytes, kLeftBehind);
}

}  // namespace
}  // namespace sluice
