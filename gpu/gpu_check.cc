// gpu_check: the model, the engine and the trainer's step on a CUDA device,
// checked against the CPU and measured against the hardware. Run by
// scripts/gpu-check.sh; prints progress to stderr and writes one JSON file.
//
//   checks.logits      a Qwen2.5-0.5B-shaped model's log-probs on the GPU
//                      (float32, and bfloat16 compute) against the CPU's
//   checks.generation  the engine on the GPU: float32 tokens against the CPU
//                      engine's (same per-sample streams), bfloat16 samples
//                      finite, the engine's log-probs against a full forward
//   checks.train_step  one decoupled-PPO step with float32 masters and
//                      bfloat16 compute: gradient against the CPU's (cosine),
//                      finite loss, weights moved, masters still float32
//   decode             engine decode tokens/s at each --batches, with the
//                      HBM roofline (weights + KV bytes read per step over
//                      the measured copy bandwidth)
//   train              trainer tokens/s of one decoupled-PPO step
//
// Without a CUDA device (or with --device cpu and --quick) it runs the same
// code on the CPU with a small model: the smoke test of the program itself.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "benchmarks/model_shapes.h"
#include "common/model/device_spec.h"
#include "common/model/engine.h"
#include "common/model/transformer.h"
#include "common/torch_compat.h"
#include "nlohmann/json.hpp"
#include "trainer/policy_loss.h"

namespace sluice {
namespace {

using model::ModelConfig;
using model::ModelPlacement;
using model::Transformer;
using nlohmann::json;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Log(const std::string& line) { std::cerr << "[gpu_check] " << line << std::endl; }

// Qwen2.5-0.5B's shape (benchmarks/model_shapes.h).
ModelConfig Qwen05B() { return bench::Qwen25HalfB(); }

// The same family, small enough for a CPU smoke run.
ModelConfig Small() {
  ModelConfig c = Qwen05B();
  c.vocab_size = 4096;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 1024;
  return c;
}

std::shared_ptr<Transformer> Build(const ModelConfig& config, const ModelPlacement& placement) {
  absl::StatusOr<std::unique_ptr<Transformer>> model = Transformer::Create(config, 7, placement);
  if (!model.ok()) {
    Log("cannot build the model: " + std::string(model.status().message()));
    std::exit(2);
  }
  return std::shared_ptr<Transformer>(std::move(*model));
}

torch::Tensor RandomIds(int64_t rows, int64_t length, int64_t vocab, uint64_t seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  return torch::randint(0, vocab, {rows, length}, generator, torch::kInt64);
}

double Seconds(const torch::Device& device, const std::function<void()>& work) {
  SynchronizeDevice(device);
  const double start = Now();
  work();
  SynchronizeDevice(device);
  return Now() - start;
}

// Device copy bandwidth (bytes read + written per second) of a 2 GiB copy.
double CopyBandwidth(const torch::Device& device, int64_t bytes) {
  torch::Tensor a =
      torch::empty({bytes / 2}, torch::TensorOptions().dtype(torch::kBFloat16).device(device));
  torch::Tensor b = torch::empty_like(a);
  b.copy_(a);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) best = std::min(best, Seconds(device, [&] { b.copy_(a); }));
  return 2.0 * static_cast<double>(bytes) / best;
}

// Log-probs of each next input token under `model`, on the host.
torch::Tensor NextTokenLogProbs(Transformer& model, const torch::Tensor& ids) {
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model.Forward(ids).narrow(1, 0, ids.size(1) - 1);
  return model::TokenLogProbs(logits, ids.narrow(1, 1, ids.size(1) - 1).to(model.device()))
      .to(torch::kCPU);
}

json CheckLogits(const ModelConfig& config, const torch::Device& device, bool* ok) {
  Log("logits: building the CPU float32 reference");
  std::shared_ptr<Transformer> cpu = Build(config, ModelPlacement{});
  const torch::Tensor ids = RandomIds(2, 64, config.vocab_size, 11);
  const torch::Tensor want = NextTokenLogProbs(*cpu, ids);
  cpu.reset();
  json out;
  struct Variant {
    const char* name;
    ModelPlacement placement;
    double max_tolerance;
    double mean_tolerance;
  };
  const std::vector<Variant> variants = {
      {"float32", {device, torch::kFloat32, torch::kFloat32}, 2e-3, 2e-4},
      // bfloat16 weights and activations over 24 layers: per-token
      // log-probs within a few tenths of float32's, on average a few
      // hundredths.
      {"bfloat16", {device, torch::kBFloat16, torch::kBFloat16}, 0.5, 0.05},
  };
  for (const Variant& v : variants) {
    std::shared_ptr<Transformer> model = Build(config, v.placement);
    const torch::Tensor got = NextTokenLogProbs(*model, ids);
    const double max_diff = (got - want).abs().max().item<double>();
    const double mean_diff = (got - want).abs().mean().item<double>();
    const bool pass = max_diff <= v.max_tolerance && mean_diff <= v.mean_tolerance;
    *ok = *ok && pass;
    out[v.name] = {{"max_abs_logprob_diff", max_diff},
                   {"mean_abs_logprob_diff", mean_diff},
                   {"tolerance_max", v.max_tolerance},
                   {"tolerance_mean", v.mean_tolerance},
                   {"pass", pass}};
    Log(std::string("logits ") + v.name + ": max |dlogp| " + std::to_string(max_diff) + ", mean " +
        std::to_string(mean_diff) + (pass ? " PASS" : " FAIL"));
  }
  return out;
}

absl::StatusOr<std::vector<model::Completion>> Generate(
    std::shared_ptr<Transformer> model, const std::vector<std::vector<int32_t>>& prompts,
    int samples, int64_t new_tokens, int64_t max_rows, double temperature, bool graphs = true) {
  model::SamplingOptions sampling;
  sampling.temperature = temperature;
  sampling.max_new_tokens = new_tokens;
  model::EngineOptions options;
  options.max_rows = max_rows;
  options.cuda_graphs = graphs;
  std::vector<std::vector<model::SampleRequest>> requests(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int s = 0; s < samples; ++s) {
      model::SampleRequest request;
      request.seed = 1000 * p + static_cast<uint64_t>(s);
      requests[p].push_back(request);
    }
  }
  return model::GenerateContinuous(model::PolicySnapshot{model, 0}, prompts, std::move(requests),
                                   options, sampling);
}

