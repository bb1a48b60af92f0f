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
#include "common/model/device_spec.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"

namespace sluice::model {

// Where a model lives and what it computes in. Parameters are stored in
// param_dtype (the trainer's float32 masters, or a rollout worker's bf16
// copy); activations, the KV cache and the logits are compute_dtype. A
// parameter stored wider than compute_dtype is cast at each use, inside
// autograd, so gradients reach the float32 masters. Norms, softmax and
// log-probs are computed in float32 whatever compute_dtype is (as HF does).
// On CPU only float32 / bfloat16 compute is allowed (LibTorch 1.13 has no
// float16 CPU matmul).
struct ModelPlacement {
  torch::Device device = torch::kCPU;
  torch::ScalarType param_dtype = torch::kFloat32;
  torch::ScalarType compute_dtype = torch::kFloat32;

  // "cpu / float32 params / bfloat16 compute", for logs and errors.
  std::string DebugString() const;
  bool operator==(const ModelPlacement& other) const {
    return device == other.device && param_dtype == other.param_dtype &&
           compute_dtype == other.compute_dtype;
  }
  bool operator!=(const ModelPlacement& other) const { return !(*this == other); }
};

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
// On the device and in the dtypes of its ModelPlacement (float32 on the CPU
// by default). Forward passes are const and may run concurrently on one
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
  // The weights are drawn on the CPU in float32 (the same values on every
  // device) and then moved to `placement`. INVALID_ARGUMENT for a placement
  // the build cannot serve (ValidatePlacement).
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(const ModelConfig& config,
                                                             uint64_t seed,
                                                             const ModelPlacement& placement = {});
  // The parameters allocated but not initialised (their values are
  // garbage): for a model whose every weight LoadWeights fills next, which
  // spares a large model the cost of drawing random weights it then throws
  // away.
  static absl::StatusOr<std::unique_ptr<Transformer>> CreateUninitialized(
      const ModelConfig& config, const ModelPlacement& placement = {});

  const ModelConfig& config() const { return config_; }
  const ModelPlacement& placement() const { return placement_; }
  torch::Device device() const { return placement_.device; }

  // All parameters, HF names, HF order. requires_grad is true.
  const std::vector<NamedTensor>& parameters() const { return params_; }
  std::vector<torch::Tensor> parameter_tensors() const;

  // Copies `weights` into the parameters (no grad). Every parameter must be
  // present exactly once with its shape; an unknown, missing or mis-shaped
  // tensor is an INVALID_ARGUMENT naming it. Converts each tensor to the
  // parameters' dtype and device as it copies (a host tensor goes to the
  // device in one copy per parameter).
  absl::Status LoadWeights(const std::vector<NamedTensor>& weights);

  // Full-sequence forward. input_ids: int64 [B, T]. attention_mask: optional
  // int64/bool [B, T], 1 for real tokens, 0 for padding; padding may be on the
  // left (positions are counted over real tokens only, so a left-padded row
  // gets the same logits as the unpadded row). Causal. Returns logits
  // [B, T, vocab] in the compute dtype, on the model's device (inputs on
  // another device are moved there). Differentiable.
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
  // `longest`, when >= 0, is max(lengths), which the caller knows: it spares
  // a device-to-host read of `lengths` on a GPU (it is checked only against
  // the capacity). Returns logits [B, 1, vocab]. Intended under
  // torch::NoGradGuard.
  torch::Tensor ForwardRows(const torch::Tensor& input_ids, const torch::Tensor& lengths,
                            KVCache& cache, int64_t longest = -1) const;

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
  Transformer(ModelConfig config, ModelPlacement placement)
      : config_(std::move(config)), placement_(placement) {}
  // Create (seed set) and CreateUninitialized (nullopt).
  static absl::StatusOr<std::unique_ptr<Transformer>> Build(const ModelConfig& config,
                                                            std::optional<uint64_t> seed,
                                                            const ModelPlacement& placement);
  // A parameter as the forward pass uses it: cast to the compute dtype
  // (a no-op when it is stored in it).
  torch::Tensor Use(const torch::Tensor& param) const;
  torch::TensorOptions DeviceOptions() const { return torch::TensorOptions().device(device()); }

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
  ModelPlacement placement_;
  std::vector<NamedTensor> params_;
  // Handles to the tensors of params_ (same storage), per layer, for the
  // forward pass (filled by Create). q/k/v biases are undefined without
  // attention_bias.
  struct LayerParams {
    torch::Tensor input_norm, q, k, v, q_bias, k_bias, v_bias, o, post_norm, gate, up, down;
  };
  torch::Tensor embed_, final_norm_, lm_head_;  // lm_head_ is embed_ when tied
  std::vector<LayerParams> layers_;
  // Rotary tables cos/sin [max_position_embeddings, head_dim], computed in
  // float32 and kept in the compute dtype on the device, built once by
  // Create (not parameters).
  torch::Tensor rope_cos_, rope_sin_;
};

// INVALID_ARGUMENT when this build cannot place a model so: a CUDA device
// with a LibTorch built without CUDA (Debian's is CPU-only), a device index
// the machine does not have, a dtype other than float32 / bfloat16 /
// float16, float16 compute on the CPU, or parameters narrower than compute.
absl::Status ValidatePlacement(const ModelPlacement& placement);

// Where a run's model goes (its model.device and model.dtype, DType::kF32,
// kBF16 or kF16, nullopt when unset). On the CPU: float32 throughout (the
// run's dtype then only sets the checkpoints' dtype). On a CUDA device:
// compute in the run's dtype, bfloat16 when unset; a trainer (`training`)
// keeps float32 master weights (and so float32 optimizer state), a rollout
// worker holds its weights in the compute dtype. The result is validated
// (ValidatePlacement): a CPU-only build refuses cuda here.
absl::StatusOr<ModelPlacement> PlacementFor(const DeviceSpec& device, std::optional<DType> dtype,
                                            bool training);

// Log-probabilities of `targets` under logits / temperature:
// log_softmax(logits / temperature)[target]. logits [..., V], targets int64
// [...]; returns float32 [...]. Differentiable.
torch::Tensor TokenLogProbs(const torch::Tensor& logits, const torch::Tensor& targets,
                            double temperature = 1.0);

// Entropy (nats) of softmax(logits / temperature) along the last dim.
torch::Tensor Entropy(const torch::Tensor& logits, double temperature = 1.0);

// Raw bytes (little-endian, row-major) of a tensor on any device, copied to
// the host and made contiguous.
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
