// bench_weight_delta: how large a weight version is as a sparse bf16 delta
// against the one before, for a model trained by AdamW, against the version
// in full (issue 20). The optimizer steps are real AdamW steps over the
// model's parameters; the gradients are random (Adam normalises each
// element's step to about the learning rate whatever the gradient's scale,
// so the fraction of bf16 values that change depends on the learning rate
// and the weights' magnitudes, which are the model's). One line per
// learning rate, and a JSON file with every figure.
//
//   bench_weight_delta --model tiny --steps 20 --json out.json
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "benchmarks/model_shapes.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/task/char_tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/weights/weight_delta.h"
#include "services/weights/weight_dtype.h"

namespace sluice {
namespace {

struct Figures {
  double learning_rate = 0;
  int64_t full_bytes = 0;       // one version in bf16
  double delta_bytes_mean = 0;  // one version as a delta stream carries it
  double delta_bytes_max = 0;
  double changed_fraction = 0;     // of the bf16 elements, mean over steps
  double encode_seconds_mean = 0;  // per version
  double apply_seconds_mean = 0;   // per version, with the CRC checks
};

std::vector<std::string> Bf16Version(const model::Transformer& m) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : m.parameters()) {
    out.push_back(
        *weights::Float32BytesTo(v1::DTYPE_BFLOAT16, model::TensorBytes(tensor.detach())));
  }
  return out;
}

Figures Measure(const model::ModelConfig& config, double lr, int steps) {
  torch::manual_seed(0);
  std::unique_ptr<model::Transformer> m = *model::Transformer::Create(config, /*seed=*/0);
  std::vector<torch::Tensor> params;
  for (const auto& [name, tensor] : m->parameters()) params.push_back(tensor);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(lr).betas({0.9, 0.999}));
  Figures f;
  f.learning_rate = lr;
  std::vector<std::string> previous = Bf16Version(*m);
  for (const std::string& t : previous) f.full_bytes += static_cast<int64_t>(t.size());
  for (int step = 0; step < steps; ++step) {
    for (torch::Tensor& p : params) p.mutable_grad() = torch::randn_like(p);
    optimizer.step();
    std::vector<std::string> current = Bf16Version(*m);
    int64_t delta = 0;
    int64_t changed = 0;
    const absl::Time encode_start = absl::Now();
    std::vector<weights::EncodedTensor> encoded;
    for (size_t i = 0; i < current.size(); ++i) {
      encoded.push_back(*weights::EncodeTensorDelta(previous[i], current[i]));
      delta += encoded.back().encoding == v1::TENSOR_ENCODING_SPARSE_DELTA
                   ? static_cast<int64_t>(encoded.back().bytes.size())
                   : static_cast<int64_t>(current[i].size());
    }
    f.encode_seconds_mean += absl::ToDoubleSeconds(absl::Now() - encode_start) / steps;
    const absl::Time apply_start = absl::Now();
    for (size_t i = 0; i < current.size(); ++i) {
      if (encoded[i].encoding != v1::TENSOR_ENCODING_SPARSE_DELTA) continue;
      v1::TensorSpec spec;
      spec.set_name("t");
      spec.set_size_bytes(static_cast<int64_t>(current[i].size()));
      spec.set_encoding(v1::TENSOR_ENCODING_SPARSE_DELTA);
      absl::StatusOr<std::string> applied =
          weights::DecodeTensor(spec, previous[i], std::move(encoded[i].bytes));
      if (!applied.ok() || *applied != current[i]) {
        std::fprintf(stderr, "delta did not round-trip\n");
        std::exit(1);
      }
    }
    f.apply_seconds_mean += absl::ToDoubleSeconds(absl::Now() - apply_start) / steps;
    for (size_t i = 0; i < current.size(); ++i) {
      for (size_t j = 0; j < current[i].size(); j += 2) {
        changed += current[i][j] != previous[i][j] || current[i][j + 1] != previous[i][j + 1];
      }
    }
    f.delta_bytes_mean += static_cast<double>(delta) / steps;
    f.delta_bytes_max = std::max(f.delta_bytes_max, static_cast<double>(delta));
    f.changed_fraction += static_cast<double>(changed) / (f.full_bytes / 2) / steps;
    previous = std::move(current);
  }
  return f;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  CLI::App app("Sparse bf16 weight deltas between AdamW steps");
  std::string model_name = "tiny";
  int steps = 10;
  std::string json_path;
  std::vector<double> learning_rates = {3e-4, 3e-5, 1e-6};
  app.add_option("--model", model_name, "tiny (the quickstart's), micro, or midsize (56 M Qwen2)");
  app.add_option("--steps", steps, "AdamW steps (versions) per learning rate");
  app.add_option("--lr", learning_rates, "learning rates");
  app.add_option("--json", json_path, "write the figures here");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(2);
  sluice::model::ModelConfig config;
  if (model_name == "midsize") {
    config = sluice::bench::MidSizeQwen2();
  } else {
    config =
        *sluice::model::BuiltinModelConfig(model_name, sluice::task::CharTokenizer().vocab_size());
  }
  nlohmann::json out = {{"model", model_name},
                        {"parameters", config.ParameterCount()},
                        {"steps", steps},
                        {"runs", nlohmann::json::array()}};
  for (double lr : learning_rates) {
    const sluice::Figures f = sluice::Measure(config, lr, steps);
    std::printf(
        "%s (%lld params) lr %.0e: full %lld bytes/version, delta %.0f bytes (%.1f%%, max "
        "%.0f), %.1f%% of bf16 values changed; encode %.4f s, apply+check %.4f s\n",
        model_name.c_str(), static_cast<long long>(config.ParameterCount()), lr,
        static_cast<long long>(f.full_bytes), f.delta_bytes_mean,
        100 * f.delta_bytes_mean / f.full_bytes, f.delta_bytes_max, 100 * f.changed_fraction,
        f.encode_seconds_mean, f.apply_seconds_mean);
    out["runs"].push_back({{"learning_rate", lr},
                           {"full_bytes_per_version", f.full_bytes},
                           {"delta_bytes_per_version_mean", f.delta_bytes_mean},
                           {"delta_bytes_per_version_max", f.delta_bytes_max},
                           {"delta_over_full", f.delta_bytes_mean / f.full_bytes},
                           {"changed_fraction", f.changed_fraction},
                           {"encode_seconds_per_version", f.encode_seconds_mean},
                           {"apply_seconds_per_version", f.apply_seconds_mean}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}
