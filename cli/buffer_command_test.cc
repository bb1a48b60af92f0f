// `sluice buffer stats`: the formatting as pure functions, and the command
// against the real replay buffer service on loopback.
#include "cli/buffer_command.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "replay_buffer/replay_buffer.h"
#include "replay_buffer/replay_buffer_service.h"
#include "replay_buffer/test_util.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

v1::StalenessHistogram Histogram(std::vector<int64_t> bounds, std::vector<int64_t> counts,
                                 int64_t sum) {
  v1::StalenessHistogram histogram;
  for (int64_t bound : bounds) histogram.add_bucket_upper_bounds(bound);
  for (int64_t count : counts) histogram.add_counts(count);
  histogram.set_sum(sum);
  return histogram;
}

// Every field set to a distinct value.
v1::BufferStats FullStats() {
  v1::BufferStats stats;
  stats.set_run_id("run-7");
  stats.set_size_groups(12);
  stats.set_size_trajectories(48);
  stats.set_size_bytes(3 * 1024 * 1024 / 2);
  stats.set_inserted_groups(40);
  stats.set_duplicate_inserts(3);
  stats.set_rejected_inserts(2);
  stats.set_sampled_groups(26);
  v1::EvictionCount* stale = stats.add_evictions();
  stale->set_reason(v1::EVICTION_REASON_STALE);
  stale->set_groups(2);
  v1::EvictionCount* sampled = stats.add_evictions();
  sampled->set_reason(v1::EVICTION_REASON_MAX_TIMES_SAMPLED);
  sampled->set_groups(26);
  // Sampled-group staleness 0 x10, 1 x12, 2 x4: sum 20.
  *stats.mutable_sampled_group_staleness() = Histogram({0, 1, 2, 4}, {10, 12, 4, 0, 0}, 20);
  *stats.mutable_sampled_token_staleness() = Histogram({0, 1, 2, 4}, {300, 100, 0, 0, 8}, 160);
  stats.set_policy_version(7);
  stats.set_running(4);
  stats.set_accepted(40);
  stats.set_admission_limit(40);
  stats.set_rate_limiter_insert_blocked_ms(11);
  stats.set_rate_limiter_sample_blocked_ms(22);
  stats.set_admission_blocked_ms(333);
  stats.mutable_config()->set_sampler(v1::SAMPLER_KIND_UNIFORM);
  stats.mutable_config()->set_capacity_groups(1000);
  stats.set_batch_size_groups(4);
  stats.set_max_staleness(2);
  return stats;
}

// ---------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------

TEST(BufferStatsToJsonTest, HasEveryFigureUnderItsDocumentedName) {
  const Json json = Json::parse(BufferStatsToJson(FullStats()));

  EXPECT_EQ(json["run_id"], "run-7");
  EXPECT_EQ(json["groups"], 12);
  EXPECT_EQ(json["trajectories"], 48);
  EXPECT_EQ(json["bytes"], 3 * 1024 * 1024 / 2);
  EXPECT_EQ(json["policy_version"], 7);
  EXPECT_EQ(json["accepted"], 40);
  EXPECT_EQ(json["running"], 4);
  EXPECT_EQ(json["admission_limit"], 40);
  EXPECT_EQ(json["batch_size_groups"], 4);
  EXPECT_EQ(json["max_staleness"], 2);
  EXPECT_EQ(json["inserted_groups"], 40);
  EXPECT_EQ(json["duplicate_inserts"], 3);
  EXPECT_EQ(json["rejected_inserts"], 2);
  EXPECT_EQ(json["sampled_groups"], 26);
  EXPECT_EQ(json["evictions"], Json::parse(R"({"stale": 2, "max_times_sampled": 26, "capacity": 0,
                            "run_deleted": 0, "uniform_reward": 0})"));
  EXPECT_EQ(json["rate_limiter"],
            Json::parse(R"({"insert_blocked_ms": 11, "sample_blocked_ms": 22})"));
  EXPECT_EQ(json["admission_blocked_ms"], 333);
  EXPECT_EQ(json["config"]["sampler"], "SAMPLER_KIND_UNIFORM");
  EXPECT_EQ(json["config"]["capacity_groups"], 1000);
  EXPECT_EQ(json["config"]["max_times_sampled"], 0) << "defaults are printed";
}

