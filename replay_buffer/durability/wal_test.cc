#include "replay_buffer/durability/wal.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/durability/record_format.h"
#include "replay_buffer/durability/test_util.h"

namespace sluice::replay_buffer::durability {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::TempDirectory;

struct Record {
  uint64_t lsn;
  std::string payload;
  bool operator==(const Record& other) const {
    return lsn == other.lsn && payload == other.payload;
  }
};

std::ostream& operator<<(std::ostream& os, const Record& record) {
  return os << "{" << record.lsn << ", \"" << record.payload.substr(0, 20) << "\"}";
}

// Every record with LSN >= from_lsn, or the error.
absl::StatusOr<std::vector<Record>> ReadAll(const std::string& dir, uint64_t from_lsn = 0,
                                            WalReadResult* result_out = nullptr) {
  std::vector<Record> records;
  absl::StatusOr<WalReadResult> result =
      ReadWal(dir, from_lsn, [&](uint64_t lsn, absl::string_view payload) {
        records.push_back({lsn, std::string(payload)});
        return absl::OkStatus();
      });
  if (!result.ok()) return result.status();
  EXPECT_EQ(result->records, records.size());
  if (result_out != nullptr) *result_out = *result;
  return records;
}

WalOptions NoSync() {
  WalOptions options;
  options.fsync_policy = FsyncPolicy::kNever;
  return options;
}

std::unique_ptr<WalWriter> OpenOrDie(const std::string& dir, WalOptions options) {
  absl::StatusOr<std::unique_ptr<WalWriter>> writer = WalWriter::Open(dir, std::move(options));
  EXPECT_TRUE(writer.ok()) << writer.status();
  return writer.ok() ? *std::move(writer) : nullptr;
}

std::string Payload(uint64_t i, size_t size = 40) {
  std::string payload = absl::StrCat("record-", i, "-");
  payload.resize(size, static_cast<char>('a' + i % 26));
  return payload;
}

TEST(WalTest, AppendedRecordsReadBackInOrder) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.path(), NoSync());
  ASSERT_NE(writer, nullptr);
  EXPECT_EQ(writer->recovery().next_lsn, kFirstLsn);
  EXPECT_EQ(writer->Append("one").value(), 1u);
  EXPECT_EQ(writer->Append("").value(), 2u);
  const std::vector<std::string> batch = {"three", std::string(200000, 'z'), "five"};
  EXPECT_EQ(writer->Append(absl::MakeConstSpan(batch)).value(), 3u);
  const std::vector<absl::string_view> views = {"six", "seven"};
  EXPECT_EQ(writer->Append(absl::MakeConstSpan(views)).value(), 6u);
  EXPECT_EQ(writer->next_lsn(), 8u);

  WalReadResult result;
  EXPECT_THAT(ReadAll(dir.path(), 0, &result).value(),
              ElementsAre(Record{1, "one"}, Record{2, ""}, Record{3, "three"},
                          Record{4, std::string(200000, 'z')}, Record{5, "five"}, Record{6, "six"},
                          Record{7, "seven"}));
  EXPECT_EQ(result.next_lsn, 8u);
  EXPECT_EQ(result.torn_tail_bytes, 0u);
  // From the middle.
  EXPECT_THAT(ReadAll(dir.path(), 6).value(), ElementsAre(Record{6, "six"}, Record{7, "seven"}));
  EXPECT_TRUE(ReadAll(dir.path(), 100).value().empty());
}

TEST(WalTest, CountsBytesRecordsAndSegments) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.path(), NoSync());
  ASSERT_TRUE(writer->Append("12345").ok());
  ASSERT_TRUE(writer->Append(std::vector<std::string>{"a", "bc"}).ok());
  const WalStats stats = writer->stats();
  EXPECT_EQ(stats.records_appended, 3u);
  EXPECT_EQ(stats.bytes_appended, 3 * kRecordHeaderBytes + 8);
  EXPECT_EQ(stats.disk_bytes, stats.bytes_appended);
  EXPECT_EQ(stats.segment_count, 1u);
  EXPECT_EQ(stats.fsyncs, 0u);  // kNever
  EXPECT_EQ(stats.next_lsn, 4u);
  EXPECT_EQ(testing_util::SizeOf(dir.Sub(WalSegmentFileName(1))), stats.disk_bytes);
}

