#include "replay_buffer/durability/snapshot_store.h"

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay_buffer/durability/record_format.h"
#include "replay_buffer/durability/test_util.h"

namespace sluice::replay_buffer::durability {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;
using testing_util::TempDirectory;

std::unique_ptr<SnapshotStore> OpenOrDie(const std::string& dir, int keep_last = 2) {
  absl::StatusOr<std::unique_ptr<SnapshotStore>> store = SnapshotStore::Open(dir, keep_last);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

std::vector<std::string> Records(uint64_t lsn, int count) {
  std::vector<std::string> records;
  for (int i = 0; i < count; ++i) records.push_back(absl::StrCat("lsn ", lsn, " record ", i));
  return records;
}

// Writes and commits a snapshot of `records` at `lsn`.
SnapshotInfo CommitSnapshot(const SnapshotStore& store, uint64_t lsn,
                            const std::vector<std::string>& records) {
  auto writer = store.BeginSnapshot(lsn);
  EXPECT_TRUE(writer.ok()) << writer.status();
  for (const std::string& record : records) EXPECT_TRUE((*writer)->Append(record).ok());
  absl::StatusOr<SnapshotInfo> info = (*writer)->Commit();
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? *info : SnapshotInfo();
}

struct Loaded {
  SnapshotLoadResult result;
  std::vector<std::string> records;
};

Loaded LoadOrDie(const SnapshotStore& store) {
  Loaded loaded;
  absl::StatusOr<SnapshotLoadResult> result = store.LoadLatest([&](absl::string_view payload) {
    loaded.records.emplace_back(payload);
    return absl::OkStatus();
  });
  EXPECT_TRUE(result.ok()) << result.status();
  if (result.ok()) loaded.result = *result;
  return loaded;
}

TEST(SnapshotStoreTest, EmptyDirectoryHasNoSnapshot) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path());
  const Loaded loaded = LoadOrDie(*store);
  EXPECT_EQ(loaded.result.lsn, std::nullopt);
  EXPECT_THAT(loaded.records, IsEmpty());
  EXPECT_THAT(loaded.result.warnings, IsEmpty());
  EXPECT_THAT(store->ListSnapshots().value(), IsEmpty());
}

TEST(SnapshotStoreTest, CommittedSnapshotLoadsBack) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.Sub("snapshots"));
  std::vector<std::string> records = Records(42, 100);
  records.push_back("");                         // empty payload
  records.push_back(std::string(3 << 20, 'b'));  // bigger than the write buffer
  const SnapshotInfo info = CommitSnapshot(*store, 42, records);
  EXPECT_EQ(info.lsn, 42u);
  EXPECT_EQ(info.records, records.size());
  EXPECT_EQ(info.path, dir.Sub("snapshots/" + SnapshotFileName(42)));
  EXPECT_EQ(info.size_bytes, testing_util::SizeOf(info.path));
  EXPECT_GT(info.duration, absl::ZeroDuration());
  EXPECT_THAT(testing_util::ListNames(dir.Sub("snapshots")), ElementsAre(SnapshotFileName(42)));

  const Loaded loaded = LoadOrDie(*OpenOrDie(dir.Sub("snapshots")));
  EXPECT_EQ(loaded.result.lsn, 42u);
  EXPECT_EQ(loaded.result.records, records.size());
  EXPECT_EQ(loaded.result.size_bytes, info.size_bytes);
  EXPECT_EQ(loaded.records, records);
  EXPECT_THAT(loaded.result.warnings, IsEmpty());
}

TEST(SnapshotStoreTest, EmptySnapshotIsValid) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path());
  CommitSnapshot(*store, 7, {});
  const Loaded loaded = LoadOrDie(*store);
  EXPECT_EQ(loaded.result.lsn, 7u);
  EXPECT_THAT(loaded.records, IsEmpty());
}

TEST(SnapshotStoreTest, CommitPrunesAllButKeepLast) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path(), /*keep_last=*/2);
  CommitSnapshot(*store, 10, Records(10, 3));
  CommitSnapshot(*store, 20, Records(20, 3));
  EXPECT_THAT(store->ListSnapshots().value(), ElementsAre(10, 20));
  CommitSnapshot(*store, 30, Records(30, 3));
  EXPECT_THAT(store->ListSnapshots().value(), ElementsAre(20, 30));
  EXPECT_THAT(testing_util::ListNames(dir.path()),
              ElementsAre(SnapshotFileName(20), SnapshotFileName(30)));
  EXPECT_EQ(LoadOrDie(*store).records, Records(30, 3));

  auto keep_one = OpenOrDie(dir.path(), /*keep_last=*/1);
  CommitSnapshot(*keep_one, 40, Records(40, 1));
  EXPECT_THAT(keep_one->ListSnapshots().value(), ElementsAre(40));
}

