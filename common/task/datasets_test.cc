#include "common/task/datasets.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::task {
namespace {

using ::testing::HasSubstr;

std::string Data(const std::string& relative) {
  return std::string(SLUICE_TESTDATA_DIR) + "/" + relative;
}

TEST(DatasetsTest, Gsm8kTestSplit) {
  absl::StatusOr<std::vector<DatasetRecord>> records =
      ReadDataset(Data("datasets/gsm8k/test.jsonl"), DatasetKind::kGsm8k);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 1319u);
  EXPECT_THAT((*records)[0].question, HasSubstr("Janet"));
  EXPECT_EQ((*records)[0].reference_answer, "18");
  EXPECT_EQ((*records)[0].id, "gsm8k-1");
  EXPECT_THAT((*records)[0].metadata.at("solution"), HasSubstr("<<16-3-4=9>>"));
  for (const DatasetRecord& record : *records) {
    EXPECT_EQ(record.reference_answer.find(','), std::string::npos) << record.id;
    EXPECT_FALSE(record.reference_answer.empty()) << record.id;
  }
}

TEST(DatasetsTest, Math500) {
  absl::StatusOr<std::vector<DatasetRecord>> records =
      ReadDataset(Data("datasets/math500/test.jsonl"), DatasetKind::kMath);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 500u);
  EXPECT_EQ((*records)[0].reference_answer, "\\left( 3, \\frac{\\pi}{2} \\right)");
  EXPECT_THAT((*records)[0].id, HasSubstr("test/precalculus/"));
  EXPECT_EQ((*records)[0].metadata.at("subject"), "Precalculus");
  // Where both exist, the answer column is the solution's last \boxed{}.
  int agree = 0;
  for (const DatasetRecord& record : *records) {
    std::optional<std::string> boxed = LastBoxedContent(record.metadata.at("solution"));
    agree += boxed.has_value() && *boxed == record.reference_answer;
  }
  EXPECT_GT(agree, 450);
}

TEST(DatasetsTest, HumanEvalGzip) {
  absl::StatusOr<std::vector<DatasetRecord>> records =
      ReadDataset(Data("datasets/humaneval/HumanEval.jsonl.gz"), DatasetKind::kHumanEval);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 164u);
  const DatasetRecord& first = (*records)[0];
  EXPECT_EQ(first.id, "HumanEval/0");
  EXPECT_EQ(first.metadata.at("entry_point"), "has_close_elements");
  EXPECT_THAT(first.metadata.at("test"), HasSubstr("def check(candidate)"));
  EXPECT_THAT(first.metadata.at("canonical_solution"), HasSubstr("for idx, elem"));
  EXPECT_TRUE(first.reference_answer.empty());

  DatasetReadOptions three;
  three.max_records = 3;
  EXPECT_EQ(ReadDataset(Data("datasets/humaneval/HumanEval.jsonl.gz"), DatasetKind::kHumanEval,
                        three)
                ->size(),
            3u);
}

TEST(DatasetsTest, AnswerHelpers) {
  EXPECT_EQ(Gsm8kFinalAnswer("so 3 + 4\n#### 1,234,567"), "1234567");
  EXPECT_EQ(Gsm8kFinalAnswer("#### -2.5 "), "-2.5");
  EXPECT_EQ(Gsm8kFinalAnswer("no marker"), std::nullopt);
  EXPECT_EQ(Gsm8kFinalAnswer("####  "), std::nullopt);
  EXPECT_EQ(LastBoxedContent("a \\boxed{1} b \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(LastBoxedContent("\\boxed{1} then \\fbox{2}"), "2");
  EXPECT_EQ(LastBoxedContent("\\boxed{1} then \\boxed{unclosed"), "1");
  EXPECT_EQ(LastBoxedContent("nothing"), std::nullopt);
  EXPECT_EQ(ParseDatasetKind("GSM8K").value(), DatasetKind::kGsm8k);
  EXPECT_THAT(std::string(ParseDatasetKind("csv").status().message()), HasSubstr("humaneval"));
}

class DatasetFilesTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             absl::StrCat("datasets_test_", getpid(), "_",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    std::ofstream(path_, std::ios::binary) << text;
    return path_;
  }
  void TearDown() override {
    if (!path_.empty()) std::remove(path_.c_str());
  }
  std::string path_;
};

TEST_F(DatasetFilesTest, GenericJsonlWithNamedColumns) {
  DatasetReadOptions options;
  options.question_field = "q";
  options.answer_field = "a";
  absl::StatusOr<std::vector<DatasetRecord>> records = ReadDataset(
      Write("{\"id\": \"x1\", \"q\": \"1+1\", \"a\": 2, \"topic\": \"add\"}\n\n"
            "{\"q\": \"2+2\", \"a\": \"4\"}"),
      DatasetKind::kJsonl, options);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0].id, "x1");
  EXPECT_EQ((*records)[0].reference_answer, "2");
  EXPECT_EQ((*records)[0].metadata.at("topic"), "add");
  EXPECT_EQ((*records)[1].id, "jsonl-3");
  EXPECT_FALSE((*records)[0].reference_is_solution);
}

