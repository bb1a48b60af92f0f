#include "common/tokenizer/bpe_tokenizer.h"

#include <atomic>
#include <cctype>
#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/tokenizer/chat_template.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TestdataPath(const std::string& relative) {
  return std::string(SLUICE_TESTDATA_DIR) + "/" + relative;
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

// Loading a 5 MB tokenizer.json takes a while; each is loaded once.
const BpeTokenizer& Load(const std::string& name) {
  static auto* tokenizers = new std::map<std::string, std::unique_ptr<BpeTokenizer>>();
  auto it = tokenizers->find(name);
  if (it == tokenizers->end()) {
    auto loaded = BpeTokenizer::FromFile(TestdataPath("tokenizers/" + name + "/tokenizer.json"));
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) std::abort();
    it = tokenizers->emplace(name, *std::move(loaded)).first;
  }
  return *it->second;
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<Case> LoadCases(const std::string& name) {
  std::vector<Case> cases;
  std::ifstream file(TestdataPath("tokenizers/" + name + "/cases.jsonl"));
  std::string line;
  while (std::getline(file, line)) {
    if (line.empty()) continue;
    const nlohmann::json json = nlohmann::json::parse(line);
    cases.push_back(Case{json["text"].get<std::string>(), json["ids"].get<std::vector<int32_t>>()});
  }
  return cases;
}

class OracleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OracleTest, EveryCaseMatchesAndRoundTrips) {
  const BpeTokenizer& tokenizer = Load(GetParam());
  const std::vector<Case> cases = LoadCases(GetParam());
  ASSERT_EQ(cases.size(), 46u);
  int matched = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = tokenizer.Encode(c.text);
    EXPECT_EQ(ids, c.ids) << "text: \"" << c.text << "\"";
    if (ids == c.ids) ++matched;
    absl::StatusOr<std::string> decoded = tokenizer.Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c.text);
  }
  EXPECT_EQ(matched, 46);
}

TEST_P(OracleTest, EmptyStringIsNoIds) {
  const BpeTokenizer& tokenizer = Load(GetParam());
  EXPECT_TRUE(tokenizer.Encode("").empty());
  EXPECT_EQ(tokenizer.Decode({}).value(), "");
}

TEST_P(OracleTest, InvalidUtf8RoundTripsByteForByte) {
  const BpeTokenizer& tokenizer = Load(GetParam());
  for (const std::string& text :
       {std::string("\xff"), std::string("abc\xff\xfe def"), std::string("\xe2\x82"),
        std::string("caf\xc3"), std::string("\xc3\xa9\x80\x80 x"), std::string("\0a\0", 3),
        std::string("\xed\xa0\x80 surrogate"), std::string("\xf4\x90\x80\x80 too big")}) {
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tokenizer.Decode(ids).value(), text);
  }
}

TEST_P(OracleTest, DecodeRejectsIdsThatAreNotTokens) {
  const BpeTokenizer& tokenizer = Load(GetParam());
  const int32_t size = tokenizer.vocab_size();
  for (int32_t bad : {-1, size, size + 1000}) {
    absl::StatusOr<std::string> decoded = tokenizer.Decode({1, bad});
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(decoded.status().message(), HasSubstr("ids[1]"));
  }
}

TEST_P(OracleTest, RoundTripsMixedScriptsAndWhitespace) {
  const BpeTokenizer& tokenizer = Load(GetParam());
  const std::string text =
      "  Hello,\tworld!\r\n\n  Ünïcödé — 日本語のテキスト 🦙🦙 x²+y₂ 12345678 don'T "
      "we'LL\x0b\xc2\x85 end  ";
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text)).value(), text);
}

TEST_P(OracleTest, LargeAndRandomInputsRoundTrip) {
  const BpeTokenizer& tokenizer = Load(GetParam());
  std::mt19937 rng(7);
  std::string bytes(1 << 16, 0);
  for (char& c : bytes) c = static_cast<char>(rng());
  const std::string random_bytes = bytes;
  const std::string long_word(200000, 'a');
  const std::string long_spaces = std::string(100000, ' ') + "x";
  for (const std::string* text : {&random_bytes, &long_word, &long_spaces}) {
    const std::vector<int32_t> ids = tokenizer.Encode(*text);
    EXPECT_LT(ids.size(), text->size() + 1);
    const std::string decoded = tokenizer.Decode(ids).value();
    if (GetParam() == "qwen2") {
      // Qwen2 normalises to NFC: decoding gives the normalised text, which
      // encodes to the same ids.
      EXPECT_TRUE(tokenizer.Encode(decoded) == ids);
    } else {
      EXPECT_TRUE(decoded == *text);
    }
  }
}

