#include "common/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/torch_compat.h"

namespace sluice::model {
namespace {

constexpr double kInitStd = 0.02;

// Masked scores get the lowest finite float rather than -inf: a query whose
// every key is masked (left padding attending only padding) then gets a
// uniform, finite distribution instead of NaN, and its output is never used.
constexpr float kMaskedScore = std::numeric_limits<float>::lowest();

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape.begin(), shape.end(), ", "), "]");
}

// In float32 whatever x's dtype (as HF's Qwen2RMSNorm), then back to x's
// dtype and scaled by `weight` (already in it). In float32 the casts are
// no-ops and this is x * rsqrt(mean(x^2) + eps) * weight.
torch::Tensor RmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor x32 = x.to(torch::kFloat32);
  return (x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type()) *
         weight;
}

// HF's rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dim.
torch::Tensor RotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [B, T, heads, head_dim]; cos/sin [B, T, 1, head_dim].
torch::Tensor ApplyRotary(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  return x * cos + RotateHalf(x) * sin;
}

const char* ScalarTypeName(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return "float32";
    case torch::kBFloat16:
      return "bfloat16";
    case torch::kFloat16:
      return "float16";
    case torch::kFloat64:
      return "float64";
    default:
      return c10::toString(type);
  }
}

}  // namespace

std::string ModelPlacement::DebugString() const {
  return absl::StrCat(device.str(), " / ", ScalarTypeName(param_dtype), " params / ",
                      ScalarTypeName(compute_dtype), " compute");
}

