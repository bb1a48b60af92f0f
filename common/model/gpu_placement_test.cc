// Model placement (device and dtypes): what runs on every build (the CPU,
// bfloat16 compute, float32 masters, the refusal of cuda by a CPU-only
// LibTorch), and, where a CUDA device is visible, the same model on it
// against the CPU. In ./test.sh (Debian's CPU LibTorch) the CUDA cases skip;
// scripts/gpu-check.sh runs them on a GPU.
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/model/decode_graphs.h"
#include "common/model/device_spec.h"
#include "common/model/engine.h"
#include "common/model/test_models.h"
#include "common/model/transformer.h"
#include "common/torch_compat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::model {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 24;

ModelConfig Config(const std::string& name = "tiny") {
  absl::StatusOr<ModelConfig> config = BuiltinModelConfig(name, kVocab);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// The same O(1)-logit weights as testing::TestModel, placed as asked.
std::shared_ptr<Transformer> Placed(const ModelPlacement& placement, uint64_t seed = 3) {
  std::shared_ptr<const Transformer> reference = testing::TestModel(seed, kVocab);
  absl::StatusOr<std::unique_ptr<Transformer>> model =
      Transformer::CreateUninitialized(reference->config(), placement);
  EXPECT_TRUE(model.ok()) << model.status();
  EXPECT_TRUE((*model)->LoadWeights(reference->parameters()).ok());
  return std::shared_ptr<Transformer>(std::move(*model));
}

torch::Tensor Ids() {
  return torch::tensor({3, 7, 1, 9, 12, 4, 4, 20, 2, 5, 6, 11}, torch::kInt64).view({2, 6});
}

bool CudaVisible() { return TorchHasCuda() && torch::cuda::is_available(); }

TEST(DeviceSpecTest, ParsesTheFormsARunSpecMayUse) {
  EXPECT_FALSE(ParseDeviceSpec("")->cuda);
  EXPECT_FALSE(ParseDeviceSpec("cpu")->cuda);
  EXPECT_TRUE(ParseDeviceSpec("cuda")->cuda);
  EXPECT_EQ(ParseDeviceSpec("cuda")->index, -1);
  EXPECT_EQ(ParseDeviceSpec("cuda:3")->index, 3);
  EXPECT_EQ(ParseDeviceSpec("cuda:3")->ToString(), "cuda:3");
  for (const char* bad :
       {"gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "cuda:1:2", "cuda:99999", " cpu", "mps"}) {
    absl::StatusOr<DeviceSpec> spec = ParseDeviceSpec(bad);
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_THAT(spec.status().message(), HasSubstr("cpu, cuda or cuda:N")) << bad;
  }
}

TEST(PlacementTest, TheCpuIsFloat32WhateverTheRunsDtype) {
  for (std::optional<DType> dtype : {std::optional<DType>(), std::optional<DType>(DType::kBF16),
                                     std::optional<DType>(DType::kF32)}) {
    for (bool training : {false, true}) {
      absl::StatusOr<ModelPlacement> placement = PlacementFor(DeviceSpec{}, dtype, training);
      ASSERT_TRUE(placement.ok()) << placement.status();
      EXPECT_TRUE(placement->device.is_cpu());
      EXPECT_EQ(placement->param_dtype, torch::kFloat32);
      EXPECT_EQ(placement->compute_dtype, torch::kFloat32);
    }
  }
}

TEST(PlacementTest, ACpuOnlyLibTorchRefusesCudaSayingWhy) {
  if (TorchHasCuda()) GTEST_SKIP() << "this LibTorch has CUDA";
  DeviceSpec cuda;
  cuda.cuda = true;
  absl::StatusOr<ModelPlacement> placement = PlacementFor(cuda, std::nullopt, true);
  ASSERT_FALSE(placement.ok());
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(placement.status().message(), HasSubstr("has no CUDA"));
  EXPECT_THAT(placement.status().message(), HasSubstr("SLUICE_TORCH_CUDA"));
  absl::StatusOr<std::unique_ptr<Transformer>> model =
      Transformer::Create(Config(), 1, ModelPlacement{torch::Device(torch::kCUDA, 0)});
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(model.status().message(), HasSubstr("has no CUDA"));
}

TEST(PlacementTest, Float16ComputeOnTheCpuIsRefused) {
  ModelPlacement placement;
  placement.compute_dtype = torch::kFloat16;
  placement.param_dtype = torch::kFloat16;
  absl::Status status = ValidatePlacement(placement);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("float16"));
  placement.compute_dtype = torch::kFloat64;
  EXPECT_THAT(ValidatePlacement(placement).message(), HasSubstr("float64"));
}

TEST(PlacementTest, DefaultPlacementIsBitwiseTheFloat32Model) {
  // The placement code paths (casts, float32 norms and softmax) must leave
  // the float32 CPU model exactly as it was.
  std::shared_ptr<const Transformer> plain = testing::TestModel(3, kVocab);
  std::shared_ptr<Transformer> placed = Placed(ModelPlacement{});
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(plain->Forward(Ids()), placed->Forward(Ids())));
  EXPECT_EQ(placed->Forward(Ids()).scalar_type(), torch::kFloat32);
}

