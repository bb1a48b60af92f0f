// The replay buffer's promise, tested on the real binaries: every insert it
// acknowledged is there after `kill -9` and a restart, including when the
// newest snapshot is damaged and a crash left a half-written one behind.
//
// The load comes from `bench_replay_buffer --target ... --ack-log FILE`, a
// separate process that appends each group's key to FILE only once its
// insert was acknowledged.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "replay_buffer/test_util.h"
#include "services/runtime/health_client.h"
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

// Starts a buffer process; AwaitServing then waits until it serves.
Buffer LaunchBuffer(const std::string& data_dir, const std::string& log_path,
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
  if (process.ok()) buffer.process = std::move(*process);
  return buffer;
}

void AwaitServing(Buffer& buffer) {
  if (buffer.process == nullptr) return;
  absl::StatusOr<std::string> ready = buffer.process->WaitReady(Soon());
  EXPECT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(buffer.log_path);
  if (!ready.ok()) return;
  buffer.grpc = nlohmann::json::parse(*ready)["grpc"];
}

Buffer StartBuffer(const std::string& data_dir, const std::string& log_path,
                   std::vector<std::string> extra = {}) {
  Buffer buffer = LaunchBuffer(data_dir, log_path, std::move(extra));
  AwaitServing(buffer);
  return buffer;
}

