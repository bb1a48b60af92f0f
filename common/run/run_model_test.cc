#include "common/run/run_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "absl/strings/str_join.h"
#include "common/task/char_tokenizer.h"
#include "nlohmann/json.hpp"

namespace sluice::run {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::string TestData(const std::string& relative) {
  return (fs::path(SLUICE_TESTDATA_DIR) / relative).string();
}

// A scratch directory removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    path_ = fs::temp_directory_path() /
            ("run_model_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void Copy(const std::string& from, const std::string& to) {
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

v1::RunSpec SpecWithModel(const v1::ModelConfig& model) {
  v1::RunSpec spec;
  *spec.mutable_model() = model;
  return spec;
}

std::vector<std::string> Problems(const v1::RunSpec& spec) {
  std::vector<std::string> problems;
  ValidateRunModel(spec, &problems);
  return problems;
}

TEST(BuiltinTokenizerTest, GivesTheCharacterTokenizersIdsForEveryAlphabetString) {
  v1::ModelConfig model;
  model.set_builtin("tiny");
  auto bpe = LoadRunTokenizer(model);
  ASSERT_TRUE(bpe.ok()) << bpe.status();
  const task::CharTokenizer chars;
  EXPECT_EQ((*bpe)->vocab_size(), chars.vocab_size());
  EXPECT_EQ((*bpe)->bos_id(), chars.bos_id());
  EXPECT_EQ((*bpe)->eos_id(), chars.eos_id());
  const std::string alphabet = "0123456789+-*=() .,?:";
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const size_t length = rng() % 40;
    for (size_t i = 0; i < length; ++i) text += alphabet[rng() % alphabet.size()];
    auto expected = chars.Encode(text);
    ASSERT_TRUE(expected.ok());
    const std::vector<int32_t> ids = (*bpe)->Encode(text);
    ASSERT_EQ(ids, *expected) << "\"" << text << "\"";
    auto decoded = (*bpe)->Decode(ids);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, text);
  }
  // Specials are whole tokens; generated text drops them.
  EXPECT_THAT((*bpe)->Encode("<bos>1+2=<eos>"),
              ElementsAre(1, 4, 13, 5, 16, 2));
  auto completion = (*bpe)->Decode({6, 5, 2, 0}, /*skip_special=*/true);
  ASSERT_TRUE(completion.ok());
  EXPECT_EQ(*completion, "32");
  auto raw = (*bpe)->Decode({6, 2});
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, "3<eos>");
}

TEST(RunModelTest, EncodePromptAddsThePostProcessorPrefixOnce) {
  std::ifstream in(TestData("tokenizers/llama3/tokenizer.json"));
  nlohmann::json root = nlohmann::json::parse(in);
  // Meta's post-processor: <|begin_of_text|> before every text.
  root["post_processor"] = nlohmann::json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000]}}})");
  const std::string text = root.dump();
  auto llama = tokenizer::BpeTokenizer::FromJson(text);
  ASSERT_TRUE(llama.ok()) << llama.status();
  const std::vector<int32_t> hello = (*llama)->Encode("Hello");
  std::vector<int32_t> expected = {128000};
  expected.insert(expected.end(), hello.begin(), hello.end());
  EXPECT_EQ(EncodePrompt(**llama, "Hello"), expected);
  // A template that writes the marker itself does not get a second one.
  EXPECT_EQ(EncodePrompt(**llama, "<|begin_of_text|>Hello"), expected);

  v1::ModelConfig builtin;
  builtin.set_builtin("micro");
  auto chars = LoadRunTokenizer(builtin);
  ASSERT_TRUE(chars.ok());
  EXPECT_THAT(EncodePrompt(**chars, "1+2="), ElementsAre(4, 13, 5, 16));
}