TEST(PlacementTest, Bfloat16ComputeStaysCloseToFloat32) {
  std::shared_ptr<Transformer> f32 = Placed(ModelPlacement{});
  std::shared_ptr<Transformer> bf16 =
      Placed(ModelPlacement{torch::kCPU, torch::kBFloat16, torch::kBFloat16});
  EXPECT_EQ(bf16->parameters()[0].tensor.scalar_type(), torch::kBFloat16);
  torch::NoGradGuard no_grad;
  const torch::Tensor want = torch::log_softmax(f32->Forward(Ids()), -1);
  const torch::Tensor logits = bf16->Forward(Ids());
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  const torch::Tensor got = torch::log_softmax(logits.to(torch::kFloat32), -1);
  const double max_diff = (got - want).abs().max().item<double>();
  const double mean_diff = (got - want).abs().mean().item<double>();
  // bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9 ~ 0.002);
  // through two layers the log-probs move by a few hundredths.
  EXPECT_LT(mean_diff, 0.05);
  EXPECT_LT(max_diff, 0.3);
  EXPECT_GT(max_diff, 0.0) << "bfloat16 compute left no trace: is it really bfloat16?";
}

TEST(PlacementTest, Float32MastersGetGradientsThroughBfloat16Compute) {
  // The trainer's GPU placement, on the CPU: float32 parameters (and so
  // float32 optimizer state), bfloat16 activations.
  std::shared_ptr<Transformer> mixed =
      Placed(ModelPlacement{torch::kCPU, torch::kFloat32, torch::kBFloat16});
  std::shared_ptr<Transformer> f32 = Placed(ModelPlacement{});
  const torch::Tensor targets = Ids().roll(-1, 1);
  auto gradients = [&](Transformer& model) {
    for (torch::Tensor& p : model.parameter_tensors()) p.mutable_grad() = torch::Tensor();
    TokenLogProbs(model.Forward(Ids()), targets).mean().backward();
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : model.parameter_tensors()) {
      EXPECT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
      grads.push_back(p.grad().reshape({-1}));
    }
    return torch::cat(grads);
  };
  const torch::Tensor a = gradients(*mixed);
  const torch::Tensor b = gradients(*f32);
  const double cosine = (a * b).sum().item<double>() / (a.norm() * b.norm()).item<double>();
  EXPECT_GT(cosine, 0.99);
  torch::optim::AdamW optimizer(mixed->parameter_tensors(), torch::optim::AdamWOptions(1e-3));
  optimizer.step();
  EXPECT_EQ(mixed->parameters()[0].tensor.scalar_type(), torch::kFloat32);
}

TEST(PlacementTest, TheEngineSamplesFromABfloat16Model) {
  std::shared_ptr<Transformer> bf16 =
      Placed(ModelPlacement{torch::kCPU, torch::kBFloat16, torch::kBFloat16});
  SamplingOptions sampling;
  sampling.temperature = 1.0;
  sampling.max_new_tokens = 8;
  std::vector<SampleRequest> samples(4);
  for (size_t i = 0; i < samples.size(); ++i) samples[i].seed = 100 + i;
  EngineOptions options;
  options.max_rows = 4;
  absl::StatusOr<std::vector<Completion>> done =
      GenerateContinuous(PolicySnapshot{bf16, 0}, {{3, 7, 1}}, {samples}, options, sampling);
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->size(), 4u);
  for (const Completion& completion : *done) {
    EXPECT_EQ(completion.tokens.size(), 8u);
    for (float logprob : completion.logprobs) {
      EXPECT_TRUE(std::isfinite(logprob));
      EXPECT_LE(logprob, 0.0f);
    }
  }
}

TEST(PlacementTest, TheEngineRefusesAPolicyOnAnotherPlacementMidRun) {
  std::shared_ptr<Transformer> f32 = Placed(ModelPlacement{});
  std::shared_ptr<Transformer> bf16 =
      Placed(ModelPlacement{torch::kCPU, torch::kBFloat16, torch::kBFloat16});
  SamplingOptions sampling;
  sampling.max_new_tokens = 8;
  EngineOptions options;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(f32->config(), options, sampling);
  ASSERT_TRUE(engine.ok());
  ASSERT_TRUE((*engine)->AddGroup({3, 7, 1}, std::vector<SampleRequest>(2)).ok());
  ASSERT_TRUE((*engine)->Step(PolicySnapshot{f32, 0}).ok());
  absl::StatusOr<std::vector<FinishedSample>> step = (*engine)->Step(PolicySnapshot{bf16, 1});
  ASSERT_FALSE(step.ok());
  EXPECT_THAT(step.status().message(), HasSubstr("every version must share them"));
}