TEST(WalTest, EmptyOrMissingDirectoryIsAnEmptyLog) {
  TempDirectory dir;
  WalReadResult result;
  EXPECT_TRUE(ReadAll(dir.Sub("missing"), 0, &result).value().empty());
  EXPECT_EQ(result.next_lsn, kFirstLsn);
  EXPECT_TRUE(ReadAll(dir.path()).value().empty());
}

TEST(WalTest, OpenCreatesNestedDirectory) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.Sub("a/b/wal"), WalOptions());
  ASSERT_NE(writer, nullptr);
  ASSERT_TRUE(writer->Append("x").ok());
  EXPECT_THAT(testing_util::ListNames(dir.Sub("a/b/wal")),
              ElementsAre("LOCK", WalSegmentFileName(1)));
}

TEST(WalTest, LsnsContinueAcrossReopen) {
  TempDirectory dir;
  for (int round = 0; round < 3; ++round) {
    auto writer = OpenOrDie(dir.path(), WalOptions());
    ASSERT_NE(writer, nullptr);
    EXPECT_EQ(writer->recovery().next_lsn, 1u + 2 * round);
    EXPECT_EQ(writer->recovery().truncated_bytes, 0u);
    EXPECT_EQ(writer->Append(Payload(2 * round)).value(), 1u + 2 * round);
    EXPECT_EQ(writer->Append(Payload(2 * round + 1)).value(), 2u + 2 * round);
    ASSERT_TRUE(writer->Close().ok());
    EXPECT_FALSE(writer->Append("after close").ok());
  }
  const std::vector<Record> records = ReadAll(dir.path()).value();
  ASSERT_EQ(records.size(), 6u);
  for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(records[i], (Record{i + 1, Payload(i)}));
}

TEST(WalTest, SecondWriterOnTheSameDirectoryIsRefused) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.path(), NoSync());
  absl::StatusOr<std::unique_ptr<WalWriter>> second = WalWriter::Open(dir.path(), NoSync());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("LOCK"));
  writer.reset();
  EXPECT_TRUE(WalWriter::Open(dir.path(), NoSync()).ok());
}

TEST(WalTest, OpenWaitsForTheHolderToReleaseTheLock) {
  // As after kill -9: the previous writer still holds the lock for a
  // moment. Open waits for it rather than failing.
  TempDirectory dir;
  auto holder = OpenOrDie(dir.path(), NoSync());
  ASSERT_TRUE(holder->Append("before").ok());
  WalOptions options = NoSync();
  options.lock_wait = absl::Seconds(30);
  absl::Mutex mu;
  std::vector<std::string> waited_for;
  options.lock_wait_observer = [&](const std::string& who) {
    absl::MutexLock lock(&mu);
    waited_for.push_back(who);
  };
  absl::Notification opened;
  absl::StatusOr<std::unique_ptr<WalWriter>> second;
  std::thread opener([&] {
    second = WalWriter::Open(dir.path(), options);
    opened.Notify();
  });
  EXPECT_FALSE(opened.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  holder.reset();  // releases the lock
  EXPECT_TRUE(opened.WaitForNotificationWithTimeout(absl::Seconds(10)));
  opener.join();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->next_lsn(), 2u);
  absl::MutexLock lock(&mu);
  EXPECT_THAT(waited_for, ElementsAre(absl::StrCat("pid ", getpid())));
}

TEST(WalTest, ALiveHolderIsStillRefusedAfterTheWaitNamingItsPid) {
  TempDirectory dir;
  auto holder = OpenOrDie(dir.path(), NoSync());
  WalOptions options = NoSync();
  options.lock_wait = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<WalWriter>> second = WalWriter::Open(dir.path(), options);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("LOCK is locked by pid ", getpid())));
  EXPECT_THAT(second.status().message(), HasSubstr("still after waiting"));
  // The holder is untouched.
  EXPECT_TRUE(holder->Append("still mine").ok());
}

