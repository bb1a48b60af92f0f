// bench_model: what real-model support costs, against baselines measured in
// the same run.
//
//   tokenizer: Qwen2 and Llama-3 byte-level BPE (testdata/tokenizers/)
//              encoding the GSM8K and MATH-500 texts (questions and worked
//              solutions), MB/s; decoding, MB/s.
//   model:     a mid-size random Qwen2-shaped model (vocab 32768, hidden 512,
//              8 layers, 8 heads / 2 KV heads, SwiGLU 1408, q/k/v bias; 56 M
//              parameters), saved as an HF directory, then one full forward
//              of B x T tokens and N KV-cached decoding steps, tokens/s,
//              against benchmarks/torch_model_baseline.py running the same
//              forward on the same weights with Debian's python3-torch (the
//              same LibTorch 1.13.1) in the same run. The two sides' logits
//              of one position are compared so that both compute one function.
//
//   bench_model [--json FILE] [--quick] [--threads N]
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/task/datasets.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/torch_threads.h"
#include "benchmarks/model_shapes.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Flags {
  std::string json_path;
  std::string testdata = SLUICE_TESTDATA_DIR;
  std::string baseline = SLUICE_SOURCE_DIR "/benchmarks/torch_model_baseline.py";
  std::string python = "/usr/bin/python3";
  int threads = 2;
  int batch = 4;
  int seq = 128;
  int decode_steps = 32;
  int repeats = 3;
  bool quick = false;
};

// GSM8K and MATH-500 questions and solutions, as one list of texts.
std::vector<std::string> Texts(const Flags& flags) {
  std::vector<std::string> texts;
  using sluice::task::DatasetKind;
  for (const auto& [file, kind] : std::vector<std::pair<std::string, DatasetKind>>{
           {"/datasets/gsm8k/test.jsonl", DatasetKind::kGsm8k},
           {"/datasets/math500/test.jsonl", DatasetKind::kMath}}) {
    auto records = sluice::task::ReadDataset(flags.testdata + file, kind);
    if (!records.ok()) {
      std::cerr << "bench_model: " << records.status().message() << "\n";
      continue;
    }
    for (const auto& record : *records) {
      texts.push_back(record.question);
      texts.push_back(record.metadata.at("solution"));
    }
  }
  return texts;
}