TEST(DatasetsTest, OnlyAJsonlAnswerColumnCanHoldSolutions) {
  DatasetReadOptions options;
  options.answer_is_solution = true;
  absl::StatusOr<DatasetRecord> jsonl = ParseDatasetRow(
      R"({"prompt": "2+2", "answer": "2+2 = 4.\n#### 4"})", DatasetKind::kJsonl, 1, options);
  ASSERT_TRUE(jsonl.ok()) << jsonl.status();
  EXPECT_TRUE(jsonl->reference_is_solution);
  EXPECT_EQ(jsonl->reference_answer, "2+2 = 4.\n#### 4");
  // GSM8K and MATH rows give the final answer, whatever the option says.
  absl::StatusOr<DatasetRecord> gsm8k = ParseDatasetRow(
      R"({"question": "2+2", "answer": "2+2 = 4.\n#### 4"})", DatasetKind::kGsm8k, 1, options);
  ASSERT_TRUE(gsm8k.ok()) << gsm8k.status();
  EXPECT_FALSE(gsm8k->reference_is_solution);
  EXPECT_EQ(gsm8k->reference_answer, "4");
  absl::StatusOr<DatasetRecord> math = ParseDatasetRow(
      R"({"problem": "p", "solution": "so $\\boxed{3\\sqrt{13}}$"})", DatasetKind::kMath, 1,
      options);
  ASSERT_TRUE(math.ok()) << math.status();
  EXPECT_FALSE(math->reference_is_solution);
  EXPECT_EQ(math->reference_answer, "3\\sqrt{13}");
}

TEST_F(DatasetFilesTest, MalformedRowsNameTheFileAndLine) {
  const std::string path = Write("{\"question\": \"q\", \"answer\": \"#### 1\"}\n{broken\n");
  absl::StatusOr<std::vector<DatasetRecord>> bad = ReadDataset(path, DatasetKind::kGsm8k);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(path + ":line 2: not valid JSON"));

  EXPECT_THAT(std::string(ReadDataset(Write("{\"question\": \"q\", \"answer\": \"no marker\"}\n"),
                                      DatasetKind::kGsm8k)
                              .status()
                              .message()),
              HasSubstr("no \"#### <answer>\" line"));
  EXPECT_THAT(std::string(ReadDataset(Write("{\"problem\": \"p\", \"solution\": \"none\"}\n"),
                                      DatasetKind::kMath)
                              .status()
                              .message()),
              HasSubstr("no \\boxed{} answer"));
  EXPECT_THAT(std::string(ReadDataset(Write("{\"task_id\": \"t\", \"prompt\": \"p\", \"test\": "
                                            "\"t\"}\n"),
                                      DatasetKind::kHumanEval)
                              .status()
                              .message()),
              HasSubstr("no \"entry_point\" column"));
  EXPECT_EQ(ReadDataset("/nonexistent/data.jsonl", DatasetKind::kMath).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DatasetFilesTest, ARowOverTheBoundIsAnErrorNotAnAllocation) {
  const std::string row =
      "{\"prompt\": \"" + std::string(16 << 20, 'a') + "\", \"answer\": \"1\"}";
  absl::StatusOr<std::vector<DatasetRecord>> records = ReadDataset(
      Write("{\"prompt\": \"q\", \"answer\": \"1\"}\n" + row + "\n"), DatasetKind::kJsonl);
  EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(records.status().message()),
              HasSubstr(path_ + ":line 2: longer than 16 MiB, the most a row may hold"));
}

TEST_F(DatasetFilesTest, CorruptGzipIsDataLoss) {
  // A gzip header followed by garbage.
  std::string bytes = "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03";
  bytes += std::string(64, '\xff');
  absl::StatusOr<std::vector<DatasetRecord>> records =
      ReadDataset(Write(bytes), DatasetKind::kHumanEval);
  EXPECT_EQ(records.status().code(), absl::StatusCode::kDataLoss) << records.status();
}

}  // namespace
}  // namespace sluice::task
