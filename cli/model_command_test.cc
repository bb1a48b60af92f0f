#include "cli/model_command.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "common/model/hf_checkpoint.h"
#include "common/tokenizer/bpe_tokenizer.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int64_t kVocab = 258;

std::string OracleDir(const std::string& model) {
  return absl::StrCat(SLUICE_TESTDATA_DIR, "/model_oracle/", model);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::vector<nlohmann::json> Cases(const std::string& model) {
  std::vector<nlohmann::json> cases;
  std::istringstream in(ReadAll(OracleDir(model) + "/cases.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) cases.push_back(nlohmann::json::parse(line));
  }
  return cases;
}

class ModelCommandTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelCommandTest, LogitsMatchTheOracle) {
  const nlohmann::json c = Cases(GetParam())[1];  // 7 tokens
  ModelFlags flags;
  flags.model_dir = OracleDir(GetParam());
  flags.ids = absl::StrJoin(c["input_ids"].get<std::vector<int>>(), ",");
  std::ostringstream out, err;
  ASSERT_EQ(RunLogits(flags, out, err), 0) << err.str();
  const nlohmann::json result = nlohmann::json::parse(out.str());
  const std::string oracle = ReadAll(OracleDir(GetParam()) + "/logits.f32");
  const int64_t offset = c["logits_row_offset"];
  ASSERT_EQ(result["logits"].size(), c["input_ids"].size());
  double worst = 0;
  for (size_t t = 0; t < result["logits"].size(); ++t) {
    ASSERT_EQ(result["logits"][t].size(), static_cast<size_t>(kVocab));
    for (int64_t v = 0; v < kVocab; ++v) {
      float expected;
      std::memcpy(&expected, oracle.data() + ((offset + t) * kVocab + v) * 4, 4);
      worst = std::max(worst, std::abs(result["logits"][t][v].get<double>() - expected));
    }
  }
  EXPECT_LE(worst, 1e-4);
}

TEST_P(ModelCommandTest, GreedyGenerateMatchesTheOracle) {
  for (const nlohmann::json& c : Cases(GetParam())) {
    ModelFlags flags;
    flags.model_dir = OracleDir(GetParam());
    flags.ids = absl::StrJoin(c["input_ids"].get<std::vector<int>>(), ",");
    flags.greedy = true;
    flags.ignore_eos = true;
    flags.max_new_tokens = 16;
    std::ostringstream out, err;
    ASSERT_EQ(RunGenerate(flags, out, err), 0) << err.str();
    const nlohmann::json result = nlohmann::json::parse(out.str());
    EXPECT_EQ(result["ids"], c["greedy_16"]) << "case " << c["case"];
    EXPECT_EQ(result["finish"], "length");
    EXPECT_FALSE(result.contains("text"));  // no tokenizer.json here
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ModelCommandTest, ::testing::Values("qwen2_tiny", "llama_tiny"));

TEST(ModelCommand, GenerateStopsAtEosAndSamplingIsSeeded) {
  ModelFlags flags;
  flags.model_dir = OracleDir("llama_tiny");
  flags.ids = "1,2,3";
  flags.max_new_tokens = 12;
  flags.temperature = 1.0;
  flags.seed = 7;
  std::ostringstream first, second, err;
  ASSERT_EQ(RunGenerate(flags, first, err), 0) << err.str();
  ASSERT_EQ(RunGenerate(flags, second, err), 0) << err.str();
  EXPECT_EQ(first.str(), second.str());
  const nlohmann::json result = nlohmann::json::parse(first.str());
  const std::vector<int> ids = result["ids"];
  ASSERT_FALSE(ids.empty());
  EXPECT_LE(ids.size(), 12u);
  const bool stopped = ids.back() == 257;  // eos_token_id of the config
  EXPECT_EQ(result["finish"], stopped ? "stop" : "length");
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_NE(ids[i], 257);
}

TEST(ModelCommand, BadFlagsAreUsageErrors) {
  ModelFlags flags;
  flags.model_dir = OracleDir("qwen2_tiny");
  std::ostringstream out, err;
  flags.ids = "1,x,3";
  EXPECT_EQ(RunLogits(flags, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("\"x\" is not a token id"));
  flags.ids = "1,258";
  EXPECT_EQ(RunLogits(flags, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("token id 258 is outside the vocabulary [0, 258)"));
  flags.ids = "";
  flags.prompt = "hello";
  EXPECT_EQ(RunGenerate(flags, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("--prompt needs a tokenizer"));
  flags.prompt = "";
  EXPECT_EQ(RunGenerate(flags, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("exactly one of --ids and --prompt"));
  flags.ids = "1";
  flags.top_p = 0;
  EXPECT_EQ(RunGenerate(flags, out, err), 2);
  flags.model_dir = "/nonexistent/model";
  EXPECT_EQ(RunLogits(flags, out, err), 1);
  EXPECT_THAT(err.str(), HasSubstr("no config.json"));
  EXPECT_TRUE(out.str().empty());
}

// A stand-in tokenizer: one id per byte (ids 0..255), as the oracle vocab is.
class ByteTokenizer : public TextTokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (int32_t id : ids) text += id < 256 ? std::string(1, static_cast<char>(id)) : "<eos>";
    return text;
  }
};

TEST(ModelCommand, PromptAndTextGoThroughTheTokenizerHook) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("model_command_test_", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* name : {"config.json", "model.safetensors"}) {
    fs::copy_file(fs::path(OracleDir("qwen2_tiny")) / name, dir / name);
  }
  std::ofstream(dir / "tokenizer.json") << "{}";
  TokenizerLoader loader = [](const std::string& path) -> absl::StatusOr<std::unique_ptr<TextTokenizer>> {
    EXPECT_THAT(path, HasSubstr("tokenizer.json"));
    return std::unique_ptr<TextTokenizer>(new ByteTokenizer());
  };
  ModelFlags flags;
  flags.model_dir = dir.string();
  flags.prompt = "abc";
  flags.greedy = true;
  flags.ignore_eos = true;
  flags.max_new_tokens = 4;
  std::ostringstream by_prompt, by_ids, err;
  ASSERT_EQ(RunGenerate(flags, by_prompt, err, loader), 0) << err.str();
  flags.prompt = "";
  flags.ids = "97,98,99";
  ASSERT_EQ(RunGenerate(flags, by_ids, err, loader), 0) << err.str();
  EXPECT_EQ(by_prompt.str(), by_ids.str());
  const nlohmann::json result = nlohmann::json::parse(by_prompt.str());
  ASSERT_TRUE(result.contains("text"));
  EXPECT_EQ(result["ids"].size(), 4u);
  fs::remove_all(dir);
}

// The real path: a Qwen2-shaped model whose vocabulary covers Qwen's
// tokenizer, saved as an HF directory with its tokenizer.json, driven by
// --prompt through DefaultTokenizerLoader (common/tokenizer's BPE).
TEST(ModelCommand, PromptThroughARealTokenizerJson) {
  TokenizerLoader loader = DefaultTokenizerLoader();
  ASSERT_TRUE(loader) << "this build has no tokenizer support";
  const std::string tokenizer_json =
      absl::StrCat(SLUICE_TESTDATA_DIR, "/tokenizers/qwen2/tokenizer.json");
  model::ModelConfig config;
  config.architecture = "Qwen2ForCausalLM";
  config.vocab_size = 151646;  // 151643 BPE tokens + 3 special ones.
  config.hidden_size = 16;
  config.intermediate_size = 32;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 1;
  config.max_position_embeddings = 64;
  config.attention_bias = true;
  config.eos_token_id = 151645;
  absl::StatusOr<std::unique_ptr<model::Transformer>> created = model::Transformer::Create(config, 5);
  ASSERT_TRUE(created.ok()) << created.status();
  const fs::path dir =
      fs::temp_directory_path() / absl::StrCat("model_command_real_tokenizer_", getpid());
  fs::remove_all(dir);
  model::SaveHfOptions save;
  save.extra_files = {tokenizer_json};
  ASSERT_TRUE(model::SaveHfModel(dir.string(), **created, save).ok());

  ModelFlags flags;
  flags.model_dir = dir.string();
  flags.prompt = "Hello world";
  std::ostringstream logits, err;
  ASSERT_EQ(RunLogits(flags, logits, err), 0) << err.str();
  // "Hello world" is [9707, 1879] in Qwen2's vocabulary: two positions.
  EXPECT_EQ(nlohmann::json::parse(logits.str())["logits"].size(), 2u);

  flags.greedy = true;
  flags.ignore_eos = true;
  flags.max_new_tokens = 5;
  std::ostringstream by_prompt, by_ids;
  ASSERT_EQ(RunGenerate(flags, by_prompt, err), 0) << err.str();
  flags.prompt = "";
  flags.ids = "9707,1879";
  ASSERT_EQ(RunGenerate(flags, by_ids, err), 0) << err.str();
  EXPECT_EQ(by_prompt.str(), by_ids.str());
  const nlohmann::json result = nlohmann::json::parse(by_prompt.str());
  ASSERT_EQ(result["ids"].size(), 5u);
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> bpe =
      tokenizer::BpeTokenizer::FromFile(tokenizer_json);
  ASSERT_TRUE(bpe.ok());
  absl::StatusOr<std::string> text = (*bpe)->Decode(result["ids"].get<std::vector<int32_t>>());
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(result["text"], *text);
  fs::remove_all(dir);
}

TEST(ModelCommand, AddModelCommandsParsesFlags) {
  CLI::App app;
  ModelFlags flags;
  InitModelFlags init_flags;
  ModelCommands commands = AddModelCommands(app, &flags, &init_flags);
  std::vector<std::string> args = {"sluice",   "generate", "--model", "/m",     "--ids",
                                   "1,2",      "--greedy", "--seed",  "3",      "--max-new-tokens",
                                   "5"};
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  EXPECT_TRUE(commands.generate->parsed());
  EXPECT_FALSE(commands.logits->parsed());
  EXPECT_EQ(flags.model_dir, "/m");
  EXPECT_EQ(flags.ids, "1,2");
  EXPECT_TRUE(flags.greedy);
  EXPECT_EQ(flags.seed, 3u);
  EXPECT_EQ(flags.max_new_tokens, 5);
  EXPECT_THAT(*ParseIds(" 4, 5 ,6"), ElementsAre(4, 5, 6));
}

TEST(ModelCommand, InitModelWritesTheRunsStartingWeightsAsAnHfDirectory) {
  const std::string dir =
      (fs::temp_directory_path() / ("init_model_" + std::to_string(::getpid()))).string();
  InitModelFlags flags;
  flags.builtin = "micro";
  flags.out_dir = dir;
  flags.seed = 5;
  std::ostringstream out, err;
  ASSERT_EQ(RunInitModel(flags, out, err), 0) << err.str();
  const nlohmann::json result = nlohmann::json::parse(out.str());
  EXPECT_EQ(result["dir"], dir);
  absl::StatusOr<model::HfModel> loaded = model::LoadHfModel(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(result["parameters"], loaded->config.ParameterCount());
  // The same weights a run of seed 5 starts from.
  auto expected = model::Transformer::Create(loaded->config, 5);
  ASSERT_TRUE(expected.ok());
  for (size_t i = 0; i < loaded->model->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded->model->parameters()[i].tensor,
                             (*expected)->parameters()[i].tensor))
        << loaded->model->parameters()[i].name;
  }
  // Its tokenizer spells the arithmetic prompts with the builtin ids.
  auto tokenizer = tokenizer::BpeTokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tokenizer.ok());
  EXPECT_THAT((*tokenizer)->Encode("12+30="), ElementsAre(4, 5, 13, 6, 3, 16));
  EXPECT_TRUE(fs::exists(dir + "/tokenizer_config.json"));

  flags.builtin = "huge";
  EXPECT_EQ(RunInitModel(flags, out, err), 2);
  EXPECT_THAT(err.str(), HasSubstr("--builtin: unknown built-in model \"huge\"; known: tiny, micro"));
  flags.builtin = "micro";
  flags.dtype = "int4";
  EXPECT_EQ(RunInitModel(flags, out, err), 2);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sluice::cli
