// Hostile requests against the real service binaries (issue 19): a message
// over the size limit, too many items in one request, an identifier of
// 100 KiB, a thousand streams from one client, a long-poll without a
// deadline. Each gets the expected status with a message that names the
// limit; afterwards the service is still SERVING and answers a normal call,
// and its memory stayed bounded (ExpectMemoryBounded says by what).
//
// The services run with small limits (a 4 MiB message, 8 streams per peer, a
// 1 s longest wait) so that the test is quick; the checks are the same ones
// the defaults get (request_limits.h).
#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/runtime/health_client.h"
#include "services/runtime/request_limits.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/reward_server.grpc.pb.h"
#include "sluice/v1/rollout_worker.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMessageLimitBytes = 4 << 20;
constexpr int kStreamsPerPeer = 8;
// One client trying to open this many streams (all but kStreamsPerPeer are
// refused).
constexpr int kStreamFlood = 1000;
const std::string kHugeId(100 << 10, 'i');
// Items in the too-many-items requests: a few hundred KB on the wire.
constexpr int64_t kHostileItems = 100000;
// gRPC's transport buffers and allocator slack beside a call's own cost.
constexpr int64_t kSlackBytes = 8 << 20;

// Memory a process holds (VmRSS) and the most it ever held (VmHWM).
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

void WithDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

void ExpectRefused(const grpc::Status& status, grpc::StatusCode code,
                   const std::string& names_the_limit) {
  EXPECT_EQ(status.error_code(), code) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(names_the_limit));
}

