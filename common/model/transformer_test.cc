#include "common/model/transformer.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::model {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 24;  // task::CharTokenizer's

ModelConfig Config(const std::string& name) {
  absl::StatusOr<ModelConfig> config = BuiltinModelConfig(name, kVocab);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::unique_ptr<Transformer> Make(const ModelConfig& config, uint64_t seed = 0) {
  absl::StatusOr<std::unique_ptr<Transformer>> model = Transformer::Create(config, seed);
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(*model);
}

// Larger random weights than the 0.02 initialisation (norm weights and
// biases too), so that logits are O(1) (std ~1.2 for tiny) and every
// component visibly matters: with the initial weights logits are ~1e-2 and
// an atol of 1e-5 would hardly tell a right model from a wrong one.
void Randomize(Transformer& model, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<NamedTensor> weights;
  for (const NamedTensor& param : model.parameters()) {
    torch::Tensor value = torch::randn(param.tensor.sizes()) * 0.1;
    if (param.name.find("norm") != std::string::npos) value = 1.0 + value;
    weights.push_back({param.name, value});
  }
  ASSERT_TRUE(model.LoadWeights(weights).ok());
}

torch::Tensor Ids(const std::vector<std::vector<int64_t>>& rows) {
  torch::Tensor ids = torch::empty({static_cast<int64_t>(rows.size()),
                                    static_cast<int64_t>(rows[0].size())},
                                   torch::kInt64);
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < rows[r].size(); ++c) ids[r][c] = rows[r][c];
  }
  return ids;
}