absl::Status ValidatePlacement(const ModelPlacement& placement) {
  for (torch::ScalarType type : {placement.param_dtype, placement.compute_dtype}) {
    if (type != torch::kFloat32 && type != torch::kBFloat16 && type != torch::kFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model dtype ", ScalarTypeName(type), " is not supported: use float32 or bfloat16"));
    }
  }
  const torch::Device& device = placement.device;
  if (device.is_cpu()) {
    if (placement.compute_dtype == torch::kFloat16) {
      return absl::InvalidArgumentError(
          "float16 compute on the CPU is not supported (LibTorch has no float16 CPU matrix "
          "product): use float32 or bfloat16");
    }
    return absl::OkStatus();
  }
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model device \"", device.str(), "\" is not supported: use cpu, cuda or cuda:N"));
  }
  if (!TorchHasCuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model device \"", device.str(), "\": this binary is built against ", TorchBuildName(),
        ", which has no CUDA; build with -DSLUICE_TORCH_CUDA=ON against a CUDA LibTorch "
        "(docs/gpu.md), or run on cpu"));
  }
  if (!torch::cuda::is_available()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model device \"", device.str(), "\": no CUDA device is visible to this process "
        "(no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them)"));
  }
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  const int64_t index = device.has_index() ? device.index() : 0;
  if (index >= count) {
    return absl::InvalidArgumentError(absl::StrCat("model device \"", device.str(),
                                                   "\": this machine has ", count,
                                                   " CUDA device(s), cuda:0 .. cuda:", count - 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelPlacement> PlacementFor(const DeviceSpec& device, std::optional<DType> dtype,
                                            bool training) {
  ModelPlacement placement;
  if (!device.cuda) return placement;  // float32 on the CPU
  placement.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                     device.index < 0 ? 0 : device.index));
  switch (dtype.value_or(DType::kBF16)) {
    case DType::kF32:
      placement.compute_dtype = torch::kFloat32;
      break;
    case DType::kBF16:
      placement.compute_dtype = torch::kBFloat16;
      break;
    case DType::kF16:
      placement.compute_dtype = torch::kFloat16;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "model.dtype ", DTypeName(*dtype), " is not a compute dtype: use float32 or bfloat16"));
  }
  placement.param_dtype = training ? torch::kFloat32 : placement.compute_dtype;
  if (absl::Status status = ValidatePlacement(placement); !status.ok()) return status;
  return placement;
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(const ModelConfig& config,
                                                                 uint64_t seed,
                                                                 const ModelPlacement& placement) {
  return Build(config, seed, placement);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::CreateUninitialized(
    const ModelConfig& config, const ModelPlacement& placement) {
  return Build(config, std::nullopt, placement);
}

torch::Tensor Transformer::Use(const torch::Tensor& param) const {
  if (!param.defined() || param.scalar_type() == placement_.compute_dtype) return param;
  return param.to(placement_.compute_dtype);
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Build(const ModelConfig& config,
                                                                std::optional<uint64_t> seed,
                                                                const ModelPlacement& placement) {
  if (absl::Status status = config.Validate(); !status.ok()) return status;
  if (absl::Status status = ValidatePlacement(placement); !status.ok()) return status;
  std::unique_ptr<Transformer> model(new Transformer(config, placement));

  // A private generator: creating models never touches (or races on) torch's
  // global random state. Weights are drawn on the CPU in float32, so a seed
  // gives the same model on every device (rounded to its dtype).
  at::Generator generator = at::detail::createCPUGenerator(seed.value_or(0));
  const bool init = seed.has_value();
  const auto options =
      torch::TensorOptions().dtype(placement.param_dtype).device(placement.device);
  const bool host_float32 = placement.device.is_cpu() && placement.param_dtype == torch::kFloat32;
  auto add = [&](std::string name, torch::Tensor tensor) {
    tensor.set_requires_grad(true);
    model->params_.push_back({std::move(name), tensor});
    return tensor;
  };
  auto normal = [&](std::string name, std::vector<int64_t> shape) {
    torch::Tensor tensor = torch::empty(shape, options);
    if (init && host_float32) {
      tensor.normal_(0.0, kInitStd, generator);
    } else if (init) {
      tensor.copy_(torch::empty(shape, torch::kFloat32).normal_(0.0, kInitStd, generator));
    }
    return add(std::move(name), tensor);
  };
  auto ones = [&](std::string name, int64_t size) {
    return add(std::move(name), init ? torch::ones({size}, options) : torch::empty({size}, options));
  };
  auto zeros = [&](std::string name, int64_t size) {
    return add(std::move(name), init ? torch::zeros({size}, options) : torch::empty({size}, options));
  };

  const int64_t hidden = config.hidden_size;
  const int64_t head_dim = config.resolved_head_dim();
  const int64_t q_width = config.num_attention_heads * head_dim;
  const int64_t kv_width = config.num_key_value_heads * head_dim;
  const int64_t ffn = config.intermediate_size;

  model->embed_ = normal("model.embed_tokens.weight", {config.vocab_size, hidden});
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string prefix = absl::StrCat("model.layers.", i, ".");
    LayerParams layer;
    layer.input_norm = ones(prefix + "input_layernorm.weight", hidden);
    layer.q = normal(prefix + "self_attn.q_proj.weight", {q_width, hidden});
    if (config.attention_bias) layer.q_bias = zeros(prefix + "self_attn.q_proj.bias", q_width);
    layer.k = normal(prefix + "self_attn.k_proj.weight", {kv_width, hidden});
    if (config.attention_bias) layer.k_bias = zeros(prefix + "self_attn.k_proj.bias", kv_width);
    layer.v = normal(prefix + "self_attn.v_proj.weight", {kv_width, hidden});
    if (config.attention_bias) layer.v_bias = zeros(prefix + "self_attn.v_proj.bias", kv_width);
    layer.o = normal(prefix + "self_attn.o_proj.weight", {hidden, q_width});
    layer.post_norm = ones(prefix + "post_attention_layernorm.weight", hidden);
    layer.gate = normal(prefix + "mlp.gate_proj.weight", {ffn, hidden});
    layer.up = normal(prefix + "mlp.up_proj.weight", {ffn, hidden});
    layer.down = normal(prefix + "mlp.down_proj.weight", {hidden, ffn});
    model->layers_.push_back(std::move(layer));
  }
  model->final_norm_ = ones("model.norm.weight", hidden);
  model->lm_head_ = config.tie_word_embeddings
                        ? model->embed_
                        : normal("lm_head.weight", {config.vocab_size, hidden});

  // Rotary tables computed in float32 the way HF computes them, so that
  // logits match HF's to float rounding.
  const torch::Tensor exponents =
      torch::arange(0, head_dim, 2, torch::kInt64).to(torch::kFloat32) / static_cast<double>(head_dim);
  const torch::Tensor inv_freq = torch::pow(config.rope_theta, exponents).reciprocal();
  const torch::Tensor steps = torch::arange(config.max_position_embeddings, torch::kInt64)
                                  .to(torch::kFloat32);
  const torch::Tensor freqs = torch::outer(steps, inv_freq);
  const torch::Tensor angles = torch::cat({freqs, freqs}, -1);
  model->rope_cos_ = angles.cos().to(placement.device, placement.compute_dtype);
  model->rope_sin_ = angles.sin().to(placement.device, placement.compute_dtype);
  return model;
}

std::vector<torch::Tensor> Transformer::parameter_tensors() const {
  std::vector<torch::Tensor> tensors;
  tensors.reserve(params_.size());
  for (const NamedTensor& param : params_) tensors.push_back(param.tensor);
  return tensors;
}

absl::Status Transformer::LoadWeights(const std::vector<NamedTensor>& weights) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].name, i);

  // Check everything before copying anything: a bad checkpoint leaves the
  // model as it was.
  std::vector<const torch::Tensor*> sources(params_.size(), nullptr);
  for (const NamedTensor& weight : weights) {
    auto it = index.find(weight.name);
    if (it == index.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown tensor \"", weight.name, "\": the model has no such parameter"));
    }
    const NamedTensor& param = params_[it->second];
    if (sources[it->second] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", weight.name, "\" is given more than once"));
    }
    if (!weight.tensor.defined()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", weight.name, "\" is undefined"));
    }
    if (weight.tensor.sizes() != param.tensor.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", weight.name, "\" has shape ", ShapeString(weight.tensor.sizes()),
          ", the parameter has shape ", ShapeString(param.tensor.sizes())));
    }
    if (!weight.tensor.is_floating_point()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", weight.name,
                                                     "\" is not floating point (",
                                                     std::string(weight.tensor.dtype().name()), ")"));
    }
    sources[it->second] = &weight.tensor;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (sources[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing tensor \"", params_[i].name, "\""));
    }
  }

  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].tensor.copy_(*sources[i]);  // Converts the dtype as it copies.
  }
  return absl::OkStatus();
}

