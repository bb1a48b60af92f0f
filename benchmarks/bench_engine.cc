// bench_engine: rollout generation (model::Engine, what a rollout worker
// runs, and model::Generate's static batch) on a long-tailed workload,
// against Python PyTorch eager doing the straightforward thing on the same
// weights and workload, in the same run.
//
//   workload: P prompts of T random tokens, G samples each; every sequence
//             has its own completion length drawn from a log-normal
//             (median --median-length, sigma --sigma, capped at
//             --max-length): most completions short, a few very long, as
//             reasoning traces are. Generation runs in batches of --rows
//             sequences, temperature 1 sampling, no stop tokens (a
//             sequence's length is imposed, so both sides do the same work
//             whatever they sample).
//   engine:   model::Engine, continuous batching over --rows rows: each
//             sequence asks for its own length, a finished one's row goes to
//             the next, the G samples of a prompt share one prefill.
//   static:   model::Generate per batch of --rows sequences, decoding to the
//             batch's longest length (a sequence's extra tokens are thrown
//             away).
//   baseline: benchmarks/torch_engine_baseline.py: static batches with a KV
//             cache in Python PyTorch eager (Debian's python3-torch, the same
//             LibTorch 1.13.1), same threads.
//
// Both sides count useful tokens (the sum of the sequences' lengths) per
// second; `engine_vs_python` is their ratio (> 1: the engine is faster).
// `padding_fraction` is the share of decoded row-steps that were thrown away:
// what continuous batching removes.
//
//   bench_engine [--json FILE] [--quick] [--threads N] [--model small|mid]
#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/model/engine.h"
#include "common/model/generation.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/torch_threads.h"
#include "benchmarks/model_shapes.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Flags {
  std::string json_path;
  std::string baseline = SLUICE_SOURCE_DIR "/benchmarks/torch_engine_baseline.py";
  std::string python = "/usr/bin/python3";
  std::string model = "small";
  int threads = 1;
  int prompts = 32;
  int group_size = 4;
  int prompt_tokens = 16;
  int rows = 64;
  double median_length = 12;
  double sigma = 1.0;
  int max_length = 160;
  uint64_t seed = 1;
  bool quick = false;
};

// "small": the shape of the built-in tiny model with room for long
// completions (the per-op overhead regime of the quickstart); "mid": the
// 56 M-parameter Qwen2 shape of bench_model (the matmul regime).
sluice::model::ModelConfig Config(const std::string& name) {
  if (name == "mid") return sluice::bench::MidSizeQwen2();
  sluice::model::ModelConfig config;
  config.architecture = "LlamaForCausalLM";
  config.vocab_size = 512;
  config.hidden_size = 128;
  config.intermediate_size = 344;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 32;
  config.max_position_embeddings = 1024;
  config.rms_norm_eps = 1e-6;
  config.rope_theta = 10000;
  config.tie_word_embeddings = false;
  return config;
}

struct Workload {
  std::vector<std::vector<int32_t>> prompts;  // One per group.
  std::vector<int> lengths;                   // One per sequence.
};

Workload MakeWorkload(const Flags& flags, int64_t vocab) {
  std::mt19937_64 rng(flags.seed);
  std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(vocab - 1));
  std::lognormal_distribution<double> length(std::log(flags.median_length), flags.sigma);
  Workload workload;
  for (int p = 0; p < flags.prompts; ++p) {
    std::vector<int32_t> prompt(flags.prompt_tokens);
    for (int32_t& id : prompt) id = token(rng);
    workload.prompts.push_back(std::move(prompt));
    for (int g = 0; g < flags.group_size; ++g) {
      workload.lengths.push_back(
          std::clamp(static_cast<int>(std::lround(length(rng))), 1, flags.max_length));
    }
  }
  return workload;
}

struct EngineFigures {
  int64_t useful_tokens = 0;
  int64_t decoded_row_steps = 0;
  int64_t prompt_prefills = 0;
  int64_t decode_steps = 0;
  double seconds = 0;
};

