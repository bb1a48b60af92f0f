#include "common/model/model_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::model {
namespace {

using ::testing::HasSubstr;

TEST(ModelConfigTest, BuiltinTinyIsTheQuickstartModel) {
  absl::StatusOr<ModelConfig> config = BuiltinModelConfig("tiny", 24);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "LlamaForCausalLM");
  EXPECT_EQ(config->num_hidden_layers, 4);
  EXPECT_EQ(config->hidden_size, 128);
  EXPECT_EQ(config->intermediate_size, 344);
  EXPECT_EQ(config->num_attention_heads, 4);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_EQ(config->resolved_head_dim(), 32);
  EXPECT_EQ(config->max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000.0);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->pad_token_id, 0);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_id, 2);
  // embed + lm_head 2 * 24 * 128, per layer 2 norms + q,o 128x128 + k,v
  // 128x64 + 3 x 128x344, final norm.
  EXPECT_EQ(config->ParameterCount(), 2 * 24 * 128 + 4 * (256 + 2 * 16384 + 2 * 8192 + 3 * 44032) + 128);
  EXPECT_EQ(config->ParameterCount(), 732288);
}

TEST(ModelConfigTest, BuiltinMicroAndUnknownNames) {
  absl::StatusOr<ModelConfig> micro = BuiltinModelConfig("micro", 24);
  ASSERT_TRUE(micro.ok());
  EXPECT_EQ(micro->num_hidden_layers, 2);
  EXPECT_EQ(micro->hidden_size, 32);
  EXPECT_EQ(micro->intermediate_size, 64);
  EXPECT_EQ(micro->num_attention_heads, 2);
  EXPECT_EQ(micro->num_key_value_heads, 1);
  EXPECT_EQ(micro->max_position_embeddings, 32);

  absl::StatusOr<ModelConfig> unknown = BuiltinModelConfig("huge", 24);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("tiny, micro"));
  EXPECT_EQ(BuiltinModelConfig("tiny", 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, ParameterCountCountsBiasesAndTiedEmbeddingsOnce) {
  ModelConfig config = *BuiltinModelConfig("micro", 24);
  const int64_t base = config.ParameterCount();
  config.attention_bias = true;
  EXPECT_EQ(config.ParameterCount(), base + 2 * (32 + 16 + 16));
  config.attention_bias = false;
  config.tie_word_embeddings = true;
  EXPECT_EQ(config.ParameterCount(), base - 24 * 32);
}

TEST(ModelConfigTest, JsonRoundTrip) {
  ModelConfig config = *BuiltinModelConfig("tiny", 24);
  config.architecture = "Qwen2ForCausalLM";
  config.attention_bias = true;
  config.tie_word_embeddings = true;
  config.head_dim = 16;
  config.rms_norm_eps = 1e-6;
  config.rope_theta = 1000000.0;
  config.pad_token_id = -1;
  const std::string text = config.ToJson();
  const nlohmann::json json = nlohmann::json::parse(text);
  EXPECT_EQ(json["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(json["model_type"], "qwen2");
  EXPECT_EQ(json["hidden_size"], 128);
  EXPECT_TRUE(json["pad_token_id"].is_null());

  absl::StatusOr<ModelConfig> parsed = ModelConfig::FromJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->architecture, config.architecture);
  EXPECT_EQ(parsed->vocab_size, config.vocab_size);
  EXPECT_EQ(parsed->hidden_size, config.hidden_size);
  EXPECT_EQ(parsed->intermediate_size, config.intermediate_size);
  EXPECT_EQ(parsed->num_hidden_layers, config.num_hidden_layers);
  EXPECT_EQ(parsed->num_attention_heads, config.num_attention_heads);
  EXPECT_EQ(parsed->num_key_value_heads, config.num_key_value_heads);
  EXPECT_EQ(parsed->head_dim, 16);
  EXPECT_EQ(parsed->max_position_embeddings, config.max_position_embeddings);
  EXPECT_EQ(parsed->rms_norm_eps, config.rms_norm_eps);
  EXPECT_EQ(parsed->rope_theta, config.rope_theta);
  EXPECT_EQ(parsed->tie_word_embeddings, true);
  EXPECT_EQ(parsed->attention_bias, true);
  EXPECT_EQ(parsed->bos_token_id, 1);
  EXPECT_EQ(parsed->eos_token_id, 2);
  EXPECT_EQ(parsed->pad_token_id, -1);
  EXPECT_EQ(parsed->ToJson(), text);
}

// The shape of Qwen2.5-0.5B-Instruct's config.json, with the keys we ignore.
TEST(ModelConfigTest, FromJsonReadsAHuggingFaceQwen2Config) {
  const char* text = R"({
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 21,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": null,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })";
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(text);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(config->hidden_size, 896);
  EXPECT_EQ(config->num_attention_heads, 14);
  EXPECT_EQ(config->num_key_value_heads, 2);
  EXPECT_EQ(config->resolved_head_dim(), 64);
  EXPECT_EQ(config->vocab_size, 151936);
  EXPECT_EQ(config->max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(config->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope_theta, 1e6);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_TRUE(config->attention_bias);  // Qwen2 has q/k/v biases without saying so
  EXPECT_EQ(config->bos_token_id, 151643);
  EXPECT_EQ(config->eos_token_id, 151645);
  EXPECT_EQ(config->pad_token_id, -1);
  EXPECT_EQ(config->ParameterCount(), 494032768);  // Qwen2.5-0.5B's published count
}

TEST(ModelConfigTest, FromJsonNamesMissingAndMistypedKeys) {
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": "big", "num_hidden_layers": 2,
    "num_attention_heads": 2, "max_position_embeddings": 8, "tie_word_embeddings": 1
  })");
  ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  EXPECT_THAT(message, HasSubstr("vocab_size: missing"));
  EXPECT_THAT(message, HasSubstr("intermediate_size: missing"));
  EXPECT_THAT(message, HasSubstr("hidden_size: expected an integer, got \"big\""));
  EXPECT_THAT(message, HasSubstr("tie_word_embeddings: expected true or false"));

  EXPECT_THAT(std::string(ModelConfig::FromJson("{not json").status().message()),
              HasSubstr("not valid JSON"));
  EXPECT_EQ(ModelConfig::FromJson("[1, 2]").status().code(), absl::StatusCode::kInvalidArgument);
  // Found by the model_config fuzz target: nlohmann::json throws out_of_range,
  // not parse_error, for a number past a double, and it escaped.
  EXPECT_THAT(std::string(ModelConfig::FromJson(R"({"rms_norm_eps": 1e705})").status().message()),
              HasSubstr("not valid JSON"));
}

// Found by the model_config fuzz target: an integer field written as a float
// past int64 ("bos_token_id": 1e33) was cast (undefined behaviour), and no
// size had an upper bound, so ParameterCount could overflow.
TEST(ModelConfigTest, FromJsonRefusesHostileSizes) {
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(R"({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 1000000000000, "hidden_size": 1e33,
    "intermediate_size": 8, "num_hidden_layers": 100000, "num_attention_heads": 2,
    "head_dim": 1048576, "max_position_embeddings": 9223372036854775807,
    "bos_token_id": -1e300
  })");
  ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(config.status().message());
  EXPECT_THAT(message, HasSubstr("hidden_size: integer out of range, got 1e+33"));
  EXPECT_THAT(message, HasSubstr("bos_token_id: integer out of range"));

  ModelConfig huge = *BuiltinModelConfig("micro", 24);
  huge.vocab_size = int64_t{1} << 40;
  huge.num_hidden_layers = 100000;
  huge.head_dim = 1 << 20;
  huge.max_position_embeddings = int64_t{1} << 62;
  const std::string problems(huge.Validate().message());
  EXPECT_THAT(problems, HasSubstr("vocab_size: must be <= 16777216, got 1099511627776"));
  EXPECT_THAT(problems, HasSubstr("num_hidden_layers: must be <= 4096, got 100000"));
  EXPECT_THAT(problems, HasSubstr("head_dim: must be <= 4096, got 1048576"));
  EXPECT_THAT(problems, HasSubstr("max_position_embeddings: must be <= 16777216"));
}

