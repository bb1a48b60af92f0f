// The replay buffer's promise, tested on the real binaries: every insert it
// acknowledged is there after `kill -9` and a restart, including when the
// newest snapshot is damaged and a crash left a half-written one behind.
//
// The load comes from `bench_replay_buffer --target ... --ack-log FILE`, a
// separate process that appends each group's key to FILE only once its
// insert was acknowledged.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "tests/test_support.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
constexpr char kRun[] = "durable";

absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

struct Buffer {
  std::unique_ptr<Subprocess> process;
  std::string grpc;
  std::string log_path;
};

Buffer StartBuffer(const std::string& data_dir, const std::string& log_path,
                   std::vector<std::string> extra = {}) {
  Buffer buffer;
  buffer.log_path = log_path;
  SubprocessOptions options;
  options.argv = {testing::BinDir() + "/sluice-replay-buffer", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--ready-fd=3", "--data-dir=" + data_dir};
  for (auto& arg : extra) options.argv.push_back(std::move(arg));
  options.log_path = log_path;
  options.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> process = Subprocess::Start(options);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return buffer;
  buffer.process = std::move(*process);
  absl::StatusOr<std::string> ready = buffer.process->WaitReady(Soon());
  EXPECT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(log_path);
  if (!ready.ok()) return buffer;
  buffer.grpc = nlohmann::json::parse(*ready)["grpc"];
  return buffer;
}

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// Every idempotency key the buffer holds for the run (each group is taken
// with one Sample of exactly the held count; FIFO, nothing is stale).
std::set<std::string> HeldKeys(const std::string& target, int64_t* held) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1::ReplayBufferService::NewStub(channel);
  grpc::ClientContext stats_context;
  stats_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GetStatsRequest stats_request;
  stats_request.set_run_id(kRun);
  v1::GetStatsResponse stats;
  const grpc::Status status = stub->GetStats(&stats_context, stats_request, &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  *held = stats.stats().size_groups();
  std::set<std::string> keys;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->Sample(&context);
  for (int64_t remaining = *held; remaining > 0;) {
    v1::SampleRequest request;
    request.set_run_id(kRun);
    request.set_batch_size_groups(static_cast<int32_t>(std::min<int64_t>(100, remaining)));
    request.set_trainer_policy_version(stats.stats().policy_version());
    request.set_timeout_ms(10000);
    EXPECT_TRUE(stream->Write(request));
    v1::SampleResponse response;
    EXPECT_TRUE(stream->Read(&response));
    if (response.timed_out() || response.groups_size() == 0) {
      ADD_FAILURE() << "sample timed out with " << remaining << " groups left";
      break;
    }
    for (const auto& sampled : response.groups()) keys.insert(sampled.group().idempotency_key());
    remaining -= response.groups_size();
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  return keys;
}

TEST(ReplayBufferDurabilityTest, EveryAcknowledgedGroupSurvivesKill9AndDamagedSnapshots) {
  const std::string dir = testing::MakeTempDir("durability");
  const std::string data_dir = dir + "/data";
  const std::string ack_log = dir + "/acked.txt";
  // Small snapshot threshold: snapshots are taken (and may be interrupted)
  // during the load.
  const std::vector<std::string> flags = {"--fsync=interval", "--snapshot-wal-mb=2",
                                          "--snapshot-interval-s=1"};
  Buffer first = StartBuffer(data_dir, dir + "/buffer1.log", flags);
  ASSERT_NE(first.process, nullptr);

  auto loader = Subprocess::Start(
      {.argv = {testing::BinDir() + "/bench_replay_buffer", "--target", first.grpc,
                "--run-id", kRun, "--insert-groups", "100000", "--group-bytes", "16384",
                "--ack-log", ack_log},
       .log_path = dir + "/loader.log"});
  ASSERT_TRUE(loader.ok()) << loader.status();
  // Let it get well into the load (several snapshots' worth), then kill -9.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  const auto snapshot_taken = [&] {
    for (const auto& entry : fs::directory_iterator(data_dir + "/snapshots")) {
      if (entry.path().extension() == ".snap") return true;
    }
    return false;
  };
  while ((Lines(ack_log).size() < 1500 || !snapshot_taken()) && absl::Now() < deadline) {
    ASSERT_FALSE((*loader)->Wait(absl::Now()).ok()) << testing::ReadFile(dir + "/loader.log");
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(first.process->Signal(SIGKILL).ok());
  ASSERT_TRUE(first.process->Wait(Soon()).ok());
  // The loader notices the server is gone and stops with an error.
  absl::StatusOr<ExitStatus> loader_exit = (*loader)->Wait(Soon());
  ASSERT_TRUE(loader_exit.ok());
  EXPECT_NE(loader_exit->ToString(), "exited with code 0");
  const std::vector<std::string> acked = Lines(ack_log);
  ASSERT_GE(acked.size(), 1500u) << testing::ReadFile(dir + "/loader.log");

  // Restart on the same directory: every acknowledged key is there.
  {
    Buffer second = StartBuffer(data_dir, dir + "/buffer2.log", flags);
    ASSERT_NE(second.process, nullptr);
    EXPECT_THAT(testing::ReadFile(second.log_path), ::testing::HasSubstr("replay buffer restored"));
    int64_t held = 0;
    // Not sampled away: taken with a tighter eye below after the SIGTERM.
    auto channel = grpc::CreateChannel(second.grpc, grpc::InsecureChannelCredentials());
    auto stub = v1::ReplayBufferService::NewStub(channel);
    grpc::ClientContext context;
    v1::GetStatsRequest request;
    request.set_run_id(kRun);
    v1::GetStatsResponse stats;
    ASSERT_TRUE(stub->GetStats(&context, request, &stats).ok());
    held = stats.stats().size_groups();
    EXPECT_GE(held, static_cast<int64_t>(acked.size()));
    EXPECT_EQ(stats.stats().inserted_groups(), held);
    EXPECT_EQ(stats.stats().accepted(), held);  // the gate's count came back too
    // A clean stop writes a final snapshot.
    ASSERT_TRUE(second.process->Signal(SIGTERM).ok());
    absl::StatusOr<ExitStatus> exit = second.process->Wait(Soon());
    ASSERT_TRUE(exit.ok());
    EXPECT_EQ(exit->ToString(), "exited with code 0") << testing::ReadFile(second.log_path);
  }

  // Damage: cut the newest snapshot in half and leave a half-written .tmp
  // behind, as a crash in the middle of a snapshot would.
  std::vector<fs::path> snapshots;
  for (const auto& entry : fs::directory_iterator(data_dir + "/snapshots")) {
    if (entry.path().extension() == ".snap") snapshots.push_back(entry.path());
  }
  std::sort(snapshots.begin(), snapshots.end());
  ASSERT_GE(snapshots.size(), 2u) << "expected the previous snapshot to be kept";
  fs::resize_file(snapshots.back(), fs::file_size(snapshots.back()) / 2);
  {
    std::ofstream tmp(data_dir + "/snapshots/snapshot-00000000000099999999.tmp");
    tmp << "half a snapshot";
  }

  Buffer third = StartBuffer(data_dir, dir + "/buffer3.log", flags);
  ASSERT_NE(third.process, nullptr);
  EXPECT_THAT(testing::ReadFile(third.log_path), ::testing::HasSubstr("replay buffer restore"));
  int64_t held = 0;
  const std::set<std::string> keys = HeldKeys(third.grpc, &held);
  EXPECT_EQ(static_cast<int64_t>(keys.size()), held);
  int missing = 0;
  for (const std::string& key : acked) {
    if (keys.count(key) == 0) ++missing;
  }
  EXPECT_EQ(missing, 0) << "of " << acked.size() << " acknowledged groups";
  EXPECT_FALSE(fs::exists(data_dir + "/snapshots/snapshot-00000000000099999999.tmp"));
  ASSERT_TRUE(third.process->Signal(SIGTERM).ok());
  ASSERT_TRUE(third.process->Wait(Soon()).ok());
}

}  // namespace
}  // namespace sluice
