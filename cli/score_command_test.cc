#include "cli/score_command.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/proto_convert.h"
#include "reward_server/reward_server_service.h"
#include "reward_server/scorer.h"

namespace sluice::cli {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

std::shared_ptr<reward_server::Scorer> MakeScorer() {
  auto registry = reward_server::MakeBuiltinVerifierRegistry();
  EXPECT_TRUE(registry.ok()) << registry.status();
  auto scorer = reward_server::Scorer::Create(
      std::make_shared<const reward_server::VerifierRegistry>(*std::move(registry)));
  EXPECT_TRUE(scorer.ok()) << scorer.status();
  return *std::move(scorer);
}

ScoreBatchFn InProcess(std::shared_ptr<reward_server::Scorer> scorer, int* calls = nullptr) {
  return [scorer, calls](const v1::ScoreBatchRequest& request)
             -> absl::StatusOr<v1::ScoreBatchResponse> {
    if (calls != nullptr) ++*calls;
    std::vector<reward_server::ScoreItem> items;
    for (const auto& item : request.items()) items.push_back(reward_server::ScoreItemFromProto(item));
    auto scores = scorer->ScoreBatch(std::move(items),
                                     reward_server::CompositionFromProto(request.composition()));
    if (!scores.ok()) return scores.status();
    v1::ScoreBatchResponse response;
    reward_server::BatchScoresToProto(*scores, &response);
    return response;
  };
}

std::vector<json> Lines(const std::string& text) {
  std::vector<json> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    lines.push_back(json::parse(line));
  }
  return lines;
}

TEST(ScoreJsonlTest, WritesEveryLineBackInOrderWithRewardAndDetails) {
  std::istringstream in(
      R"({"id": "a", "verifier": "math", "response": "so \\boxed{42}", "reference": "42"})" "\n"
      R"({"id": "b", "verifier": "math", "response": "I get 41", "reference": 42})" "\n"
      "\n"
      R"({"id": "c", "verifier": "math", "response": "#### 1,000", "reference_answer": "1000"})" "\n"
      R"({"id": "d", "response": "<think>x</think> 7", "verifier": "format", "metadata": {"format": "think_answer"}})" "\n"
      R"({"id": "e", "verifier": "exact_match", "response": "  yes ", "reference": "yes", "extra": [1, 2]})" "\n");
  std::ostringstream out;
  ScoreFlags flags;
  flags.batch_size = 2;  // Several batches: order must survive them.
  int calls = 0;
  absl::StatusOr<ScoreSummary> summary = ScoreJsonl(flags, in, out, InProcess(MakeScorer(), &calls));
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(calls, 3);
  const std::vector<json> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["id"], "a");
  EXPECT_EQ(lines[0]["reward"], 1.0);
  EXPECT_EQ(lines[0]["error_kind"], "none");
  EXPECT_EQ(lines[0]["extracted_answer"], "42");
  EXPECT_EQ(lines[0]["verifier"], "math");
  EXPECT_EQ(lines[1]["id"], "b");
  EXPECT_EQ(lines[1]["reward"], 0.0);
  EXPECT_EQ(lines[1]["reference"], 42);  // Input keys are kept as they were.
  EXPECT_EQ(lines[2]["reward"], 1.0);
  EXPECT_EQ(lines[3]["reward"], 1.0) << lines[3].dump();
  EXPECT_EQ(lines[4]["reward"], 1.0);
  EXPECT_EQ(lines[4]["extra"], json::array({1, 2}));
  EXPECT_EQ(summary->lines, 5);
  EXPECT_EQ(summary->invalid_lines, 0);
  EXPECT_DOUBLE_EQ(summary->reward_sum, 4.0);
  EXPECT_EQ(summary->by_verifier.at("math").first, 3);
}

