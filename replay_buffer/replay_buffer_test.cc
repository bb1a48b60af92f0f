#include "replay_buffer/replay_buffer.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/run/run_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::MakeGroup;

RunConfig Config(const std::string& run_id, int32_t batch_size = 4, int32_t max_staleness = 2) {
  RunConfig config;
  config.run_id = run_id;
  config.batch_size_groups = batch_size;
  config.max_staleness = max_staleness;
  config.group_size = 2;
  return config;
}

std::unique_ptr<ReplayBuffer> MakeBuffer() {
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> buffer = ReplayBuffer::Create();
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return std::move(buffer).value();
}

TEST(ReplayBufferTest, ConfigureRunCreatesOnceAndIsIdempotent) {
  auto buffer = MakeBuffer();
  absl::StatusOr<ReplayBuffer::ConfigureResult> first = buffer->ConfigureRun(Config("a"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->created);
  EXPECT_EQ(first->stats.gate.admission_limit, 12);
  ASSERT_EQ(buffer->Insert({MakeGroup("a", "g0", 2, 0)})[0].status, InsertStatus::kStored);

  absl::StatusOr<ReplayBuffer::ConfigureResult> again = buffer->ConfigureRun(Config("a"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->stats.size_groups, 1);  // stored groups are kept
}

TEST(ReplayBufferTest, ReconfiguringTheGateIsRefusedButTheBufferConfigIsReplaced) {
  auto buffer = MakeBuffer();
  ASSERT_TRUE(buffer->ConfigureRun(Config("a")).ok());
  absl::StatusOr<ReplayBuffer::ConfigureResult> other_batch = buffer->ConfigureRun(Config("a", 8));
  EXPECT_EQ(other_batch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other_batch.status().message()),
              HasSubstr("batch_size_groups: run a is configured with 4; it cannot change to 8"));
  EXPECT_EQ(buffer->ConfigureRun(Config("a", 4, 0)).status().code(),
            absl::StatusCode::kFailedPrecondition);

  RunConfig reconfigured = Config("a");
  reconfigured.buffer.set_max_times_sampled(3);
  reconfigured.initial_policy_version = 5;
  absl::StatusOr<ReplayBuffer::ConfigureResult> replaced = buffer->ConfigureRun(reconfigured);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(replaced->stats.config.buffer.max_times_sampled(), 3);
  EXPECT_EQ(replaced->stats.gate.policy_version, 5);
}

TEST(ReplayBufferTest, ConfigureRunValidationNamesEveryField) {
  auto buffer = MakeBuffer();
  RunConfig config = Config("a", -3, -1);
  config.group_size = 0;
  config.buffer.set_sampler(static_cast<v1::SamplerKind>(17));
  config.buffer.set_samples_per_insert(-1);
  config.buffer.set_priority_epsilon(-0.5);
  absl::Status status = buffer->ConfigureRun(config).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "batch_size_groups: must be > 0, got -3\n"
            "max_staleness: must be >= 0, got -1\n"
            "group_size: must be > 0, got 0\n"
            "buffer.sampler: unknown sampler kind 17\n"
            "buffer.priority_epsilon: must be >= 0 (0 = 0.01), got -0.5\n"
            "buffer.samples_per_insert: must be >= 0 (0 = off), got -1");
  config = Config("a");
  config.buffer.set_capacity_groups(2);
  EXPECT_THAT(std::string(buffer->ConfigureRun(config).status().message()),
              HasSubstr("buffer.capacity_groups: must be 0 (unbounded) or >= "
                        "max(batch_size_groups, min_size_to_sample_groups) = 4, got 2"));
  EXPECT_EQ(buffer->ConfigureRun(Config("")).status().message(), "run_id: required");
}

TEST(ReplayBufferTest, UnknownRunIsNotFoundAndUnknownRunInsert) {
  auto buffer = MakeBuffer();
  ASSERT_TRUE(buffer->ConfigureRun(Config("a")).ok());
  absl::StatusOr<std::shared_ptr<RunTable>> missing = buffer->GetRun("b");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("run_id: run \"b\""));

  std::vector<InsertResult> results = buffer->Insert(
      {MakeGroup("a", "g0", 2, 0), MakeGroup("b", "g0", 2, 0), MakeGroup("a", "g1", 2, 0)});
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].status, InsertStatus::kStored);
  EXPECT_EQ(results[1].status, InsertStatus::kUnknownRun);
  EXPECT_EQ(results[1].idempotency_key, "b/g0");
  EXPECT_THAT(results[1].message, HasSubstr("not configured"));
  EXPECT_EQ(results[2].status, InsertStatus::kStored);
  EXPECT_EQ(results[2].buffer_sequence, 2);
}