class HostileRequestsTest : public ::testing::Test {
 protected:
  void Start(const std::string& binary) {
    dir_ = testing::MakeTempDir(binary);
    log_path_ = dir_ + "/" + binary + ".log";
    SubprocessOptions options;
    options.argv = {testing::BinDir() + "/" + binary,
                    "--listen=127.0.0.1:0",
                    "--metrics-port=0",
                    "--ready-fd=3",
                    absl::StrCat("--max-message-size-bytes=", kMessageLimitBytes),
                    absl::StrCat("--max-streams-per-peer=", kStreamsPerPeer),
                    "--max-wait-ms=1000"};
    options.log_path = log_path_;
    options.ready_pipe = true;
    absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(options);
    ASSERT_TRUE(process.ok()) << process.status();
    process_ = std::move(*process);
    absl::StatusOr<std::string> ready =
        process_->WaitReady(absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(log_path_);
    const nlohmann::json info = nlohmann::json::parse(*ready);
    address_ = info["grpc"];
    metrics_ = info["metrics"];
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    before_ = ReadMemory(process_->pid());
  }

  void TearDown() override {
    if (process_ != nullptr) process_->Stop(absl::Seconds(30));
  }

  // The service is SERVING (overall and by name) and answers `normal` OK.
  void ExpectStillServing(const std::string& grpc_service,
                          const std::function<grpc::Status()>& normal) {
    absl::StatusOr<std::string> overall = runtime::CheckHealth(address_, "", absl::Seconds(20));
    ASSERT_TRUE(overall.ok()) << overall.status() << "\n" << testing::ReadFile(log_path_);
    EXPECT_EQ(*overall, "SERVING");
    absl::StatusOr<std::string> named =
        runtime::CheckHealth(address_, grpc_service, absl::Seconds(20));
    ASSERT_TRUE(named.ok()) << named.status();
    EXPECT_EQ(*named, "SERVING");
    const grpc::Status answered = normal();
    EXPECT_TRUE(answered.ok()) << answered.error_message();
  }

  // Runs `hostile_round` twice. The peak (VmHWM) grows by less than the
  // message-size limit (the bytes of the largest request read) plus slack:
  // gRPC refuses an oversized message from its length prefix, and a message
  // under the limit is bounded on the wire before it is parsed, so that a
  // request of 10^5 empty items is refused without building one of them
  // (bounded_methods.h). Resident memory (VmRSS) after both rounds is under
  // the same bound: a refused call keeps nothing.
  void ExpectMemoryBoundedOverTwoRounds(const std::function<void()>& hostile_round) {
    hostile_round();
    const Memory middle = ReadMemory(process_->pid());
    hostile_round();
    const Memory after = ReadMemory(process_->pid());
    const int64_t rss_growth = after.rss_bytes - before_.rss_bytes;
    const int64_t peak_growth = after.hwm_bytes - before_.hwm_bytes;
    const int64_t bound = kMessageLimitBytes + kSlackBytes;
    std::printf("memory: VmRSS %lld -> %lld -> %lld KiB (%+lld), VmHWM %lld -> %lld KiB "
                "(%+lld); bound %lld KiB\n",
                static_cast<long long>(before_.rss_bytes >> 10),
                static_cast<long long>(middle.rss_bytes >> 10),
                static_cast<long long>(after.rss_bytes >> 10),
                static_cast<long long>(rss_growth >> 10),
                static_cast<long long>(before_.hwm_bytes >> 10),
                static_cast<long long>(after.hwm_bytes >> 10),
                static_cast<long long>(peak_growth >> 10), static_cast<long long>(bound >> 10));
    RecordProperty("rss_growth_kib", static_cast<int>(rss_growth >> 10));
    RecordProperty("hwm_growth_kib", static_cast<int>(peak_growth >> 10));
    EXPECT_LT(rss_growth, bound);
    EXPECT_LT(peak_growth, bound);
  }

  // The refusals were counted on /metrics, by reason.
  void ExpectRefusalsCounted(const std::string& reason) {
    absl::StatusOr<std::string> text = runtime::HttpGet(metrics_, absl::Seconds(20));
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_GT(testing::MetricSum(
                  *text, absl::StrCat("sluice_requests_refused_total{reason=\"", reason, "\"")),
              0)
        << reason;
  }

  std::string dir_;
  std::string log_path_;
  std::unique_ptr<Subprocess> process_;
  std::string address_;
  std::string metrics_;
  std::shared_ptr<grpc::Channel> channel_;
  Memory before_;
};

// A client stream and the context of its call.
template <typename Stream>
struct HeldStream {
  std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
  std::unique_ptr<Stream> stream;
};

template <typename Stream>
using OpenStream =
    std::function<grpc::Status(grpc::ClientContext&, std::unique_ptr<Stream>&)>;

// Opens a stream, retrying while it is refused RESOURCE_EXHAUSTED for at
// most 10 s: a slot is given back when its handler returns, which a handler
// waiting on a condition does only when it next checks for the cancel (the
// trainer's watch every 500 ms).
template <typename Stream>
grpc::Status OpenOnceSlotsAreFree(const OpenStream<Stream>& open, HeldStream<Stream>& held) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    held = HeldStream<Stream>();
    const grpc::Status status = open(*held.context, held.stream);
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED || absl::Now() > deadline) {
      return status;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// Opens kStreamsPerPeer streams (each accepted), then kStreamFlood more from
// the same client (each refused RESOURCE_EXHAUSTED naming the flag), then
// closes the held ones and checks that a new one is accepted again.
// `open(context, &stream)` returns OK once the server holds the stream, or
// the status it was refused with.
template <typename Stream>
void ExpectStreamsCappedPerPeer(const OpenStream<Stream>& open) {
  std::vector<HeldStream<Stream>> held(kStreamsPerPeer);
  for (HeldStream<Stream>& h : held) {
    const grpc::Status status = OpenOnceSlotsAreFree(open, h);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  int refused = 0;
  for (int i = 0; i < kStreamFlood; ++i) {
    HeldStream<Stream> extra;
    const grpc::Status status = open(*extra.context, extra.stream);
    if (i == 0) {
      ExpectRefused(status, grpc::StatusCode::RESOURCE_EXHAUSTED,
                    absl::StrCat("(--max-streams-per-peer ", kStreamsPerPeer, ")"));
    }
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) ++refused;
  }
  EXPECT_EQ(refused, kStreamFlood);
  for (HeldStream<Stream>& h : held) {
    h.context->TryCancel();
    h.stream->Finish().ok();
  }
  HeldStream<Stream> again;
  const grpc::Status reopened = OpenOnceSlotsAreFree(open, again);
  EXPECT_TRUE(reopened.ok()) << reopened.error_message();
  again.context->TryCancel();
  again.stream->Finish().ok();
}

TEST_F(HostileRequestsTest, Controller) {
  Start("sluice-controller");
  auto stub = v1::ControllerService::NewStub(channel_);
  ExpectMemoryBoundedOverTwoRounds([&] {
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::GetRunRequest request;
      request.set_run_id(std::string(kMessageLimitBytes + 1024, 'x'));
      v1::GetRunResponse response;
      ExpectRefused(stub->GetRun(&context, request, &response),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StrCat(kMessageLimitBytes));
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::GetRunRequest request;
      request.set_run_id(kHugeId);
      v1::GetRunResponse response;
      ExpectRefused(stub->GetRun(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "run_id: 102400 bytes, at most 1024");
    }
    {
      // Before the limit, a lease of 10^9 prompts looped over the pool's
      // epochs until the controller ran out of memory.
      grpc::ClientContext context;
      WithDeadline(context);
      v1::LeasePromptsRequest request;
      request.set_run_id("r");
      request.set_worker_id("w");
      request.set_max_prompts(1000000000);
      v1::LeasePromptsResponse response;
      ExpectRefused(stub->LeasePrompts(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "max_prompts: 1000000000 items, at most 4096 per request");
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::LeasePromptsRequest request;
      request.set_worker_id("w");
      request.set_max_prompts(-5);
      v1::LeasePromptsResponse response;
      ExpectRefused(stub->LeasePrompts(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "max_prompts: must be > 0, got -5");
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::WatchRunRequest request;
      request.set_run_id("r");
      request.set_min_interval_ms(int64_t{1} << 50);
      std::unique_ptr<grpc::ClientReader<v1::RunUpdate>> reader =
          stub->WatchRun(&context, request);
      v1::RunUpdate update;
      EXPECT_FALSE(reader->Read(&update));
      ExpectRefused(reader->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                    "min_interval_ms: must be in [0, 3600000]");
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::ReportRolloutProgressRequest request;
      request.set_run_id("r");
      request.set_worker_id("w");
      for (int i = 0; i < kHostileItems; ++i) request.add_completed_prompt_ids("p");
      v1::ReportRolloutProgressResponse response;
      ExpectRefused(stub->ReportRolloutProgress(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "100000 items, at most 4096");
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::ListRunsRequest request;
      for (int i = 0; i < kHostileItems; ++i) request.add_states(v1::RUN_STATE_TRAINING);
      v1::ListRunsResponse response;
      ExpectRefused(stub->ListRuns(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "states: 100000 items, at most 4096");
    }
  });
  ExpectStillServing("sluice.v1.ControllerService", [&] {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::ListRunsResponse response;
    return stub->ListRuns(&context, v1::ListRunsRequest(), &response);
  });
  ExpectRefusalsCounted("id_too_long");
  ExpectRefusalsCounted("too_many_items");
  ExpectRefusalsCounted("value_out_of_range");
}

TEST_F(HostileRequestsTest, ReplayBuffer) {
  Start("sluice-replay-buffer");
  auto stub = v1::ReplayBufferService::NewStub(channel_);
  {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::ConfigureRunRequest request;
    request.set_run_id("r");
    request.set_batch_size_groups(2);
    request.set_group_size(2);
    v1::ConfigureRunResponse response;
    ASSERT_TRUE(stub->ConfigureRun(&context, request, &response).ok());
  }
  ExpectMemoryBoundedOverTwoRounds([&] {
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::GetStatsRequest request;
      request.set_run_id(std::string(kMessageLimitBytes + 1024, 'x'));
      v1::GetStatsResponse response;
      ExpectRefused(stub->GetStats(&context, request, &response),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StrCat(kMessageLimitBytes));
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::ConfigureRunRequest request;
      request.set_run_id(kHugeId);
      request.set_batch_size_groups(2);
      request.set_group_size(2);
      v1::ConfigureRunResponse response;
      ExpectRefused(stub->ConfigureRun(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "run_id: 102400 bytes, at most 1024");
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::AcquireGenerationSlotsRequest request;
      request.set_run_id("r");
      request.set_worker_id("w");
      request.set_num_groups(1000000000);
      v1::AcquireGenerationSlotsResponse response;
      ExpectRefused(stub->AcquireGenerationSlots(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "num_groups: 1000000000 items, at most 4096 per request");
    }
    {
      // A group of 10^5 trajectories, then a message of 10^5 groups: each ends
      // its stream, before any of it is validated or stored.
      for (const bool many_groups : {false, true}) {
        grpc::ClientContext context;
        WithDeadline(context);
        auto stream = stub->InsertGroups(&context);
        v1::InsertGroupsRequest request;
        if (many_groups) {
          for (int i = 0; i < kHostileItems; ++i) request.add_groups();
        } else {
          v1::Group* group = request.add_groups();
          group->set_run_id("r");
          for (int i = 0; i < kHostileItems; ++i) group->add_trajectories();
        }
        stream->Write(request);
        stream->WritesDone();
        v1::InsertGroupsResponse response;
        EXPECT_FALSE(stream->Read(&response));
        ExpectRefused(stream->Finish(), grpc::StatusCode::INVALID_ARGUMENT,
                      many_groups ? "groups: 100000 items, at most 4096"
                                  : "groups[0].trajectories: 100000 items, at most 4096");
      }
    }
    {
      // A long-poll asking to wait 10^12 ms with no deadline answers "timed
      // out" after --max-wait-ms (1 s here), not never.
      grpc::ClientContext context;  // no deadline
      auto stream = stub->Sample(&context);
      v1::SampleRequest request;
      request.set_run_id("r");
      request.set_timeout_ms(int64_t{1000000000000});
      const absl::Time start = absl::Now();
      ASSERT_TRUE(stream->Write(request));
      v1::SampleResponse response;
      ASSERT_TRUE(stream->Read(&response));
      const absl::Duration waited = absl::Now() - start;
      EXPECT_TRUE(response.timed_out());
      EXPECT_GE(waited, absl::Milliseconds(900));
      EXPECT_LT(waited, absl::Seconds(20));
      stream->WritesDone();
      EXPECT_TRUE(stream->Finish().ok());
    }
    using InsertStream =
        grpc::ClientReaderWriter<v1::InsertGroupsRequest, v1::InsertGroupsResponse>;
    ExpectStreamsCappedPerPeer<InsertStream>(
        [&](grpc::ClientContext& context, std::unique_ptr<InsertStream>& stream) {
          WithDeadline(context);
          stream = stub->InsertGroups(&context);
          // An empty insert is answered at once by a stream the server holds.
          stream->Write(v1::InsertGroupsRequest());
          v1::InsertGroupsResponse response;
          if (stream->Read(&response)) return grpc::Status::OK;
          return stream->Finish();
        });
  });
  ExpectStillServing("sluice.v1.ReplayBufferService", [&] {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::GetStatsRequest request;
    request.set_run_id("r");
    v1::GetStatsResponse response;
    return stub->GetStats(&context, request, &response);
  });
  ExpectRefusalsCounted("streams_per_peer");
  ExpectRefusalsCounted("too_many_items");
}

TEST_F(HostileRequestsTest, RewardServer) {
  Start("sluice-reward-server");
  auto stub = v1::RewardService::NewStub(channel_);
  ExpectMemoryBoundedOverTwoRounds([&] {
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::ScoreBatchRequest request;
      request.add_items()->set_response(std::string(kMessageLimitBytes + 1024, 'x'));
      v1::ScoreBatchResponse response;
      ExpectRefused(stub->ScoreBatch(&context, request, &response),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StrCat(kMessageLimitBytes));
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::ScoreBatchRequest request;
      for (int i = 0; i < kHostileItems; ++i) request.add_items();
      v1::ScoreBatchResponse response;
      ExpectRefused(stub->ScoreBatch(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "items: 100000 items, at most 4096 per request (--max-batch-items)");
    }
  });
  ExpectStillServing("sluice.v1.RewardService", [&] {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::ListVerifiersResponse response;
    return stub->ListVerifiers(&context, v1::ListVerifiersRequest(), &response);
  });
}

TEST_F(HostileRequestsTest, RolloutWorker) {
  Start("sluice-rollout-worker");
  auto stub = v1::RolloutWorkerService::NewStub(channel_);
  ExpectMemoryBoundedOverTwoRounds([&] {
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::StartRolloutsRequest request;
      request.set_run_id(std::string(kMessageLimitBytes + 1024, 'x'));
      v1::StartRolloutsResponse response;
      ExpectRefused(stub->StartRollouts(&context, request, &response),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StrCat(kMessageLimitBytes));
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::StartRolloutsRequest request;
      request.set_run_id(kHugeId);
      v1::StartRolloutsResponse response;
      ExpectRefused(stub->StartRollouts(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "run_id: 102400 bytes, at most 1024");
    }
  });
  ExpectStillServing("sluice.v1.RolloutWorkerService", [&] {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::GetWorkerStatusResponse response;
    return stub->GetWorkerStatus(&context, v1::GetWorkerStatusRequest(), &response);
  });
}

TEST_F(HostileRequestsTest, Trainer) {
  Start("sluice-trainer");
  auto stub = v1::TrainerService::NewStub(channel_);
  ExpectMemoryBoundedOverTwoRounds([&] {
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::GetLatestVersionRequest request;
      request.set_run_id(std::string(kMessageLimitBytes + 1024, 'x'));
      v1::GetLatestVersionResponse response;
      ExpectRefused(stub->GetLatestVersion(&context, request, &response),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StrCat(kMessageLimitBytes));
    }
    {
      grpc::ClientContext context;
      WithDeadline(context);
      v1::GetLatestVersionRequest request;
      request.set_run_id(kHugeId);
      v1::GetLatestVersionResponse response;
      ExpectRefused(stub->GetLatestVersion(&context, request, &response),
                    grpc::StatusCode::INVALID_ARGUMENT, "run_id: 102400 bytes, at most 1024");
    }
    using WatchStream = grpc::ClientReader<v1::VersionAnnouncement>;
    ExpectStreamsCappedPerPeer<WatchStream>(
        [&](grpc::ClientContext& context, std::unique_ptr<WatchStream>& stream) {
          v1::WatchVersionsRequest request;
          request.set_after_version(0);  // nothing to announce: the watch waits
          stream = stub->WatchVersions(&context, request);
          // A held watch sends its initial metadata at once, with the slot's
          // key; a refused one sends none before its status.
          stream->WaitForInitialMetadata();
          if (context.GetServerInitialMetadata().count(runtime::kStreamSlotMetadataKey) > 0) {
            return grpc::Status::OK;
          }
          return stream->Finish();
        });
  });
  ExpectStillServing("sluice.v1.TrainerService", [&] {
    grpc::ClientContext context;
    WithDeadline(context);
    v1::GetTrainerStatusResponse response;
    return stub->GetTrainerStatus(&context, v1::GetTrainerStatusRequest(), &response);
  });
  ExpectRefusalsCounted("streams_per_peer");
}

}  // namespace
}  // namespace sluice