// An independent, deliberately naive Llama forward for one unpadded row:
// per-head loops, explicit repeat of KV heads, rotary from the formula
// (x_i cos - x_{i+d/2} sin, x_{i+d/2} cos + x_i sin) in double precision.
torch::Tensor NaiveForward(const Transformer& model, const std::vector<int64_t>& tokens) {
  const ModelConfig& c = model.config();
  std::map<std::string, torch::Tensor> w;
  for (const NamedTensor& p : model.parameters()) w[p.name] = p.tensor.detach().to(torch::kFloat64);
  if (c.tie_word_embeddings) w["lm_head.weight"] = w["model.embed_tokens.weight"];
  const int64_t length = static_cast<int64_t>(tokens.size());
  const int64_t d = c.resolved_head_dim();
  const int64_t group = c.num_attention_heads / c.num_key_value_heads;
  auto norm = [&](const torch::Tensor& x, const torch::Tensor& weight) {
    return x / torch::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps) * weight;
  };
  auto rotate = [&](const torch::Tensor& x /* [T, d] */) {
    torch::Tensor out = torch::empty_like(x);
    for (int64_t t = 0; t < length; ++t) {
      for (int64_t i = 0; i < d / 2; ++i) {
        const double angle = t / std::pow(c.rope_theta, 2.0 * i / d);
        const double a = x[t][i].item<double>();
        const double b = x[t][i + d / 2].item<double>();
        out[t][i] = a * std::cos(angle) - b * std::sin(angle);
        out[t][i + d / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
    return out;
  };
  auto linear = [&](const torch::Tensor& x, const std::string& name) {
    torch::Tensor y = x.matmul(w[name + ".weight"].t());
    if (w.count(name + ".bias")) y = y + w[name + ".bias"];
    return y;
  };
  torch::Tensor x = w["model.embed_tokens.weight"].index_select(0, torch::tensor(tokens));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    torch::Tensor h = norm(x, w[p + "input_layernorm.weight"]);
    torch::Tensor q = linear(h, p + "self_attn.q_proj");
    torch::Tensor k = linear(h, p + "self_attn.k_proj");
    torch::Tensor v = linear(h, p + "self_attn.v_proj");
    std::vector<torch::Tensor> heads;
    for (int64_t head = 0; head < c.num_attention_heads; ++head) {
      const int64_t kv = head / group;
      torch::Tensor qh = rotate(q.narrow(1, head * d, d));
      torch::Tensor kh = rotate(k.narrow(1, kv * d, d));
      torch::Tensor vh = v.narrow(1, kv * d, d);
      torch::Tensor scores = qh.matmul(kh.t()) / std::sqrt(static_cast<double>(d));
      torch::Tensor future = torch::ones({length, length}, torch::kBool).triu(1);
      scores = scores.masked_fill(future, -1e30);
      heads.push_back(torch::softmax(scores, -1).matmul(vh));
    }
    x = x + linear(torch::cat(heads, 1), p + "self_attn.o_proj");
    h = norm(x, w[p + "post_attention_layernorm.weight"]);
    torch::Tensor gate = linear(h, p + "mlp.gate_proj");
    x = x + linear(gate * torch::sigmoid(gate) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj");
  }
  return linear(norm(x, w["model.norm.weight"]), "lm_head").to(torch::kFloat32);
}

TEST(TransformerTest, TinyHasHuggingFaceParameterNamesInOrder) {
  const ModelConfig config = Config("tiny");
  std::unique_ptr<Transformer> model = Make(config);
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (int i = 0; i < 4; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* name :
         {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
      expected.push_back(p + name);
    }
  }
  expected.push_back("model.norm.weight");
  expected.push_back("lm_head.weight");
  std::vector<std::string> names;
  int64_t numel = 0;
  for (const NamedTensor& param : model->parameters()) {
    names.push_back(param.name);
    numel += param.tensor.numel();
    EXPECT_TRUE(param.tensor.requires_grad()) << param.name;
    EXPECT_EQ(param.tensor.dtype(), torch::kFloat32);
  }
  EXPECT_EQ(names, expected);
  EXPECT_EQ(numel, config.ParameterCount());
  EXPECT_EQ(numel, 732288);
  EXPECT_EQ(model->parameter_tensors().size(), expected.size());

  const auto& params = model->parameters();
  EXPECT_EQ(params[2].tensor.sizes(), (std::vector<int64_t>{128, 128}));  // q
  EXPECT_EQ(params[3].tensor.sizes(), (std::vector<int64_t>{64, 128}));   // k
  EXPECT_EQ(params[7].tensor.sizes(), (std::vector<int64_t>{344, 128}));  // gate
  EXPECT_EQ(params[9].tensor.sizes(), (std::vector<int64_t>{128, 344}));  // down
}

TEST(TransformerTest, InitialisationFollowsTheDocumentedScheme) {
  ModelConfig config = Config("tiny");
  config.attention_bias = true;
  std::unique_ptr<Transformer> model = Make(config, 5);
  for (const NamedTensor& param : model->parameters()) {
    if (param.name.find("norm") != std::string::npos) {
      EXPECT_TRUE(torch::equal(param.tensor, torch::ones_like(param.tensor))) << param.name;
    } else if (param.name.find("bias") != std::string::npos) {
      EXPECT_TRUE(torch::equal(param.tensor, torch::zeros_like(param.tensor))) << param.name;
    } else {
      EXPECT_NEAR(param.tensor.std().item<double>(), 0.02, 0.002) << param.name;
      EXPECT_NEAR(param.tensor.mean().item<double>(), 0.0, 0.002) << param.name;
    }
  }
}

TEST(TransformerTest, Qwen2StyleConfigHasAttentionBiases) {
  ModelConfig config = Config("micro");
  config.architecture = "Qwen2ForCausalLM";
  config.attention_bias = true;
  std::unique_ptr<Transformer> model = Make(config);
  std::vector<std::string> names;
  int64_t numel = 0;
  for (const NamedTensor& param : model->parameters()) {
    names.push_back(param.name);
    numel += param.tensor.numel();
  }
  const std::vector<std::string> layer0(names.begin() + 1, names.begin() + 9);
  EXPECT_EQ(layer0, (std::vector<std::string>{
                        "model.layers.0.input_layernorm.weight",
                        "model.layers.0.self_attn.q_proj.weight",
                        "model.layers.0.self_attn.q_proj.bias",
                        "model.layers.0.self_attn.k_proj.weight",
                        "model.layers.0.self_attn.k_proj.bias",
                        "model.layers.0.self_attn.v_proj.weight",
                        "model.layers.0.self_attn.v_proj.bias",
                        "model.layers.0.self_attn.o_proj.weight"}));
  EXPECT_EQ(numel, config.ParameterCount());
}

TEST(TransformerTest, TiedEmbeddingsHaveNoLmHead) {
  ModelConfig config = Config("micro");
  config.tie_word_embeddings = true;
  std::unique_ptr<Transformer> model = Make(config);
  int64_t numel = 0;
  for (const NamedTensor& param : model->parameters()) {
    EXPECT_NE(param.name, "lm_head.weight");
    numel += param.tensor.numel();
  }
  EXPECT_EQ(numel, config.ParameterCount());
  EXPECT_EQ(model->parameters().back().name, "model.norm.weight");
}

TEST(TransformerTest, CreateIsDeterministicInTheSeed) {
  const ModelConfig config = Config("micro");
  std::unique_ptr<Transformer> a = Make(config, 1);
  std::unique_ptr<Transformer> b = Make(config, 1);
  std::unique_ptr<Transformer> c = Make(config, 2);
  for (size_t i = 0; i < a->parameters().size(); ++i) {
    EXPECT_TRUE(torch::equal(a->parameters()[i].tensor, b->parameters()[i].tensor));
  }
  EXPECT_FALSE(torch::equal(a->parameters()[0].tensor, c->parameters()[0].tensor));
}

TEST(TransformerTest, CreateRejectsAnInvalidConfig) {
  ModelConfig config = Config("micro");
  config.num_key_value_heads = 3;
  absl::StatusOr<std::unique_ptr<Transformer>> model = Transformer::Create(config, 0);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("num_key_value_heads"));
}

// RMSNorm, rotate-half RoPE, GQA head mapping, SwiGLU and tied embeddings
// against the naive reference, for Llama- and Qwen2-style configs.
TEST(TransformerTest, ForwardMatchesANaiveReference) {
  for (const bool qwen_style : {false, true}) {
    ModelConfig config = Config("tiny");
    if (qwen_style) {
      config.architecture = "Qwen2ForCausalLM";
      config.attention_bias = true;
      config.tie_word_embeddings = true;
      config.rope_theta = 1000.0;
    }
    std::unique_ptr<Transformer> model = Make(config);
    Randomize(*model, 3);
    const std::vector<int64_t> tokens = {1, 5, 9, 13, 3, 22, 7, 16, 4};
    torch::NoGradGuard no_grad;
    const torch::Tensor logits = model->Forward(Ids({tokens}))[0];
    const torch::Tensor expected = NaiveForward(*model, tokens);
    EXPECT_GT(expected.abs().max().item<double>(), 0.5);
    EXPECT_TRUE(torch::allclose(logits, expected, /*rtol=*/1e-4, /*atol=*/1e-4))
        << "qwen_style=" << qwen_style << " max diff "
        << (logits - expected).abs().max().item<double>();
  }
}

TEST(TransformerTest, LeftPaddedRowsMatchUnpaddedRows) {
  std::unique_ptr<Transformer> model = Make(Config("tiny"));
  Randomize(*model, 4);
  const std::vector<std::vector<int64_t>> rows = {
      {1, 5, 9, 13, 3, 22, 7}, {1, 4, 4}, {1, 8, 3, 12, 6}, {11}};
  const int64_t width = 7;
  std::vector<std::vector<int64_t>> padded, mask;
  for (const auto& row : rows) {
    std::vector<int64_t> ids(width - row.size(), 0), m(width - row.size(), 0);
    ids.insert(ids.end(), row.begin(), row.end());
    m.insert(m.end(), row.size(), 1);
    padded.push_back(ids);
    mask.push_back(m);
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor batch_logits = model->Forward(Ids(padded), Ids(mask));
  EXPECT_FALSE(batch_logits.isnan().any().item<bool>());
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t length = static_cast<int64_t>(rows[r].size());
    const torch::Tensor alone = model->Forward(Ids({rows[r]}))[0];
    const torch::Tensor in_batch = batch_logits[r].narrow(0, width - length, length);
    EXPECT_TRUE(torch::allclose(in_batch, alone, 0, 1e-5))
        << "row " << r << " max diff " << (in_batch - alone).abs().max().item<double>();
  }
  // A boolean mask works the same.
  EXPECT_TRUE(torch::allclose(model->Forward(Ids(padded), Ids(mask).to(torch::kBool)),
                              batch_logits, 0, 1e-6));
}

TEST(TransformerTest, ForwardCachedReproducesForward) {
  std::unique_ptr<Transformer> model = Make(Config("tiny"));
  Randomize(*model, 5);
  const std::vector<std::vector<int64_t>> rows = {{1, 5, 9, 13, 3, 22, 7, 16},
                                                  {1, 4, 4, 8, 19, 20, 2, 3}};
  const torch::Tensor ids = Ids(rows);
  torch::NoGradGuard no_grad;
  const torch::Tensor full = model->Forward(ids);
  const torch::Tensor positions = torch::arange(8, torch::kInt64).unsqueeze(0).expand({2, 8});
  const torch::Tensor key_mask = torch::ones({2, 8}, torch::kInt64);

  // One token at a time.
  KVCache cache = model->NewCache(2, 8);
  for (int64_t t = 0; t < 8; ++t) {
    const torch::Tensor logits = model->ForwardCached(
        ids.narrow(1, t, 1), positions.narrow(1, t, 1), key_mask.narrow(1, 0, t + 1), cache);
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 1, kVocab}));
    EXPECT_TRUE(torch::allclose(logits.select(1, 0), full.select(1, t), 0, 1e-5)) << "t=" << t;
  }
  EXPECT_EQ(cache.length, 8);

  // A prefill of five tokens, then single steps.
  KVCache prefilled = model->NewCache(2, 10);
  const torch::Tensor prefill = model->ForwardCached(ids.narrow(1, 0, 5), positions.narrow(1, 0, 5),
                                                     key_mask.narrow(1, 0, 5), prefilled);
  EXPECT_TRUE(torch::allclose(prefill, full.narrow(1, 0, 5), 0, 1e-5));
  for (int64_t t = 5; t < 8; ++t) {
    const torch::Tensor logits = model->ForwardCached(
        ids.narrow(1, t, 1), positions.narrow(1, t, 1), key_mask.narrow(1, 0, t + 1), prefilled);
    EXPECT_TRUE(torch::allclose(logits.select(1, 0), full.select(1, t), 0, 1e-5)) << "t=" << t;
  }
  // The cache refuses to overflow.
  KVCache small = model->NewCache(2, 2);
  EXPECT_THROW(model->ForwardCached(ids.narrow(1, 0, 3), positions.narrow(1, 0, 3),
                                    key_mask.narrow(1, 0, 3), small),
               c10::Error);
}