TEST_P(OracleTest, ConcurrentEncodesAgree) {
  const BpeTokenizer& tokenizer = Load(GetParam());
  const std::vector<Case> cases = LoadCases(GetParam());
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        for (const Case& c : cases) {
          if (tokenizer.Encode(c.text) != c.ids) ++mismatches;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, OracleTest, ::testing::Values("qwen2", "llama3"));

TEST(BpeTokenizerTest, QwenSpecialTokensAreKeptWhole) {
  const BpeTokenizer& tokenizer = Load("qwen2");
  const std::vector<int32_t> ids = tokenizer.Encode("<|im_start|>user\nhi<|im_end|>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(ids.back(), 151645);
  // "user", "\n", "hi" in between, as the ordinary text encodes.
  std::vector<int32_t> middle(ids.begin() + 1, ids.end() - 1);
  EXPECT_EQ(middle, tokenizer.Encode("user\nhi"));
  EXPECT_EQ(tokenizer.Decode(ids).value(), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_TRUE(tokenizer.IsSpecial(151644));
  EXPECT_FALSE(tokenizer.IsSpecial(9707));
}

TEST(BpeTokenizerTest, SpecialTokensAreTextWhenNotAllowed) {
  const BpeTokenizer& tokenizer = Load("qwen2");
  const std::vector<int32_t> ids = tokenizer.Encode("<|im_end|>", /*allow_special=*/false);
  EXPECT_GT(ids.size(), 1u);
  for (int32_t id : ids) EXPECT_LT(id, 151643);
  EXPECT_EQ(tokenizer.Decode(ids).value(), "<|im_end|>");
}

TEST(BpeTokenizerTest, AdjacentSpecialTokensAndPartialMarkers) {
  const BpeTokenizer& tokenizer = Load("llama3");
  EXPECT_THAT(tokenizer.Encode("<|begin_of_text|><|eot_id|>"), ElementsAre(128000, 128009));
  // A marker cut short is ordinary text.
  const std::vector<int32_t> ids = tokenizer.Encode("<|eot_id");
  for (int32_t id : ids) EXPECT_LT(id, 128000);
}

TEST(BpeTokenizerTest, TokenLookups) {
  const BpeTokenizer& qwen = Load("qwen2");
  EXPECT_EQ(qwen.vocab_size(), 151646);
  EXPECT_EQ(qwen.TokenToId("<|endoftext|>"), 151643);
  EXPECT_EQ(qwen.TokenToId("Hello"), 9707);
  EXPECT_EQ(qwen.TokenToId("ĠHello"), 21927);
  EXPECT_EQ(qwen.IdToToken(21927), "ĠHello");
  EXPECT_EQ(qwen.IdToBytes(21927), " Hello");
  EXPECT_EQ(qwen.TokenToId("no such token"), std::nullopt);
  EXPECT_EQ(qwen.IdToToken(-3), std::nullopt);
  EXPECT_EQ(qwen.eos_id(), 151645);
  EXPECT_EQ(qwen.bos_id(), std::nullopt);
  EXPECT_EQ(qwen.num_merges(), 151387);

  const BpeTokenizer& llama = Load("llama3");
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.bos_id(), 128000);
  EXPECT_EQ(llama.eos_id(), 128009);
}

TEST(BpeTokenizerTest, ChatMlEncodesToMarkerIds) {
  const BpeTokenizer& tokenizer = Load("qwen2");
  const std::string prompt =
      ApplyChatMlTemplate({{"user", "What is 2+2?"}}, /*add_generation_prompt=*/true);
  const std::vector<int32_t> ids = tokenizer.Encode(prompt);
  EXPECT_EQ(ids.front(), 151644);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151644), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 1);
  EXPECT_EQ(tokenizer.Decode(ids).value(), prompt);
}