std::vector<std::vector<int32_t>> Prompts(int count, int64_t length, int64_t vocab, uint64_t seed) {
  const torch::Tensor ids = RandomIds(count, length, vocab, seed).to(torch::kInt32).contiguous();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < count; ++i) {
    const int32_t* row = ids[i].data_ptr<int32_t>();
    prompts.emplace_back(row, row + length);
  }
  return prompts;
}

json CheckGeneration(const ModelConfig& config, const torch::Device& device, bool* ok) {
  json out;
  const std::vector<std::vector<int32_t>> prompts = Prompts(4, 16, config.vocab_size, 5);
  // float32 on both: the same per-sample streams give the same tokens
  // unless a draw falls within rounding of a CDF step.
  absl::StatusOr<std::vector<model::Completion>> cpu =
      Generate(Build(config, ModelPlacement{}), prompts, 4, 24, 16, 1.0);
  absl::StatusOr<std::vector<model::Completion>> gpu =
      Generate(Build(config, {device, torch::kFloat32, torch::kFloat32}), prompts, 4, 24, 16, 1.0);
  if (!cpu.ok() || !gpu.ok()) {
    *ok = false;
    out["error"] = std::string(cpu.ok() ? gpu.status().message() : cpu.status().message());
    return out;
  }
  int same = 0;
  double logprob_diff = 0;
  for (size_t i = 0; i < cpu->size(); ++i) {
    same += (*cpu)[i].tokens == (*gpu)[i].tokens;
    if ((*cpu)[i].tokens == (*gpu)[i].tokens) {
      for (size_t t = 0; t < (*cpu)[i].logprobs.size(); ++t) {
        logprob_diff =
            std::max<double>(logprob_diff, std::abs((*cpu)[i].logprobs[t] - (*gpu)[i].logprobs[t]));
      }
    }
  }
  const bool same_pass = same >= static_cast<int>(cpu->size()) - 1;
  out["float32_samples"] = cpu->size();
  out["float32_samples_identical_to_cpu"] = same;
  out["float32_max_abs_logprob_diff_on_identical"] = logprob_diff;
  // bfloat16 (the rollout workers' placement): every log-prob finite, and
  // the engine's log-probs (incremental decode) against a full forward of
  // the same sequences on the same device.
  std::shared_ptr<Transformer> bf16 = Build(config, {device, torch::kBFloat16, torch::kBFloat16});
  absl::StatusOr<std::vector<model::Completion>> sampled = Generate(bf16, prompts, 4, 24, 16, 1.0);
  bool finite = sampled.ok();
  double engine_vs_forward = 0;
  if (sampled.ok()) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < sampled->size(); ++i) {
      const model::Completion& c = (*sampled)[i];
      std::vector<int64_t> sequence(prompts[i / 4].begin(), prompts[i / 4].end());
      sequence.insert(sequence.end(), c.tokens.begin(), c.tokens.end());
      const torch::Tensor ids = torch::tensor(sequence, torch::kInt64).unsqueeze(0);
      const torch::Tensor full = NextTokenLogProbs(*bf16, ids)[0];
      const int64_t p = static_cast<int64_t>(prompts[i / 4].size());
      for (size_t t = 0; t < c.logprobs.size(); ++t) {
        finite = finite && std::isfinite(c.logprobs[t]);
        engine_vs_forward = std::max<double>(
            engine_vs_forward,
            std::abs(c.logprobs[t] - full[p - 1 + static_cast<int64_t>(t)].item<double>()));
      }
    }
  }
  out["bfloat16_all_logprobs_finite"] = finite;
  out["bfloat16_engine_vs_full_forward_max_abs_logprob_diff"] = engine_vs_forward;
  // Decode graphs (the default on a GPU) against eager steps: the same
  // kernels on wider (masked) attention, so the same tokens but for a draw
  // within rounding of a CDF step.
  absl::StatusOr<std::vector<model::Completion>> eager =
      Generate(bf16, prompts, 4, 24, 16, 1.0, /*graphs=*/false);
  int graph_same = 0;
  double graph_diff = 0;
  if (sampled.ok() && eager.ok()) {
    for (size_t i = 0; i < eager->size(); ++i) {
      if ((*eager)[i].tokens != (*sampled)[i].tokens) continue;
      ++graph_same;
      for (size_t t = 0; t < (*eager)[i].logprobs.size(); ++t) {
        graph_diff = std::max<double>(
            graph_diff, std::abs((*eager)[i].logprobs[t] - (*sampled)[i].logprobs[t]));
      }
    }
  }
  out["bfloat16_graphs_vs_eager_identical_samples"] = graph_same;
  out["bfloat16_graphs_vs_eager_max_abs_logprob_diff_on_identical"] = graph_diff;
  const bool graphs_pass =
      eager.ok() && graph_same * 4 >= static_cast<int>(eager->size()) * 3 && graph_diff < 0.05;
  const bool pass = same_pass && finite && engine_vs_forward < 0.5 && graphs_pass;
  out["pass"] = pass;
  *ok = *ok && pass;
  Log("generation: " + std::to_string(same) + "/" + std::to_string(cpu->size()) +
      " float32 samples identical to the CPU's; bfloat16 engine vs forward max |dlogp| " +
      std::to_string(engine_vs_forward) + (pass ? " PASS" : " FAIL"));
  return out;
}