TEST(ReplayBufferTest, RunsAreIndependent) {
  auto buffer = MakeBuffer();
  ASSERT_TRUE(buffer->ConfigureRun(Config("a", 1)).ok());
  ASSERT_TRUE(buffer->ConfigureRun(Config("b", 1)).ok());
  ASSERT_EQ(buffer->Insert({MakeGroup("a", "g0", 2, 0)})[0].status, InsertStatus::kStored);
  ASSERT_EQ(buffer->Insert({MakeGroup("b", "g0", 2, 0)})[0].status, InsertStatus::kStored);
  ASSERT_TRUE((*buffer->GetRun("a"))->UpdatePolicyVersion(9).ok());
  EXPECT_EQ((*buffer->GetRun("a"))->Stats().size_groups, 0);  // evicted as stale
  EXPECT_EQ((*buffer->GetRun("b"))->Stats().size_groups, 1);
}

TEST(ReplayBufferTest, ShutdownReachesEveryTableAndRefusesNewRuns) {
  auto buffer = MakeBuffer();
  ASSERT_TRUE(buffer->ConfigureRun(Config("a")).ok());
  buffer->Shutdown();
  SampleRequest request;
  request.timeout = absl::Seconds(60);
  EXPECT_EQ((*buffer->GetRun("a"))->Sample(request).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(buffer->ConfigureRun(Config("b")).status().code(), absl::StatusCode::kUnavailable);
}

TEST(ReplayBufferTest, InvalidLeaseTtlIsRefused) {
  RunTableOptions options;
  options.lease_ttl = absl::ZeroDuration();
  EXPECT_EQ(ReplayBuffer::Create(options).status().message(), "lease_ttl_ms: must be > 0, got 0");
}

// In process, through the real files: what a buffer held is there after it
// is shut down and recreated on the same directory, whether it comes back
// from the final snapshot, or from an earlier snapshot plus the log (the
// newest snapshot removed, as if it had been damaged).
TEST(ReplayBufferTest, ADataDirectoryBringsEveryRunBack) {
  const std::string dir = ::testing::TempDir() + "/replay-buffer-durable-" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  DurabilityOptions durability;
  durability.data_dir = dir;
  durability.fsync_policy = durability::FsyncPolicy::kNever;
  durability.keep_snapshots = 3;
  RunStats before;
  {
    auto created = ReplayBuffer::Create({}, durability);
    ASSERT_TRUE(created.ok()) << created.status();
    ReplayBuffer& buffer = **created;
    RunConfig config = Config("a", 2);
    config.buffer.set_sampler(v1::SAMPLER_KIND_PRIORITIZED);
    ASSERT_TRUE(buffer.ConfigureRun(config).ok());
    ASSERT_TRUE(buffer.ConfigureRun(Config("b", 2)).ok());
    std::vector<v1::Group> groups;
    for (int i = 0; i < 6; ++i) groups.push_back(MakeGroup("a", "g" + std::to_string(i), 2, 0));
    for (const InsertResult& result : buffer.Insert(std::move(groups))) {
      ASSERT_EQ(result.status, InsertStatus::kStored) << result.message;
    }
    ASSERT_TRUE(buffer.SnapshotNow().ok());  // an older snapshot ...
    std::shared_ptr<RunTable> a = *buffer.GetRun("a");
    ASSERT_TRUE(a->Sample({.trainer_policy_version = 1, .timeout = absl::ZeroDuration()}).ok());
    ASSERT_TRUE(a->UpdatePolicyVersion(2).ok());
    ASSERT_EQ(buffer.Insert({MakeGroup("b", "h0", 2, 0)})[0].status, InsertStatus::kStored);
    before = a->Stats();
    EXPECT_GT(buffer.durability_stats().wal.records_appended, 8u);
  }  // ... then the final one, at shutdown
  const auto check = [&](const ReplayBuffer& buffer) {
    const RunStats after = (*buffer.GetRun("a"))->Stats();
    EXPECT_EQ(after.size_groups, 4);
    EXPECT_EQ(after.sampled_groups, before.sampled_groups);
    EXPECT_EQ(after.gate.accepted, before.gate.accepted);
    EXPECT_EQ(after.gate.policy_version, 2);
    EXPECT_EQ(after.config.buffer.sampler(), v1::SAMPLER_KIND_PRIORITIZED);
    EXPECT_EQ((*buffer.GetRun("b"))->Stats().size_groups, 1);
  };
  {
    auto restored = ReplayBuffer::Create({}, durability);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ((*restored)->restore_report().runs, 2);
    EXPECT_EQ((*restored)->restore_report().wal_records_replayed, 0);
    check(**restored);
    // A duplicate of a stored group is still a duplicate.
    EXPECT_EQ((*restored)->Insert({MakeGroup("a", "g5", 2, 2)})[0].status,
              InsertStatus::kDuplicate);
  }
  // Drop the newest snapshot: the older one plus the log give the same state.
  std::vector<std::string> snapshots;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/snapshots")) {
    if (entry.path().extension() == ".snap") snapshots.push_back(entry.path());
  }
  std::sort(snapshots.begin(), snapshots.end());
  ASSERT_GE(snapshots.size(), 2u);
  std::filesystem::remove(snapshots.back());
  auto replayed = ReplayBuffer::Create({}, durability);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_GT((*replayed)->restore_report().wal_records_replayed, 0);
  check(**replayed);
  replayed->reset();
  std::filesystem::remove_all(dir);
}