TEST(ScoreJsonlTest, BadLinesAreWrittenBackAsInvalidInputAndScoringGoesOn) {
  std::istringstream in(
      "this is not json\n"
      "[1, 2]\n"
      R"({"verifier": "math", "reference": "1"})" "\n"
      R"({"verifier": "math", "response": "1", "reference": "1", "metadata": "x"})" "\n"
      R"({"verifier": "math", "response": "1", "reference": "1", "timeout_ms": -5})" "\n"
      R"({"verifier": "nope", "response": "1"})" "\n"
      R"({"verifier": "math", "response": "1", "reference": "1"})" "\n");
  std::ostringstream out;
  absl::StatusOr<ScoreSummary> summary = ScoreJsonl(ScoreFlags{}, in, out, InProcess(MakeScorer()));
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::vector<json> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0]["input"], "this is not json");
  EXPECT_EQ(lines[0]["line"], 1);
  EXPECT_THAT(lines[0]["detail"].get<std::string>(), HasSubstr("line 1: not valid JSON"));
  EXPECT_THAT(lines[1]["detail"].get<std::string>(), HasSubstr("not a JSON object"));
  EXPECT_THAT(lines[2]["detail"].get<std::string>(), HasSubstr("no \"response\""));
  EXPECT_THAT(lines[3]["detail"].get<std::string>(), HasSubstr("\"metadata\" must be an object"));
  EXPECT_THAT(lines[4]["detail"].get<std::string>(), HasSubstr("timeout_ms"));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(lines[i]["error_kind"], "invalid_input") << i;
    EXPECT_EQ(lines[i]["reward"], 0.0) << i;
  }
  EXPECT_EQ(lines[5]["error_kind"], "unknown_verifier");
  EXPECT_EQ(lines[6]["reward"], 1.0);
  EXPECT_EQ(summary->invalid_lines, 5);
}

TEST(ScoreJsonlTest, ReferencesAreAnswersUnlessMarkedAsSolutions) {
  std::istringstream in(
      // Bare answers, compared as a whole: "3\sqrt{13}" is not 3.
      R"({"response": "\\boxed{\\sqrt{117}}", "reference": "3\\sqrt{13}"})" "\n"
      R"({"response": "\\boxed{3}", "reference": "3\\sqrt{13}"})" "\n"
      R"({"response": "\\boxed{3}", "reference": "3\\sqrt{13}", "reference_is_solution": false})" "\n"
      // Marked as a solution, the reference has its final answer extracted.
      R"({"response": "\\boxed{3}", "reference": "3\\sqrt{13}", "reference_is_solution": true})" "\n"
      R"({"response": "\\boxed{18}", "solution": "16 - 3 - 4 = 9; 9 * 2 = 18.\n#### 18"})" "\n"
      R"({"response": "\\boxed{18}", "reference": "so $\\boxed{18}$", "reference_is_solution": true})" "\n"
      // "reference" wins over "solution"; the marker must be a boolean.
      R"({"response": "\\boxed{2}", "reference": "2", "solution": "1 + 2 = 3. #### 3"})" "\n"
      R"({"response": "\\boxed{2}", "reference": "2", "reference_is_solution": "yes"})" "\n");
  std::ostringstream out;
  ScoreFlags flags;
  flags.verifier = "math";
  absl::StatusOr<ScoreSummary> summary = ScoreJsonl(flags, in, out, InProcess(MakeScorer()));
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::vector<json> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 8u);
  const std::vector<double> rewards = {1, 0, 0, 1, 1, 1, 1, 0};
  for (size_t i = 0; i < rewards.size(); ++i) {
    EXPECT_EQ(lines[i]["reward"], rewards[i]) << i << ": " << lines[i].dump();
  }
  EXPECT_EQ(lines[7]["error_kind"], "invalid_input");
  EXPECT_THAT(lines[7]["detail"].get<std::string>(), HasSubstr("reference_is_solution"));
  EXPECT_EQ(summary->invalid_lines, 1);
}

