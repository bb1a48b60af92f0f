#include "common/model/model_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace sluice::model {
namespace {

using Json = nlohmann::json;

// Upper bounds far beyond any released model (Llama-3 405B: vocabulary 128 K,
// hidden 16384, intermediate 53248, 126 layers, 128 heads; Qwen2.5-1M:
// 1,010,000 positions), so that a hostile config.json is refused before
// anything is sized from it, and ParameterCount and the memory estimates,
// products of these, stay far from int64 overflow (below 2^57).
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
constexpr int64_t kMaxHiddenSize = int64_t{1} << 17;
constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;
constexpr int64_t kMaxLayers = int64_t{1} << 12;
constexpr int64_t kMaxHeads = int64_t{1} << 12;  // query and KV heads, and head_dim
constexpr int64_t kMaxPositions = int64_t{1} << 24;

constexpr char kLlama[] = "LlamaForCausalLM";
constexpr char kQwen2[] = "Qwen2ForCausalLM";

// Token ids of task::CharTokenizer; repeated here so that this library does
// not depend on the task one.
constexpr int64_t kCharPadId = 0;
constexpr int64_t kCharBosId = 1;
constexpr int64_t kCharEosId = 2;

std::string ModelType(const std::string& architecture) {
  if (architecture == kQwen2) return "qwen2";
  return "llama";
}

// Collects "field: problem" messages while reading config.json.
class JsonReader {
 public:
  explicit JsonReader(const Json& root) : root_(root) {}

  // Reads an integer field; `required` fields that are absent are errors.
  // Absent or null optional fields leave `out` unchanged.
  void Int(const char* key, bool required, int64_t& out) {
    const Json* value = Find(key, required);
    if (value == nullptr) return;
    if (value->is_number_integer()) {
      out = value->get<int64_t>();
    } else if (value->is_number_float() && std::floor(value->get<double>()) == value->get<double>()) {
      // 2^63 itself does not fit; a cast of anything outside is undefined.
      const double number = value->get<double>();
      if (!(std::fabs(number) < 0x1p63)) {
        Error(key, absl::StrCat("integer out of range, got ", value->dump()));
        return;
      }
      out = static_cast<int64_t>(number);
    } else {
      Error(key, absl::StrCat("expected an integer, got ", value->dump()));
    }
  }

  // Like Int, but HF allows a list of ids (e.g. several eos tokens): the
  // first one is taken.
  void TokenId(const char* key, int64_t& out) {
    const Json* value = Find(key, /*required=*/false);
    if (value == nullptr) return;
    if (value->is_array()) {
      if (value->empty() || !(*value)[0].is_number_integer()) {
        Error(key, absl::StrCat("expected an integer or a list of integers, got ", value->dump()));
        return;
      }
      out = (*value)[0].get<int64_t>();
      return;
    }
    Int(key, /*required=*/false, out);
  }

  void Double(const char* key, bool required, double& out) {
    const Json* value = Find(key, required);
    if (value == nullptr) return;
    if (!value->is_number()) {
      Error(key, absl::StrCat("expected a number, got ", value->dump()));
      return;
    }
    out = value->get<double>();
  }

  void Bool(const char* key, bool& out) {
    const Json* value = Find(key, /*required=*/false);
    if (value == nullptr) return;
    if (!value->is_boolean()) {
      Error(key, absl::StrCat("expected true or false, got ", value->dump()));
      return;
    }
    out = value->get<bool>();
  }

  const Json* Find(const char* key, bool required) {
    auto it = root_.find(key);
    if (it == root_.end() || it->is_null()) {
      if (required) Error(key, "missing (required)");
      return nullptr;
    }
    return &*it;
  }

  void Error(const std::string& key, const std::string& message) {
    errors_.push_back(absl::StrCat(key, ": ", message));
  }

  const std::vector<std::string>& errors() const { return errors_; }

 private:
  const Json& root_;
  std::vector<std::string> errors_;
};

}  // namespace