TEST(BufferStatsToJsonTest, HistogramsHaveBucketsCountsSumAndMean) {
  const Json json = Json::parse(BufferStatsToJson(FullStats()));

  EXPECT_EQ(json["staleness"]["sampled_groups"], Json::parse(R"({
    "buckets": [
      {"le": 0, "count": 10, "cumulative": 10},
      {"le": 1, "count": 12, "cumulative": 22},
      {"le": 2, "count": 4, "cumulative": 26},
      {"le": 4, "count": 0, "cumulative": 26},
      {"le": "+Inf", "count": 0, "cumulative": 26}],
    "count": 26, "sum": 20, "mean": 0.7692307692307693})"));
  const Json& tokens = json["staleness"]["sampled_tokens"];
  EXPECT_EQ(tokens["buckets"].back(),
            Json::parse(R"({"le": "+Inf", "count": 8, "cumulative": 408})"));
  EXPECT_EQ(tokens["count"], 408);
  EXPECT_DOUBLE_EQ(tokens["mean"].get<double>(), 160.0 / 408);
}

TEST(BufferStatsToJsonTest, EmptyStatsGiveZerosAndNullMeans) {
  const Json json = Json::parse(BufferStatsToJson(v1::BufferStats()));

  EXPECT_EQ(json["groups"], 0);
  EXPECT_EQ(json["evictions"]["stale"], 0);
  const Json& groups = json["staleness"]["sampled_groups"];
  EXPECT_EQ(groups["buckets"], Json::parse(R"([{"le": "+Inf", "count": 0, "cumulative": 0}])"));
  EXPECT_TRUE(groups["mean"].is_null()) << "no values, no mean";
}

TEST(BufferStatsToJsonTest, KeepsKeysInDocumentedOrder) {
  const std::string json = BufferStatsToJson(FullStats());
  std::vector<size_t> positions;
  for (const char* key :
       {"\"run_id\"", "\"groups\"", "\"trajectories\"", "\"bytes\"", "\"policy_version\"",
        "\"accepted\"", "\"inserted_groups\"", "\"evictions\"", "\"staleness\"", "\"rate_limiter\"",
        "\"admission_blocked_ms\"", "\"config\""}) {
    positions.push_back(json.find(key));
    ASSERT_NE(positions.back(), std::string::npos) << key;
  }
  EXPECT_TRUE(std::is_sorted(positions.begin(), positions.end())) << json;
}

TEST(BufferStatsToJsonTest, TakesMalformedHistogramsAndUnknownReasonsWithoutLoss) {
  v1::BufferStats stats;
  // Too few counts for the bounds, then too many.
  *stats.mutable_sampled_group_staleness() = Histogram({0, 1, 2}, {5}, 0);
  *stats.mutable_sampled_token_staleness() = Histogram({0}, {1, 2, 3, 4}, 9);
  v1::EvictionCount* future = stats.add_evictions();
  future->set_reason(static_cast<v1::EvictionReason>(42));
  future->set_groups(6);

  const Json json = Json::parse(BufferStatsToJson(stats));

  const Json& groups = json["staleness"]["sampled_groups"]["buckets"];
  ASSERT_EQ(groups.size(), 4u);
  EXPECT_EQ(groups[0]["count"], 5);
  EXPECT_EQ(groups[3]["cumulative"], 5);
  const Json& tokens = json["staleness"]["sampled_tokens"];
  EXPECT_EQ(tokens["buckets"].back()["count"], 9) << "extra counts land in +Inf";
  EXPECT_EQ(tokens["count"], 10);
  EXPECT_EQ(json["evictions"]["reason_42"], 6);
}