torch::Tensor Transformer::Decode(const torch::Tensor& input_ids, const torch::Tensor& positions,
                                  const torch::Tensor& blocked, KVCache* cache,
                                  const torch::Tensor& row_columns,
                                  const torch::Tensor& last) const {
  const int64_t batch = input_ids.size(0);
  const int64_t length = input_ids.size(1);
  const int64_t heads = config_.num_attention_heads;
  const int64_t kv_heads = config_.num_key_value_heads;
  const int64_t group = heads / kv_heads;
  const int64_t head_dim = config_.resolved_head_dim();
  const double eps = config_.rms_norm_eps;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  TORCH_CHECK(positions.sizes() == input_ids.sizes(), "positions ", positions.sizes(),
              " must have the shape of input_ids ", input_ids.sizes());

  // [B, T, 1, head_dim], broadcast over heads. index_select range-checks the
  // positions (max_position_embeddings).
  const torch::Tensor flat_positions = positions.reshape({-1}).to(device(), torch::kInt64);
  const torch::Tensor cos =
      rope_cos_.index_select(0, flat_positions).view({batch, length, 1, head_dim});
  const torch::Tensor sin =
      rope_sin_.index_select(0, flat_positions).view({batch, length, 1, head_dim});

  // Per-row writes (row_columns) index cache rows 0 .. B - 1, and `last`
  // picks one position per row: the row indices, made once per call.
  const torch::Tensor cache_rows = row_columns.defined() || last.defined()
                                       ? torch::arange(batch, DeviceOptions().dtype(torch::kInt64))
                                       : torch::Tensor();
  const torch::ScalarType compute = placement_.compute_dtype;
  // The rows gathered, then cast: cheaper than casting the whole table.
  torch::Tensor x =
      torch::embedding(embed_, input_ids.to(device(), torch::kInt64)).to(compute);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerParams& p = layers_[l];
    const torch::Tensor h = RmsNorm(x, Use(p.input_norm), eps);
    torch::Tensor q =
        torch::linear(h, Use(p.q), Use(p.q_bias)).view({batch, length, heads, head_dim});
    torch::Tensor k =
        torch::linear(h, Use(p.k), Use(p.k_bias)).view({batch, length, kv_heads, head_dim});
    torch::Tensor v =
        torch::linear(h, Use(p.v), Use(p.v_bias)).view({batch, length, kv_heads, head_dim});
    q = ApplyRotary(q, cos, sin);
    k = ApplyRotary(k, cos, sin);
    k = k.transpose(1, 2);  // [B, kv_heads, T, head_dim]
    v = v.transpose(1, 2);
    if (cache != nullptr && row_columns.defined()) {
      // One new position per row, each at its own column.
      using torch::indexing::Slice;
      cache->keys[l].index_put_({cache_rows, Slice(), row_columns}, k.select(2, 0));
      cache->values[l].index_put_({cache_rows, Slice(), row_columns}, v.select(2, 0));
      const int64_t columns = blocked.size(-1);
      k = cache->keys[l].narrow(0, 0, batch).narrow(2, 0, columns);
      v = cache->values[l].narrow(0, 0, batch).narrow(2, 0, columns);
    } else if (cache != nullptr) {
      cache->keys[l].narrow(2, cache->length, length).copy_(k);
      cache->values[l].narrow(2, cache->length, length).copy_(v);
      k = cache->keys[l].narrow(2, 0, cache->length + length);
      v = cache->values[l].narrow(2, 0, cache->length + length);
    }
    const int64_t keys = k.size(2);
    // Grouped-query attention without copying K/V per head: query head
    // kv * group + j attends KV head kv (HF's repeat_kv), so the queries of a
    // group are stacked along the sequence axis of their KV head.
    q = q.view({batch, length, kv_heads, group, head_dim})
            .permute({0, 2, 3, 1, 4})
            .reshape({batch, kv_heads, group * length, head_dim});
    // Masking and softmax in float32 (as HF's eager attention): the lowest
    // float is -inf in bfloat16, and a row of -inf has no softmax.
    torch::Tensor scores = (torch::matmul(q, k.transpose(-1, -2)) * scale).to(torch::kFloat32);
    scores = scores.view({batch, kv_heads, group, length, keys}).masked_fill(blocked, kMaskedScore);
    const torch::Tensor probs =
        torch::softmax(scores, -1).to(compute).view({batch, kv_heads, group * length, keys});
    const torch::Tensor attended = torch::matmul(probs, v)  // [B, kv, group * T, head_dim]
                                       .view({batch, kv_heads, group, length, head_dim})
                                       .permute({0, 3, 1, 2, 4})
                                       .reshape({batch, length, heads * head_dim});
    x = x + torch::linear(attended, Use(p.o));
    const torch::Tensor h2 = RmsNorm(x, Use(p.post_norm), eps);
    x = x + torch::linear(torch::silu(torch::linear(h2, Use(p.gate))) * torch::linear(h2, Use(p.up)),
                          Use(p.down));
  }
  if (cache != nullptr && !row_columns.defined()) cache->length += length;
  if (last.defined()) {
    x = x.index({cache_rows, last}).unsqueeze(1);
  }
  return torch::linear(RmsNorm(x, Use(final_norm_), eps), Use(lm_head_));
}

