#include "cli/model_command.h"

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/generation.h"
#include "common/model/hf_checkpoint.h"
#include "common/run/run_model.h"
#include "nlohmann/json.hpp"

#include "common/tokenizer/bpe_tokenizer.h"

namespace sluice::cli {
namespace {

using nlohmann::json;

constexpr int kExitLoad = 1;
constexpr int kExitUsage = 2;

std::string TokenizerPath(const ModelFlags& flags) {
  return (std::filesystem::path(flags.model_dir) / "tokenizer.json").string();
}

// The tokenizer of flags.model_dir, or nullptr when there is none (no
// tokenizer.json, or no loader). An error only when loading one fails.
absl::StatusOr<std::unique_ptr<TextTokenizer>> MaybeTokenizer(const ModelFlags& flags,
                                                              const TokenizerLoader& loader) {
  std::error_code error;
  if (!loader || !std::filesystem::exists(TokenizerPath(flags), error)) {
    return std::unique_ptr<TextTokenizer>();
  }
  return loader(TokenizerPath(flags));
}

// The prompt ids from --ids or --prompt, checked against the vocabulary and
// context. Returns a message for the user on failure.
absl::StatusOr<std::vector<int32_t>> PromptIds(const ModelFlags& flags,
                                               const model::ModelConfig& config,
                                               const TextTokenizer* tokenizer) {
  const bool has_ids = !flags.ids.empty();
  const bool has_prompt = !flags.prompt.empty();
  if (has_ids == has_prompt) {
    return absl::InvalidArgumentError("give exactly one of --ids and --prompt");
  }
  std::vector<int32_t> ids;
  if (has_ids) {
    absl::StatusOr<std::vector<int32_t>> parsed = ParseIds(flags.ids);
    if (!parsed.ok()) return parsed.status();
    ids = *std::move(parsed);
  } else {
    if (tokenizer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt needs a tokenizer: ", TokenizerPath(flags),
          " is missing or this build has no tokenizer support; pass --ids instead"));
    }
    absl::StatusOr<std::vector<int32_t>> encoded = tokenizer->Encode(flags.prompt);
    if (!encoded.ok()) return encoded.status();
    ids = *std::move(encoded);
    if (ids.empty()) return absl::InvalidArgumentError("--prompt encodes to no tokens");
  }
  for (int32_t id : ids) {
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  if (static_cast<int64_t>(ids.size()) > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", ids.size(),
                                                   " tokens, more than the model's context of ",
                                                   config.max_position_embeddings));
  }
  return ids;
}

class BpeTextTokenizer : public TextTokenizer {
 public:
  explicit BpeTextTokenizer(std::unique_ptr<tokenizer::BpeTokenizer> bpe) : bpe_(std::move(bpe)) {}
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const override {
    return bpe_->Encode(text);
  }
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const override {
    return bpe_->Decode(ids);
  }

 private:
  std::unique_ptr<tokenizer::BpeTokenizer> bpe_;
};

}  // namespace

TokenizerLoader DefaultTokenizerLoader() {
  return [](const std::string& path) -> absl::StatusOr<std::unique_ptr<TextTokenizer>> {
    absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> bpe =
        tokenizer::BpeTokenizer::FromFile(path);
    if (!bpe.ok()) return bpe.status();
    return std::unique_ptr<TextTokenizer>(new BpeTextTokenizer(*std::move(bpe)));
  };
}