TEST(TransformerTest, ForwardCachedWithLeftPaddingMatchesUnpaddedRows) {
  std::unique_ptr<Transformer> model = Make(Config("micro"));
  Randomize(*model, 6);
  // Row 0 has two pads; the prompt of 4 columns is prefilled, then 2 steps.
  const torch::Tensor ids = Ids({{0, 0, 1, 5, 9, 13}, {1, 7, 8, 3, 4, 6}});
  const torch::Tensor mask = Ids({{0, 0, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}});
  const torch::Tensor positions = Ids({{0, 0, 0, 1, 2, 3}, {0, 1, 2, 3, 4, 5}});
  torch::NoGradGuard no_grad;
  KVCache cache = model->NewCache(2, 6);
  std::vector<torch::Tensor> steps = {model->ForwardCached(
      ids.narrow(1, 0, 4), positions.narrow(1, 0, 4), mask.narrow(1, 0, 4), cache)};
  for (int64_t t = 4; t < 6; ++t) {
    steps.push_back(model->ForwardCached(ids.narrow(1, t, 1), positions.narrow(1, t, 1),
                                         mask.narrow(1, 0, t + 1), cache));
  }
  const torch::Tensor cached = torch::cat(steps, 1);
  const torch::Tensor row0 = model->Forward(Ids({{1, 5, 9, 13}}))[0];
  const torch::Tensor row1 = model->Forward(Ids({{1, 7, 8, 3, 4, 6}}))[0];
  EXPECT_TRUE(torch::allclose(cached[0].narrow(0, 2, 4), row0, 0, 1e-5));
  EXPECT_TRUE(torch::allclose(cached[1], row1, 0, 1e-5));
}