TEST(ScoreJsonlTest, DefaultVerifierAndComposition) {
  const std::string input =
      R"({"response": "The answer is 6.", "reference": "6"})" "\n"
      R"({"response": "6", "reference": "6"})" "\n";
  {
    std::istringstream in(input);
    std::ostringstream out;
    ScoreFlags flags;
    flags.verifier = "math";
    ASSERT_TRUE(ScoreJsonl(flags, in, out, InProcess(MakeScorer())).ok());
    const auto lines = Lines(out.str());
    EXPECT_EQ(lines[0]["reward"], 1.0);
    EXPECT_EQ(lines[1]["reward"], 1.0);
  }
  {
    std::istringstream in(input);
    std::ostringstream out;
    ScoreFlags flags;
    flags.composition = "math:3,format:1";
    ASSERT_TRUE(ScoreJsonl(flags, in, out, InProcess(MakeScorer())).ok());
    const auto lines = Lines(out.str());
    EXPECT_EQ(lines[0]["reward"], 1.0);
    EXPECT_EQ(lines[1]["reward"], 0.75);  // Right, but not marked as the answer.
    ASSERT_EQ(lines[1]["components"].size(), 2u);
    EXPECT_EQ(lines[1]["components"][1]["verifier"], "format");
    EXPECT_EQ(lines[1]["components"][1]["weight"], 1.0);
  }
  EXPECT_THAT(std::string(ParseComposition("math:0").status().message()), HasSubstr("math:0"));
  EXPECT_FALSE(ParseComposition(":2").ok());
  EXPECT_EQ(ParseComposition(" math , format:0.5 ")->size(), 2u);
}

class ScoreCommandFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("score_command_test_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::filesystem::path dir_;
};

TEST_F(ScoreCommandFilesTest, InProcessFilesAndExitCodes) {
  ScoreFlags flags;
  flags.input = Write("in.jsonl",
                      R"({"verifier": "math", "response": "\\boxed{\\frac{1}{2}}", "reference": "0.5"})"
                      "\n");
  flags.output = (dir_ / "out.jsonl").string();
  std::ostringstream err;
  EXPECT_EQ(RunScore(flags, err), 0) << err.str();
  EXPECT_THAT(err.str(), HasSubstr("1 lines"));
  const auto lines = Lines(Read(flags.output));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0]["reward"], 1.0);

  flags.input = Write("bad.jsonl", "{oops\n");
  EXPECT_EQ(RunScore(flags, err), 3);
  flags.input = (dir_ / "missing.jsonl").string();
  std::ostringstream missing;
  EXPECT_EQ(RunScore(flags, missing), 1);
  EXPECT_THAT(missing.str(), HasSubstr("cannot open --input"));
  flags.input = Write("in2.jsonl", "{}\n");
  flags.composition = "math:-1";
  std::ostringstream bad_composition;
  EXPECT_EQ(RunScore(flags, bad_composition), 1);
  EXPECT_THAT(bad_composition.str(), HasSubstr("--composition"));
}

TEST_F(ScoreCommandFilesTest, ScoresOnARunningRewardServerWithTarget) {
  prometheus::Registry metrics;
  auto service = std::make_unique<reward_server::RewardServerServiceImpl>(MakeScorer(), metrics,
                                                                         reward_server::RewardServiceOptions{});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  ScoreFlags flags;
  flags.input = Write(
      "in.jsonl",
      R"({"verifier": "math", "response": "x = 5", "reference": "5"})" "\n"
      R"({"verifier": "math", "response": "3", "reference": "3\\sqrt{13}"})" "\n"
      R"({"verifier": "math", "response": "3", "solution": "3\\sqrt{13}"})" "\n");
  flags.output = (dir_ / "out.jsonl").string();
  flags.target = absl::StrCat("127.0.0.1:", port);
  std::ostringstream err;
  EXPECT_EQ(RunScore(flags, err), 0) << err.str();
  const auto lines = Lines(Read(flags.output));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["reward"], 1.0) << lines[0].dump();
  // reference_is_solution reaches the server: only as a solution is
  // "3\sqrt{13}" extracted from (and read as 3).
  EXPECT_EQ(lines[1]["reward"], 0.0) << lines[1].dump();
  EXPECT_EQ(lines[2]["reward"], 1.0) << lines[2].dump();
  server->Shutdown();

  std::ostringstream down;
  EXPECT_EQ(RunScore(flags, down), 1);
  EXPECT_THAT(down.str(), HasSubstr(flags.target));
}

}  // namespace
}  // namespace sluice::cli