// ---------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------

TEST(BufferStatsToTextTest, SummarisesEveryFigure) {
  const std::string text = BufferStatsToText(FullStats());

  EXPECT_THAT(text, HasSubstr("run              run-7\n"));
  EXPECT_THAT(text, HasSubstr("size             12 groups, 48 trajectories, 1.5 MiB\n"));
  EXPECT_THAT(text, HasSubstr("policy version   7\n"));
  EXPECT_THAT(text, HasSubstr("admission gate   accepted 40, running 4, limit 40 (B 4, eta 2)\n"));
  EXPECT_THAT(text, HasSubstr("inserts          40 stored, 3 duplicate, 2 rejected\n"));
  EXPECT_THAT(text, HasSubstr("samples          26 groups handed out\n"));
  EXPECT_THAT(
      text,
      HasSubstr("evictions        stale 2, max_times_sampled 26, capacity 0, run_deleted 0, "
                "uniform_reward 0\n"));
  EXPECT_THAT(text, HasSubstr("blocked          rate limiter: inserts 11 ms, samples 22 ms; "
                              "admission gate 333 ms\n"));
  EXPECT_THAT(text, HasSubstr("config           sampler=UNIFORM capacity_groups=1000\n"));
  EXPECT_THAT(text, HasSubstr("staleness of sampled groups: 26 observed, mean 0.77 versions\n"));
  EXPECT_THAT(text, HasSubstr("staleness of sampled tokens: 408 observed, mean 0.39 versions\n"));
}

TEST(BufferStatsToTextTest, HistogramRowsHaveBoundsCountsAndBars) {
  const std::string text = BufferStatsToText(FullStats());
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  const auto line_after = [&](const std::string& title, int n) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind(title, 0) == 0 && i + n < lines.size()) return lines[i + n];
    }
    return std::string("<missing>");
  };
  const std::string title = "staleness of sampled groups";
  // The largest bucket gets the full 40-character bar, the others in proportion.
  EXPECT_EQ(line_after(title, 1), "  <= 0             10  " + std::string(34, '#'));
  EXPECT_EQ(line_after(title, 2), "  <= 1             12  " + std::string(40, '#'));
  EXPECT_EQ(line_after(title, 3), "  <= 2              4  " + std::string(14, '#'));
  EXPECT_EQ(line_after(title, 4), "  <= 4              0");
  EXPECT_EQ(line_after(title, 5), "  > 4               0");
}

TEST(BufferStatsToTextTest, EmptyStatsSayAllDefaultsAndHaveNoMean) {
  const std::string text = BufferStatsToText(v1::BufferStats());
  EXPECT_THAT(text, HasSubstr("size             0 groups, 0 trajectories, 0 B\n"));
  EXPECT_THAT(text, HasSubstr("config           all defaults\n"));
  EXPECT_THAT(text, HasSubstr("staleness of sampled groups: 0 observed\n"));
  EXPECT_THAT(text, Not(HasSubstr("mean")));
}

// ---------------------------------------------------------------------------
// The command against a real buffer
// ---------------------------------------------------------------------------

constexpr char kRun[] = "run-stats";

class BufferStatsCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<replay_buffer::ReplayBuffer>> buffer =
        replay_buffer::ReplayBuffer::Create();
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    service_ = std::make_unique<replay_buffer::ReplayBufferServiceImpl>(
        std::shared_ptr<replay_buffer::ReplayBuffer>(std::move(buffer).value()), registry_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = absl::StrCat("127.0.0.1:", port);
    stub_ = v1::ReplayBufferService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override {
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }

  // A run with B = 2, eta = 1, G = 2: 5 groups inserted (one twice), 2
  // sampled at version 1 (staleness 1), 1 rejected as stale at version 3.
  void FillRun() {
    v1::ConfigureRunRequest configure;
    configure.set_run_id(kRun);
    configure.set_batch_size_groups(2);
    configure.set_max_staleness(1);
    configure.set_group_size(2);
    configure.mutable_config()->set_capacity_groups(100);
    v1::ConfigureRunResponse configured;
    ASSERT_TRUE(Call([&](grpc::ClientContext* c) {
                  return stub_->ConfigureRun(c, configure, &configured);
                }).ok());

    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub_->InsertGroups(&context);
    v1::InsertGroupsRequest insert;
    for (int i = 0; i < 5; ++i) {
      *insert.add_groups() = replay_buffer::testing::MakeGroup(kRun, absl::StrCat("g", i), 2, 0);
    }
    *insert.add_groups() = insert.groups(0);
    v1::InsertGroupsResponse inserted;
    ASSERT_TRUE(stream->Write(insert));
    ASSERT_TRUE(stream->Read(&inserted));
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());

    grpc::ClientContext sample_context;
    sample_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto sampler = stub_->Sample(&sample_context);
    v1::SampleRequest sample;
    sample.set_run_id(kRun);
    sample.set_trainer_policy_version(1);
    sample.set_timeout_ms(5000);
    v1::SampleResponse batch;
    ASSERT_TRUE(sampler->Write(sample));
    ASSERT_TRUE(sampler->Read(&batch));
    ASSERT_EQ(batch.groups_size(), 2);
    sampler->WritesDone();
    ASSERT_TRUE(sampler->Finish().ok());
  }

  template <typename F>
  grpc::Status Call(F call) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return call(&context);
  }

  struct Result {
    int code;
    std::string out;
    std::string err;
  };
  Result Run(BufferStatsFlags flags) {
    std::ostringstream out, err;
    const int code = RunBufferStats(flags, out, err);
    return {code, out.str(), err.str()};
  }
  BufferStatsFlags Flags(bool json) {
    BufferStatsFlags flags;
    flags.target = target_;
    flags.run_id = kRun;
    flags.json = json;
    return flags;
  }

  prometheus::Registry registry_;
  std::unique_ptr<replay_buffer::ReplayBufferServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::unique_ptr<v1::ReplayBufferService::Stub> stub_;
};

TEST_F(BufferStatsCommandTest, PrintsTheRunsStatsAsJson) {
  ASSERT_NO_FATAL_FAILURE(FillRun());

  const Result result = Run(Flags(/*json=*/true));

  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.err, "");
  const Json json = Json::parse(result.out);
  EXPECT_EQ(json["run_id"], kRun);
  EXPECT_EQ(json["groups"], 3);
  EXPECT_EQ(json["trajectories"], 6);
  EXPECT_GT(json["bytes"].get<int64_t>(), 0);
  EXPECT_EQ(json["inserted_groups"], 5);
  EXPECT_EQ(json["duplicate_inserts"], 1);
  EXPECT_EQ(json["sampled_groups"], 2);
  EXPECT_EQ(json["evictions"]["max_times_sampled"], 2);
  EXPECT_EQ(json["policy_version"], 1);
  EXPECT_EQ(json["batch_size_groups"], 2);
  EXPECT_EQ(json["max_staleness"], 1);
  const Json& staleness = json["staleness"]["sampled_groups"];
  EXPECT_EQ(staleness["count"], 2);
  EXPECT_EQ(staleness["sum"], 2);
  EXPECT_DOUBLE_EQ(staleness["mean"].get<double>(), 1.0);
  EXPECT_EQ(json["config"]["capacity_groups"], 100);
}

TEST_F(BufferStatsCommandTest, PrintsTheRunsStatsAsText) {
  ASSERT_NO_FATAL_FAILURE(FillRun());

  const Result result = Run(Flags(/*json=*/false));

  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("run              run-stats\n"));
  EXPECT_THAT(result.out, HasSubstr("size             3 groups, 6 trajectories"));
  EXPECT_THAT(result.out, HasSubstr("inserts          5 stored, 1 duplicate, 0 rejected\n"));
  EXPECT_THAT(result.out, HasSubstr("config           capacity_groups=100\n"));
  EXPECT_THAT(result.out, HasSubstr("staleness of sampled groups: 2 observed, mean 1.00 versions"));
}