struct StepBatch {
  torch::Tensor inputs, targets, mask, behaviour, advantages;
};

StepBatch MakeStepBatch(int64_t rows, int64_t prompt, int64_t completion, int64_t vocab,
                        const torch::Device& device) {
  StepBatch b;
  const torch::Tensor ids = RandomIds(rows, prompt + completion, vocab, 21);
  b.inputs = ids.narrow(1, 0, prompt + completion - 1).to(device);
  b.targets = ids.narrow(1, 1, prompt + completion - 1).to(device);
  b.mask = torch::zeros({rows, prompt + completion - 1});
  b.mask.narrow(1, prompt - 1, completion).fill_(1.0);
  b.mask = b.mask.to(device);
  at::Generator generator = at::detail::createCPUGenerator(22);
  b.advantages =
      (torch::randint(0, 2, {rows, 1}, generator, torch::kInt64).to(torch::kFloat32) * 2 - 1)
          .expand({rows, prompt + completion - 1})
          .contiguous()
          .to(device);
  return b;
}

// One decoupled-PPO step as the trainer takes it (trainer_rl.cc): forward,
// token log-probs, the loss with behaviour = proximal = current (detached,
// shifted a little), backward, clip, AdamW. Returns the loss.
double PpoStep(Transformer& model, torch::optim::AdamW& optimizer, const StepBatch& b) {
  optimizer.zero_grad();
  const torch::Tensor logp = model::TokenLogProbs(model.Forward(b.inputs), b.targets);
  trainer::PolicyLossInputs in;
  in.logp = logp;
  in.logp_prox = logp.detach();
  in.logp_behav = logp.detach() - 0.01;
  in.advantages = b.advantages;
  in.mask = b.mask;
  trainer::PolicyLoss loss = trainer::DecoupledPpoLoss(in, trainer::PolicyLossOptions{});
  loss.loss.backward();
  torch::nn::utils::clip_grad_norm_(model.parameter_tensors(), 1.0);
  optimizer.step();
  return loss.loss.item<double>();
}

