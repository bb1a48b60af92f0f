#include "cli/tokenize_command.h"

#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

TokenizeFlags QwenFlags() {
  TokenizeFlags flags;
  flags.tokenizer = std::string(SLUICE_TESTDATA_DIR) + "/tokenizers/qwen2/tokenizer.json";
  return flags;
}

TEST(TokenizeCommandTest, TokenizeWritesIdsPerLine) {
  std::istringstream in(
      "{\"text\": \"Hello world\"}\n\n{\"text\": \"<|im_start|>user\\nhi<|im_end|>\"}\n"
      "{\"text\": \"\"}\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunTokenize(QwenFlags(), in, out, err), 0);
  EXPECT_THAT(err.str(), IsEmpty());
  const std::string lines = out.str();
  EXPECT_EQ(lines.substr(0, lines.find('\n')), "{\"ids\":[9707,1879]}");
  EXPECT_THAT(lines, HasSubstr("{\"ids\":[151644,"));
  EXPECT_THAT(lines, HasSubstr(",151645]}\n{\"ids\":[]}\n"));
}

TEST(TokenizeCommandTest, NoSpecialEncodesMarkersAsText) {
  TokenizeFlags flags = QwenFlags();
  flags.no_special = true;
  std::istringstream in("{\"text\": \"<|im_end|>\"}\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunTokenize(flags, in, out, err), 0);
  EXPECT_THAT(out.str(), testing::Not(HasSubstr("151645")));
}

TEST(TokenizeCommandTest, DetokenizeWritesText) {
  std::istringstream in("{\"ids\": [9707, 1879]}\n{\"ids\": [151644, 872]}\n{\"ids\": []}\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunDetokenize(QwenFlags(), in, out, err), 0);
  EXPECT_THAT(err.str(), IsEmpty());
  EXPECT_EQ(out.str(),
            "{\"text\":\"Hello world\"}\n{\"text\":\"<|im_start|>user\"}\n{\"text\":\"\"}\n");
}

TEST(TokenizeCommandTest, BadLinesAreReportedAndTheRestIsProcessed) {
  std::istringstream in(
      "{\"text\": \"a\"}\nnot json\n[1]\n{\"ids\": [1]}\n{\"text\": 5}\n{\"text\": \"b\"}\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunTokenize(QwenFlags(), in, out, err), 1);
  EXPECT_EQ(out.str(), "{\"ids\":[64]}\n{\"ids\":[65]}\n");
  EXPECT_THAT(err.str(), HasSubstr("line 2: not valid JSON"));
  EXPECT_THAT(err.str(), HasSubstr("line 3: not a JSON object"));
  EXPECT_THAT(err.str(), HasSubstr("line 4: needs a string \"text\""));
  EXPECT_THAT(err.str(), HasSubstr("line 5: "));
}

TEST(TokenizeCommandTest, DetokenizeReportsIdsThatAreNotTokens) {
  std::istringstream in(
      "{\"ids\": [9707, 99999999]}\n{\"ids\": [\"x\"]}\n{\"ids\": 3}\n{\"ids\": [1879]}\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunDetokenize(QwenFlags(), in, out, err), 1);
  EXPECT_EQ(out.str(), "{\"text\":\" world\"}\n");
  EXPECT_THAT(err.str(), HasSubstr("line 1: ids[1]: 99999999 is not a token id"));
  EXPECT_THAT(err.str(), HasSubstr("line 2: ids[0]"));
  EXPECT_THAT(err.str(), HasSubstr("line 3: needs an array \"ids\""));
}

TEST(TokenizeCommandTest, DetokenizeOfHalfACharacterWritesReplacementChar) {
  // 144 is the lone byte 0xD4, the lead byte of a two-byte character.
  std::istringstream in("{\"ids\": [7]}\n{\"ids\": [144]}\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunDetokenize(QwenFlags(), in, out, err), 0);
  EXPECT_THAT(out.str(), HasSubstr("\xef\xbf\xbd"));  // U+FFFD for the lone byte.
}

TEST(TokenizeCommandTest, UnloadableTokenizerFailsWithoutReading) {
  TokenizeFlags flags;
  flags.tokenizer = "/nonexistent/tokenizer.json";
  std::istringstream in("{\"text\": \"a\"}\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunTokenize(flags, in, out, err), 1);
  EXPECT_THAT(out.str(), IsEmpty());
  EXPECT_THAT(err.str(), HasSubstr("cannot load tokenizer"));
  EXPECT_THAT(err.str(), HasSubstr("/nonexistent/tokenizer.json"));
}

TEST(TokenizeCommandTest, CommandsParseTheirFlags) {
  CLI::App app;
  TokenizeFlags flags;
  TokenizeCommands commands = AddTokenizeCommands(app, &flags);
  app.parse(std::vector<std::string>{"x.json", "--tokenizer", "--no-special", "tokenize"});
  EXPECT_TRUE(commands.tokenize->parsed());
  EXPECT_FALSE(commands.detokenize->parsed());
  EXPECT_EQ(flags.tokenizer, "x.json");
  EXPECT_TRUE(flags.no_special);
}

}  // namespace
}  // namespace sluice::cli