// A minimal byte-level tokenizer.json around `model` and the other parts.
std::string TinyJson(const std::string& model, const std::string& extra = "") {
  std::string vocab;
  // Every byte as its byte-level character, as ids 0..255.
  nlohmann::json v = nlohmann::json::object();
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int c = printable ? b : next++;
    std::string s;
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    v[s] = b;
  }
  v["ab"] = 256;
  v["abc"] = 257;
  v["Ġa"] = 258;
  nlohmann::json root = nlohmann::json::parse(
      R"({"normalizer":null,"added_tokens":[{"id":300,"content":"<eos>","special":true}],
          "pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},
          "decoder":{"type":"ByteLevel"}})");
  nlohmann::json model_json = nlohmann::json::parse(model);
  if (model_json.is_object() && !model_json.contains("vocab")) model_json["vocab"] = v;
  root["model"] = model_json;
  if (!extra.empty()) {
    const nlohmann::json overrides = nlohmann::json::parse(extra);
    for (auto it = overrides.begin(); it != overrides.end(); ++it) root[it.key()] = it.value();
  }
  return root.dump();
}

// Meta's own Llama-3 tokenizer.json adds <|begin_of_text|> through a
// TemplateProcessing post-processor (llama.cpp's conversion, in testdata,
// keeps only ByteLevel); prefix_ids() reports it and Encode leaves it out.
TEST(BpeTokenizerTest, TemplateProcessingPrefixIsReportedNotAdded) {
  nlohmann::json root =
      nlohmann::json::parse(ReadFile(TestdataPath("tokenizers/llama3/tokenizer.json")));
  EXPECT_TRUE(Load("llama3").prefix_ids().empty());
  EXPECT_TRUE(Load("qwen2").prefix_ids().empty());
  root["post_processor"] = nlohmann::json::parse(R"({
    "type": "Sequence",
    "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                  {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}}],
       "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000],
                                                "tokens": ["<|begin_of_text|>"]}}}]})");
  auto tokenizer = BpeTokenizer::FromJson(root.dump());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->prefix_ids(), std::vector<int32_t>{128000});
  EXPECT_EQ((*tokenizer)->Encode("Hello"), Load("llama3").Encode("Hello"));

  // A template naming a token the vocabulary lacks is an error naming it.
  root["post_processor"] = nlohmann::json::parse(R"({"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<nope>", "type_id": 0}}, {"Sequence": {"id": "A"}}]})");
  auto bad = BpeTokenizer::FromJson(root.dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("post_processor.single"), absl::string_view::npos);
  EXPECT_NE(bad.status().message().find("<nope>"), absl::string_view::npos);
}

TEST(BpeTokenizerTest, TinyTokenizerMergesByRankWithBothMergeSpellings) {
  for (const std::string merges :
       {R"(["a b", "ab c", "Ġ a"])", R"([["a", "b"], ["ab", "c"], ["Ġ", "a"]])"}) {
    auto tokenizer = BpeTokenizer::FromJson(TinyJson(R"({"type":"BPE","merges":)" + merges + "}"));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    EXPECT_THAT((*tokenizer)->Encode("abc abd<eos>"), ElementsAre(257, ' ', 256, 'd', 300));
    EXPECT_EQ((*tokenizer)->Decode({257, 258, 300}).value(), "abc a<eos>");
  }
}

TEST(BpeTokenizerTest, IgnoreMergesEmitsWholeVocabPreTokens) {
  // No merge leads to "abc", but it is in the vocab.
  auto plain = BpeTokenizer::FromJson(TinyJson(R"({"type":"BPE","merges":[]})"));
  auto ignoring =
      BpeTokenizer::FromJson(TinyJson(R"({"type":"BPE","merges":[],"ignore_merges":true})"));
  ASSERT_TRUE(plain.ok() && ignoring.ok());
  EXPECT_THAT((*plain)->Encode("abc"), ElementsAre('a', 'b', 'c'));
  EXPECT_THAT((*ignoring)->Encode("abc"), ElementsAre(257));
}

void ExpectInvalid(const std::string& json, const std::string& message) {
  auto tokenizer = BpeTokenizer::FromJson(json);
  ASSERT_FALSE(tokenizer.ok()) << "accepted: " << json.substr(0, 200);
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(message));
}