torch::Tensor FlatGradient(Transformer& model) {
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : model.parameter_tensors()) {
    // float64: a float32 norm or dot over ~5e8 elements drifts by whole
    // percents (a first run here printed a cosine of 1.08).
    grads.push_back(p.grad().defined() ? p.grad().to(torch::kCPU, torch::kFloat64).reshape({-1})
                                       : torch::zeros({p.numel()}, torch::kFloat64));
  }
  return torch::cat(grads);
}

json CheckTrainStep(const ModelConfig& config, const torch::Device& device, bool* ok) {
  json out;
  // The gradient of the same small batch, CPU float32 against the GPU's
  // float32 masters with bfloat16 compute.
  const StepBatch small_cpu = MakeStepBatch(2, 16, 16, config.vocab_size, torch::kCPU);
  const StepBatch small_gpu = MakeStepBatch(2, 16, 16, config.vocab_size, device);
  std::shared_ptr<Transformer> cpu = Build(config, ModelPlacement{});
  torch::optim::AdamW cpu_opt(cpu->parameter_tensors(), torch::optim::AdamWOptions(0.0));
  PpoStep(*cpu, cpu_opt, small_cpu);
  const torch::Tensor want = FlatGradient(*cpu);
  cpu.reset();
  std::shared_ptr<Transformer> gpu = Build(config, {device, torch::kFloat32, torch::kBFloat16});
  const torch::Tensor before = gpu->parameters()[1].tensor.detach().clone();
  torch::optim::AdamW gpu_opt(gpu->parameter_tensors(), torch::optim::AdamWOptions(1e-5));
  const double loss = PpoStep(*gpu, gpu_opt, small_gpu);
  const torch::Tensor got = FlatGradient(*gpu);
  const double cosine =
      (got * want).sum().item<double>() / (got.norm() * want.norm()).item<double>();
  const double moved = (gpu->parameters()[1].tensor.detach() - before).abs().max().item<double>();
  const bool masters_f32 = gpu->parameters()[1].tensor.scalar_type() == torch::kFloat32;
  const bool pass = std::isfinite(loss) && cosine > 0.99 && moved > 0 && masters_f32;
  out = {{"loss", loss},
         {"gradient_cosine_vs_cpu_float32", cosine},
         {"max_weight_change", moved},
         {"masters_float32", masters_f32},
         {"pass", pass}};
  *ok = *ok && pass;
  Log("train step: gradient cosine vs CPU " + std::to_string(cosine) + ", loss " +
      std::to_string(loss) + (pass ? " PASS" : " FAIL"));
  return out;
}