absl::Status ModelConfig::Validate() const {
  std::vector<std::string> problems;
  auto positive = [&](const char* field, int64_t value, int64_t max) {
    if (value <= 0) problems.push_back(absl::StrCat(field, ": must be > 0, got ", value));
    if (value > max) {
      problems.push_back(absl::StrCat(field, ": must be <= ", max, ", got ", value));
    }
  };
  if (architecture != kLlama && architecture != kQwen2) {
    problems.push_back(absl::StrCat("architecture: must be \"", kLlama, "\" or \"", kQwen2,
                                    "\", got unsupported \"", architecture, "\""));
  }
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16") {
    problems.push_back(absl::StrCat(
        "torch_dtype: must be \"float32\", \"bfloat16\" or \"float16\", got \"", torch_dtype,
        "\""));
  }
  positive("vocab_size", vocab_size, kMaxVocabSize);
  positive("hidden_size", hidden_size, kMaxHiddenSize);
  positive("intermediate_size", intermediate_size, kMaxIntermediateSize);
  positive("num_hidden_layers", num_hidden_layers, kMaxLayers);
  positive("num_attention_heads", num_attention_heads, kMaxHeads);
  positive("num_key_value_heads", num_key_value_heads, kMaxHeads);
  positive("max_position_embeddings", max_position_embeddings, kMaxPositions);
  if (num_attention_heads > 0 && num_key_value_heads > 0 &&
      num_attention_heads % num_key_value_heads != 0) {
    problems.push_back(absl::StrCat("num_key_value_heads: must divide num_attention_heads (",
                                    num_attention_heads, "), got ", num_key_value_heads));
  }
  if (head_dim > kMaxHeads) {
    problems.push_back(absl::StrCat("head_dim: must be <= ", kMaxHeads, ", got ", head_dim));
  }
  if (head_dim < 0) {
    problems.push_back(absl::StrCat("head_dim: must be >= 0 (0 = hidden_size / "
                                    "num_attention_heads), got ",
                                    head_dim));
  } else if (head_dim == 0 && hidden_size > 0 && num_attention_heads > 0 &&
             hidden_size % num_attention_heads != 0) {
    problems.push_back(absl::StrCat("hidden_size: must be a multiple of num_attention_heads (",
                                    num_attention_heads, ") when head_dim is 0, got ",
                                    hidden_size));
  }
  const int64_t resolved = resolved_head_dim();
  if (head_dim >= 0 && resolved > 0 && resolved % 2 != 0) {
    problems.push_back(absl::StrCat("head_dim: must be even for rotary embeddings, got ", resolved,
                                    head_dim == 0 ? " (hidden_size / num_attention_heads)" : ""));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    problems.push_back(absl::StrCat("rms_norm_eps: must be > 0, got ", rms_norm_eps));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    problems.push_back(absl::StrCat("rope_theta: must be > 0, got ", rope_theta));
  }
  auto token = [&](const char* field, int64_t id) {
    if (id < -1 || (vocab_size > 0 && id >= vocab_size)) {
      problems.push_back(absl::StrCat(field, ": must be -1 (none) or in [0, vocab_size = ",
                                      vocab_size, "), got ", id));
    }
  };
  token("bos_token_id", bos_token_id);
  token("eos_token_id", eos_token_id);
  token("pad_token_id", pad_token_id);
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid model config: ", absl::StrJoin(problems, "; ")));
}

int64_t ModelConfig::ParameterCount() const {
  const int64_t head = resolved_head_dim();
  const int64_t q_width = num_attention_heads * head;
  const int64_t kv_width = num_key_value_heads * head;
  int64_t per_layer = 2 * hidden_size;                           // two RMSNorms
  per_layer += hidden_size * (q_width + 2 * kv_width);           // q, k, v
  if (attention_bias) per_layer += q_width + 2 * kv_width;       // their biases
  per_layer += q_width * hidden_size;                            // o
  per_layer += 3 * hidden_size * intermediate_size;              // gate, up, down
  int64_t total = vocab_size * hidden_size;                      // embed_tokens
  total += num_hidden_layers * per_layer + hidden_size;          // layers, final norm
  if (!tie_word_embeddings) total += vocab_size * hidden_size;   // lm_head
  return total;
}

std::string ModelConfig::ToJson() const {
  Json json;
  json["architectures"] = Json::array({architecture});
  json["model_type"] = ModelType(architecture);
  json["vocab_size"] = vocab_size;
  json["hidden_size"] = hidden_size;
  json["intermediate_size"] = intermediate_size;
  json["num_hidden_layers"] = num_hidden_layers;
  json["num_attention_heads"] = num_attention_heads;
  json["num_key_value_heads"] = num_key_value_heads;
  if (head_dim > 0) json["head_dim"] = head_dim;
  json["max_position_embeddings"] = max_position_embeddings;
  json["rms_norm_eps"] = rms_norm_eps;
  json["rope_theta"] = rope_theta;
  json["tie_word_embeddings"] = tie_word_embeddings;
  json["attention_bias"] = attention_bias;
  json["hidden_act"] = "silu";
  json["torch_dtype"] = torch_dtype;
  auto token = [&](const char* key, int64_t id) {
    json[key] = id >= 0 ? Json(id) : Json(nullptr);
  };
  token("bos_token_id", bos_token_id);
  token("eos_token_id", eos_token_id);
  token("pad_token_id", pad_token_id);
  return json.dump(2);
}