// In a child process (the file size limit binds the whole process): the
// log's segment may grow only a little, as on a nearly full disk. Inserts
// are stored until one no longer fits, then refused RETRYABLE_ERROR and the
// buffer reports it cannot write; once the limit is lifted (space freed)
// it recovers by itself and stores again, with no restart. Exits with the
// number of groups it stored (0 and 100+ are failures).
[[noreturn]] void FillTheDiskThenFreeIt(const std::string& dir) {
  ::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
  absl::Notification failed;
  absl::Notification recovered;
  DurabilityOptions durability;
  durability.data_dir = dir;
  durability.fsync_policy = durability::FsyncPolicy::kNever;
  durability.write_retry_interval = absl::Milliseconds(20);
  durability.on_write_health = [&](const absl::Status& status) {
    if (!status.ok() && !failed.HasBeenNotified()) failed.Notify();
    if (status.ok() && failed.HasBeenNotified() && !recovered.HasBeenNotified()) {
      recovered.Notify();
    }
  };
  auto created = ReplayBuffer::Create({}, durability);
  if (!created.ok()) ::_exit(101);
  std::unique_ptr<ReplayBuffer> buffer = *std::move(created);
  if (!buffer->ConfigureRun(Config("a", 4, 1000)).ok()) ::_exit(102);
  // Room for a few groups more than the segment holds now, but not for the
  // recovery's 64 KiB probe.
  const uint64_t used = buffer->durability_stats().wal.disk_bytes;
  const rlimit limit = {used + 20000, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(103);
  int stored = 0;
  int i = 0;
  for (; i < 50; ++i) {
    const InsertResult result =
        buffer->Insert({MakeGroup("a", absl::StrCat("g", i), 2, 0, /*tokens=*/300)})[0];
    if (result.status == InsertStatus::kStored) {
      ++stored;
      continue;
    }
    if (result.status != InsertStatus::kRetryableError) ::_exit(104);
    break;
  }
  if (stored == 0 || i == 50) ::_exit(105);
  if (!failed.WaitForNotificationWithTimeout(absl::Seconds(30))) ::_exit(106);
  if (buffer->write_health().error.ok()) ::_exit(107);
  // Still full: refused, and not recovered.
  if (buffer->Insert({MakeGroup("a", absl::StrCat("g", i), 2, 0, 300)})[0].status !=
      InsertStatus::kRetryableError) {
    ::_exit(108);
  }
  if (recovered.WaitForNotificationWithTimeout(absl::Milliseconds(200))) ::_exit(109);
  const rlimit lifted = {RLIM_INFINITY, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &lifted) != 0) ::_exit(110);
  if (!recovered.WaitForNotificationWithTimeout(absl::Seconds(30))) ::_exit(111);
  if (!buffer->write_health().error.ok()) ::_exit(112);
  if (buffer->Insert({MakeGroup("a", absl::StrCat("g", i), 2, 0, 300)})[0].status !=
      InsertStatus::kStored) {
    ::_exit(113);
  }
  ++stored;
  buffer.reset();
  ::_exit(stored);
}