TEST(RunModelTest, BuiltinConfigStopAndPadTokens) {
  v1::ModelConfig model;
  model.set_builtin("micro");
  auto config = LoadRunModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  auto tokenizer = LoadRunTokenizer(model);
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_THAT(StopTokenIds(*config, **tokenizer), ElementsAre(task::CharTokenizer::kEosId));
  EXPECT_EQ(PadTokenId(*config, **tokenizer), task::CharTokenizer::kPadId);
  EXPECT_EQ(TokenizerPath(model), "");
}

TEST(RunModelTest, QwenInstructStopsAtEndOfTurnAndEndOfText) {
  auto tokenizer = tokenizer::BpeTokenizer::FromFile(TestData("tokenizers/qwen2/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  model::ModelConfig config;
  config.vocab_size = 151936;  // Qwen2.5's embedding: more rows than tokens.
  config.eos_token_id = 151643;  // <|endoftext|>, as in the base model's config.json
  // <|im_end|> first (the tokenizer's end of turn), then config.json's.
  EXPECT_THAT(StopTokenIds(config, **tokenizer), ElementsAre(151645, 151643));
  EXPECT_EQ(PadTokenId(config, **tokenizer), 151645);
  config.pad_token_id = 151643;
  EXPECT_EQ(PadTokenId(config, **tokenizer), 151643);
  // Ids past the vocabulary are never stop tokens.
  config.vocab_size = 1000;
  config.eos_token_id = 5000;
  EXPECT_THAT(StopTokenIds(config, **tokenizer), IsEmpty());
}

TEST(RunModelTest, ReadsAModelDirectorysConfigAndTokenizer) {
  ScratchDir dir;
  Copy(TestData("model_oracle/qwen2_tiny/config.json"), dir.path() + "/config.json");
  v1::ModelConfig model;
  model.set_hf_model_dir(dir.path());
  auto config = LoadRunModelConfig(model);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(config->vocab_size, 258);
  EXPECT_EQ(TokenizerPath(model), dir.path() + "/tokenizer.json");
  EXPECT_EQ(LoadRunTokenizer(model).status().code(), absl::StatusCode::kNotFound);

  // tokenizer_path as a file or as its directory.
  model.set_tokenizer_path(TestData("tokenizers/qwen2/tokenizer.json"));
  EXPECT_TRUE(LoadRunTokenizer(model).ok());
  model.set_tokenizer_path(TestData("tokenizers/qwen2"));
  EXPECT_EQ(TokenizerPath(model), TestData("tokenizers/qwen2") + "/tokenizer.json");
  EXPECT_TRUE(LoadRunTokenizer(model).ok());
}

TEST(RunModelTest, BadConfigsNameTheFileAndField) {
  ScratchDir dir;
  v1::ModelConfig model;
  model.set_hf_model_dir(dir.path());
  EXPECT_EQ(LoadRunModelConfig(model).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir.path() + "/config.json") << R"({"architectures": ["GPT2LMHeadModel"]})";
  auto config = LoadRunModelConfig(model);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr(dir.path() + "/config.json"));
  EXPECT_THAT(config.status().message(), HasSubstr("architectures: unsupported \"GPT2LMHeadModel\"; supported: LlamaForCausalLM, Qwen2ForCausalLM")) << config.status();
}

TEST(RunModelTest, CheckpointSideFilesOfABuiltinModelMakeItAHfDirectory) {
  v1::ModelConfig model;
  model.set_builtin("tiny");
  auto files = CheckpointSideFiles(model);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ(files->at("tokenizer.json"), task::CharTokenizer().ToHfTokenizerJson());
  EXPECT_THAT(files->at("tokenizer_config.json"), HasSubstr("\"eos_token\": \"<eos>\""));
}

TEST(RunModelTest, CheckpointSideFilesOfAModelDirectory) {
  ScratchDir dir;
  Copy(TestData("model_oracle/qwen2_tiny/config.json"), dir.path() + "/config.json");
  std::ofstream(dir.path() + "/tokenizer_config.json") << "{}";
  std::ofstream(dir.path() + "/generation_config.json") << R"({"eos_token_id": 257})";
  v1::ModelConfig model;
  model.set_hf_model_dir(dir.path());
  auto files = CheckpointSideFiles(model);
  ASSERT_TRUE(files.ok()) << files.status();
  std::vector<std::string> names;
  for (const auto& [name, contents] : *files) names.push_back(name);
  EXPECT_THAT(names, ElementsAre("generation_config.json", "tokenizer_config.json"));
  // A separate tokenizer travels as the checkpoint's tokenizer.json.
  model.set_tokenizer_path(TestData("tokenizers/llama3/tokenizer.json"));
  files = CheckpointSideFiles(model);
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(files->count("tokenizer.json"), 1u);
  EXPECT_GT(files->at("tokenizer.json").size(), 1000000u);
}

TEST(ValidateRunModelTest, AcceptsBuiltinModels) {
  v1::ModelConfig model;
  model.set_builtin("tiny");
  EXPECT_THAT(Problems(SpecWithModel(model)), IsEmpty());
}

TEST(ValidateRunModelTest, NamesEveryProblemWithItsField) {
  v1::ModelConfig model;
  model.set_builtin("huge");
  EXPECT_THAT(Problems(SpecWithModel(model)),
              ElementsAre(HasSubstr("model.builtin: unknown model \"huge\"; known:")));

  model.set_builtin("tiny");
  model.set_max_context_tokens(4096);
  model.set_tokenizer_path("/x/tokenizer.json");
  EXPECT_THAT(Problems(SpecWithModel(model)),
              ElementsAre(HasSubstr("model.tokenizer_path: builtin models use their built-in"),
                          HasSubstr("model.max_context_tokens: must be <= 1024 (the longest "
                                    "context a builtin model takes), got 4096")));
  // Within 1024 a builtin model takes the context it is given (rotary
  // positions): the run's config has it.
  model.clear_tokenizer_path();
  model.set_max_context_tokens(64);
  EXPECT_THAT(Problems(SpecWithModel(model)), IsEmpty());
  EXPECT_EQ(LoadRunModelConfig(model)->max_position_embeddings, 64);
  model.set_max_context_tokens(0);
  EXPECT_EQ(LoadRunModelConfig(model)->max_position_embeddings, 32);

  model.Clear();
  model.set_hf_model_dir("/no/such/model");
  EXPECT_THAT(Problems(SpecWithModel(model)),
              ElementsAre("model.hf_model_dir: \"/no/such/model\" is not a directory readable "
                          "by the controller"));

  ScratchDir dir;
  model.set_hf_model_dir(dir.path());
  EXPECT_THAT(Problems(SpecWithModel(model)),
              ElementsAre(HasSubstr("model.hf_model_dir: cannot open " + dir.path() +
                                    "/config.json")));

  Copy(TestData("model_oracle/qwen2_tiny/config.json"), dir.path() + "/config.json");
  EXPECT_THAT(Problems(SpecWithModel(model)),
              ElementsAre(HasSubstr("a model directory needs a tokenizer.json")));

  // A Qwen2 tokenizer for a 258-token model.
  model.set_tokenizer_path(TestData("tokenizers/qwen2/tokenizer.json"));
  EXPECT_THAT(Problems(SpecWithModel(model)),
              ElementsAre(HasSubstr("model.tokenizer_path: the tokenizer has 151646 tokens but "
                                    "the model's vocab_size is 258")));
}

TEST(ValidateRunModelTest, ChatMlNeedsItsTokens) {
  v1::RunSpec spec;
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->set_chat_template("chatml");
  EXPECT_THAT(Problems(spec),
              ElementsAre("task.chat_template: \"chatml\" needs the tokens <|im_start|> and "
                          "<|im_end|>, which the tiny model's tokenizer lacks"));
}

}  // namespace
}  // namespace sluice::run