TEST(WalTest, NegativeLockWaitIsInvalid) {
  TempDirectory dir;
  WalOptions options = NoSync();
  options.lock_wait = absl::Milliseconds(-1);
  EXPECT_EQ(WalWriter::Open(dir.path(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WalTest, InvalidOptionsAndBatchesAreRejected) {
  TempDirectory dir;
  WalOptions options;
  options.segment_size_bytes = 0;
  EXPECT_EQ(WalWriter::Open(dir.path(), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = WalOptions();
  options.fsync_interval = absl::ZeroDuration();
  EXPECT_THAT(options.Validate().message(), HasSubstr("fsync_interval"));
  auto writer = OpenOrDie(dir.path(), NoSync());
  EXPECT_EQ(writer->Append(absl::Span<const absl::string_view>()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Not sticky.
  EXPECT_EQ(writer->Append("fine").value(), 1u);
}

TEST(WalTest, CallbackErrorStopsTheRead) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.path(), NoSync());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(writer->Append(Payload(i)).ok());
  int calls = 0;
  const absl::StatusOr<WalReadResult> result =
      ReadWal(dir.path(), 0, [&](uint64_t lsn, absl::string_view) {
        ++calls;
        return lsn == 3 ? absl::CancelledError("enough") : absl::OkStatus();
      });
  EXPECT_EQ(result.status(), absl::CancelledError("enough"));
  EXPECT_EQ(calls, 3);
}

// Cuts the log at every offset inside its last record, as a crash during
// that record's write(2) would: the complete records survive, the cut one
// is dropped (it was never acknowledged), and appending carries on.
TEST(WalTest, TornTailIsTruncatedAtEveryOffsetOfTheLastRecord) {
  TempDirectory original;
  std::vector<uint64_t> record_ends;
  {
    auto writer = OpenOrDie(original.path(), NoSync());
    for (uint64_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(writer->Append(Payload(i, 30 + 10 * i)).ok());
      record_ends.push_back(writer->stats().disk_bytes);
    }
  }
  const std::string segment = WalSegmentFileName(1);
  const std::string content = testing_util::ReadFileOrDie(original.Sub(segment));
  const uint64_t last_start = record_ends[2];
  ASSERT_EQ(content.size(), record_ends[3]);

  for (uint64_t cut = last_start; cut < content.size(); ++cut) {
    SCOPED_TRACE(absl::StrCat("cut at ", cut));
    TempDirectory dir;
    testing_util::WriteFileOrDie(dir.Sub(segment), content.substr(0, cut));

    WalReadResult result;
    const std::vector<Record> before = ReadAll(dir.path(), 0, &result).value();
    ASSERT_EQ(before.size(), 3u);
    EXPECT_EQ(before[2], (Record{3, Payload(2, 50)}));
    EXPECT_EQ(result.next_lsn, 4u);
    EXPECT_EQ(result.torn_tail_bytes, cut - last_start);
    if (cut > last_start) {
      EXPECT_THAT(result.torn_tail, HasSubstr(absl::StrCat("offset ", last_start)));
    }

    auto writer = OpenOrDie(dir.path(), NoSync());
    ASSERT_NE(writer, nullptr);
    EXPECT_EQ(writer->recovery().truncated_bytes, cut - last_start);
    EXPECT_EQ(writer->recovery().next_lsn, 4u);
    if (cut > last_start) {
      EXPECT_EQ(writer->recovery().truncated_at_offset, last_start);
      EXPECT_EQ(writer->recovery().truncated_segment, dir.Sub(segment));
    }
    EXPECT_EQ(writer->Append("after the crash").value(), 4u);
    writer.reset();

    const std::vector<Record> after = ReadAll(dir.path(), 0, &result).value();
    ASSERT_EQ(after.size(), 4u);
    EXPECT_EQ(after[3], (Record{4, "after the crash"}));
    EXPECT_EQ(result.torn_tail_bytes, 0u);
  }
}

TEST(WalTest, DamagedFinalRecordPayloadIsATornTail) {
  TempDirectory dir;
  {
    auto writer = OpenOrDie(dir.path(), NoSync());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(writer->Append(Payload(i)).ok());
  }
  const std::string path = dir.Sub(WalSegmentFileName(1));
  testing_util::FlipByte(path, testing_util::SizeOf(path) - 1);
  EXPECT_EQ(ReadAll(dir.path()).value().size(), 2u);
  auto writer = OpenOrDie(dir.path(), NoSync());
  EXPECT_EQ(writer->recovery().next_lsn, 3u);
  EXPECT_THAT(writer->recovery().truncation_reason, HasSubstr("CRC"));
}

TEST(WalTest, FlippedByteInTheMiddleIsDataLossNamingFileAndOffset) {
  TempDirectory dir;
  {
    auto writer = OpenOrDie(dir.path(), NoSync());
    for (int i = 0; i < 10; ++i) ASSERT_TRUE(writer->Append(Payload(i)).ok());
  }
  const std::string path = dir.Sub(WalSegmentFileName(1));
  const std::string pristine = testing_util::ReadFileOrDie(path);
  const uint64_t record_bytes = kRecordHeaderBytes + Payload(0).size();
  const uint64_t fourth = 3 * record_bytes;
  // One byte in a payload, then one in a header (its LSN field).
  for (uint64_t offset : {fourth + kRecordHeaderBytes + 7, fourth + 9}) {
    SCOPED_TRACE(offset);
    testing_util::WriteFileOrDie(path, pristine);
    testing_util::FlipByte(path, offset);
    const absl::Status status = ReadAll(dir.path()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(status.message(), HasSubstr(path));
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("offset ", fourth)));
    // The writer refuses to append after damaged acknowledged data.
    const absl::Status opened = WalWriter::Open(dir.path(), NoSync()).status();
    EXPECT_EQ(opened.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(opened.message(), HasSubstr(absl::StrCat("offset ", fourth)));
  }
}

WalOptions SmallSegments() {
  WalOptions options = NoSync();
  options.segment_size_bytes = 500;  // 7 records of 64 bytes
  return options;
}

TEST(WalTest, RotatesSegmentsAndRemovesThoseBeforeAnLsn) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.path(), SmallSegments());
  for (uint64_t i = 0; i < 50; ++i) ASSERT_EQ(writer->Append(Payload(i)).value(), i + 1);
  // 64-byte records, 7 per 500-byte segment: 1-7, 8-14, ..., 50.
  EXPECT_EQ(writer->stats().segment_count, 8u);
  EXPECT_THAT(testing_util::ListNames(dir.path()),
              ElementsAre("LOCK", WalSegmentFileName(1), WalSegmentFileName(8),
                          WalSegmentFileName(15), WalSegmentFileName(22), WalSegmentFileName(29),
                          WalSegmentFileName(36), WalSegmentFileName(43), WalSegmentFileName(50)));
  EXPECT_EQ(ReadAll(dir.path()).value().size(), 50u);

  // 1-7, 8-14 and 15-21 are all < 22; 22-28 holds 22 itself.
  ASSERT_TRUE(writer->RemoveSegmentsBefore(22).ok());
  EXPECT_EQ(writer->stats().segment_count, 5u);
  EXPECT_EQ(writer->stats().disk_bytes, 29 * 64u);
  const std::vector<Record> records = ReadAll(dir.path(), 22).value();
  ASSERT_EQ(records.size(), 29u);
  EXPECT_EQ(records.front(), (Record{22, Payload(21)}));
  // Asking for removed records is an error, not a silent skip.
  const absl::Status status = ReadAll(dir.path(), 5).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("starts at LSN 22"));

  // The active segment is never removed, so LSNs continue after a reopen.
  ASSERT_TRUE(writer->RemoveSegmentsBefore(1000).ok());
  EXPECT_THAT(testing_util::ListNames(dir.path()), ElementsAre("LOCK", WalSegmentFileName(50)));
  writer.reset();
  writer = OpenOrDie(dir.path(), SmallSegments());
  EXPECT_EQ(writer->Append("next").value(), 51u);
  EXPECT_THAT(ReadAll(dir.path(), 50).value(),
              ElementsAre(Record{50, Payload(49)}, Record{51, "next"}));
}

TEST(WalTest, DamageOutsideTheLastSegmentIsDataLoss) {
  TempDirectory dir;
  {
    auto writer = OpenOrDie(dir.path(), SmallSegments());
    for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(writer->Append(Payload(i)).ok());
  }
  // A torn tail is only acceptable in the last segment.
  const std::string first = dir.Sub(WalSegmentFileName(1));
  const std::string pristine = testing_util::ReadFileOrDie(first);
  testing_util::TruncateTo(first, pristine.size() - 10);
  absl::Status status = ReadAll(dir.path()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr(first));
  EXPECT_THAT(status.message(), HasSubstr("not the last"));
  // Reading from a later segment does not need the damaged one.
  EXPECT_EQ(ReadAll(dir.path(), 8).value().size(), 13u);

  // A missing middle segment is a gap.
  testing_util::WriteFileOrDie(first, pristine);
  std::filesystem::remove(dir.Sub(WalSegmentFileName(8)));
  status = ReadAll(dir.path()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("gap"));
  EXPECT_THAT(status.message(), HasSubstr(WalSegmentFileName(15)));
}

TEST(WalTest, ConcurrentAppendersGetUniqueLsnsAndShareFsyncs) {
  TempDirectory dir;
  WalOptions options;
  options.fsync_policy = FsyncPolicy::kAlways;
  options.segment_size_bytes = 16 << 10;  // rotate under load too
  absl::Mutex latencies_mu;
  std::vector<absl::Duration> latencies;
  options.fsync_observer = [&](absl::Duration latency) {
    {
      absl::MutexLock lock(&latencies_mu);
      latencies.push_back(latency);
    }
    // Model a slower disk, so that appends pile up behind each sync as they
    // do in production, whatever this machine's fsync costs.
    absl::SleepFor(absl::Microseconds(300));
  };
  auto writer = OpenOrDie(dir.path(), options);
  constexpr int kThreads = 8;  // more than the cores
  constexpr int kPerThread = 60;
  absl::Mutex mu;
  std::map<uint64_t, std::string> acknowledged;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string payload = absl::StrCat("thread ", t, " record ", i);
        const absl::StatusOr<uint64_t> lsn = writer->Append(payload);
        ASSERT_TRUE(lsn.ok()) << lsn.status();
        absl::MutexLock lock(&mu);
        EXPECT_TRUE(acknowledged.emplace(*lsn, payload).second) << "duplicate LSN " << *lsn;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  constexpr uint64_t kTotal = kThreads * kPerThread;
  ASSERT_EQ(acknowledged.size(), kTotal);
  EXPECT_EQ(acknowledged.begin()->first, 1u);
  EXPECT_EQ(acknowledged.rbegin()->first, kTotal);
  const WalStats stats = writer->stats();
  EXPECT_EQ(stats.synced_lsn, kTotal);
  EXPECT_GT(stats.fsyncs, 0u);
  EXPECT_LT(stats.fsyncs, kTotal) << "no group commit";
  EXPECT_GT(stats.segment_count, 1u);
  {
    absl::MutexLock lock(&latencies_mu);
    EXPECT_EQ(latencies.size(), stats.fsyncs);
  }
  const std::vector<Record> records = ReadAll(dir.path()).value();
  ASSERT_EQ(records.size(), kTotal);
  for (const Record& record : records) EXPECT_EQ(record.payload, acknowledged[record.lsn]);
}

// The replay buffer's pattern: append under a caller's lock (records in
// mutation order), wait for the shared sync after releasing it.
TEST(WalTest, AppendWithoutSyncThenSyncUpToSharesSyncs) {
  TempDirectory dir;
  WalOptions options;
  options.fsync_policy = FsyncPolicy::kAlways;
  // A slower disk, as in ConcurrentAppendersGetUniqueLsnsAndShareFsyncs.
  options.fsync_observer = [](absl::Duration) { absl::SleepFor(absl::Microseconds(300)); };
  auto writer = OpenOrDie(dir.path(), options);
  absl::Mutex table_mu;
  constexpr int kThreads = 6;
  constexpr int kPerThread = 40;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<uint64_t> lsn;
        {
          absl::MutexLock lock(&table_mu);
          lsn = writer->AppendWithoutSync(absl::StrCat(t, "/", i));
        }
        ASSERT_TRUE(lsn.ok()) << lsn.status();
        ASSERT_TRUE(writer->SyncUpTo(*lsn).ok());
        EXPECT_GE(writer->stats().synced_lsn, *lsn);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const WalStats stats = writer->stats();
  EXPECT_EQ(stats.synced_lsn, uint64_t{kThreads * kPerThread});
  EXPECT_LT(stats.fsyncs, uint64_t{kThreads * kPerThread}) << "no group commit";
  EXPECT_EQ(writer->SyncUpTo(stats.next_lsn).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadAll(dir.path()).value().size(), uint64_t{kThreads * kPerThread});
}

TEST(WalTest, SyncUpToReturnsAtOnceUnderLaxPolicies) {
  TempDirectory dir;
  WalOptions options = NoSync();
  auto writer = OpenOrDie(dir.path(), options);
  const uint64_t lsn = writer->AppendWithoutSync("x").value();
  EXPECT_TRUE(writer->SyncUpTo(lsn).ok());
  EXPECT_EQ(writer->stats().fsyncs, 0u);
}

// The log lost its tail to power loss while a snapshot at LSN 9 survived:
// new records must not reuse LSNs the snapshot covers.
TEST(WalTest, AdvanceNextLsnJumpsPastASnapshot) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.path(), WalOptions());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(writer->Append(Payload(i)).ok());
  ASSERT_TRUE(writer->AdvanceNextLsn(10).ok());
  ASSERT_TRUE(writer->AdvanceNextLsn(5).ok());  // never backwards
  EXPECT_EQ(writer->next_lsn(), 10u);
  EXPECT_EQ(writer->Append("after the jump").value(), 10u);
  writer.reset();

  writer = OpenOrDie(dir.path(), WalOptions());
  EXPECT_EQ(writer->next_lsn(), 11u);
  EXPECT_THAT(ReadAll(dir.path(), 10).value(), ElementsAre(Record{10, "after the jump"}));
  const absl::Status spanning = ReadAll(dir.path(), 1).status();
  EXPECT_EQ(spanning.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(spanning.message(), HasSubstr("gap"));
}

TEST(WalTest, IntervalPolicySyncsInTheBackground) {
  TempDirectory dir;
  WalOptions options;
  options.fsync_policy = FsyncPolicy::kInterval;
  options.fsync_interval = absl::Milliseconds(5);
  absl::Notification synced;
  options.fsync_observer = [&](absl::Duration) {
    if (!synced.HasBeenNotified()) synced.Notify();
  };
  auto writer = OpenOrDie(dir.path(), options);
  ASSERT_TRUE(writer->Append("x").ok());
  // Nothing but the interval thread syncs before Close.
  ASSERT_TRUE(synced.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(writer->stats().synced_lsn, 1u);
  EXPECT_GE(writer->stats().fsyncs, 1u);
}

// In a child process (fork): caps the file size with RLIMIT_FSIZE (which
// binds root too) so that the fourth 64 KiB record is cut short, checks that
// the error is sticky, and exits with the number of acknowledged records.
[[noreturn]] void AppendUntilTheFileSizeLimit(const std::string& dir) {
  ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of a signal
  auto writer = WalWriter::Open(dir, NoSync());
  if (!writer.ok()) ::_exit(101);
  const std::string payload(64 << 10, 'p');
  const rlimit limit = {3 * (kRecordHeaderBytes + payload.size()) + 1000, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(102);
  int acknowledged = 0;
  absl::Status error;
  while (acknowledged < 10) {
    const absl::StatusOr<uint64_t> lsn = (*writer)->Append(payload);
    if (!lsn.ok()) {
      error = lsn.status();
      break;
    }
    if (*lsn != static_cast<uint64_t>(acknowledged + 1)) ::_exit(103);
    ++acknowledged;
  }
  if (error.ok() || !absl::StrContains(error.message(), "offset")) ::_exit(104);
  // Sticky, even for a record that would fit.
  const absl::Status again = (*writer)->Append("tiny").status();
  if (again.code() != absl::StatusCode::kFailedPrecondition ||
      !absl::StrContains(again.message(), error.message())) {
    ::_exit(105);
  }
  ::_exit(acknowledged);
}

TEST(WalDeathTest, WriteErrorIsStickyAndReopenRecovers) {
  // The default "fast" style forks, so the child writes to this very
  // directory (every earlier test has joined its threads).
  TempDirectory dir;
  EXPECT_EXIT(AppendUntilTheFileSizeLimit(dir.path()), ::testing::ExitedWithCode(3), "");

  // The torn fourth record is dropped; the three acknowledged ones remain.
  WalReadResult result;
  const std::vector<Record> records = ReadAll(dir.path(), 0, &result).value();
  EXPECT_EQ(records.size(), 3u);
  EXPECT_EQ(result.torn_tail_bytes, 1000u);
  auto writer = OpenOrDie(dir.path(), NoSync());
  EXPECT_EQ(writer->recovery().truncated_bytes, 1000u);
  EXPECT_EQ(writer->Append("recovered").value(), 4u);
}

// In a child process: the file size limit makes the fourth 64 KiB record
// fail half-written, as a full disk does; once the limit is lifted (space
// freed), Recover makes the same writer take appends again, with no reopen.
// Exits with a code the parent checks (0 = every step as expected).
[[noreturn]] void FailThenRecoverWithoutReopening(const std::string& dir) {
  ::signal(SIGXFSZ, SIG_IGN);
  auto writer = WalWriter::Open(dir, NoSync());
  if (!writer.ok()) ::_exit(101);
  const std::string payload(64 << 10, 'p');
  const rlimit limit = {3 * (kRecordHeaderBytes + payload.size()) + 1000, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(102);
  for (int i = 0; i < 3; ++i) {
    if (!(*writer)->Append(payload).ok()) ::_exit(103);
  }
  if ((*writer)->Append(payload).ok()) ::_exit(104);
  if ((*writer)->error().ok()) ::_exit(105);
  // Still full: nothing is written, and the error stays.
  if ((*writer)->Append("tiny").status().code() != absl::StatusCode::kFailedPrecondition) {
    ::_exit(106);
  }
  const rlimit lifted = {RLIM_INFINITY, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &lifted) != 0) ::_exit(107);
  if (!(*writer)->Recover().ok()) ::_exit(108);
  if (!(*writer)->error().ok()) ::_exit(109);
  const absl::StatusOr<uint64_t> lsn = (*writer)->Append("after recovery");
  if (!lsn.ok() || *lsn != 4) ::_exit(110);
  if ((*writer)->stats().segment_count != 1) ::_exit(111);  // repaired in place
  if (!(*writer)->Close().ok()) ::_exit(112);
  ::_exit(0);
}

TEST(WalDeathTest, AFailedWriteIsRepairedInPlaceOnceWritesSucceedAgain) {
  TempDirectory dir;
  EXPECT_EXIT(FailThenRecoverWithoutReopening(dir.path()), ::testing::ExitedWithCode(0), "");
  // The torn record is gone; the record after the recovery follows the
  // three acknowledged ones.
  WalReadResult result;
  const std::vector<Record> records = ReadAll(dir.path(), 0, &result).value();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[3], (Record{4, "after recovery"}));
  EXPECT_EQ(result.torn_tail_bytes, 0u);
}

TEST(WalTest, RecoverIsANoOpWithoutAnError) {
  TempDirectory dir;
  auto writer = OpenOrDie(dir.path(), NoSync());
  ASSERT_EQ(writer->Append("one").value(), 1u);
  EXPECT_TRUE(writer->Recover().ok());
  EXPECT_TRUE(writer->error().ok());
  EXPECT_EQ(writer->Append("two").value(), 2u);
}

// A rotation that cannot create its segment (here a directory in the way;
// on a full disk, no room for the file) leaves no active segment open;
// Recover starts it once it can, and the log reads on without a gap.
TEST(WalTest, AFailedRotationIsRecoveredInANewSegment) {
  TempDirectory dir;
  WalOptions options = NoSync();
  options.segment_size_bytes = 100;
  auto writer = OpenOrDie(dir.path(), options);
  ASSERT_EQ(writer->Append(Payload(1, 80)).value(), 1u);
  const std::string blocker = dir.Sub(WalSegmentFileName(2));
  ASSERT_EQ(::mkdir(blocker.c_str(), 0755), 0);
  EXPECT_FALSE(writer->Append(Payload(2, 80)).ok());
  EXPECT_FALSE(writer->error().ok());
  EXPECT_FALSE(writer->Recover().ok()) << "the directory is still in the way";
  ASSERT_EQ(::rmdir(blocker.c_str()), 0);
  ASSERT_TRUE(writer->Recover().ok());
  ASSERT_EQ(writer->Append(Payload(2, 80)).value(), 2u);
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_THAT(ReadAll(dir.path()).value(),
              ElementsAre(Record{1, Payload(1, 80)}, Record{2, Payload(2, 80)}));
}

TEST(WalTest, SegmentFileNames) {
  EXPECT_EQ(WalSegmentFileName(42), "wal-00000000000000000042.log");
  EXPECT_EQ(ParseWalSegmentFileName("wal-00000000000000000042.log"), 42u);
  EXPECT_EQ(ParseWalSegmentFileName("wal-18446744073709551615.log"), UINT64_MAX);
  EXPECT_EQ(ParseWalSegmentFileName("wal-0000000000000000004x.log"), std::nullopt);
  EXPECT_EQ(ParseWalSegmentFileName("wal-42.log"), std::nullopt);
  EXPECT_EQ(ParseWalSegmentFileName("wal-00000000000000000042.log.tmp"), std::nullopt);
  EXPECT_EQ(ParseWalSegmentFileName("LOCK"), std::nullopt);
}

}  // namespace
}  // namespace sluice::replay_buffer::durability