TEST(TransformerTest, LoadWeightsFromAnotherModelGivesIdenticalLogits) {
  const ModelConfig config = Config("tiny");
  std::unique_ptr<Transformer> source = Make(config, 1);
  std::unique_ptr<Transformer> target = Make(config, 2);
  const torch::Tensor ids = Ids({{1, 5, 9, 13, 3}});
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(torch::equal(source->Forward(ids), target->Forward(ids)));
  // Through bytes, as weights travel between services.
  std::vector<NamedTensor> weights;
  for (const NamedTensor& param : source->parameters()) {
    std::vector<int64_t> shape(param.tensor.sizes().begin(), param.tensor.sizes().end());
    absl::StatusOr<torch::Tensor> copy = Float32TensorFromBytes(shape, TensorBytes(param.tensor));
    ASSERT_TRUE(copy.ok());
    weights.push_back({param.name, *copy});
  }
  ASSERT_TRUE(target->LoadWeights(weights).ok());
  EXPECT_TRUE(torch::equal(source->Forward(ids), target->Forward(ids)));
  EXPECT_TRUE(target->parameters()[0].tensor.requires_grad());
}

TEST(TransformerTest, LoadWeightsConvertsDtypeAndKeepsTiedEmbeddingsTied) {
  ModelConfig config = Config("micro");
  config.tie_word_embeddings = true;
  std::unique_ptr<Transformer> model = Make(config, 1);
  std::vector<NamedTensor> weights;
  for (const NamedTensor& param : model->parameters()) {
    weights.push_back({param.name, torch::full(param.tensor.sizes(), 0.5, torch::kFloat64)});
  }
  ASSERT_TRUE(model->LoadWeights(weights).ok());
  EXPECT_EQ(model->parameters()[0].tensor.dtype(), torch::kFloat32);
  torch::NoGradGuard no_grad;
  // With every weight 0.5 the logits are all equal: the head is the loaded
  // embedding, not a stale copy.
  const torch::Tensor logits = model->Forward(Ids({{1, 2, 3}}));
  EXPECT_TRUE(torch::allclose(logits, logits.select(-1, 0).unsqueeze(-1).expand_as(logits)));
}