TEST(ReplayBufferDeathTest, AFullDataDirectoryRefusesInsertsAndRecoversOnceFreed) {
  const std::string dir =
      ::testing::TempDir() + "/replay-buffer-full-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  int stored = 0;
  EXPECT_EXIT(
      FillTheDiskThenFreeIt(dir),
      [&](int status) {
        stored = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return stored > 0 && stored < 100;
      },
      "");
  // Every group it acknowledged is there after a restart, none it refused.
  DurabilityOptions durability;
  durability.data_dir = dir;
  durability.fsync_policy = durability::FsyncPolicy::kNever;
  auto restored = ReplayBuffer::Create({}, durability);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*restored)->GetRun("a").value()->Stats().size_groups, stored);
  restored->reset();
  std::filesystem::remove_all(dir);
}

// The batches of trainer steps not committed yet come back with the rest,
// from the final snapshot as from the log: the same groups for the same
// steps, still counted against the memory budget.
TEST(ReplayBufferTest, RecordedStepsComeBackFromTheSnapshotAndTheLog) {
  const std::string dir = ::testing::TempDir() + "/replay-buffer-steps-" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  DurabilityOptions durability;
  durability.data_dir = dir;
  durability.fsync_policy = durability::FsyncPolicy::kNever;
  durability.keep_snapshots = 3;
  const auto ids = [](const absl::StatusOr<SampleResult>& batch) {
    std::vector<std::string> out;
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok()) return out;
    for (const SampledGroup& sampled : batch->groups) out.push_back(sampled.group->group_id());
    return out;
  };
  const auto step = [](int64_t s) {
    return SampleRequest{.timeout = absl::ZeroDuration(), .step = s};
  };
  std::vector<std::string> step2, step3;
  int64_t used = 0;
  {
    auto created = ReplayBuffer::Create({}, durability);
    ASSERT_TRUE(created.ok()) << created.status();
    ReplayBuffer& buffer = **created;
    ASSERT_TRUE(buffer.ConfigureRun(Config("a", 2)).ok());
    std::vector<v1::Group> groups;
    for (int i = 0; i < 8; ++i) groups.push_back(MakeGroup("a", "g" + std::to_string(i), 2, 0));
    for (const InsertResult& result : buffer.Insert(std::move(groups))) {
      ASSERT_EQ(result.status, InsertStatus::kStored) << result.message;
    }
    std::shared_ptr<RunTable> a = *buffer.GetRun("a");
    ASSERT_EQ(ids(a->Sample(step(1))).size(), 2u);
    step2 = ids(a->Sample(step(2)));
    ASSERT_TRUE(buffer.SnapshotNow().ok());  // an older snapshot: steps 1 and 2
    ASSERT_TRUE(a->CommitTrainedSteps(1).ok());
    step3 = ids(a->Sample(step(3)));
    used = buffer.memory_used_bytes();
    EXPECT_EQ(a->Stats().retained_groups, 4);
  }  // ... then the final one, at shutdown
  const auto check = [&](ReplayBuffer& buffer) {
    std::shared_ptr<RunTable> a = *buffer.GetRun("a");
    EXPECT_EQ(buffer.memory_used_bytes(), used);
    EXPECT_EQ(a->Stats().retained_groups, 4);
    EXPECT_EQ(ids(a->Sample(step(2))), step2);
    EXPECT_EQ(ids(a->Sample(step(3))), step3);
    EXPECT_EQ(a->Sample(step(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  };
  {
    auto restored = ReplayBuffer::Create({}, durability);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_EQ((*restored)->restore_report().wal_records_replayed, 0);
    check(**restored);
  }
  std::vector<std::string> snapshots;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/snapshots")) {
    if (entry.path().extension() == ".snap") snapshots.push_back(entry.path());
  }
  std::sort(snapshots.begin(), snapshots.end());
  ASSERT_GE(snapshots.size(), 2u);
  // The newest snapshots gone: the older one and the log.
  for (size_t i = 1; i < snapshots.size(); ++i) std::filesystem::remove(snapshots[i]);
  auto replayed = ReplayBuffer::Create({}, durability);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_GT((*replayed)->restore_report().wal_records_replayed, 0);
  check(**replayed);
  replayed->reset();
  std::filesystem::remove_all(dir);
}

// A log damaged in the middle refuses to start (DATA_LOSS naming the file)
// and leaves the directory as it was: no snapshot of the partial state.
TEST(ReplayBufferTest, ADamagedLogIsRefusedAndLeftAlone) {
  const std::string dir = ::testing::TempDir() + "/replay-buffer-damaged-" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  DurabilityOptions durability;
  durability.data_dir = dir;
  durability.fsync_policy = durability::FsyncPolicy::kNever;
  {
    auto buffer = ReplayBuffer::Create({}, durability);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_TRUE((*buffer)->ConfigureRun(Config("a", 2)).ok());
    for (int i = 0; i < 20; ++i) {
      ASSERT_EQ((*buffer)->Insert({MakeGroup("a", "g" + std::to_string(i), 2, 0)})[0].status,
                InsertStatus::kStored);
    }
  }
  // No snapshot may cover the log, or it would not be read: remove them.
  std::filesystem::remove_all(dir + "/snapshots");
  std::string segment;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/wal")) {
    if (entry.path().extension() == ".log") segment = entry.path();
  }
  ASSERT_FALSE(segment.empty());
  const auto size = std::filesystem::file_size(segment);
  {
    std::fstream file(segment, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(size / 2));
    file.put('\x5a');
    file.put('\x5a');
  }
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> refused = ReplayBuffer::Create({}, durability);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("wal-"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/snapshots") &&
               !std::filesystem::is_empty(dir + "/snapshots"));
  std::filesystem::remove_all(dir);
}