// Absent optional keys take Hugging Face's defaults for Llama / Qwen2:
// num_key_value_heads = num_attention_heads, rms_norm_eps 1e-6, rope_theta
// 10000, tie_word_embeddings false, attention_bias false for Llama and true
// for Qwen2 (Qwen2's config has no such key: its q/k/v always have biases),
// token ids -1. Features this model does not implement (rope_scaling, an
// activation other than silu) are errors rather than silently wrong logits.
absl::StatusOr<ModelConfig> ModelConfig::FromJson(absl::string_view json_text) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& error) {
    // parse_error, and out_of_range for a number past a double (1e400).
    return absl::InvalidArgumentError(absl::StrCat("config.json is not valid JSON: ", error.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError("config.json: expected a JSON object at the top level");
  }

  ModelConfig config;
  JsonReader reader(root);
  if (const Json* architectures = reader.Find("architectures", /*required=*/false)) {
    if (!architectures->is_array() || architectures->empty() || !(*architectures)[0].is_string()) {
      reader.Error("architectures", absl::StrCat("expected a list of strings, got ",
                                                 architectures->dump()));
    } else {
      config.architecture = (*architectures)[0].get<std::string>();
      if (config.architecture != kLlama && config.architecture != kQwen2) {
        // Said at once: the missing fields such a config has are not the
        // problem.
        reader.Error("architectures", absl::StrCat("unsupported \"", config.architecture,
                                                   "\"; supported: ", kLlama, ", ", kQwen2));
      }
    }
  } else if (const Json* model_type = reader.Find("model_type", /*required=*/false)) {
    const std::string type = model_type->is_string() ? model_type->get<std::string>() : "";
    if (type == "llama") {
      config.architecture = kLlama;
    } else if (type == "qwen2") {
      config.architecture = kQwen2;
    } else {
      reader.Error("model_type", absl::StrCat("expected \"llama\" or \"qwen2\", got ",
                                              model_type->dump()));
    }
  } else {
    reader.Error("architectures", "missing (required, or model_type)");
  }

  reader.Int("vocab_size", true, config.vocab_size);
  reader.Int("hidden_size", true, config.hidden_size);
  reader.Int("intermediate_size", true, config.intermediate_size);
  reader.Int("num_hidden_layers", true, config.num_hidden_layers);
  reader.Int("num_attention_heads", true, config.num_attention_heads);
  config.num_key_value_heads = config.num_attention_heads;
  reader.Int("num_key_value_heads", false, config.num_key_value_heads);
  reader.Int("head_dim", false, config.head_dim);
  reader.Int("max_position_embeddings", true, config.max_position_embeddings);
  config.rms_norm_eps = 1e-6;
  reader.Double("rms_norm_eps", false, config.rms_norm_eps);
  config.rope_theta = 10000.0;
  reader.Double("rope_theta", false, config.rope_theta);
  reader.Bool("tie_word_embeddings", config.tie_word_embeddings);
  config.attention_bias = config.architecture == kQwen2;
  reader.Bool("attention_bias", config.attention_bias);
  reader.TokenId("bos_token_id", config.bos_token_id);
  reader.TokenId("eos_token_id", config.eos_token_id);
  reader.TokenId("pad_token_id", config.pad_token_id);
  if (const Json* act = reader.Find("hidden_act", /*required=*/false)) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      reader.Error("hidden_act", absl::StrCat("only \"silu\" is supported, got ", act->dump()));
    }
  }
  if (const Json* scaling = reader.Find("rope_scaling", /*required=*/false)) {
    reader.Error("rope_scaling", absl::StrCat("not supported, got ", scaling->dump()));
  }
  bool mlp_bias = false;
  reader.Bool("mlp_bias", mlp_bias);
  if (mlp_bias) reader.Error("mlp_bias", "not supported, got true");
  bool use_sliding_window = false;
  reader.Bool("use_sliding_window", use_sliding_window);
  if (use_sliding_window) reader.Error("use_sliding_window", "not supported, got true");
  if (const Json* dtype = reader.Find("torch_dtype", /*required=*/false)) {
    const std::string name = dtype->is_string() ? dtype->get<std::string>() : "";
    if (name == "float32" || name == "float") {
      config.torch_dtype = "float32";
    } else if (name == "bfloat16" || name == "float16") {
      config.torch_dtype = name;
    } else {
      reader.Error("torch_dtype", absl::StrCat("expected \"float32\", \"bfloat16\" or "
                                               "\"float16\", got ", dtype->dump()));
    }
  }

  if (!reader.errors().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid config.json: ", absl::StrJoin(reader.errors(), "; ")));
  }
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  return config;
}

absl::StatusOr<ModelConfig> BuiltinModelConfig(absl::string_view name, int64_t vocab_size) {
  ModelConfig config;
  config.architecture = kLlama;
  config.vocab_size = vocab_size;
  config.max_position_embeddings = 32;
  config.rms_norm_eps = 1e-5;
  config.rope_theta = 10000.0;
  config.tie_word_embeddings = false;
  config.attention_bias = false;
  config.bos_token_id = kCharBosId;
  config.eos_token_id = kCharEosId;
  config.pad_token_id = kCharPadId;
  if (name == "tiny") {
    config.num_hidden_layers = 4;
    config.hidden_size = 128;
    config.intermediate_size = 344;
    config.num_attention_heads = 4;
    config.num_key_value_heads = 2;
  } else if (name == "micro") {
    config.num_hidden_layers = 2;
    config.hidden_size = 32;
    config.intermediate_size = 64;
    config.num_attention_heads = 2;
    config.num_key_value_heads = 1;
  } else {
    return absl::NotFoundError(
        absl::StrCat("unknown built-in model \"", std::string(name), "\"; known: tiny, micro"));
  }
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  return config;
}

}  // namespace sluice::model