TEST(TransformerTest, LoadWeightsRejectsMissingUnknownAndMisshapedTensorsNamingThem) {
  std::unique_ptr<Transformer> model = Make(Config("micro"), 1);
  std::vector<NamedTensor> good;
  for (const NamedTensor& param : model->parameters()) {
    good.push_back({param.name, torch::zeros(param.tensor.sizes())});
  }
  const torch::Tensor before = model->parameters()[0].tensor.clone();

  std::vector<NamedTensor> missing(good.begin(), good.end() - 1);
  absl::Status status = model->LoadWeights(missing);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"lm_head.weight\""));

  std::vector<NamedTensor> unknown = good;
  unknown.push_back({"model.layers.9.mlp.up_proj.weight", torch::zeros({1})});
  status = model->LoadWeights(unknown);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("model.layers.9.mlp.up_proj.weight"));

  std::vector<NamedTensor> misshaped = good;
  misshaped[3].tensor = torch::zeros({3, 3});
  status = model->LoadWeights(misshaped);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr(misshaped[3].name));
  EXPECT_THAT(std::string(status.message()), HasSubstr("[3, 3]"));

  std::vector<NamedTensor> duplicated = good;
  duplicated.push_back(good[1]);
  EXPECT_EQ(model->LoadWeights(duplicated).code(), absl::StatusCode::kInvalidArgument);

  // Nothing was copied by the failed loads.
  EXPECT_TRUE(torch::equal(model->parameters()[0].tensor, before));
}

TEST(TransformerTest, ForwardIsDifferentiableInEveryParameter) {
  std::unique_ptr<Transformer> model = Make(Config("micro"));
  const torch::Tensor ids = Ids({{0, 1, 5, 9}, {1, 7, 8, 3}});
  const torch::Tensor mask = Ids({{0, 1, 1, 1}, {1, 1, 1, 1}});
  const torch::Tensor logits = model->Forward(ids, mask);
  TokenLogProbs(logits.narrow(1, 0, 3), ids.narrow(1, 1, 3)).sum().backward();
  for (const NamedTensor& param : model->parameters()) {
    ASSERT_TRUE(param.tensor.grad().defined()) << param.name;
    EXPECT_GT(param.tensor.grad().abs().sum().item<double>(), 0) << param.name;
    EXPECT_FALSE(param.tensor.grad().isnan().any().item<bool>()) << param.name;
  }
}

TEST(TransformerTest, TokenLogProbsAndEntropy) {
  const torch::Tensor logits = torch::tensor({{1.0f, 2.0f, 3.0f}, {0.0f, 0.0f, 0.0f}});
  const torch::Tensor targets = torch::tensor({2, 0}, torch::kInt64);
  const torch::Tensor logprobs = TokenLogProbs(logits, targets);
  const double z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(logprobs[0].item<double>(), 3.0 - z, 1e-6);
  EXPECT_NEAR(logprobs[1].item<double>(), -std::log(3.0), 1e-6);
  const double z_half = std::log(std::exp(2.0) + std::exp(4.0) + std::exp(6.0));
  EXPECT_NEAR(TokenLogProbs(logits, targets, 0.5)[0].item<double>(), 6.0 - z_half, 1e-6);

  const torch::Tensor entropy = Entropy(logits);
  EXPECT_NEAR(entropy[1].item<double>(), std::log(3.0), 1e-6);
  const torch::Tensor p = torch::softmax(logits[0], -1);
  EXPECT_NEAR(entropy[0].item<double>(), -(p * p.log()).sum().item<double>(), 1e-6);
  // Low temperature: nearly one-hot.
  EXPECT_LT(Entropy(logits, 0.01)[0].item<double>(), 1e-6);
  EXPECT_EQ(TokenLogProbs(torch::zeros({2, 3, 5}), torch::zeros({2, 3}, torch::kInt64)).sizes(),
            (std::vector<int64_t>{2, 3}));
}

