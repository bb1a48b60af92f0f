#ifndef SLUICE_COMMON_MODEL_TRANSFORMER_H_
#define SLUICE_COMMON_MODEL_TRANSFORMER_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"

namespace sluice::model {

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
};

// Key/value cache for incremental decoding of a batch: per layer
// [batch, kv_heads, capacity, head_dim], filled up to `length` positions.
struct KVCache {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  int64_t length = 0;
  int64_t capacity = 0;
};

// Llama / Qwen2 decoder in LibTorch: token embedding, N x (RMSNorm,
// grouped-query attention with rotary embeddings (rotate-half convention, as
// HF), RMSNorm, SwiGLU MLP), final RMSNorm, LM head. Parameters carry Hugging
// Face names in HF order:
//   model.embed_tokens.weight
//   model.layers.{i}.input_layernorm.weight
//   model.layers.{i}.self_attn.{q,k,v}_proj.weight (+ .bias when attention_bias)
//   model.layers.{i}.self_attn.o_proj.weight
//   model.layers.{i}.post_attention_layernorm.weight
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight
//   model.norm.weight
//   lm_head.weight (absent when tie_word_embeddings)
//
// Float32 on CPU. Forward passes are const and may run concurrently on one
// instance (no mutable state besides the caller's KVCache); LoadWeights and
// the optimizer mutate the parameters and must not overlap with them.
// Misuse of the tensor API (shapes that do not match, a position beyond
// max_position_embeddings, a cache too small) throws c10::Error: these are
// programmer errors, while bad input from outside (weights, configs) gets a
// Status.
//
// Cost: dominated by the matrix products and, for the tiny built-in models,
// by the number of element-wise passes; there are no per-row loops. On CPU,
// glibc's habit of returning freed memory to the OS makes every large
// activation page-fault anew; a process that runs the model should raise
// M_MMAP_THRESHOLD / M_TRIM_THRESHOLD (mallopt) at start-up.
class Transformer {
 public:
  // Random initialisation, deterministic in `seed` (normal(0, 0.02) for
  // linear and embedding weights, ones for norms, zeros for biases), drawn
  // from a private generator: thread-safe, and torch's global random state
  // is neither used nor changed. INVALID_ARGUMENT when config.Validate()
  // fails.
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(const ModelConfig& config,
                                                             uint64_t seed);
  // The parameters allocated but not initialised (their values are
  // garbage): for a model whose every weight LoadWeights fills next, which
  // spares a large model the cost of drawing random weights it then throws
  // away.
  static absl::StatusOr<std::unique_ptr<Transformer>> CreateUninitialized(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }

  // All parameters, HF names, HF order. requires_grad is true.
  const std::vector<NamedTensor>& parameters() const { return params_; }
  std::vector<torch::Tensor> parameter_tensors() const;

  // Copies `weights` into the parameters (no grad). Every parameter must be
  // present exactly once with its shape; an unknown, missing or mis-shaped
  // tensor is an INVALID_ARGUMENT naming it. Converts dtype to float32.
  absl::Status LoadWeights(const std::vector<NamedTensor>& weights);

  // Full-sequence forward. input_ids: int64 [B, T]. attention_mask: optional
  // int64/bool [B, T], 1 for real tokens, 0 for padding; padding may be on the
  // left (positions are counted over real tokens only, so a left-padded row
  // gets the same logits as the unpadded row). Causal. Returns float32 logits
  // [B, T, vocab]. Differentiable.
  torch::Tensor Forward(const torch::Tensor& input_ids,
                        const torch::Tensor& attention_mask = torch::Tensor()) const;

  // An empty cache for `batch` rows and up to `capacity` positions.
  KVCache NewCache(int64_t batch, int64_t capacity) const;

  // Incremental forward: feeds input_ids [B, t] at the next t cache
  // positions. positions: int64 [B, t] rotary positions of these tokens.
  // key_mask: int64/bool [B, cache.length + t], 1 where the key is a real
  // token (0 for left padding). Appends to the cache; returns logits
  // [B, t, vocab]. Intended under torch::NoGradGuard.
  torch::Tensor ForwardCached(const torch::Tensor& input_ids, const torch::Tensor& positions,
                              const torch::Tensor& key_mask, KVCache& cache) const;