// ---- on a CUDA device (skipped where none is visible) ----------------------

TEST(CudaPlacementTest, Float32LogitsOnTheGpuMatchTheCpu) {
  if (!CudaVisible()) GTEST_SKIP() << "no CUDA device (" << TorchBuildName() << ")";
  std::shared_ptr<Transformer> cpu = Placed(ModelPlacement{});
  std::shared_ptr<Transformer> gpu = Placed(ModelPlacement{torch::Device(torch::kCUDA, 0)});
  EXPECT_TRUE(gpu->parameters()[0].tensor.is_cuda());
  torch::NoGradGuard no_grad;
  const torch::Tensor want = torch::log_softmax(cpu->Forward(Ids()), -1);
  const torch::Tensor got = torch::log_softmax(gpu->Forward(Ids()), -1).cpu();
  EXPECT_LT((got - want).abs().max().item<double>(), 1e-4);
}

TEST(CudaPlacementTest, TheEngineOnTheGpuDecodesAsOnTheCpu) {
  if (!CudaVisible()) GTEST_SKIP() << "no CUDA device (" << TorchBuildName() << ")";
  SamplingOptions sampling;
  sampling.temperature = 1.0;
  sampling.max_new_tokens = 12;
  EngineOptions options;
  options.max_rows = 8;
  std::vector<SampleRequest> samples(6);
  for (size_t i = 0; i < samples.size(); ++i) samples[i].seed = 7 + i;
  auto run = [&](const ModelPlacement& placement) {
    absl::StatusOr<std::vector<Completion>> done =
        GenerateContinuous(PolicySnapshot{Placed(placement), 0}, {{3, 7, 1}, {5, 5}},
                           {samples, samples}, options, sampling);
    EXPECT_TRUE(done.ok()) << done.status();
    return *done;
  };
  const std::vector<Completion> cpu = run(ModelPlacement{});
  const std::vector<Completion> gpu = run(ModelPlacement{torch::Device(torch::kCUDA, 0)});
  ASSERT_EQ(cpu.size(), gpu.size());
  int same = 0;
  for (size_t i = 0; i < cpu.size(); ++i) same += cpu[i].tokens == gpu[i].tokens;
  // One uniform per token from the sample's own stream: float32 on either
  // device picks the same tokens unless a draw lands within rounding of a
  // CDF step.
  EXPECT_GE(same, static_cast<int>(cpu.size()) - 1);
}

TEST(DecodeGraphsTest, NoneOnTheCpu) {
  absl::StatusOr<std::unique_ptr<DecodeGraphs>> graphs =
      MakeDecodeGraphs(Config(), ModelPlacement{}, 8, 64);
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  EXPECT_EQ(*graphs, nullptr);
}

TEST(CudaPlacementTest, DecodeGraphsGiveTheEagerStepsTokens) {
  if (!CudaVisible()) GTEST_SKIP() << "no CUDA device (" << TorchBuildName() << ")";
  SamplingOptions sampling;
  sampling.temperature = 1.0;
  sampling.max_new_tokens = 20;
  std::vector<SampleRequest> samples(5);
  for (size_t i = 0; i < samples.size(); ++i) samples[i].seed = 40 + i;
  std::shared_ptr<Transformer> gpu = Placed(ModelPlacement{torch::Device(torch::kCUDA, 0)});
  auto run = [&](bool graphs, EngineStats* stats) {
    EngineOptions options;
    options.max_rows = 8;
    options.cuda_graphs = graphs;
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(gpu->config(), options, sampling);
    EXPECT_TRUE(engine.ok());
    EXPECT_TRUE((*engine)->AddGroup({3, 7, 1}, samples).ok());
    EXPECT_TRUE((*engine)->AddGroup({5, 5}, samples).ok());
    std::vector<std::vector<int32_t>> tokens(10);
    while (!(*engine)->idle()) {
      absl::StatusOr<std::vector<FinishedSample>> done = (*engine)->Step(PolicySnapshot{gpu, 0});
      EXPECT_TRUE(done.ok()) << done.status();
      if (!done.ok()) break;
      for (FinishedSample& f : *done) tokens[f.group * 5 + f.sample] = f.completion.tokens;
    }
    *stats = (*engine)->stats();
    return tokens;
  };
  EngineStats graph_stats, eager_stats;
  const auto with_graphs = run(true, &graph_stats);
  const auto eager = run(false, &eager_stats);
  EXPECT_EQ(graph_stats.graph_error, "");
  EXPECT_GT(graph_stats.graph_replays, 0);
  EXPECT_GT(graph_stats.graph_captures, 0);
  EXPECT_EQ(eager_stats.graph_replays, 0);
  int same = 0;
  for (size_t i = 0; i < eager.size(); ++i) same += eager[i] == with_graphs[i];
  EXPECT_GE(same, 9);
}

}  // namespace
}  // namespace sluice::model