TEST(TransformerTest, TensorBytesRoundTripAndSizeCheck) {
  const torch::Tensor tensor = torch::arange(6, torch::kFloat32).view({2, 3}).t();  // not contiguous
  const std::string bytes = TensorBytes(tensor);
  ASSERT_EQ(bytes.size(), 24u);
  float first[2];
  std::memcpy(first, bytes.data(), sizeof(first));
  EXPECT_EQ(first[0], 0.0f);
  EXPECT_EQ(first[1], 3.0f);  // row-major of the transposed view
  absl::StatusOr<torch::Tensor> back = Float32TensorFromBytes({3, 2}, bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(torch::equal(*back, tensor));

  absl::StatusOr<torch::Tensor> wrong = Float32TensorFromBytes({4, 2}, bytes);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("32 bytes"));
  EXPECT_FALSE(Float32TensorFromBytes({-1, 2}, bytes).ok());
  EXPECT_TRUE(Float32TensorFromBytes({0, 5}, "").ok());
  // The copy owns its data; the view reads the string's.
  EXPECT_NE(back->data_ptr(), static_cast<const void*>(bytes.data()));
  absl::StatusOr<torch::Tensor> view = Float32TensorView({3, 2}, bytes);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->data_ptr(), static_cast<const void*>(bytes.data()));
  EXPECT_TRUE(torch::equal(*view, tensor));
  EXPECT_EQ(Float32TensorView({4, 2}, bytes).status().code(), absl::StatusCode::kInvalidArgument);
}

// The micro model memorises a handful of fixed sequences: the whole training
// path (Forward, TokenLogProbs, backward, AdamW) learns.
TEST(TransformerTest, MicroModelLearnsFixedSequencesWithAdamW) {
  std::unique_ptr<Transformer> model = Make(Config("micro"), 7);
  const torch::Tensor ids = Ids({{1, 3, 10, 13, 7, 8, 16, 8, 5, 2},
                                 {1, 4, 4, 13, 3, 9, 16, 4, 12, 2},
                                 {1, 11, 3, 13, 12, 12, 16, 5, 8, 2},
                                 {1, 6, 6, 14, 6, 6, 16, 3, 2, 0},
                                 {1, 9, 9, 15, 3, 5, 16, 11, 8, 2},
                                 {1, 5, 7, 13, 12, 3, 16, 5, 2, 0}});
  const torch::Tensor mask = (ids != 0).to(torch::kInt64);
  const torch::Tensor inputs = ids.narrow(1, 0, 9);
  const torch::Tensor targets = ids.narrow(1, 1, 9);
  // Every sequence starts with <bos>, so the first target (which of six
  // digits follows <bos>) cannot be learnt: it is left out of the loss.
  torch::Tensor target_mask = mask.narrow(1, 1, 9).to(torch::kFloat32);
  target_mask.select(1, 0).zero_();
  torch::optim::AdamW optimizer(model->parameter_tensors(),
                                torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
  auto loss_fn = [&] {
    const torch::Tensor logprobs = TokenLogProbs(model->Forward(inputs, mask.narrow(1, 0, 9)), targets);
    return -(logprobs * target_mask).sum() / target_mask.sum();
  };
  const double initial = loss_fn().item<double>();
  EXPECT_NEAR(initial, std::log(static_cast<double>(kVocab)), 0.1);
  double loss = initial;
  for (int step = 0; step < 300; ++step) {
    optimizer.zero_grad();
    torch::Tensor value = loss_fn();
    value.backward();
    optimizer.step();
    loss = value.item<double>();
  }
  // Every remaining target is determined by its prefix: the loss can reach 0.
  EXPECT_LT(loss, 0.05) << "initial " << initial;
}

}  // namespace
}  // namespace sluice::model