TEST(SnapshotStoreTest, AbortAndDestructionRemoveTheTempFile) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path());
  {
    auto writer = store->BeginSnapshot(5).value();
    ASSERT_TRUE(writer->Append("x").ok());
    EXPECT_THAT(testing_util::ListNames(dir.path()), ElementsAre(SnapshotTempFileName(5)));
    writer->Abort();
    EXPECT_THAT(testing_util::ListNames(dir.path()), IsEmpty());
    EXPECT_EQ(writer->Append("y").code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(writer->Commit().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    auto writer = store->BeginSnapshot(6).value();
    ASSERT_TRUE(writer->Append("x").ok());
  }
  EXPECT_THAT(testing_util::ListNames(dir.path()), IsEmpty());
  EXPECT_EQ(LoadOrDie(*store).result.lsn, std::nullopt);
}

TEST(SnapshotStoreTest, OneWriterPerLsnAndNoAppendAfterCommit) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path());
  auto writer = store->BeginSnapshot(9).value();
  EXPECT_EQ(store->BeginSnapshot(9).status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(writer->Commit().ok());
  EXPECT_EQ(writer->Append("late").code(), absl::StatusCode::kFailedPrecondition);
  // Re-snapshotting the same LSN replaces the committed file.
  CommitSnapshot(*store, 9, {"again"});
  EXPECT_THAT(LoadOrDie(*store).records, ElementsAre("again"));
}

// A crash mid-snapshot: the child process writes records and dies without
// committing or cleaning up, as kill -9 would leave it.
TEST(SnapshotStoreDeathTest, CrashMidSnapshotLeavesTempFileThatIsIgnoredAndRemoved) {
  TempDirectory dir;
  {
    auto store = OpenOrDie(dir.path());
    CommitSnapshot(*store, 10, Records(10, 5));
    EXPECT_EXIT(
        {
          auto writer = store->BeginSnapshot(20).value();
          for (const std::string& record : Records(20, 50)) writer->Append(record).IgnoreError();
          ::_exit(0);
        },
        ::testing::ExitedWithCode(0), "");
    EXPECT_THAT(testing_util::ListNames(dir.path()),
                ElementsAre(SnapshotFileName(10), SnapshotTempFileName(20)));
    // Never read, even before the next Open removes it.
    EXPECT_EQ(LoadOrDie(*store).result.lsn, 10u);
  }
  auto store = OpenOrDie(dir.path());
  EXPECT_THAT(store->removed_temp_files(), ElementsAre(dir.Sub(SnapshotTempFileName(20))));
  EXPECT_THAT(testing_util::ListNames(dir.path()), ElementsAre(SnapshotFileName(10)));
  const Loaded loaded = LoadOrDie(*store);
  EXPECT_EQ(loaded.result.lsn, 10u);
  EXPECT_EQ(loaded.records, Records(10, 5));
}