// The continuous-batching engine: every sequence asks for its own length,
// --rows of them run at once, a finished one's row is taken by the next.
absl::StatusOr<EngineFigures> RunContinuous(const sluice::model::PolicySnapshot& policy,
                                            const Workload& workload, const Flags& flags) {
  sluice::model::EngineOptions options;
  options.max_rows = flags.rows;
  sluice::model::SamplingOptions sampling;
  sampling.temperature = 1.0;
  sampling.max_new_tokens = flags.max_length;
  absl::StatusOr<std::unique_ptr<sluice::model::Engine>> engine =
      sluice::model::Engine::Create(policy.model->config(), options, sampling);
  if (!engine.ok()) return engine.status();
  const absl::Time start = absl::Now();
  // Sequence i samples prompt i / G; a workload may hold fewer sequences
  // than prompts x G (the warm-up's).
  const size_t sequences = workload.lengths.size();
  for (size_t p = 0; p < workload.prompts.size() && p * flags.group_size < sequences; ++p) {
    std::vector<sluice::model::SampleRequest> samples;
    for (size_t g = 0; g < static_cast<size_t>(flags.group_size) &&
                       p * flags.group_size + g < sequences;
         ++g) {
      sluice::model::SampleRequest request;
      request.seed = flags.seed * 1000003 + p * flags.group_size + g;
      request.max_new_tokens = workload.lengths[p * flags.group_size + g];
      samples.push_back(request);
    }
    if (auto added = (*engine)->AddGroup(workload.prompts[p], std::move(samples)); !added.ok()) {
      return added.status();
    }
  }
  EngineFigures figures;
  while (!(*engine)->idle()) {
    absl::StatusOr<std::vector<sluice::model::FinishedSample>> finished = (*engine)->Step(policy);
    if (!finished.ok()) return finished.status();
    for (const auto& sample : *finished) {
      figures.useful_tokens += static_cast<int64_t>(sample.completion.tokens.size());
    }
  }
  figures.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // Rows decoded plus the first token of each sequence (from its prefill).
  figures.decoded_row_steps = (*engine)->stats().sampled_tokens;
  figures.prompt_prefills = (*engine)->stats().prompt_prefills;
  figures.decode_steps = (*engine)->stats().decode_steps;
  return figures;
}