// True once the file at `path` contains `text`; false at `deadline`.
bool AwaitFileContains(const std::string& path, const std::string& text, absl::Time deadline) {
  while (!absl::StrContains(testing::ReadFile(path), text)) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
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
std::set<std::string> HeldKeys(const std::string& target, int64_t* held,
                               const std::string& run = kRun) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1::ReplayBufferService::NewStub(channel);
  grpc::ClientContext stats_context;
  stats_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::GetStatsRequest stats_request;
  stats_request.set_run_id(run);
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
    request.set_run_id(run);
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
  // And past it: groups acknowledged after a snapshot are in the log only,
  // which the restart must replay (and which make its final snapshot a new
  // one). A loader starved by a busy machine may otherwise stop right at one.
  size_t acked_at_snapshot = 0;
  while ((Lines(ack_log).size() < 1500 || acked_at_snapshot == 0 ||
          Lines(ack_log).size() < acked_at_snapshot + 200) &&
         absl::Now() < deadline) {
    ASSERT_FALSE((*loader)->Wait(absl::Now()).ok()) << testing::ReadFile(dir + "/loader.log");
    if (acked_at_snapshot == 0 && snapshot_taken()) acked_at_snapshot = Lines(ack_log).size() + 1;
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

// A supervisor restarts the buffer the moment it is killed, without waiting
// for the dead process to be torn down: the kernel frees its memory before
// its files, so its lock on the data directory outlives it by a moment, the
// longer the more memory it held. A few hundred MB of groups held (the
// ballast) make that longer than the new buffer's start, as a real buffer's
// gigabytes do. Every time, the new buffer waits for the lock and then holds
// every group the previous one acknowledged.
TEST(ReplayBufferDurabilityTest, RestartedAtOnceAfterKill9KeepsEveryAcknowledgedGroupEachTime) {
  const std::string dir = testing::MakeTempDir("restart-at-once");
  const std::string data_dir = dir + "/data";
  // A minute for the lock: a loaded machine may take its time to tear a big
  // process down.
  const std::vector<std::string> flags = {"--fsync=interval", "--data-dir-lock-wait-ms=60000"};
  Buffer buffer = StartBuffer(data_dir, dir + "/buffer0.log", flags);
  ASSERT_NE(buffer.process, nullptr);
  {
    auto ballast = Subprocess::Start(
        {.argv = {testing::BinDir() + "/bench_replay_buffer", "--target", buffer.grpc,
                  "--run-id", "ballast", "--insert-groups", "6000", "--group-bytes", "65536",
                  "--ack-log", dir + "/acked-ballast.txt"},
         .log_path = dir + "/ballast.log"});
    ASSERT_TRUE(ballast.ok()) << ballast.status();
    absl::StatusOr<ExitStatus> exit = (*ballast)->Wait(absl::Now() + absl::Seconds(240));
    ASSERT_TRUE(exit.ok());
    ASSERT_TRUE(exit->success()) << testing::ReadFile(dir + "/ballast.log");
  }
  int waited = 0;
  constexpr int kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    // One run per round: checking a round's groups samples them away.
    const std::string run = absl::StrCat("round-", round);
    const std::string ack_log = absl::StrCat(dir, "/acked-", round, ".txt");
    const std::string loader_log = absl::StrCat(dir, "/loader-", round, ".log");
    auto loader = Subprocess::Start(
        {.argv = {testing::BinDir() + "/bench_replay_buffer", "--target", buffer.grpc, "--run-id",
                  run, "--insert-groups", "1000000", "--group-bytes", "8192", "--ack-log",
                  ack_log},
         .log_path = loader_log});
    ASSERT_TRUE(loader.ok()) << loader.status();
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (Lines(ack_log).size() < 300 && absl::Now() < deadline) {
      ASSERT_FALSE((*loader)->Wait(absl::Now()).ok()) << testing::ReadFile(loader_log);
      absl::SleepFor(absl::Milliseconds(10));
    }
    // Mid-load: kill -9 and restart at once, with no wait for the death.
    // Every other round the process is frozen (SIGSTOP) first, at the same
    // arbitrary point, and killed only once the new one says it waits for
    // the lock: so the wait is exercised whatever this machine's timing,
    // while the other rounds keep the plain race.
    std::unique_ptr<Subprocess> killed = std::move(buffer.process);
    const std::string next_log = absl::StrCat(dir, "/buffer", round + 1, ".log");
    if (round % 2 == 0) {
      ASSERT_TRUE(killed->Signal(SIGSTOP).ok());
      buffer = LaunchBuffer(data_dir, next_log, flags);
      ASSERT_NE(buffer.process, nullptr);
      const bool waiting = AwaitFileContains(next_log, "waiting for it", Soon());
      ASSERT_TRUE(killed->Signal(SIGKILL).ok());
      ASSERT_TRUE(waiting) << testing::ReadFile(next_log);
      AwaitServing(buffer);
    } else {
      ASSERT_TRUE(killed->Signal(SIGKILL).ok());
      buffer = StartBuffer(data_dir, next_log, flags);
    }
    ASSERT_NE(buffer.process, nullptr);
    if (absl::StrContains(testing::ReadFile(buffer.log_path), "waiting for it")) ++waited;
    ASSERT_TRUE(killed->Wait(Soon()).ok());
    ASSERT_TRUE((*loader)->Wait(Soon()).ok());
    const std::vector<std::string> acked = Lines(ack_log);
    ASSERT_GE(acked.size(), 300u) << testing::ReadFile(loader_log);

    int64_t held = 0;
    const std::set<std::string> keys = HeldKeys(buffer.grpc, &held, run);
    EXPECT_EQ(static_cast<int64_t>(keys.size()), held);
    int missing = 0;
    for (const std::string& key : acked) missing += keys.count(key) == 0 ? 1 : 0;
    EXPECT_EQ(missing, 0) << "of " << acked.size() << " acknowledged groups";
  }
  // The point of the test: restarts found the lock still held, and waited.
  EXPECT_GE(waited, 1) << "no restart had to wait for the lock; the race was not exercised";
  ::testing::Test::RecordProperty("restarts_that_waited", waited);
  ASSERT_TRUE(buffer.process->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> exit = buffer.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(exit->ToString(), "exited with code 0") << testing::ReadFile(buffer.log_path);
  // The ballast's log and snapshots are most of a GB: kept only on failure.
  if (!HasFailure()) fs::remove_all(dir);
}

constexpr char kStepsRun[] = "steps";

// A trainer step's batch (SampleRequest.step) is part of what survives: the
// buffer killed between the sample and the commit hands the step the same
// groups after its restart; once committed the step is gone, also across a
// kill. Each start has its own incarnation.
TEST(ReplayBufferDurabilityTest, RecordedStepsSurviveKill9UntilCommitted) {
  const std::string dir = testing::MakeTempDir("recorded-steps");
  const std::string data_dir = dir + "/data";
  const std::vector<std::string> flags = {"--fsync=interval"};
  struct Client {
    explicit Client(const std::string& target)
        : stub(v1::ReplayBufferService::NewStub(
              grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}
    v1::GetStatsResponse Stats() {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      v1::GetStatsRequest request;
      request.set_run_id(kStepsRun);
      v1::GetStatsResponse response;
      EXPECT_TRUE(stub->GetStats(&context, request, &response).ok());
      return response;
    }
    // The group ids of the step's batch; empty with the stream's error.
    std::vector<std::string> Sample(int64_t step, grpc::Status* status, bool* replayed) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto stream = stub->Sample(&context);
      v1::SampleRequest request;
      request.set_run_id(kStepsRun);
      request.set_timeout_ms(10000);
      request.set_step(step);
      std::vector<std::string> ids;
      v1::SampleResponse response;
      if (stream->Write(request) && stream->Read(&response)) {
        for (const auto& sampled : response.groups()) ids.push_back(sampled.group().group_id());
        *replayed = response.replayed();
      }
      stream->WritesDone();
      *status = stream->Finish();
      return ids;
    }
    std::unique_ptr<v1::ReplayBufferService::Stub> stub;
  };
  const auto kill_and_restart = [&](Buffer& buffer, int round) {
    EXPECT_TRUE(buffer.process->Signal(SIGKILL).ok());
    EXPECT_TRUE(buffer.process->Wait(Soon()).ok());
    buffer = StartBuffer(data_dir, absl::StrCat(dir, "/buffer", round, ".log"), flags);
  };

  Buffer buffer = StartBuffer(data_dir, dir + "/buffer0.log", flags);
  ASSERT_NE(buffer.process, nullptr);
  std::vector<std::string> step1, step2;
  uint64_t first_incarnation = 0;
  {
    Client client(buffer.grpc);
    grpc::ClientContext context;
    v1::ConfigureRunRequest configure;
    configure.set_run_id(kStepsRun);
    configure.set_batch_size_groups(2);
    configure.set_max_staleness(1);
    configure.set_group_size(2);
    v1::ConfigureRunResponse configured;
    ASSERT_TRUE(client.stub->ConfigureRun(&context, configure, &configured).ok());
    grpc::ClientContext insert_context;
    auto inserts = client.stub->InsertGroups(&insert_context);
    v1::InsertGroupsRequest request;
    for (int i = 0; i < 6; ++i) {
      *request.add_groups() = replay_buffer::testing::MakeGroup(kStepsRun, absl::StrCat("g", i), 2, 0);
    }
    ASSERT_TRUE(inserts->Write(request));
    v1::InsertGroupsResponse acked;
    ASSERT_TRUE(inserts->Read(&acked));
    for (const auto& result : acked.results()) ASSERT_EQ(result.status(), v1::INSERT_STATUS_STORED);
    inserts->WritesDone();
    ASSERT_TRUE(inserts->Finish().ok());
    grpc::Status status;
    bool replayed = true;
    step1 = client.Sample(1, &status, &replayed);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(replayed);
    step2 = client.Sample(2, &status, &replayed);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(step1.size(), 2u);
    first_incarnation = client.Stats().incarnation();
  }

  // Killed between the samples and the trainer's commit.
  kill_and_restart(buffer, 1);
  ASSERT_NE(buffer.process, nullptr);
  {
    Client client(buffer.grpc);
    EXPECT_NE(client.Stats().incarnation(), first_incarnation);
    EXPECT_EQ(client.Stats().stats().retained_groups(), 4);
    grpc::Status status;
    bool replayed = false;
    EXPECT_EQ(client.Sample(1, &status, &replayed), step1);
    EXPECT_TRUE(replayed);
    EXPECT_EQ(client.Sample(2, &status, &replayed), step2);
    EXPECT_TRUE(replayed);
    grpc::ClientContext context;
    v1::CommitTrainedStepsRequest commit;
    commit.set_run_id(kStepsRun);
    commit.set_step(1);
    v1::CommitTrainedStepsResponse committed;
    ASSERT_TRUE(client.stub->CommitTrainedSteps(&context, commit, &committed).ok());
    EXPECT_EQ(committed.released_groups(), 2);
  }

  // Killed after the commit: step 1 stays gone, step 2 stays, step 3 is new.
  kill_and_restart(buffer, 2);
  ASSERT_NE(buffer.process, nullptr);
  {
    Client client(buffer.grpc);
    grpc::Status status;
    bool replayed = false;
    EXPECT_TRUE(client.Sample(1, &status, &replayed).empty());
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(client.Sample(2, &status, &replayed), step2);
    EXPECT_TRUE(replayed);
    const std::vector<std::string> step3 = client.Sample(3, &status, &replayed);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(replayed);
    EXPECT_EQ(step3.size(), 2u);
    const v1::BufferStats stats = client.Stats().stats();
    EXPECT_EQ(stats.committed_step(), 1);
    EXPECT_EQ(stats.last_recorded_step(), 3);
    EXPECT_EQ(stats.sampled_groups(), 6);
  }
  ASSERT_TRUE(buffer.process->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> exit = buffer.process->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(exit->ToString(), "exited with code 0") << testing::ReadFile(buffer.log_path);
}

// The wait itself, made deterministic: this test holds the data directory's
// lock (as a dying buffer would) while a buffer starts. The buffer waits,
// saying for whom, and starts once the lock is let go; a second buffer on
// the directory of a live one is still refused, naming its pid.
TEST(ReplayBufferDurabilityTest, AStartingBufferWaitsForTheLockAndASecondLiveOneIsRefused) {
  const std::string dir = testing::MakeTempDir("lock-wait");
  const std::string data_dir = dir + "/data";
  fs::create_directories(data_dir + "/wal");
  // O_CLOEXEC: a child inheriting the descriptor would hold the lock too.
  const int lock_fd = ::open((data_dir + "/wal/LOCK").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(lock_fd, 0);
  ASSERT_EQ(::flock(lock_fd, LOCK_EX | LOCK_NB), 0);
  const std::string holder = absl::StrCat("pid ", getpid(), "\n");
  ASSERT_EQ(::pwrite(lock_fd, holder.data(), holder.size(), 0),
            static_cast<ssize_t>(holder.size()));

  SubprocessOptions options;
  options.argv = {testing::BinDir() + "/sluice-replay-buffer", "--listen=127.0.0.1:0",
                  "--metrics-port=0", "--ready-fd=3", "--data-dir=" + data_dir,
                  "--data-dir-lock-wait-ms=60000"};
  options.log_path = dir + "/first.log";
  options.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> first = Subprocess::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  // Still waiting (not refused, not serving) while the lock is held...
  absl::StatusOr<std::string> ready = (*first)->WaitReady(absl::Now() + absl::Milliseconds(700));
  EXPECT_EQ(ready.status().code(), absl::StatusCode::kDeadlineExceeded)
      << ready.status() << "\n" << testing::ReadFile(options.log_path);
  EXPECT_THAT(testing::ReadFile(options.log_path),
              ::testing::HasSubstr(absl::StrCat("pid ", getpid())));
  // ...and serving once it is let go.
  ::close(lock_fd);
  ready = (*first)->WaitReady(Soon());
  ASSERT_TRUE(ready.ok()) << ready.status() << "\n" << testing::ReadFile(options.log_path);

  options.argv.back() = "--data-dir-lock-wait-ms=300";
  options.log_path = dir + "/second.log";
  absl::StatusOr<std::unique_ptr<Subprocess>> second = Subprocess::Start(options);
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<ExitStatus> refused = (*second)->Wait(Soon());
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->ToString(), "exited with code 1");
  EXPECT_THAT(testing::ReadFile(options.log_path),
              ::testing::HasSubstr(absl::StrCat("is locked by pid ", (*first)->pid())));

  ASSERT_TRUE((*first)->Signal(SIGTERM).ok());
  absl::StatusOr<ExitStatus> exit = (*first)->Wait(Soon());
  ASSERT_TRUE(exit.ok());
  EXPECT_EQ(exit->ToString(), "exited with code 0") << testing::ReadFile(dir + "/first.log");
}

// Polls `probe` until it returns true or `timeout` passes (the buffer looks
// at its log every write_retry_interval, a second). False at the deadline.
bool Eventually(const std::function<bool()>& probe, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!probe()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(100));
  }
  return true;
}

// The data directory on a small real file system (a tmpfs), filled while
// groups are inserted: the buffer refuses what it cannot store (nothing
// acknowledged is lost), says so in its health, its statistics and its own
// log, and once space is freed it stores again by itself, with no restart;
// a restart then finds every group it acknowledged.
TEST(ReplayBufferDurabilityTest, AFullDataDirectoryIsReportedAndRecoversOnceFreed) {
  const std::string dir = testing::MakeTempDir("full-disk");
  absl::StatusOr<std::unique_ptr<testing::TmpfsMount>> disk =
      testing::TmpfsMount::Mount(dir + "/disk", 16 << 20);
  if (!disk.ok()) {
    testing::SkipOrFailWithoutRoot(disk.status(), "a full data directory (a small tmpfs)");
    return;
  }
  const std::string data_dir = dir + "/disk/data";
  const std::vector<std::string> flags = {"--fsync=always", "--snapshot-interval-s=0"};
  Buffer buffer = StartBuffer(data_dir, dir + "/buffer.log", flags);
  ASSERT_NE(buffer.process, nullptr);
  auto channel = grpc::CreateChannel(buffer.grpc, grpc::InsecureChannelCredentials());
  auto stub = v1::ReplayBufferService::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::ConfigureRunRequest request;
    request.set_run_id(kRun);
    request.set_batch_size_groups(4);
    request.set_max_staleness(1000000);
    request.set_group_size(2);
    v1::ConfigureRunResponse response;
    const grpc::Status status = stub->ConfigureRun(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  int next_group = 0;
  // Inserts one group of about 16 KiB; returns its status.
  const auto insert = [&]() {
    v1::InsertGroupsRequest request;
    *request.add_groups() = replay_buffer::testing::MakeGroup(kRun, absl::StrCat("g", next_group++),
                                                              2, 0, /*tokens=*/1000);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = stub->InsertGroups(&context);
    EXPECT_TRUE(stream->Write(request));
    stream->WritesDone();
    v1::InsertGroupsResponse response;
    const bool answered = stream->Read(&response);
    EXPECT_TRUE(stream->Finish().ok());
    return answered && response.results_size() == 1 ? response.results(0) : v1::InsertGroupResult();
  };
  const auto stats = [&]() {
    grpc::ClientContext context;
    v1::GetStatsRequest request;
    request.set_run_id(kRun);
    v1::GetStatsResponse response;
    EXPECT_TRUE(stub->GetStats(&context, request, &response).ok());
    return response;
  };
  const auto health = [&](const std::string& service) {
    return runtime::CheckHealth(buffer.grpc, service, absl::Seconds(20)).value_or("unreachable");
  };
  std::vector<std::string> acknowledged;
  const auto insert_acknowledged = [&]() {
    const v1::InsertGroupResult result = insert();
    if (result.status() == v1::INSERT_STATUS_STORED) {
      acknowledged.push_back(result.idempotency_key());
    }
    return result;
  };
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(insert_acknowledged().status(), v1::INSERT_STATUS_STORED);
  }

  // Ballast takes all but ~200 KiB of the disk; the log takes the rest.
  const std::string ballast = dir + "/disk/ballast";
  {
    std::ofstream out(ballast, std::ios::binary);
    const std::string chunk(1 << 16, 'b');
    const int64_t chunks =
        ((*disk)->FreeBytes() - (200 << 10)) / static_cast<int64_t>(chunk.size());
    for (int64_t i = 0; i < chunks; ++i) out << chunk;
  }
  v1::InsertGroupResult refused;
  for (int i = 0; i < 200; ++i) {
    refused = insert_acknowledged();
    if (refused.status() != v1::INSERT_STATUS_STORED) break;
  }
  ASSERT_EQ(refused.status(), v1::INSERT_STATUS_RETRYABLE_ERROR) << refused.message();
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("No space left on device"));

  // Said: NOT_SERVING for the service (the process is alive: the server's
  // overall health stays SERVING), the error in GetStats, and in its log.
  EXPECT_TRUE(Eventually([&] { return health("sluice.v1.ReplayBufferService") == "NOT_SERVING"; },
                         absl::Seconds(30)));
  EXPECT_EQ(health(""), "SERVING");
  const v1::GetStatsResponse full = stats();
  EXPECT_THAT(full.write_error(), ::testing::HasSubstr("No space left on device"));
  EXPECT_TRUE(full.has_write_error_since());
  EXPECT_THAT(testing::ReadFile(buffer.log_path),
              ::testing::HasSubstr("replay buffer cannot write its data directory"));
  // Still full: still refused.
  EXPECT_EQ(insert_acknowledged().status(), v1::INSERT_STATUS_RETRYABLE_ERROR);

  // Space freed: it stores again by itself.
  ASSERT_TRUE(fs::remove(ballast));
  const absl::Time freed_at = absl::Now();
  EXPECT_TRUE(Eventually([&] { return health("sluice.v1.ReplayBufferService") == "SERVING"; },
                         absl::Seconds(30)))
      << testing::ReadFile(buffer.log_path);
  std::printf("full data directory: %zu groups acknowledged before it filled; SERVING again %s "
              "after space was freed, without a restart\n",
              acknowledged.size(),
              absl::FormatDuration(absl::Trunc(absl::Now() - freed_at, absl::Milliseconds(10)))
                  .c_str());
  EXPECT_EQ(stats().write_error(), "");
  EXPECT_THAT(testing::ReadFile(buffer.log_path),
              ::testing::HasSubstr("replay buffer writes its data directory again"));
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(insert_acknowledged().status(), v1::INSERT_STATUS_STORED);
  }

  // And every acknowledged group survives kill -9.
  ASSERT_TRUE(buffer.process->Signal(SIGKILL).ok());
  ASSERT_TRUE(buffer.process->Wait(Soon()).ok());
  Buffer restarted = StartBuffer(data_dir, dir + "/restarted.log", flags);
  ASSERT_NE(restarted.process, nullptr);
  int64_t held = 0;
  const std::set<std::string> keys = HeldKeys(restarted.grpc, &held);
  EXPECT_EQ(held, static_cast<int64_t>(acknowledged.size()));
  for (const std::string& key : acknowledged) EXPECT_EQ(keys.count(key), 1u) << key;
  ASSERT_TRUE(restarted.process->Signal(SIGTERM).ok());
  ASSERT_TRUE(restarted.process->Wait(Soon()).ok());
}

}  // namespace
}  // namespace sluice