ModelCommands AddModelCommands(CLI::App& app, ModelFlags* flags, InitModelFlags* init_flags) {
  ModelCommands commands;
  commands.init_model = app.add_subcommand(
      "init-model", "Write a builtin model (random weights of a seed) as a Hugging Face directory");
  commands.init_model->add_option("--builtin", init_flags->builtin, "builtin model: tiny, micro")
      ->required();
  commands.init_model->add_option("--out", init_flags->out_dir, "directory to write")->required();
  commands.init_model->add_option("--seed", init_flags->seed, "initialisation seed (a run's seed)")
      ->capture_default_str();
  commands.init_model->add_option("--dtype", init_flags->dtype, "float32 or bfloat16")
      ->capture_default_str();
  commands.logits = app.add_subcommand(
      "logits", "Print a Hugging Face model's logits at every position of a token sequence (JSON)");
  commands.generate = app.add_subcommand(
      "generate", "Continue a token sequence or prompt with a Hugging Face model (JSON)");
  for (CLI::App* command : {commands.logits, commands.generate}) {
    command->add_option("--model", flags->model_dir,
                        "model directory: config.json + model.safetensors (or sharded)")
        ->required();
    command->add_option("--ids", flags->ids, "prompt token ids, comma-separated: 1,2,3");
    command->add_option("--prompt", flags->prompt, "prompt text (needs DIR/tokenizer.json)");
  }
  CLI::App* generate = commands.generate;
  generate->add_option("--max-new-tokens", flags->max_new_tokens, "tokens to generate at most")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  generate->add_flag("--greedy", flags->greedy, "always take the most likely token");
  generate->add_option("--temperature", flags->temperature, "sampling temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  generate->add_option("--top-p", flags->top_p, "nucleus sampling mass in (0, 1]")
      ->capture_default_str();
  generate->add_option("--seed", flags->seed, "random seed")->capture_default_str();
  generate->add_flag("--ignore-eos", flags->ignore_eos,
                     "do not stop at the config's eos_token_id");
  return commands;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(absl::string_view text) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    int32_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ids: \"", std::string(part), "\" is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError("--ids: no token ids");
  return ids;
}

// The model, the tokenizer (null without one) and the prompt's ids, shared
// by both commands; on failure, the message is on `err` and *exit_code set.
struct Prepared {
  model::HfModel loaded;
  std::unique_ptr<TextTokenizer> tokenizer;
  std::vector<int32_t> ids;
};

std::optional<Prepared> Prepare(const ModelFlags& flags, const TokenizerLoader& tokenizer_loader,
                                std::ostream& err, int* exit_code) {
  absl::StatusOr<model::HfModel> loaded = model::LoadHfModel(flags.model_dir);
  if (!loaded.ok()) {
    err << "error: " << loaded.status().message() << "\n";
    *exit_code = kExitLoad;
    return std::nullopt;
  }
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tokenizer =
      MaybeTokenizer(flags, tokenizer_loader);
  if (!tokenizer.ok()) {
    err << "error: " << tokenizer.status().message() << "\n";
    *exit_code = kExitLoad;
    return std::nullopt;
  }
  absl::StatusOr<std::vector<int32_t>> ids = PromptIds(flags, loaded->config, tokenizer->get());
  if (!ids.ok()) {
    err << "error: " << ids.status().message() << "\n";
    *exit_code = kExitUsage;
    return std::nullopt;
  }
  return Prepared{*std::move(loaded), *std::move(tokenizer), *std::move(ids)};
}

int RunLogits(const ModelFlags& flags, std::ostream& out, std::ostream& err,
              const TokenizerLoader& tokenizer_loader) {
  int exit_code = 0;
  std::optional<Prepared> prepared = Prepare(flags, tokenizer_loader, err, &exit_code);
  if (!prepared.has_value()) return exit_code;
  model::HfModel* loaded = &prepared->loaded;
  const std::vector<int32_t>* ids = &prepared->ids;
  c10::InferenceMode inference;
  const torch::Tensor input =
      torch::tensor(std::vector<int64_t>(ids->begin(), ids->end()), torch::kInt64).unsqueeze(0);
  const torch::Tensor logits = loaded->model->Forward(input)[0].contiguous();
  const int64_t vocab = logits.size(1);
  const float* data = logits.data_ptr<float>();
  json rows = json::array();
  for (int64_t t = 0; t < logits.size(0); ++t) {
    rows.push_back(std::vector<float>(data + t * vocab, data + (t + 1) * vocab));
  }
  out << json{{"logits", std::move(rows)}}.dump() << "\n";
  return 0;
}

int RunGenerate(const ModelFlags& flags, std::ostream& out, std::ostream& err,
                const TokenizerLoader& tokenizer_loader) {
  int exit_code = 0;
  std::optional<Prepared> prepared = Prepare(flags, tokenizer_loader, err, &exit_code);
  if (!prepared.has_value()) return exit_code;
  model::HfModel* loaded = &prepared->loaded;
  std::unique_ptr<TextTokenizer>* tokenizer = &prepared->tokenizer;
  const std::vector<int32_t>* ids = &prepared->ids;
  model::SamplingOptions options;
  options.temperature = flags.greedy ? 0.0 : flags.temperature;
  options.top_p = flags.greedy ? 1.0 : flags.top_p;
  options.max_new_tokens = flags.max_new_tokens;
  options.seed = flags.seed;
  if (!flags.ignore_eos && loaded->config.eos_token_id >= 0) {
    options.stop_token_ids = {loaded->config.eos_token_id};
  }
  model::PolicySnapshot policy{std::shared_ptr<const model::Transformer>(std::move(loaded->model)),
                               0};
  absl::StatusOr<std::vector<model::Completion>> completions =
      model::Generate(policy, {*ids}, options);
  if (!completions.ok()) {
    err << "error: " << completions.status().message() << "\n";
    return kExitUsage;
  }
  const model::Completion& completion = completions->front();
  json result = {{"ids", completion.tokens},
                 {"finish", completion.finish == model::Finish::kStop ? "stop" : "length"}};
  if (*tokenizer != nullptr) {
    absl::StatusOr<std::string> text = (*tokenizer)->Decode(completion.tokens);
    if (!text.ok()) {
      err << "error: decoding the completion: " << text.status().message() << "\n";
      return kExitLoad;
    }
    result["text"] = *text;
  }
  // A tokenizer may decode a cut-off multi-byte character: never throw on it.
  out << result.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  return 0;
}

int RunInitModel(const InitModelFlags& flags, std::ostream& out, std::ostream& err) {
  v1::ModelConfig spec;
  spec.set_builtin(flags.builtin);
  absl::StatusOr<model::ModelConfig> config = run::LoadRunModelConfig(spec);
  if (!config.ok()) {
    err << "sluice init-model: --builtin: " << config.status().message() << "\n";
    return 2;
  }
  model::SaveHfOptions options;
  if (flags.dtype == "bfloat16") {
    options.dtype = model::DType::kBF16;
  } else if (flags.dtype != "float32") {
    err << "sluice init-model: --dtype: must be float32 or bfloat16, got \"" << flags.dtype
        << "\"\n";
    return 2;
  }
  absl::StatusOr<std::map<std::string, std::string>> side_files = run::CheckpointSideFiles(spec);
  absl::StatusOr<std::unique_ptr<model::Transformer>> transformer =
      model::Transformer::Create(*config, flags.seed);
  if (!side_files.ok() || !transformer.ok()) {
    err << "sluice init-model: "
        << (side_files.ok() ? transformer.status() : side_files.status()).message() << "\n";
    return 1;
  }
  options.extra_contents = *std::move(side_files);
  if (absl::Status saved = model::SaveHfModel(flags.out_dir, **transformer, options); !saved.ok()) {
    err << "sluice init-model: " << saved.message() << "\n";
    return 1;
  }
  out << nlohmann::json{{"dir", flags.out_dir}, {"parameters", config->ParameterCount()}}.dump()
      << "\n";
  return 0;
}

}  // namespace sluice::cli