// ---- the memory budget ----------------------------------------------------

std::unique_ptr<ReplayBuffer> MakeBufferWithBudget(int64_t budget_bytes) {
  RunTableOptions options;
  options.memory = std::make_shared<MemoryAccount>(budget_bytes);
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> buffer = ReplayBuffer::Create(options);
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  return std::move(buffer).value();
}

// What one MakeGroup("a", "gN", 2, 0) group takes in a table.
int64_t GroupBytes() {
  auto buffer = MakeBuffer();
  EXPECT_TRUE(buffer->ConfigureRun(Config("a")).ok());
  EXPECT_EQ(buffer->Insert({MakeGroup("a", "g9", 2, 0)})[0].status, InsertStatus::kStored);
  return (*buffer->GetRun("a"))->Stats().size_bytes;
}

TEST(ReplayBufferMemoryTest, AnInsertPastTheBudgetIsRetryableAndFitsOnceTheTrainerSamples) {
  const int64_t group = GroupBytes();
  ASSERT_GT(group, 0);
  auto buffer = MakeBufferWithBudget(2 * group + group / 2);
  ASSERT_TRUE(buffer->ConfigureRun(Config("a", 2)).ok());
  const std::vector<InsertResult> results = buffer->Insert(
      {MakeGroup("a", "g0", 2, 0), MakeGroup("a", "g1", 2, 0), MakeGroup("a", "g2", 2, 0)});
  EXPECT_EQ(results[0].status, InsertStatus::kStored);
  EXPECT_EQ(results[1].status, InsertStatus::kStored);
  EXPECT_EQ(results[2].status, InsertStatus::kRetryableError);
  EXPECT_THAT(results[2].message, HasSubstr("over the memory budget"));
  EXPECT_THAT(results[2].message, HasSubstr("retry with the same idempotency key"));
  EXPECT_EQ(buffer->memory_used_bytes(), 2 * group);
  EXPECT_EQ(buffer->memory_budget_bytes(), 2 * group + group / 2);
  const RunStats stats = (*buffer->GetRun("a"))->Stats();
  EXPECT_EQ(stats.size_groups, 2);
  EXPECT_EQ(stats.retryable_insert_errors, 1);

  // The trainer takes the batch (each group sampled once): the space is back.
  ASSERT_TRUE((*buffer->GetRun("a"))
                  ->Sample({.trainer_policy_version = 0, .timeout = absl::ZeroDuration()})
                  .ok());
  EXPECT_EQ(buffer->memory_used_bytes(), 0);
  EXPECT_EQ(buffer->Insert({MakeGroup("a", "g2", 2, 0)})[0].status, InsertStatus::kStored);
}