// Today's static batch: model::Generate per --rows sequences, decoding to
// the batch's longest.
absl::StatusOr<EngineFigures> RunStatic(const sluice::model::PolicySnapshot& policy,
                                        const Workload& workload, const Flags& flags) {
  EngineFigures figures;
  const int total = static_cast<int>(workload.lengths.size());
  const absl::Time start = absl::Now();
  for (int first = 0; first < total; first += flags.rows) {
    const int last = std::min(total, first + flags.rows);
    std::vector<std::vector<int32_t>> prompts;
    int longest = 0;
    for (int i = first; i < last; ++i) {
      prompts.push_back(workload.prompts[i / flags.group_size]);
      longest = std::max(longest, workload.lengths[i]);
    }
    sluice::model::SamplingOptions options;
    options.temperature = 1.0;
    options.max_new_tokens = longest;
    options.seed = flags.seed + first;
    absl::StatusOr<std::vector<sluice::model::Completion>> completions =
        sluice::model::Generate(policy, prompts, options);
    if (!completions.ok()) return completions.status();
    for (int i = first; i < last; ++i) {
      const int produced = static_cast<int>((*completions)[i - first].tokens.size());
      figures.useful_tokens += std::min(produced, workload.lengths[i]);
    }
    figures.decoded_row_steps += static_cast<int64_t>(last - first) * longest;
  }
  figures.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return figures;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"bench_engine: rollout generation tokens/s on a long-tailed workload against "
               "Python PyTorch eager on the same weights"};
  app.add_option("--json", flags.json_path, "write the figures as JSON to this file");
  app.add_option("--model", flags.model, "small (tiny-shaped, 1 M) or mid (56 M Qwen2 shape)")
      ->check(CLI::IsMember({"small", "mid"}))
      ->capture_default_str();
  app.add_option("--threads", flags.threads, "LibTorch intra-op threads, both sides")
      ->capture_default_str();
  app.add_option("--prompts", flags.prompts, "prompts (groups)")->capture_default_str();
  app.add_option("--group-size", flags.group_size, "samples per prompt (G)")->capture_default_str();
  app.add_option("--prompt-tokens", flags.prompt_tokens, "tokens per prompt")->capture_default_str();
  app.add_option("--rows", flags.rows, "sequences decoded together")->capture_default_str();
  app.add_option("--median-length", flags.median_length, "median completion length")
      ->capture_default_str();
  app.add_option("--sigma", flags.sigma, "log-normal sigma of completion lengths (the tail)")
      ->capture_default_str();
  app.add_option("--max-length", flags.max_length, "longest completion")->capture_default_str();
  app.add_option("--seed", flags.seed, "workload and sampling seed")->capture_default_str();
  app.add_option("--python", flags.python, "python3 with torch (Debian's)")->capture_default_str();
  app.add_flag("--quick", flags.quick, "small sizes (the smoke test)");
  CLI11_PARSE(app, argc, argv);
  if (flags.quick) {
    flags.model = "small";
    flags.prompts = 4;
    flags.rows = 8;
    flags.max_length = 24;
  }
  if (flags.prompts < 1 || flags.group_size < 1 || flags.rows < 1 || flags.prompt_tokens < 1 ||
      flags.max_length < 1 || flags.median_length <= 0 || flags.sigma < 0) {
    std::cerr << "bench_engine: --prompts, --group-size, --rows, --prompt-tokens, --max-length "
                 "must be >= 1, --median-length > 0 and --sigma >= 0\n";
    return 2;
  }
  sluice::ConfigureTorchThreads(flags.threads);
  sluice::KeepTensorMemoryResident();  // As the rollout worker does.
  // OpenBLAS keeps its own pool (sized by OPENBLAS_NUM_THREADS when it
  // loads, else every core), spinning in sched_yield between calls: give it
  // --threads here and in the baseline's process, as `sluice up` gives each
  // service one, so that both sides use the threads they are said to.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(flags.threads);
  }
  setenv("OPENBLAS_NUM_THREADS", std::to_string(flags.threads).c_str(), 1);

  const sluice::model::ModelConfig config = Config(flags.model);
  if (flags.prompt_tokens + flags.max_length > config.max_position_embeddings) {
    std::cerr << "bench_engine: --prompt-tokens + --max-length exceed the model's "
              << config.max_position_embeddings << " positions\n";
    return 2;
  }
  auto model = sluice::model::Transformer::Create(config, /*seed=*/7);
  if (!model.ok()) {
    std::cerr << "bench_engine: " << model.status().message() << "\n";
    return 1;
  }
  const Workload workload = MakeWorkload(flags, config.vocab_size);
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("bench_engine_", getpid());
  if (absl::Status saved = sluice::model::SaveHfModel(dir.string(), **model); !saved.ok()) {
    std::cerr << "bench_engine: " << saved.message() << "\n";
    return 1;
  }
  const json workload_json = {{"prompts", workload.prompts},
                              {"group_size", flags.group_size},
                              {"lengths", workload.lengths},
                              {"rows", flags.rows},
                              {"temperature", 1.0},
                              {"seed", flags.seed}};
  std::ofstream(dir / "workload.json") << workload_json.dump();

  const sluice::model::PolicySnapshot policy{.model = std::move(*model), .version = 1};
  // A warm-up batch (allocator, kernels), then the measured pass.
  Workload warm_load{workload.prompts, {}};
  for (int i = 0; i < std::min<int>(flags.rows, workload.lengths.size()); ++i) {
    warm_load.lengths.push_back(std::min(4, workload.lengths[i]));
  }
  for (auto run : {RunStatic, RunContinuous}) {
    if (auto warmed = run(policy, warm_load, flags); !warmed.ok()) {
      std::cerr << "bench_engine: " << warmed.status().message() << "\n";
      return 1;
    }
  }
  absl::StatusOr<EngineFigures> static_batch = RunStatic(policy, workload, flags);
  if (!static_batch.ok()) {
    std::cerr << "bench_engine: " << static_batch.status().message() << "\n";
    return 1;
  }
  absl::StatusOr<EngineFigures> engine = RunContinuous(policy, workload, flags);
  if (!engine.ok()) {
    std::cerr << "bench_engine: " << engine.status().message() << "\n";
    return 1;
  }
  std::vector<int> sorted = workload.lengths;
  std::sort(sorted.begin(), sorted.end());
  const auto quantile = [&](double q) {
    return sorted[std::min<size_t>(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
  };
  const double engine_tps = engine->useful_tokens / engine->seconds;
  const double static_tps = static_batch->useful_tokens / static_batch->seconds;
  json out = {
      {"model", flags.model},
      {"parameters", config.ParameterCount()},
      {"threads", flags.threads},
      {"workload",
       {{"prompts", flags.prompts},
        {"group_size", flags.group_size},
        {"sequences", workload.lengths.size()},
        {"prompt_tokens", flags.prompt_tokens},
        {"rows", flags.rows},
        {"length_median", quantile(0.5)},
        {"length_p90", quantile(0.9)},
        {"length_max", sorted.back()},
        {"seed", flags.seed}}},
      {"engine",
       {{"mode", "continuous batching (model::Engine, one prefill per group)"},
        {"useful_tokens", engine->useful_tokens},
        {"decoded_row_steps", engine->decoded_row_steps},
        {"decode_steps", engine->decode_steps},
        {"prompt_prefills", engine->prompt_prefills},
        {"seconds", engine->seconds},
        {"tokens_per_s", engine_tps},
        {"padding_fraction",
         1.0 - static_cast<double>(engine->useful_tokens) / engine->decoded_row_steps}}},
      {"static_batch",
       {{"mode", "static batch (model::Generate per batch of rows)"},
        {"useful_tokens", static_batch->useful_tokens},
        {"decoded_row_steps", static_batch->decoded_row_steps},
        {"seconds", static_batch->seconds},
        {"tokens_per_s", static_tps},
        {"padding_fraction",
         1.0 - static_cast<double>(static_batch->useful_tokens) / static_batch->decoded_row_steps}}},
      {"continuous_vs_static", engine_tps / static_tps}};

  const fs::path baseline_out = dir / "baseline.json";
  const std::string command =
      absl::StrCat(flags.python, " ", flags.baseline, " --model ", dir.string(), " --workload ",
                   (dir / "workload.json").string(), " --threads ", flags.threads, " > ",
                   baseline_out.string());
  if (std::system(command.c_str()) == 0) {
    std::ifstream in(baseline_out);
    json baseline = json::parse(in, nullptr, false);
    if (baseline.is_object() && baseline.contains("tokens_per_s")) {
      out["python_torch"] = baseline;
      out["engine_vs_python"] = engine_tps / baseline["tokens_per_s"].get<double>();
    } else {
      out["python_error"] = "the baseline printed no figures (" + command + ")";
    }
  } else {
    out["python_error"] = "the baseline failed: is python3-torch installed? (" + command + ")";
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);

  std::cout << absl::StrFormat(
      "workload: %d sequences (%d prompts x G=%d), lengths median %d, p90 %d, max %d; %d rows "
      "per batch; model %s (%d params), %d threads\n",
      workload.lengths.size(), flags.prompts, flags.group_size, quantile(0.5), quantile(0.9),
      sorted.back(), flags.rows, flags.model, config.ParameterCount(), flags.threads);
  std::cout << absl::StrFormat("static batch: %.0f useful tokens/s (%.2f s), %.0f%% of decoded "
                               "row-steps thrown away\n",
                               static_tps, static_batch->seconds,
                               100 * out["static_batch"]["padding_fraction"].get<double>());
  std::cout << absl::StrFormat("engine (continuous batching): %.0f useful tokens/s (%.2f s), "
                               "%.0f%% thrown away; continuous_vs_static %.2f\n",
                               engine_tps, engine->seconds,
                               100 * out["engine"]["padding_fraction"].get<double>(),
                               engine_tps / static_tps);
  if (out.contains("engine_vs_python")) {
    std::cout << absl::StrFormat("python torch eager: %.0f useful tokens/s (%.2f s); "
                                 "engine_vs_python %.2f\n",
                                 out["python_torch"]["tokens_per_s"].get<double>(),
                                 out["python_torch"]["seconds"].get<double>(),
                                 out["engine_vs_python"].get<double>());
  } else {
    std::cerr << "bench_engine: " << out["python_error"].get<std::string>() << "\n";
  }
  if (!flags.json_path.empty()) {
    std::ofstream file(flags.json_path);
    file << out.dump(2) << "\n";
    if (!file) return 1;
  }
  return out.contains("engine_vs_python") ? 0 : 1;
}
