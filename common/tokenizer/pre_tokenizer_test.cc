#include "common/tokenizer/pre_tokenizer.h"

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::tokenizer {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> SplitWith(const Splitter& splitter, const std::string& text) {
  std::vector<absl::string_view> pieces;
  splitter.Split(text, &pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

std::unique_ptr<Splitter> Make(absl::string_view pattern, bool fast) {
  auto splitter = MakeRegexSplitter(pattern, fast);
  EXPECT_TRUE(splitter.ok()) << splitter.status();
  return *std::move(splitter);
}

TEST(PreTokenizerTest, Qwen2SplitsDigitsSinglyAndLlama3ByThree) {
  for (bool fast : {true, false}) {
    EXPECT_THAT(SplitWith(*Make(kQwen2Pattern, fast), "ab 1234"),
                ElementsAre("ab", " ", "1", "2", "3", "4"));
    EXPECT_THAT(SplitWith(*Make(kLlama3Pattern, fast), "ab 1234"),
                ElementsAre("ab", " ", "123", "4"));
  }
}

TEST(PreTokenizerTest, ContractionsWhitespaceAndPunctuation) {
  for (bool fast : {true, false}) {
    auto splitter = Make(kLlama3Pattern, fast);
    EXPECT_THAT(SplitWith(*splitter, "I'M here   now!!\n\n  x"),
                ElementsAre("I", "'M", " here", "  ", " now", "!!\n\n", " ", " x"));
    EXPECT_THAT(SplitWith(*splitter, "a \n b  "), ElementsAre("a", " \n", " b", "  "));
  }
}

TEST(PreTokenizerTest, GapsBetweenMatchesArePreTokens) {
  auto splitter = Make("[0-9]+", false);
  EXPECT_THAT(SplitWith(*splitter, "ab12cd3"), ElementsAre("ab", "12", "cd", "3"));
  EXPECT_THAT(SplitWith(*splitter, ""), ElementsAre());
  auto literal = Make(QuoteRegex("a.b"), false);
  EXPECT_THAT(SplitWith(*literal, "xa.bya_b"), ElementsAre("x", "a.b", "ya_b"));
}

// A tokenizer.json's Split pattern may backtrack exponentially; encoding
// with it used to hang (found writing the tokenizer fuzz target). Now the
// match gives up and the rest of the text is one pre-token.
TEST(PreTokenizerTest, ABacktrackingPatternGivesUpInsteadOfHanging) {
  auto splitter = Make("(a|aa)*c", false);
  const std::string text = "ac " + std::string(80, 'a') + " tail";
  const std::vector<std::string> pieces = SplitWith(*splitter, text);
  ASSERT_GE(pieces.size(), 2u);
  EXPECT_EQ(pieces[0], "ac");
  std::string joined;
  for (const std::string& piece : pieces) joined += piece;
  EXPECT_EQ(joined, text);
}

TEST(PreTokenizerTest, BadPatternIsInvalidArgument) {
  auto splitter = MakeRegexSplitter("(unclosed", true);
  ASSERT_FALSE(splitter.ok());
  EXPECT_EQ(splitter.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PreTokenizerTest, InvalidUtf8BytesAreCoveredOneByOne) {
  for (bool fast : {true, false}) {
    auto splitter = Make(kQwen2Pattern, fast);
    const std::string text = "a\xff\xfe b\xe2\x82";
    std::string joined;
    for (const std::string& piece : SplitWith(*splitter, text)) joined += piece;
    EXPECT_EQ(joined, text);
  }
}

// The hand-written scanners must split exactly as ICU runs the patterns.
TEST(PreTokenizerTest, FastPathsAgreeWithRegexOnRandomText) {
  const std::vector<std::string> alphabet = {"a",
                                             "Z",
                                             "s",
                                             "S",
                                             "t",
                                             "re",
                                             "ll",
                                             "D",
                                             "'",
                                             "'",
                                             "0",
                                             "7",
                                             "٣",
                                             "²",
                                             "Ⅻ",
                                             " ",
                                             " ",
                                             "  ",
                                             "\t",
                                             "\n",
                                             "\r",
                                             "\r\n",
                                             "\v",
                                             "\f",
                                             "\xc2\x85",
                                             "\xc2\xa0",
                                             "\xe3\x80\x80",
                                             "!",
                                             "?",
                                             ".",
                                             ",",
                                             "-",
                                             "_",
                                             "é",
                                             "e\xcc\x81",
                                             "ß",
                                             "日",
                                             "本",
                                             "ア",
                                             "я",
                                             "ſ",
                                             "🦙",
                                             "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
                                             "\xe2\x80\x8b",
                                             "\xff",
                                             "\xc3",
                                             "\xe2\x82",
                                             "\x01",
                                             "$",
                                             "ក",
                                             "្",
                                             "\xef\xbf\xbd"};
  std::mt19937 rng(12345);
  for (absl::string_view pattern : {kQwen2Pattern, kLlama3Pattern}) {
    auto fast = Make(pattern, true);
    auto regex = Make(pattern, false);
    for (int trial = 0; trial < 3000; ++trial) {
      std::string text;
      const int length = std::uniform_int_distribution<int>(0, 24)(rng);
      for (int i = 0; i < length; ++i) {
        text += alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      }
      ASSERT_EQ(SplitWith(*fast, text), SplitWith(*regex, text)) << "text: \"" << text << "\"";
    }
  }
}

TEST(PreTokenizerTest, FastPathsAgreeWithRegexOnOracleTexts) {
  for (const char* model : {"qwen2", "llama3"}) {
    const absl::string_view pattern =
        std::string(model) == "qwen2" ? kQwen2Pattern : kLlama3Pattern;
    auto fast = Make(pattern, true);
    auto regex = Make(pattern, false);
    std::ifstream file(std::string(SLUICE_TESTDATA_DIR) + "/tokenizers/" + model + "/cases.jsonl");
    std::string line;
    int texts = 0;
    while (std::getline(file, line)) {
      const std::string text = nlohmann::json::parse(line)["text"].get<std::string>();
      EXPECT_EQ(SplitWith(*fast, text), SplitWith(*regex, text)) << "text: \"" << text << "\"";
      ++texts;
    }
    EXPECT_EQ(texts, 46);
  }
}

}  // namespace
}  // namespace sluice::tokenizer