// Damage to the newest committed snapshot: a missing or cut trailer, a
// flipped byte in a record or in the trailer. Each time the previous
// snapshot loads, with a warning naming the damaged file.
TEST(SnapshotStoreTest, DamagedNewestSnapshotFallsBackToThePreviousOne) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path());
  CommitSnapshot(*store, 10, Records(10, 4));
  const SnapshotInfo newest = CommitSnapshot(*store, 20, Records(20, 4));
  const std::string pristine = testing_util::ReadFileOrDie(newest.path);
  const uint64_t size = pristine.size();
  const uint64_t trailer = size - 32;
  const uint64_t first_record = 0;
  const uint64_t second_record = kRecordHeaderBytes + Records(20, 1)[0].size();

  struct Damage {
    std::string name;
    std::function<void()> apply;
    std::string expected;  // in the warning
  };
  const std::vector<Damage> damages = {
      {"no trailer", [&] { testing_util::TruncateTo(newest.path, trailer); },
       absl::StrCat("no trailer at offset ", trailer - 32)},
      {"trailer cut short", [&] { testing_util::TruncateTo(newest.path, size - 5); }, "no trailer"},
      {"truncated to nothing", [&] { testing_util::TruncateTo(newest.path, 0); }, "incomplete"},
      {"flipped byte in trailer record count",
       [&] { testing_util::FlipByte(newest.path, trailer + 16); },
       absl::StrCat("trailer CRC mismatch at offset ", trailer)},
      {"flipped byte in the first payload",
       [&] { testing_util::FlipByte(newest.path, first_record + kRecordHeaderBytes + 1); },
       "offset 0"},
      {"flipped byte in the second header",
       [&] { testing_util::FlipByte(newest.path, second_record + 2); },
       absl::StrCat("offset ", second_record)},
      {"flipped byte in the last payload",
       [&] { testing_util::FlipByte(newest.path, trailer - 1); }, "CRC mismatch"},
      {"a record dropped",
       [&] {
         testing_util::WriteFileOrDie(
             newest.path, pristine.substr(0, second_record) + pristine.substr(2 * second_record));
       },
       "index"},
  };
  for (const Damage& damage : damages) {
    SCOPED_TRACE(damage.name);
    testing_util::WriteFileOrDie(newest.path, pristine);
    damage.apply();
    const Loaded loaded = LoadOrDie(*store);
    EXPECT_EQ(loaded.result.lsn, 10u);
    EXPECT_EQ(loaded.records, Records(10, 4));  // none of the damaged one's
    ASSERT_THAT(loaded.result.warnings, SizeIs(1));
    EXPECT_THAT(loaded.result.warnings[0], HasSubstr(newest.path));
    EXPECT_THAT(loaded.result.warnings[0], HasSubstr(damage.expected));
  }
}

TEST(SnapshotStoreTest, AllSnapshotsDamagedMeansNoSnapshot) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path());
  for (uint64_t lsn : {10, 20}) {
    const SnapshotInfo info = CommitSnapshot(*store, lsn, Records(lsn, 2));
    testing_util::TruncateTo(info.path, info.size_bytes - 1);
  }
  const Loaded loaded = LoadOrDie(*store);
  EXPECT_EQ(loaded.result.lsn, std::nullopt);
  EXPECT_THAT(loaded.records, IsEmpty());
  EXPECT_THAT(loaded.result.warnings, SizeIs(2));
}

TEST(SnapshotStoreTest, FileRenamedToAnotherLsnIsRejected) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path(), /*keep_last=*/5);
  const SnapshotInfo info = CommitSnapshot(*store, 10, Records(10, 2));
  testing_util::WriteFileOrDie(dir.Sub(SnapshotFileName(99)),
                               testing_util::ReadFileOrDie(info.path));
  const Loaded loaded = LoadOrDie(*store);
  EXPECT_EQ(loaded.result.lsn, 10u);
  ASSERT_THAT(loaded.result.warnings, SizeIs(1));
  EXPECT_THAT(loaded.result.warnings[0], HasSubstr("is for LSN 10"));
}

TEST(SnapshotStoreTest, CallbackErrorIsReturned) {
  TempDirectory dir;
  auto store = OpenOrDie(dir.path());
  CommitSnapshot(*store, 10, Records(10, 3));
  int calls = 0;
  const absl::StatusOr<SnapshotLoadResult> result = store->LoadLatest([&](absl::string_view) {
    return ++calls == 2 ? absl::InvalidArgumentError("bad record") : absl::OkStatus();
  });
  EXPECT_EQ(result.status(), absl::InvalidArgumentError("bad record"));
  EXPECT_EQ(calls, 2);
}

TEST(SnapshotStoreTest, InvalidArgumentsAreRejected) {
  TempDirectory dir;
  EXPECT_EQ(SnapshotStore::Open(dir.path(), 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SnapshotStore::Open("", 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SnapshotStoreTest, FileNames) {
  EXPECT_EQ(SnapshotFileName(42), "snapshot-00000000000000000042.snap");
  EXPECT_EQ(SnapshotTempFileName(42), "snapshot-00000000000000000042.tmp");
  EXPECT_EQ(ParseSnapshotFileName("snapshot-00000000000000000042.snap"), 42u);
  EXPECT_EQ(ParseSnapshotFileName("snapshot-00000000000000000042.tmp"), std::nullopt);
  EXPECT_EQ(ParseSnapshotFileName("snapshot-42.snap"), std::nullopt);
}

}  // namespace
}  // namespace sluice::replay_buffer::durability