json TokenizerFigures(const Flags& flags, const std::string& name,
                      const std::vector<std::string>& texts) {
  auto tokenizer =
      sluice::tokenizer::BpeTokenizer::FromFile(flags.testdata + "/tokenizers/" + name +
                                                "/tokenizer.json");
  if (!tokenizer.ok()) return {{"error", std::string(tokenizer.status().message())}};
  size_t bytes = 0;
  for (const auto& text : texts) bytes += text.size();
  // Best of `repeats`: the first pass also fills the tokenizer's cache of
  // pre-tokens, as a long-running worker's would be.
  double encode_s = 1e9, decode_s = 1e9;
  size_t tokens = 0;
  std::vector<std::vector<int32_t>> encoded(texts.size());
  for (int r = 0; r < flags.repeats; ++r) {
    absl::Time start = absl::Now();
    tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      encoded[i] = (*tokenizer)->Encode(texts[i]);
      tokens += encoded[i].size();
    }
    encode_s = std::min(encode_s, absl::ToDoubleSeconds(absl::Now() - start));
    start = absl::Now();
    for (const auto& ids : encoded) (void)(*tokenizer)->Decode(ids);
    decode_s = std::min(decode_s, absl::ToDoubleSeconds(absl::Now() - start));
  }
  return {{"texts", texts.size()},
          {"bytes", bytes},
          {"tokens", tokens},
          {"encode_mb_per_s", bytes / encode_s / 1e6},
          {"decode_mb_per_s", bytes / decode_s / 1e6},
          {"bytes_per_token", static_cast<double>(bytes) / std::max<size_t>(1, tokens)}};
}


}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"bench_model: tokenizer MB/s; forward and decode tokens/s against Python PyTorch"};
  app.add_option("--json", flags.json_path, "write the figures as JSON to this file");
  app.add_option("--threads", flags.threads, "LibTorch intra-op threads, both sides")
      ->capture_default_str();
  app.add_option("--batch", flags.batch, "sequences per forward / rows per decode step")
      ->capture_default_str();
  app.add_option("--seq", flags.seq, "tokens per sequence")->capture_default_str();
  app.add_option("--decode-steps", flags.decode_steps, "cached decoding steps")
      ->capture_default_str();
  app.add_option("--repeats", flags.repeats, "best of this many")->capture_default_str();
  app.add_option("--python", flags.python, "python3 with torch (Debian's)")->capture_default_str();
  app.add_flag("--quick", flags.quick, "small sizes (the smoke test)");
  CLI11_PARSE(app, argc, argv);
  if (flags.quick) {
    flags.batch = 1;
    flags.seq = 16;
    flags.decode_steps = 4;
    flags.repeats = 1;
  }
  sluice::ConfigureTorchThreads(flags.threads);
  sluice::KeepTensorMemoryResident();  // As the trainer and rollout worker do.
  json out;

  // ---- tokenizers ---------------------------------------------------------
  std::vector<std::string> texts = Texts(flags);
  if (flags.quick && texts.size() > 200) texts.resize(200);
  for (const char* name : {"qwen2", "llama3"}) {
    json figures = TokenizerFigures(flags, name, texts);
    out["tokenizer"][name] = figures;
    if (figures.contains("encode_mb_per_s")) {
      std::cout << absl::StrFormat(
          "tokenizer %-6s: encode %.2f MB/s, decode %.1f MB/s (%d texts, %.2f MB, %.2f bytes/token)\n",
          name, figures["encode_mb_per_s"].get<double>(), figures["decode_mb_per_s"].get<double>(),
          texts.size(), figures["bytes"].get<size_t>() / 1e6,
          figures["bytes_per_token"].get<double>());
    }
  }

  // ---- model --------------------------------------------------------------
  const sluice::model::ModelConfig config = sluice::bench::MidSizeQwen2();
  auto model = sluice::model::Transformer::Create(config, /*seed=*/7);
  if (!model.ok()) {
    std::cerr << "bench_model: " << model.status().message() << "\n";
    return 1;
  }
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("bench_model_", getpid());
  if (absl::Status saved = sluice::model::SaveHfModel(dir.string(), **model); !saved.ok()) {
    std::cerr << "bench_model: " << saved.message() << "\n";
    return 1;
  }
  // Loading the directory back into a runnable model (page cache warm, as
  // after the save), against the baseline's loader on the same files.
  double load_s = 1e9;
  for (int r = 0; r < flags.repeats; ++r) {
    const absl::Time start = absl::Now();
    absl::StatusOr<sluice::model::HfModel> loaded = sluice::model::LoadHfModel(dir.string());
    load_s = std::min(load_s, absl::ToDoubleSeconds(absl::Now() - start));
    if (!loaded.ok()) {
      std::cerr << "bench_model: " << loaded.status().message() << "\n";
      return 1;
    }
  }
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const torch::Tensor ids =
      torch::randint(0, config.vocab_size, {flags.batch, flags.seq}, torch::kInt64);
  torch::Tensor logits = (*model)->Forward(ids);  // Warm-up, and the checked logits.
  double forward_s = 1e9;
  for (int r = 0; r < flags.repeats; ++r) {
    const absl::Time start = absl::Now();
    (*model)->Forward(ids);
    forward_s = std::min(forward_s, absl::ToDoubleSeconds(absl::Now() - start));
  }
  double decode_s = 1e9;
  for (int r = 0; r < flags.repeats; ++r) {
    sluice::model::KVCache cache =
        (*model)->NewCache(flags.batch, flags.seq + flags.decode_steps);
    torch::Tensor all_keys = torch::ones({flags.batch, flags.seq}, torch::kInt64);
    torch::Tensor positions =
        torch::arange(flags.seq, torch::kInt64).unsqueeze(0).expand({flags.batch, flags.seq});
    torch::Tensor out_logits = (*model)->ForwardCached(ids, positions, all_keys, cache);
    torch::Tensor token = out_logits.select(1, flags.seq - 1).argmax(-1, /*keepdim=*/true);
    const absl::Time start = absl::Now();
    for (int step = 0; step < flags.decode_steps; ++step) {
      const int64_t length = flags.seq + step + 1;
      torch::Tensor key_mask = torch::ones({flags.batch, length}, torch::kInt64);
      torch::Tensor position = torch::full({flags.batch, 1}, flags.seq + step, torch::kInt64);
      out_logits = (*model)->ForwardCached(token, position, key_mask, cache);
      token = out_logits.select(1, 0).argmax(-1, /*keepdim=*/true);
    }
    decode_s = std::min(decode_s, absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double forward_tps = flags.batch * flags.seq / forward_s;
  const double decode_tps = flags.batch * flags.decode_steps / decode_s;
  json model_json = {{"parameters", config.ParameterCount()},
                     {"threads", flags.threads},
                     {"batch", flags.batch},
                     {"seq", flags.seq},
                     {"decode_steps", flags.decode_steps},
                     {"forward_tokens_per_s", forward_tps},
                     {"decode_tokens_per_s", decode_tps},
                     {"load_seconds", load_s}};

  // The baseline on the same weights, with the same first sequence.
  std::vector<int64_t> first(ids[0].data_ptr<int64_t>(), ids[0].data_ptr<int64_t>() + flags.seq);
  const fs::path baseline_out = dir / "baseline.json";
  const std::string command = absl::StrCat(
      flags.python, " ", flags.baseline, " --model ", dir.string(), " --batch ", flags.batch,
      " --seq ", flags.seq, " --decode-steps ", flags.decode_steps, " --threads ", flags.threads,
      " --repeats ", flags.repeats, " --ids ", absl::StrJoin(first, ","), " > ",
      baseline_out.string());
  if (std::system(command.c_str()) == 0) {
    std::ifstream in(baseline_out);
    json baseline = json::parse(in, nullptr, false);
    if (baseline.is_object()) {
      const auto theirs = baseline["last_logits_seq0"].get<std::vector<double>>();
      const torch::Tensor ours = logits[0][flags.seq - 1].contiguous();
      double max_diff = 0;
      for (int64_t v = 0; v < config.vocab_size && v < static_cast<int64_t>(theirs.size()); ++v) {
        max_diff = std::max(max_diff, std::abs(ours[v].item<double>() - theirs[v]));
      }
      baseline.erase("last_logits_seq0");
      model_json["python_torch"] = baseline;
      model_json["max_abs_logit_diff_vs_python"] = max_diff;
      model_json["forward_ratio_vs_python"] =
          forward_tps / baseline["forward_tokens_per_s"].get<double>();
      if (baseline.contains("load_seconds")) {
        // > 1: we load faster.
        model_json["load_speedup_vs_python"] = baseline["load_seconds"].get<double>() / load_s;
      }
      model_json["decode_ratio_vs_python"] =
          decode_tps / baseline["decode_tokens_per_s"].get<double>();
    }
  } else {
    model_json["python_error"] = "the baseline failed: is python3-torch installed? (" + command + ")";
    std::cerr << "bench_model: " << model_json["python_error"].get<std::string>() << "\n";
  }
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  out["model"] = model_json;
  std::cout << absl::StrFormat(
      "model (%d params, %d threads): forward %.0f tokens/s, decode %.0f tokens/s, load %.3f s\n",
      config.ParameterCount(), flags.threads, forward_tps, decode_tps, load_s);
  if (model_json.contains("load_speedup_vs_python")) {
    std::cout << absl::StrFormat("  load: python %.3f s, %.2fx faster here\n",
                                 model_json["python_torch"]["load_seconds"].get<double>(),
                                 model_json["load_speedup_vs_python"].get<double>());
  }
  if (model_json.contains("python_torch")) {
    std::cout << absl::StrFormat(
        "  python torch: forward %.0f tokens/s, decode %.0f tokens/s; ratio forward %.2f, decode "
        "%.2f; max |logit diff| %.2e\n",
        model_json["python_torch"]["forward_tokens_per_s"].get<double>(),
        model_json["python_torch"]["decode_tokens_per_s"].get<double>(),
        model_json["forward_ratio_vs_python"].get<double>(),
        model_json["decode_ratio_vs_python"].get<double>(),
        model_json["max_abs_logit_diff_vs_python"].get<double>());
  }
  if (!flags.json_path.empty()) {
    std::ofstream file(flags.json_path);
    file << out.dump(2) << "\n";
    if (!file) return 1;
  }
  return 0;
}
