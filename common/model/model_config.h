#ifndef SLUICE_COMMON_MODEL_MODEL_CONFIG_H_
#define SLUICE_COMMON_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::model {

// A decoder-only transformer of the Llama / Qwen2 family, described with the
// field names of Hugging Face's config.json so that the real-model issue can
// read those files into this same struct. No torch here: the controller
// validates configs without loading LibTorch.
struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // or "Qwen2ForCausalLM"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // grouped-query attention; divides heads
  int64_t head_dim = 0;             // 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projection biases (true for Qwen2)
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;
  // HF's "torch_dtype": the dtype the checkpoint's weights are stored in,
  // "float32", "bfloat16" or "float16" (informational: the model always
  // computes in float32; the safetensors header is authoritative).
  std::string torch_dtype = "float32";

  int64_t resolved_head_dim() const {
    return head_dim > 0 ? head_dim : (num_attention_heads > 0 ? hidden_size / num_attention_heads : 0);
  }
  // Every problem at once, each naming the field ("num_key_value_heads: must
  // divide num_attention_heads (4), got 3"). Each size also has an upper
  // bound far past any released model (vocab_size and max_position_embeddings
  // <= 2^24, hidden_size <= 2^17, intermediate_size <= 2^20, layers, heads
  // and head_dim <= 4096), so that sizes computed from a valid config fit
  // in int64.
  absl::Status Validate() const;
  // Number of parameters the model has (tied embeddings counted once).
  int64_t ParameterCount() const;

  // config.json text (HF keys: "architectures": [..], "hidden_size", ...).
  std::string ToJson() const;
  // Parses HF config.json text; unknown keys are ignored (HF configs carry
  // many), missing required ones are errors naming them. An "architectures"
  // other than LlamaForCausalLM / Qwen2ForCausalLM, and features this model
  // lacks (rope_scaling, mlp_bias, use_sliding_window, a hidden_act other
  // than silu, a torch_dtype other than float32 / bfloat16 / float16) are
  // errors naming the key. Absent optional keys
  // take HF's defaults (see model_config.cc); the result is Validate()d.
  static absl::StatusOr<ModelConfig> FromJson(absl::string_view json_text);
};

// Built-in models, for CPU runs and tests, sized for the built-in character
// tokenizer (task::CharTokenizer):
//   "tiny":  4 layers, hidden 128, 4 heads, 2 KV heads, SwiGLU 344, 32 positions
//            (~0.7 M parameters) — the quickstart model.
//   "micro": 2 layers, hidden 32, 2 heads, 1 KV head, SwiGLU 64, 32 positions —
//            for fast unit and end-to-end tests.
// bos / eos / pad are CharTokenizer's ids 1 / 2 / 0. NOT_FOUND listing the
// known names otherwise; INVALID_ARGUMENT when vocab_size cannot hold those
// ids.
absl::StatusOr<ModelConfig> BuiltinModelConfig(absl::string_view name, int64_t vocab_size);

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_MODEL_CONFIG_H_