TEST(ModelConfigTest, FromJsonRejectsFeaturesTheModelLacks) {
  ModelConfig config = *BuiltinModelConfig("micro", 24);
  nlohmann::json json = nlohmann::json::parse(config.ToJson());
  json["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  json["hidden_act"] = "gelu";
  const std::string message(ModelConfig::FromJson(json.dump()).status().message());
  EXPECT_THAT(message, HasSubstr("rope_scaling: not supported"));
  EXPECT_THAT(message, HasSubstr("hidden_act: only \"silu\""));
}

TEST(ModelConfigTest, FromJsonReadsTorchDtypeAndRejectsUnknownArchitectures) {
  ModelConfig config = *BuiltinModelConfig("micro", 24);
  nlohmann::json json = nlohmann::json::parse(config.ToJson());
  EXPECT_EQ(json["torch_dtype"], "float32");
  json["torch_dtype"] = "bfloat16";
  absl::StatusOr<ModelConfig> parsed = ModelConfig::FromJson(json.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->torch_dtype, "bfloat16");
  EXPECT_THAT(parsed->ToJson(), HasSubstr("\"torch_dtype\": \"bfloat16\""));

  json["torch_dtype"] = "int8";
  json["architectures"] = {"MistralForCausalLM"};
  json["mlp_bias"] = true;
  json["use_sliding_window"] = true;
  const std::string message(ModelConfig::FromJson(json.dump()).status().message());
  EXPECT_THAT(message, HasSubstr("torch_dtype: expected"));
  EXPECT_THAT(message, HasSubstr("mlp_bias: not supported"));
  EXPECT_THAT(message, HasSubstr("use_sliding_window: not supported"));
  json.erase("torch_dtype");
  json.erase("mlp_bias");
  json.erase("use_sliding_window");
  EXPECT_THAT(std::string(ModelConfig::FromJson(json.dump()).status().message()),
              HasSubstr("architectures: unsupported \"MistralForCausalLM\"; supported: LlamaForCausalLM, Qwen2ForCausalLM"));
}

TEST(ModelConfigTest, FromJsonAcceptsAListOfEosIdsAndModelTypeAlone) {
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(R"({
    "model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 8,
    "eos_token_id": [3, 4]
  })");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, "LlamaForCausalLM");
  EXPECT_EQ(config->eos_token_id, 3);
  EXPECT_EQ(config->num_key_value_heads, 2);  // HF default: as many as heads
  EXPECT_FALSE(config->attention_bias);
}