TEST_F(BufferStatsCommandTest, UnknownRunExitsOneNamingTheRun) {
  BufferStatsFlags flags = Flags(true);
  flags.run_id = "no-such-run";

  const Result result = Run(flags);

  EXPECT_EQ(result.code, 1);
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, HasSubstr("has no run \"no-such-run\""));
  EXPECT_THAT(result.err, HasSubstr(target_));
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
}

TEST_F(BufferStatsCommandTest, UnreachableTargetExitsOneNamingTheAddress) {
  // A bound port nobody listens on: connections are refused at once, and
  // no other process can take the port while the socket is held.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  BufferStatsFlags flags = Flags(false);
  flags.target = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));

  const Result result = Run(flags);
  close(fd);

  EXPECT_EQ(result.code, 1);
  EXPECT_EQ(result.out, "");
  EXPECT_THAT(result.err, HasSubstr("cannot reach the replay buffer at " + flags.target));
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
}

TEST_F(BufferStatsCommandTest, WithoutRunIdTheOnlyRunIsPrinted) {
  ASSERT_NO_FATAL_FAILURE(FillRun());
  BufferStatsFlags flags = Flags(/*json=*/true);
  flags.run_id.clear();

  const Result result = Run(flags);

  ASSERT_EQ(result.code, 0) << result.err;
  const Json json = Json::parse(result.out);
  EXPECT_EQ(json["run_id"], kRun);
  EXPECT_EQ(json["groups"], 3);
}

TEST_F(BufferStatsCommandTest, WithoutRunIdSeveralRunsGiveTotalsAndEachRun) {
  ASSERT_NO_FATAL_FAILURE(FillRun());
  v1::ConfigureRunRequest other;
  other.set_run_id("other");
  other.set_batch_size_groups(2);
  other.set_group_size(2);
  v1::ConfigureRunResponse configured;
  ASSERT_TRUE(Call([&](grpc::ClientContext* context) {
                return stub_->ConfigureRun(context, other, &configured);
              }).ok());
  BufferStatsFlags flags = Flags(/*json=*/true);
  flags.run_id.clear();

  const Result result = Run(flags);

  ASSERT_EQ(result.code, 0) << result.err;
  const Json json = Json::parse(result.out);
  EXPECT_EQ(json["groups"], 3);
  ASSERT_EQ(json["runs"].size(), 2u);
  EXPECT_EQ(json["runs"][0]["run_id"], "other");
  EXPECT_EQ(json["runs"][1]["run_id"], kRun);
  flags.json = false;
  EXPECT_THAT(Run(flags).out, HasSubstr("2 runs, 3 groups held"));
}

TEST(AddBufferCommandTest, ParsesTheFlags) {
  CLI::App app("test");
  BufferStatsFlags flags;
  CLI::App* buffer = AddBufferCommand(app, &flags);
  app.parse("buffer stats --target h:1 --run-id r1 --json --timeout-ms 250",
            /*program_name_included=*/false);
  EXPECT_TRUE(buffer->parsed());
  EXPECT_EQ(flags.target, "h:1");
  EXPECT_EQ(flags.run_id, "r1");
  EXPECT_TRUE(flags.json);
  EXPECT_EQ(flags.timeout_ms, 250);
}

TEST(AddBufferCommandTest, TargetIsRequired) {
  CLI::App app("test");
  BufferStatsFlags flags;
  AddBufferCommand(app, &flags);
  EXPECT_THROW(app.parse("buffer stats --run-id r1", /*program_name_included=*/false),
               CLI::RequiredError);
}

}  // namespace
}  // namespace sluice::cli