  // Continuous-batching decode step: every row at its own length. Row b of
  // the batch is cache row b (B <= the cache's rows; rows past B are left
  // alone) and holds lengths[b] positions, written left-aligned from column
  // 0 without padding; its token input_ids[b] goes to column lengths[b] with
  // rotary position lengths[b] and attends columns 0 .. lengths[b].
  // input_ids: int64 [B, 1]; lengths: int64 [B], each < cache.capacity.
  // `cache.length` is not used or changed (the caller keeps the lengths).
  // Returns logits [B, 1, vocab]. Intended under torch::NoGradGuard.
  torch::Tensor ForwardRows(const torch::Tensor& input_ids, const torch::Tensor& lengths,
                            KVCache& cache) const;

  // Prefill of right-padded sequences into an empty cache: row b's
  // lengths[b] tokens sit at columns 0 .. lengths[b] - 1 of input_ids
  // [B, L] (what follows is padding, whose keys no real token attends:
  // causality hides them) and are written to the same columns of `cache`
  // (B rows, capacity >= L, length 0; its length becomes L). Returns the
  // logits of each row's last real token only, [B, vocab], which spares the
  // LM head for every other position. Intended under torch::NoGradGuard.
  torch::Tensor Prefill(const torch::Tensor& input_ids, const torch::Tensor& lengths,
                        KVCache& cache) const;

 private:
  explicit Transformer(ModelConfig config) : config_(std::move(config)) {}
  // Create (seed set) and CreateUninitialized (nullopt).
  static absl::StatusOr<std::unique_ptr<Transformer>> Build(const ModelConfig& config,
                                                            std::optional<uint64_t> seed);

  // The decoder proper, shared by Forward and ForwardCached. positions:
  // int64 [B, T]; blocked: bool, broadcastable to [B, 1, 1, T, S] (S = keys
  // attended: T, or cache->length + T), true where a query must not see a
  // key. With a cache, appends this step's keys and values to it at
  // cache->length, or, when row_columns (int64 [B]; T = 1) is given, writes
  // row b's at column row_columns[b] and attends the first S columns of the
  // cache's first B rows. When last (int64 [B]) is given, only position
  // last[b] of row b goes through the final norm and LM head: logits
  // [B, 1, vocab].
  torch::Tensor Decode(const torch::Tensor& input_ids, const torch::Tensor& positions,
                       const torch::Tensor& blocked, KVCache* cache,
                       const torch::Tensor& row_columns = torch::Tensor(),
                       const torch::Tensor& last = torch::Tensor()) const;

  ModelConfig config_;
  std::vector<NamedTensor> params_;
  // Handles to the tensors of params_ (same storage), per layer, for the
  // forward pass (filled by Create). q/k/v biases are undefined without
  // attention_bias.
  struct LayerParams {
    torch::Tensor input_norm, q, k, v, q_bias, k_bias, v_bias, o, post_norm, gate, up, down;
  };
  torch::Tensor embed_, final_norm_, lm_head_;  // lm_head_ is embed_ when tied
  std::vector<LayerParams> layers_;
  // Rotary tables cos/sin [max_position_embeddings, head_dim], built once by
  // Create (not parameters).
  torch::Tensor rope_cos_, rope_sin_;
};

// Log-probabilities of `targets` under logits / temperature:
// log_softmax(logits / temperature)[target]. logits [..., V], targets int64
// [...]; returns float32 [...]. Differentiable.
torch::Tensor TokenLogProbs(const torch::Tensor& logits, const torch::Tensor& targets,
                            double temperature = 1.0);

// Entropy (nats) of softmax(logits / temperature) along the last dim.
torch::Tensor Entropy(const torch::Tensor& logits, double temperature = 1.0);

// Raw bytes (little-endian, row-major) of a CPU tensor, made contiguous.
std::string TensorBytes(const torch::Tensor& tensor);
// A float32 tensor of `shape` over `bytes`, not copied (copied only when the
// bytes are misaligned): valid while `bytes` lives and is unchanged; for
// handing received weights to LoadWeights without a second copy.
// INVALID_ARGUMENT when the byte count does not match.
absl::StatusOr<torch::Tensor> Float32TensorView(const std::vector<int64_t>& shape,
                                                const std::string& bytes);
// A float32 tensor of `shape` from `bytes` (copied). INVALID_ARGUMENT when the
// byte count does not match.
absl::StatusOr<torch::Tensor> Float32TensorFromBytes(const std::vector<int64_t>& shape,
                                                     const std::string& bytes);

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_TRANSFORMER_H_