// The account is the sum of the tables' size_bytes through inserts,
// samples and stale evictions, over several runs.
TEST(ReplayBufferMemoryTest, UsedBytesIsWhatEveryTableHolds) {
  auto buffer = MakeBufferWithBudget(int64_t{1} << 30);
  ASSERT_TRUE(buffer->ConfigureRun(Config("a", 2, 0)).ok());
  ASSERT_TRUE(buffer->ConfigureRun(Config("b", 2)).ok());
  const auto held = [&] {
    return (*buffer->GetRun("a"))->Stats().size_bytes + (*buffer->GetRun("b"))->Stats().size_bytes;
  };
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(buffer->Insert({MakeGroup("a", "a" + std::to_string(i), 2, 0, 10 + i),
                              MakeGroup("b", "b" + std::to_string(i), 2, 0, 20)})[1]
                  .status,
              InsertStatus::kStored);
  }
  EXPECT_GT(buffer->memory_used_bytes(), 0);
  EXPECT_EQ(buffer->memory_used_bytes(), held());
  ASSERT_TRUE((*buffer->GetRun("b"))
                  ->Sample({.trainer_policy_version = 0, .timeout = absl::ZeroDuration()})
                  .ok());
  EXPECT_EQ(buffer->memory_used_bytes(), held());
  ASSERT_TRUE((*buffer->GetRun("a"))->UpdatePolicyVersion(1).ok());  // every "a" group stale
  EXPECT_EQ((*buffer->GetRun("a"))->Stats().size_groups, 0);
  EXPECT_EQ(buffer->memory_used_bytes(), held());
  EXPECT_EQ(buffer->memory_used_bytes(), (*buffer->GetRun("b"))->Stats().size_bytes);
}

TEST(ReplayBufferMemoryTest, ConfigureRunRefusesANewTableThatCannotFitWhatIsLeft) {
  // (eta 2 + 1 + 1) x B 4 = 16 groups of 2 x 4,000 tokens: about 2 MiB.
  RunConfig big = Config("big");
  big.max_sequence_tokens = 4000;
  const int64_t estimate = 16 * run::StoredGroupBytes(2, 4000);
  {
    auto buffer = MakeBufferWithBudget(estimate - 1);
    absl::StatusOr<ReplayBuffer::ConfigureResult> refused = buffer->ConfigureRun(big);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
    EXPECT_THAT(std::string(refused.status().message()),
                AllOf(HasSubstr("replay buffer: the run needs about 2.0 MiB"),
                      HasSubstr("16 groups"), HasSubstr("lower algorithm.batch_size_groups"),
                      HasSubstr("held by other runs")));
    EXPECT_EQ(buffer->GetRun("big").status().code(), absl::StatusCode::kNotFound);
    // Unknown length: nothing to estimate, the inserts are checked instead.
    big.max_sequence_tokens = 0;
    EXPECT_TRUE(buffer->ConfigureRun(big).ok());
    big.max_sequence_tokens = 4000;
  }
  // It fits an empty buffer, but not next to what another run holds.
  auto buffer = MakeBufferWithBudget(estimate + 100);
  ASSERT_TRUE(buffer->ConfigureRun(Config("small")).ok());
  ASSERT_EQ(buffer->Insert({MakeGroup("small", "g", 2, 0)})[0].status, InsertStatus::kStored);
  absl::StatusOr<ReplayBuffer::ConfigureResult> refused = buffer->ConfigureRun(big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  ASSERT_TRUE((*buffer->GetRun("small"))
                  ->Sample({.batch_size_groups = 1,
                            .trainer_policy_version = 0,
                            .timeout = absl::ZeroDuration()})
                  .ok());
  EXPECT_TRUE(buffer->ConfigureRun(big).ok());
}

// Acknowledged groups are never dropped for the budget: a buffer restarted
// with a smaller one holds them all, and refuses inserts until they leave.
TEST(ReplayBufferMemoryTest, ARestoredBufferKeepsWhatItHeldPastASmallerBudget) {
  const std::string dir = ::testing::TempDir() + "/replay-buffer-memory-" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  DurabilityOptions durability;
  durability.data_dir = dir;
  durability.fsync_policy = durability::FsyncPolicy::kNever;
  int64_t held = 0;
  {
    RunTableOptions options;
    options.memory = std::make_shared<MemoryAccount>(int64_t{1} << 30);
    auto buffer = ReplayBuffer::Create(options, durability);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_TRUE((*buffer)->ConfigureRun(Config("a", 4)).ok());
    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ((*buffer)->Insert({MakeGroup("a", "g" + std::to_string(i), 2, 0)})[0].status,
                InsertStatus::kStored);
    }
    held = (*buffer)->memory_used_bytes();
  }
  RunTableOptions options;
  options.memory = std::make_shared<MemoryAccount>(held / 2);
  auto restored = ReplayBuffer::Create(options, durability);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ((*(*restored)->GetRun("a"))->Stats().size_groups, 4);
  EXPECT_EQ((*restored)->memory_used_bytes(), held);
  EXPECT_EQ((*restored)->Insert({MakeGroup("a", "g9", 2, 0)})[0].status,
            InsertStatus::kRetryableError);
  restored->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice::replay_buffer