torch::Tensor Transformer::Forward(const torch::Tensor& input_ids,
                                   const torch::Tensor& attention_mask) const {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, length], got ", input_ids.sizes());
  const int64_t batch = input_ids.size(0);
  const int64_t length = input_ids.size(1);
  const torch::Tensor causal =
      torch::ones({length, length}, DeviceOptions().dtype(torch::kBool)).tril();
  torch::Tensor positions;
  torch::Tensor allowed;
  if (attention_mask.defined()) {
    TORCH_CHECK(attention_mask.sizes() == input_ids.sizes(), "attention_mask ",
                attention_mask.sizes(), " must have the shape of input_ids ", input_ids.sizes());
    const torch::Tensor mask = attention_mask.to(device(), torch::kBool);
    positions = (mask.to(torch::kInt64).cumsum(1) - 1).clamp_min(0);
    allowed = causal.unsqueeze(0) & mask.unsqueeze(1);  // [B, T(query), T(key)]
  } else {
    positions = torch::arange(length, DeviceOptions().dtype(torch::kInt64))
                    .unsqueeze(0)
                    .expand({batch, length});
    allowed = causal.unsqueeze(0);
  }
  const torch::Tensor blocked = allowed.logical_not().view({allowed.size(0), 1, 1, length, length});
  return Decode(input_ids, positions, blocked, /*cache=*/nullptr);
}

