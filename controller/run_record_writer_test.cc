// A run's record on a runs directory that cannot be written: what could not
// be written is kept, in order, and written once it can. The full disk is
// /dev/full (every write ENOSPC) behind a file's name; freeing it is
// removing that link.
#include "controller/run_record_writer.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

v1::TrainingStepMetrics Step(int64_t step) {
  v1::TrainingStepMetrics metrics;
  metrics.set_step(step);
  return metrics;
}

class RunRecordWriterTest : public ::testing::Test {
 protected:
  RunRecordWriterTest() {
    runs_dir_ = absl::StrCat(::testing::TempDir(), "/record-writer-", ::getpid(), "-",
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(runs_dir_);
    files_ = std::make_unique<RunFiles>(*RunFiles::Create(runs_dir_, "run-1"));
  }
  ~RunRecordWriterTest() override { fs::remove_all(runs_dir_); }

  // Every write of `name` fails with ENOSPC until Free(name).
  void Fill(const std::string& name) {
    ASSERT_EQ(::symlink("/dev/full", files_->Path(name).c_str()), 0);
  }
  void Free(const std::string& name) { ASSERT_TRUE(fs::remove(files_->Path(name))); }

  std::string runs_dir_;
  std::unique_ptr<RunFiles> files_;
};

TEST_F(RunRecordWriterTest, WhatCannotBeWrittenIsKeptInOrderAndWrittenOnceItCanBe) {
  RunRecordWriter writer(*files_);
  writer.WriteState("{\"state\": 1}", /*durable=*/true);
  Fill(RunFiles::kMetrics);
  writer.AppendMetrics(Step(2));
  ASSERT_TRUE(writer.behind());
  RunRecordWriter::Health health = writer.health();
  EXPECT_EQ(health.error.code(), absl::StatusCode::kResourceExhausted) << health.error;
  EXPECT_THAT(health.error.message(), HasSubstr(files_->Path(RunFiles::kMetrics)));
  EXPECT_THAT(health.error.message(), HasSubstr("No space left on device"));
  EXPECT_NE(health.since, absl::InfiniteFuture());
  writer.AppendMetrics(Step(3));
  v1::EvalResult eval;
  eval.set_step(3);
  writer.AppendEval(eval);
  writer.WriteState("{\"state\": 3}", /*durable=*/true);
  v1::RunSummary summary;
  summary.set_run_id("run-1");
  writer.WriteSummary(summary);
  EXPECT_EQ(writer.health().owed_lines, 3);

  // Still full: nothing is lost, and it says so again.
  EXPECT_EQ(writer.Retry().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(writer.behind());

  Free(RunFiles::kMetrics);
  ASSERT_TRUE(writer.Retry().ok());
  EXPECT_FALSE(writer.behind());
  EXPECT_EQ(writer.health().owed_lines, 0);
  EXPECT_EQ(ReadFile(files_->Path(RunFiles::kMetrics)),
            absl::StrCat(ToJson(Step(2), false), "\n", ToJson(Step(3), false), "\n"));
  EXPECT_EQ(ReadFile(files_->Path(RunFiles::kEvals)), ToJson(eval, false) + "\n");
  EXPECT_EQ(ReadFile(files_->Path(RunFiles::kState)), "{\"state\": 3}\n");
  EXPECT_THAT(ReadFile(files_->Path(RunFiles::kSummary)), HasSubstr("\"run_id\": \"run-1\""));
}

// A full disk costs one failed write per Retry, not one per write: while the
// record is behind, writes wait in memory without touching the disk.
TEST_F(RunRecordWriterTest, WhileBehindWritesWaitWithoutTouchingTheDisk) {
  RunRecordWriter writer(*files_);
  Fill(RunFiles::kMetrics);
  writer.AppendMetrics(Step(1));
  ASSERT_TRUE(writer.behind());
  for (int i = 0; i < 100; ++i) {
    writer.AppendMetrics(Step(2 + i));
    writer.WriteState(absl::StrCat("{\"step\": ", 2 + i, "}"), /*durable=*/false);
  }
  EXPECT_EQ(writer.health().failed_writes, 1);
  // state.json could have been written; it waits behind the lines.
  EXPECT_FALSE(fs::exists(files_->Path(RunFiles::kState)));
  EXPECT_FALSE(writer.Retry().ok());
  EXPECT_EQ(writer.health().failed_writes, 2);
  Free(RunFiles::kMetrics);
  ASSERT_TRUE(writer.Retry().ok());
  // The newest state only.
  EXPECT_EQ(ReadFile(files_->Path(RunFiles::kState)), "{\"step\": 101}\n");
}

TEST_F(RunRecordWriterTest, LinesPastTheLimitAreDroppedAndCounted) {
  RunRecordWriter writer(*files_, {.max_owed_lines = 2});
  Fill(RunFiles::kMetrics);
  for (int i = 1; i <= 5; ++i) writer.AppendMetrics(Step(i));
  EXPECT_EQ(writer.health().owed_lines, 2);
  EXPECT_EQ(writer.health().dropped_lines, 3);
  Free(RunFiles::kMetrics);
  ASSERT_TRUE(writer.Retry().ok());
  EXPECT_EQ(writer.health().dropped_lines, 3);  // lost for good: still counted
}

TEST_F(RunRecordWriterTest, AFailureElsewhereKeepsTheRecordBehindUntilARetry) {
  RunRecordWriter writer(*files_);
  writer.NoteFailure(files_->Path(RunFiles::kPromptFeed),
                     absl::ResourceExhaustedError("cannot append to prompt_feed.jsonl"));
  EXPECT_TRUE(writer.behind());
  EXPECT_EQ(writer.health().path, files_->Path(RunFiles::kPromptFeed));
  ASSERT_TRUE(writer.Retry().ok());
  EXPECT_FALSE(writer.behind());
}

TEST(RunFilesTest, AFullDiskIsResourceExhaustedNamingTheFile) {
  const absl::Status status = AppendLineToFile("/dev/full", "{}");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("cannot write /dev/full: No space left on device"));
}

}  // namespace
}  // namespace sluice::controller