TEST(BpeTokenizerTest, RejectsMalformedFiles) {
  const std::string good = TinyJson(R"({"type":"BPE","merges":["a b"]})");
  ASSERT_TRUE(BpeTokenizer::FromJson(good).ok());
  ExpectInvalid(good.substr(0, good.size() / 2), "not valid JSON");
  ExpectInvalid("", "not valid JSON");
  ExpectInvalid("[1,2]", "must be a JSON object");
  ExpectInvalid("{}", "model");
  ExpectInvalid(TinyJson(R"({"type":"WordPiece","merges":[]})"),
                "model.type: only BPE is supported, got WordPiece");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":["a zzz"]})"),
                "model.merges[0]: \"zzz\" is not in the vocab");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":["a b", "b a"]})"),
                "model.merges[1]: the merged token \"ba\" is not in the vocab");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":["ab"]})"), "model.merges[0]");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[7]})"), "model.merges[0]");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":"a b"})"), "model.merges");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[],"vocab":{"a":"x"}})"), "model.vocab");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[],"vocab":{"a":2147483647}})"), "out of range");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[],"vocab":{"a":1,"b":1}})"), "is also used by");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[]})", R"({"normalizer":{"type":"Lowercase"}})"),
                "normalizer.type: unsupported normalizer \"Lowercase\"");
  ExpectInvalid(
      TinyJson(R"({"type":"BPE","merges":[]})",
               R"({"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Metaspace"}]}})"),
      "pre_tokenizer.pretokenizers[0].type");
  ExpectInvalid(
      TinyJson(
          R"({"type":"BPE","merges":[]})",
          R"({"pre_tokenizer":{"type":"Split","pattern":{"Regex":"("},"behavior":"Isolated"}})"),
      "pre_tokenizer.pattern");
  ExpectInvalid(
      TinyJson(
          R"({"type":"BPE","merges":[]})",
          R"({"pre_tokenizer":{"type":"Split","pattern":{"Regex":"a"},"behavior":"Removed"}})"),
      "pre_tokenizer.behavior");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[]})", R"({"pre_tokenizer":null})"),
                "ByteLevel pre-tokenizer");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[]})", R"({"decoder":{"type":"WordPiece"}})"),
                "decoder.type");
  ExpectInvalid(
      TinyJson(R"({"type":"BPE","merges":[]})", R"({"added_tokens":[{"id":-1,"content":"x"}]})"),
      "added_tokens[0].id");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[]})", R"({"added_tokens":[{"id":5}]})"),
                "added_tokens[0].content");
  ExpectInvalid(TinyJson(R"({"type":"BPE","merges":[],"byte_fallback":true})"),
                "model.byte_fallback");
}

TEST(BpeTokenizerTest, TruncatedRealFileIsAnError) {
  std::string json = ReadFile(TestdataPath("tokenizers/qwen2/tokenizer.json"));
  while (!json.empty() && std::isspace(static_cast<unsigned char>(json.back()))) json.pop_back();
  ASSERT_GT(json.size(), 1000u);
  for (size_t cut : {size_t{1}, json.size() / 3, json.size() - 1}) {
    ExpectInvalid(json.substr(0, cut), "not valid JSON");
  }
}

TEST(BpeTokenizerTest, MissingFileIsNotFound) {
  auto tokenizer = BpeTokenizer::FromFile("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
}

// Not an assertion on speed: prints the encoding throughput on GSM8K
// questions for the record.
TEST(BpeTokenizerTest, ReportsThroughputOnGsm8kQuestions) {
  std::ifstream file(TestdataPath("datasets/gsm8k/test.jsonl"));
  std::vector<std::string> questions;
  std::string line;
  size_t bytes = 0;
  while (std::getline(file, line)) {
    questions.push_back(nlohmann::json::parse(line)["question"].get<std::string>());
    bytes += questions.back().size();
  }
  if (questions.empty()) GTEST_SKIP() << "no gsm8k data";
  for (const char* name : {"qwen2", "llama3"}) {
    const BpeTokenizer& tokenizer = Load(name);
    size_t tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int pass = 0; pass < 3; ++pass) {
      for (const std::string& q : questions) tokens += tokenizer.Encode(q).size();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %.1f MB/s (%zu questions, %zu bytes, %zu tokens per pass)\n", name,
                3 * bytes / seconds / 1e6, questions.size(), bytes, tokens / 3);
    for (const std::string& q : questions) {
      ASSERT_EQ(tokenizer.Decode(tokenizer.Encode(q)).value(), q);
    }
  }
}

}  // namespace
}  // namespace sluice::tokenizer