KVCache Transformer::NewCache(int64_t batch, int64_t capacity) const {
  KVCache cache;
  cache.capacity = capacity;
  const auto options = DeviceOptions().dtype(placement_.compute_dtype);
  for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
    cache.keys.push_back(torch::zeros(
        {batch, config_.num_key_value_heads, capacity, config_.resolved_head_dim()}, options));
    cache.values.push_back(torch::zeros_like(cache.keys.back()));
  }
  return cache;
}

torch::Tensor Transformer::ForwardCached(const torch::Tensor& input_ids,
                                         const torch::Tensor& positions,
                                         const torch::Tensor& key_mask, KVCache& cache) const {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, length], got ", input_ids.sizes());
  const int64_t batch = input_ids.size(0);
  const int64_t length = input_ids.size(1);
  const int64_t past = cache.length;
  const int64_t total = past + length;
  TORCH_CHECK(static_cast<int64_t>(cache.keys.size()) == config_.num_hidden_layers,
              "the cache has ", cache.keys.size(), " layers, the model ",
              config_.num_hidden_layers);
  TORCH_CHECK(total <= cache.capacity, "the cache holds ", cache.capacity, " positions, ", past,
              " used, ", length, " more asked for");
  TORCH_CHECK(cache.keys.empty() || cache.keys[0].size(0) == batch, "the cache is for ",
              cache.keys[0].size(0), " rows, input_ids has ", batch);
  TORCH_CHECK(key_mask.dim() == 2 && key_mask.size(0) == batch && key_mask.size(1) == total,
              "key_mask must be [", batch, ", ", total, "], got ", key_mask.sizes());
  // Query i sits at cache position past + i and sees keys 0 .. past + i.
  const torch::Tensor causal =
      torch::ones({length, total}, DeviceOptions().dtype(torch::kBool)).tril(past);
  const torch::Tensor allowed =
      causal.unsqueeze(0) & key_mask.to(device(), torch::kBool).unsqueeze(1);
  const torch::Tensor blocked = allowed.logical_not().view({batch, 1, 1, length, total});
  return Decode(input_ids, positions, blocked, &cache);
}

torch::Tensor Transformer::ForwardRows(const torch::Tensor& input_ids, const torch::Tensor& lengths,
                                       KVCache& cache, int64_t longest) const {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.size(1) == 1, "input_ids must be [batch, 1], got ",
              input_ids.sizes());
  const int64_t batch = input_ids.size(0);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, "lengths must be [", batch,
              "], got ", lengths.sizes());
  TORCH_CHECK(static_cast<int64_t>(cache.keys.size()) == config_.num_hidden_layers,
              "the cache has ", cache.keys.size(), " layers, the model ",
              config_.num_hidden_layers);
  TORCH_CHECK(cache.keys.empty() || cache.keys[0].size(0) >= batch, "the cache has ",
              cache.keys[0].size(0), " rows, input_ids ", batch);
  if (longest < 0) longest = batch == 0 ? 0 : lengths.max().item<int64_t>();
  TORCH_CHECK(longest < cache.capacity, "the cache holds ", cache.capacity,
              " positions, a row needs column ", longest);
  const torch::Tensor columns = lengths.to(device(), torch::kInt64);
  // Keys 0 .. longest; row b sees columns 0 .. lengths[b].
  const torch::Tensor blocked =
      (torch::arange(longest + 1, DeviceOptions().dtype(torch::kInt64)).unsqueeze(0) >
       columns.unsqueeze(1))
          .view({batch, 1, 1, 1, longest + 1});
  return Decode(input_ids, columns.unsqueeze(1), blocked, &cache, columns);
}