TEST(ModelConfigTest, ValidateReportsEveryProblemNamingTheField) {
  ModelConfig config;
  config.architecture = "GPT2LMHeadModel";
  config.vocab_size = 10;
  config.hidden_size = 30;
  config.intermediate_size = 0;
  config.num_hidden_layers = -1;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 3;
  config.max_position_embeddings = 16;
  config.rms_norm_eps = 0;
  config.rope_theta = -1;
  config.eos_token_id = 10;
  const absl::Status status = config.Validate();
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("architecture: must be"));
  EXPECT_THAT(message, HasSubstr("intermediate_size: must be > 0, got 0"));
  EXPECT_THAT(message, HasSubstr("num_hidden_layers: must be > 0, got -1"));
  EXPECT_THAT(message, HasSubstr("num_key_value_heads: must divide num_attention_heads (4), got 3"));
  EXPECT_THAT(message, HasSubstr("hidden_size: must be a multiple of num_attention_heads (4)"));
  EXPECT_THAT(message, HasSubstr("rms_norm_eps: must be > 0"));
  EXPECT_THAT(message, HasSubstr("rope_theta: must be > 0"));
  EXPECT_THAT(message, HasSubstr("eos_token_id: must be -1 (none) or in [0, vocab_size = 10), got 10"));

  ModelConfig odd = *BuiltinModelConfig("micro", 24);
  odd.head_dim = 15;
  EXPECT_THAT(std::string(odd.Validate().message()), HasSubstr("head_dim: must be even"));
  EXPECT_TRUE(BuiltinModelConfig("micro", 24)->Validate().ok());
}

}  // namespace
}  // namespace sluice::model