json MeasureTrain(const ModelConfig& config, const torch::Device& device, int64_t rows,
                  int64_t prompt, int64_t completion) {
  std::shared_ptr<Transformer> model = Build(config, {device, torch::kFloat32, torch::kBFloat16});
  torch::optim::AdamW optimizer(model->parameter_tensors(), torch::optim::AdamWOptions(1e-6));
  const StepBatch b = MakeStepBatch(rows, prompt, completion, config.vocab_size, device);
  PpoStep(*model, optimizer, b);  // warm-up (allocator, kernels)
  const int steps = 3;
  const double seconds = Seconds(device, [&] {
    for (int i = 0; i < steps; ++i) PpoStep(*model, optimizer, b);
  });
  const double tokens = static_cast<double>(rows * (prompt + completion - 1)) * steps;
  json out = {{"rows", rows},
              {"sequence_tokens", prompt + completion},
              {"steps", steps},
              {"seconds_per_step", seconds / steps},
              {"tokens_per_second", tokens / seconds}};
  Log("train: " + std::to_string(tokens / seconds) + " tokens/s (" + std::to_string(rows) + " x " +
      std::to_string(prompt + completion) + ")");
  return out;
}

json MeasureDecode(const ModelConfig& config, const torch::Device& device, int64_t batch,
                   int64_t prompt, int64_t new_tokens, double bandwidth, bool graphs) {
  std::shared_ptr<Transformer> model = Build(config, {device, torch::kBFloat16, torch::kBFloat16});
  const std::vector<std::vector<int32_t>> prompts =
      Prompts(static_cast<int>(batch), prompt, config.vocab_size, 31);
  // Warm-up: kernels, the caching allocator, the KV cache.
  (void)Generate(model, {prompts[0]}, 1, 8, batch, 1.0, graphs);
  model::SamplingOptions sampling;
  sampling.temperature = 1.0;
  sampling.max_new_tokens = new_tokens;
  model::EngineOptions options;
  options.max_rows = batch;
  options.capacity = prompt + new_tokens + 1;
  options.cuda_graphs = graphs;
  absl::StatusOr<std::unique_ptr<model::Engine>> engine =
      model::Engine::Create(config, options, sampling);
  if (!engine.ok()) return {{"error", std::string(engine.status().message())}};
  for (int64_t i = 0; i < batch; ++i) {
    model::SampleRequest request;
    request.seed = static_cast<uint64_t>(i);
    (void)(*engine)->AddGroup(prompts[static_cast<size_t>(i)], {request});
  }
  const model::PolicySnapshot policy{model, 0};
  SynchronizeDevice(device);
  const double start = Now();
  // The first step prefills every prompt and samples the first tokens.
  absl::StatusOr<std::vector<model::FinishedSample>> step = (*engine)->Step(policy);
  const double prefill_done = Now();
  int64_t decode_steps = 0;
  while (step.ok() && !(*engine)->idle()) {
    step = (*engine)->Step(policy);
    ++decode_steps;
  }
  const double end = Now();
  if (!step.ok()) return {{"error", std::string(step.status().message())}};
  const double decode_seconds = end - prefill_done;
  const double decode_tokens = static_cast<double>(batch * decode_steps);
  // The roofline of the decode steps: each reads every weight once (bf16)
  // and each row's keys and values so far.
  int64_t params = 0;
  for (const model::NamedTensor& p : model->parameters()) params += p.tensor.numel();
  const double weight_bytes = 2.0 * static_cast<double>(params);
  const double kv_per_position =
      2.0 * 2.0 *
      static_cast<double>(config.num_hidden_layers * config.num_key_value_heads *
                          config.resolved_head_dim());
  double bytes = 0;
  for (int64_t s = 1; s <= decode_steps; ++s) {
    bytes += weight_bytes + kv_per_position * static_cast<double>(batch * (prompt + s));
  }
  const double roofline_seconds = bytes / bandwidth;
  const model::EngineStats& stats = (*engine)->stats();
  json out = {{"batch", batch},
              {"cuda_graphs", graphs && device.is_cuda() && stats.graph_error.empty()},
              {"graph_captures", stats.graph_captures},
              {"graph_replays", stats.graph_replays},
              {"graph_error", stats.graph_error},
              {"prompt_tokens", prompt},
              {"new_tokens", new_tokens},
              {"decode_steps", decode_steps},
              {"prefill_seconds", prefill_done - start},
              {"decode_seconds", decode_seconds},
              {"total_seconds", end - start},
              {"decode_tokens_per_second", decode_tokens / decode_seconds},
              {"total_tokens_per_second", static_cast<double>(batch * new_tokens) / (end - start)},
              {"roofline_decode_tokens_per_second", decode_tokens / roofline_seconds},
              {"fraction_of_roofline", roofline_seconds / decode_seconds},
              {"weight_bytes", weight_bytes}};
  Log(std::string(graphs && device.is_cuda() ? "decode (graphs)" : "decode (eager)") + " batch " +
      std::to_string(batch) + ": " + std::to_string(decode_tokens / decode_seconds) +
      " tokens/s, " + std::to_string(100.0 * roofline_seconds / decode_seconds) +
      "% of the roofline");
  return out;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  using namespace sluice;
  CLI::App app{"Checks and measures the model, the engine and the trainer step on a CUDA device"};
  std::string device_text = "cuda";
  std::string out_path = "gpu_check.json";
  std::vector<int64_t> batches = {1, 32, 256};
  int64_t prompt = 128;
  int64_t new_tokens = 128;
  bool quick = false;
  bool skip_checks = false;
  app.add_option("--device", device_text, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--out", out_path, "JSON file to write")->capture_default_str();
  app.add_option("--batches", batches, "decode batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--prompt-tokens", prompt)->capture_default_str();
  app.add_option("--new-tokens", new_tokens)->capture_default_str();
  app.add_flag("--quick", quick, "a small model (the smoke test; the CPU can run it)");
  app.add_flag("--skip-checks", skip_checks, "measurements only");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<model::DeviceSpec> spec = model::ParseDeviceSpec(device_text);
  if (!spec.ok()) {
    Log(std::string(spec.status().message()));
    return 2;
  }
  const torch::Device device =
      spec->cuda
          ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(std::max(0, spec->index)))
          : torch::Device(torch::kCPU);
  if (absl::Status status = model::ValidatePlacement(ModelPlacement{device}); !status.ok()) {
    Log(std::string(status.message()));
    return 2;
  }
  const ModelConfig config = quick ? Small() : Qwen05B();
  json out;
  out["libtorch"] = TorchBuildName();
  out["device"] = device.str();
  out["model"] = quick ? "small (quick)" : "Qwen2.5-0.5B shape (random weights)";
  out["parameters"] = config.ParameterCount();
  const double bandwidth = CopyBandwidth(device, quick ? (int64_t{64} << 20) : (int64_t{2} << 30));
  out["copy_bandwidth_bytes_per_second"] = bandwidth;
  Log("copy bandwidth " + std::to_string(bandwidth / 1e9) + " GB/s");
  bool ok = true;
  if (!skip_checks) {
    out["checks"]["logits"] = CheckLogits(config, device, &ok);
    out["checks"]["generation"] = CheckGeneration(config, device, &ok);
    out["checks"]["train_step"] = CheckTrainStep(config, device, &ok);
  }
  out["checks_pass"] = ok;
  for (int64_t batch : batches) {
    out["decode"].push_back(
        MeasureDecode(config, device, batch, prompt, new_tokens, bandwidth, /*graphs=*/true));
    if (device.is_cuda()) {
      out["decode_eager"].push_back(
          MeasureDecode(config, device, batch, prompt, new_tokens, bandwidth, /*graphs=*/false));
    }
  }
  out["train"] = MeasureTrain(config, device, quick ? 4 : 16, prompt, new_tokens);
  std::ofstream(out_path) << out.dump(2) << "\n";
  Log(std::string("wrote ") + out_path + (ok ? "; every check passed" : "; a check FAILED"));
  return ok ? 0 : 1;
}