torch::Tensor Transformer::Prefill(const torch::Tensor& input_ids, const torch::Tensor& lengths,
                                   KVCache& cache) const {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [batch, length], got ", input_ids.sizes());
  const int64_t batch = input_ids.size(0);
  const int64_t length = input_ids.size(1);
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, "lengths must be [", batch,
              "], got ", lengths.sizes());
  TORCH_CHECK(cache.length == 0, "Prefill needs an empty cache, this one holds ", cache.length);
  TORCH_CHECK(length <= cache.capacity, "the cache holds ", cache.capacity, " positions, ",
              length, " asked for");
  TORCH_CHECK(cache.keys.empty() || cache.keys[0].size(0) == batch, "the cache is for ",
              cache.keys[0].size(0), " rows, input_ids has ", batch);
  // Checked where the caller keeps the lengths (the host, for the engine).
  const torch::Tensor last = lengths.to(torch::kInt64) - 1;
  TORCH_CHECK(batch == 0 || (last.min().item<int64_t>() >= 0 && last.max().item<int64_t>() < length),
              "lengths must be in [1, ", length, "]");
  const torch::Tensor positions = torch::arange(length, DeviceOptions().dtype(torch::kInt64))
                                      .unsqueeze(0)
                                      .expand({batch, length});
  const torch::Tensor blocked =
      torch::ones({length, length}, DeviceOptions().dtype(torch::kBool))
          .triu(1)
          .view({1, 1, 1, length, length});
  return Decode(input_ids, positions, blocked, &cache, torch::Tensor(), last.to(device()))
      .squeeze(1);
}

torch::Tensor TokenLogProbs(const torch::Tensor& logits, const torch::Tensor& targets,
                            double temperature) {
  TORCH_CHECK(temperature > 0, "temperature must be > 0, got ", temperature);
  torch::Tensor scaled = logits.to(torch::kFloat32);
  if (temperature != 1.0) scaled = scaled / temperature;
  return torch::log_softmax(scaled, -1)
      .gather(-1, targets.to(torch::kInt64).unsqueeze(-1))
      .squeeze(-1);
}

torch::Tensor Entropy(const torch::Tensor& logits, double temperature) {
  TORCH_CHECK(temperature > 0, "temperature must be > 0, got ", temperature);
  torch::Tensor scaled = logits.to(torch::kFloat32);
  if (temperature != 1.0) scaled = scaled / temperature;
  const torch::Tensor log_probs = torch::log_softmax(scaled, -1);
  return -(log_probs.exp() * log_probs).sum(-1);
}

std::string TensorBytes(const torch::Tensor& tensor) {
  const torch::Tensor contiguous = tensor.to(torch::kCPU).contiguous();
  return std::string(static_cast<const char*>(contiguous.data_ptr()), contiguous.nbytes());
}

absl::StatusOr<torch::Tensor> Float32TensorFromBytes(const std::vector<int64_t>& shape,
                                                     const std::string& bytes) {
  ASSIGN_OR_RETURN(torch::Tensor view, Float32TensorView(shape, bytes));
  return view.clone();
}

absl::StatusOr<torch::Tensor> Float32TensorView(const std::vector<int64_t>& shape,
                                                const std::string& bytes) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (dim != 0 && numel > std::numeric_limits<int64_t>::max() / 4 / dim) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " is too large"));
    }
    numel *= dim;
  }
  if (static_cast<uint64_t>(numel) * sizeof(float) != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " needs ",
                                                   numel * 4, " bytes of float32, got ",
                                                   bytes.size()));
  }
  const auto options = torch::TensorOptions().dtype(torch::kFloat32);
  if (bytes.empty()) return torch::empty(shape, options);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0) {
    torch::Tensor tensor = torch::empty(shape, options);
    std::memcpy(tensor.data_ptr(), bytes.data(), bytes.size());
    return tensor;
  }
  return torch::from_blob(const_cast<char*>(bytes.data()), shape, options);
}

}  // namespace sluice::model
