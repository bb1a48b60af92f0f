#ifndef SLUICE_BENCHMARKS_MODEL_SHAPES_H_
#define SLUICE_BENCHMARKS_MODEL_SHAPES_H_

#include "common/model/model_config.h"

namespace sluice::bench {

// A mid-size random Qwen2-shaped model for the model benchmarks (vocab 32768,
// hidden 512, 8 layers, 8 heads / 2 KV heads, SwiGLU 1408, q/k/v bias; 56 M
// parameters): large enough that the matrix products, not per-op overhead,
// take the time on a CPU.
inline model::ModelConfig MidSizeQwen2() {
  model::ModelConfig config;
  config.architecture = "Qwen2ForCausalLM";
  config.vocab_size = 32768;
  config.hidden_size = 512;
  config.intermediate_size = 1408;
  config.num_hidden_layers = 8;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 2;
  config.head_dim = 64;
  config.max_position_embeddings = 2048;
  config.rms_norm_eps = 1e-6;
  config.rope_theta = 1e6;
  config.tie_word_embeddings = false;
  config.attention_bias = true;
  return config;
}

// Qwen2.5-0.5B's shape (config.json of Qwen/Qwen2.5-0.5B: 494 M parameters,
// tied embeddings), with the context cut to `context` positions (rotary
// tables only): what the GPU decode and trainer measurements use
// (gpu/gpu_check.cc, docs/gpu.md).
inline model::ModelConfig Qwen25HalfB(int64_t context = 4096) {
  model::ModelConfig config;
  config.architecture = "Qwen2ForCausalLM";
  config.vocab_size = 151936;
  config.hidden_size = 896;
  config.intermediate_size = 4864;
  config.num_hidden_layers = 24;
  config.num_attention_heads = 14;
  config.num_key_value_heads = 2;
  config.head_dim = 64;
  config.max_position_embeddings = context;
  config.rms_norm_eps = 1e-6;
  config.rope_theta = 1000000.0;
  config.tie_word_embeddings = true;
  config.attention_bias = true;
  return config;
}

}  // namespace sluice::bench

#endif  // SLUICE_BENCHMARKS_MODEL_SHAPES_H_
