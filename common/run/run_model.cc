#include "common/run/run_model.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "common/task/char_tokenizer.h"
#include "nlohmann/json.hpp"

namespace sluice::run {
namespace {

namespace fs = std::filesystem;

// Tokenizer files transformers, vLLM and SGLang read next to the weights.
constexpr const char* kTokenizerSideFiles[] = {
    "tokenizer.json",          "tokenizer_config.json", "special_tokens_map.json",
    "generation_config.json",  "vocab.json",            "merges.txt",
    "added_tokens.json",
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return contents.str();
}

// tokenizer_config.json for the builtin tokenizer, so that transformers'
// AutoTokenizer loads a builtin checkpoint with the right specials.
std::string BuiltinTokenizerConfigJson(int64_t max_length) {
  const nlohmann::ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                         {"bos_token", "<bos>"},
                                         {"eos_token", "<eos>"},
                                         {"pad_token", "<pad>"},
                                         {"model_max_length", max_length},
                                         {"clean_up_tokenization_spaces", false}};
  return config.dump(2);
}

}  // namespace

std::string TokenizerPath(const v1::ModelConfig& model) {
  if (model.has_builtin()) return "";
  if (!model.tokenizer_path().empty()) {
    std::error_code error;
    if (fs::is_directory(model.tokenizer_path(), error)) {
      return (fs::path(model.tokenizer_path()) / "tokenizer.json").string();
    }
    return model.tokenizer_path();
  }
  if (model.has_hf_model_dir()) return (fs::path(model.hf_model_dir()) / "tokenizer.json").string();
  return "";
}

absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> LoadRunTokenizer(
    const v1::ModelConfig& model) {
  const std::string path = TokenizerPath(model);
  if (path.empty()) return tokenizer::BpeTokenizer::FromJson(task::CharTokenizer().ToHfTokenizerJson());
  return tokenizer::BpeTokenizer::FromFile(path);
}

absl::StatusOr<model::ModelConfig> LoadRunModelConfig(const v1::ModelConfig& model) {
  if (model.has_builtin()) {
    ASSIGN_OR_RETURN(model::ModelConfig config,
                     model::BuiltinModelConfig(model.builtin(), task::CharTokenizer().vocab_size()));
    // Rotary positions, nothing learned per position: the run chooses the
    // context (ValidateRunModel bounds it).
    if (model.max_context_tokens() > 0 && model.max_context_tokens() <= kMaxBuiltinContext) {
      config.max_position_embeddings = model.max_context_tokens();
    }
    return config;
  }
  if (!model.has_hf_model_dir()) {
    return absl::InvalidArgumentError("model: exactly one of builtin or hf_model_dir must be set");
  }
  const std::string path = (fs::path(model.hf_model_dir()) / "config.json").string();
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  absl::StatusOr<model::ModelConfig> config = model::ModelConfig::FromJson(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(), absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

std::vector<int32_t> EncodePrompt(const tokenizer::BpeTokenizer& tokenizer,
                                  absl::string_view text) {
  std::vector<int32_t> ids = tokenizer.Encode(text, /*allow_special=*/true);
  const std::vector<int32_t>& prefix = tokenizer.prefix_ids();
  if (prefix.empty() || (ids.size() >= prefix.size() &&
                         std::equal(prefix.begin(), prefix.end(), ids.begin()))) {
    return ids;
  }
  ids.insert(ids.begin(), prefix.begin(), prefix.end());
  return ids;
}

std::vector<int32_t> StopTokenIds(const model::ModelConfig& config,
                                  const tokenizer::BpeTokenizer& tokenizer) {
  std::vector<int32_t> ids;
  auto add = [&](int64_t id) {
    if (id < 0 || id >= config.vocab_size) return;
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(static_cast<int32_t>(id));
  };
  if (std::optional<int32_t> eos = tokenizer.eos_id()) add(*eos);
  add(config.eos_token_id);
  return ids;
}

int32_t PadTokenId(const model::ModelConfig& config, const tokenizer::BpeTokenizer& tokenizer) {
  if (config.pad_token_id >= 0 && config.pad_token_id < config.vocab_size) {
    return static_cast<int32_t>(config.pad_token_id);
  }
  const std::vector<int32_t> stop = StopTokenIds(config, tokenizer);
  return stop.empty() ? 0 : stop.front();
}

absl::StatusOr<std::map<std::string, std::string>> CheckpointSideFiles(
    const v1::ModelConfig& model) {
  std::map<std::string, std::string> files;
  if (model.has_builtin()) {
    ASSIGN_OR_RETURN(const model::ModelConfig config, LoadRunModelConfig(model));
    files["tokenizer.json"] = task::CharTokenizer().ToHfTokenizerJson();
    files["tokenizer_config.json"] = BuiltinTokenizerConfigJson(config.max_position_embeddings);
    return files;
  }
  for (const char* name : kTokenizerSideFiles) {
    const fs::path path = fs::path(model.hf_model_dir()) / name;
    std::error_code error;
    if (!fs::is_regular_file(path, error)) continue;
    ASSIGN_OR_RETURN(files[name], ReadFile(path.string()));
  }
  if (!model.tokenizer_path().empty()) {
    ASSIGN_OR_RETURN(files["tokenizer.json"], ReadFile(TokenizerPath(model)));
  }
  return files;
}

void ValidateRunModel(const v1::RunSpec& spec, std::vector<std::string>* problems) {
  const v1::ModelConfig& model = spec.model();
  auto add = [&](absl::string_view path, absl::string_view message) {
    problems->push_back(absl::StrCat(path, ": ", message));
  };
  if (model.has_builtin()) {
    // The character tokenizer drops what it does not know: refuse text it
    // cannot spell rather than train on a mangled prompt.
    const task::CharTokenizer chars;
    const v1::TaskConfig& task = spec.task();
    if (task.has_dataset()) {
      add("task.dataset",
          absl::StrCat("the builtin models' character tokenizer knows only \"",
                       "0123456789+-*=() .,?:", "\"; dataset text needs a real model: set "
                       "model.hf_model_dir"));
    }
    std::string template_text = task.prompt_template();
    absl::StrReplaceAll({{"{question}", ""}}, &template_text);
    if (absl::StatusOr<std::vector<int32_t>> ids = chars.Encode(template_text); !ids.ok()) {
      add("task.prompt_template", absl::StrCat("the builtin models' tokenizer cannot spell it: ",
                                               ids.status().message()));
    }
    if (absl::StatusOr<std::vector<int32_t>> ids = chars.Encode(task.system_prompt()); !ids.ok()) {
      add("task.system_prompt", absl::StrCat("the builtin models' tokenizer cannot spell it: ",
                                             ids.status().message()));
    }
  }
  std::string model_name;
  switch (model.source_case()) {
    case v1::ModelConfig::SOURCE_NOT_SET:
      add("model", "exactly one of builtin or hf_model_dir must be set");
      return;
    case v1::ModelConfig::kBuiltin:
      model_name = absl::StrCat(model.builtin(), " model");
      if (!model.tokenizer_path().empty()) {
        add("model.tokenizer_path",
            "builtin models use their built-in tokenizer; leave it empty (or export the model "
            "as a Hugging Face directory and set hf_model_dir)");
      }
      break;
    case v1::ModelConfig::kHfModelDir: {
      model_name = absl::StrCat("model in ", model.hf_model_dir());
      std::error_code error;
      if (model.hf_model_dir().empty()) {
        add("model.hf_model_dir", "must not be empty");
        return;
      }
      if (!fs::is_directory(model.hf_model_dir(), error)) {
        add("model.hf_model_dir", absl::StrCat("\"", model.hf_model_dir(),
                                               "\" is not a directory readable by the controller"));
        return;
      }
      break;
    }
  }
  absl::StatusOr<model::ModelConfig> config = LoadRunModelConfig(model);
  if (!config.ok()) {
    if (model.has_builtin()) {
      // The model library's message lists the known names; keep that list.
      const absl::string_view message = config.status().message();
      const size_t known = message.find("; known:");
      add("model.builtin", absl::StrCat("unknown model \"", model.builtin(), "\"",
                                        known == absl::string_view::npos
                                            ? absl::StrCat(" (", message, ")")
                                            : std::string(message.substr(known))));
    } else {
      add("model.hf_model_dir", config.status().message());
    }
    return;
  }
  if (model.has_builtin() && model.max_context_tokens() > kMaxBuiltinContext) {
    add("model.max_context_tokens",
        absl::StrCat("must be <= ", kMaxBuiltinContext, " (the longest context a builtin model "
                     "takes), got ", model.max_context_tokens()));
  } else if (model.max_context_tokens() > config->max_position_embeddings) {
    add("model.max_context_tokens",
        absl::StrCat("must be <= ", config->max_position_embeddings, " (the context length of the ",
                     model_name, "), got ", model.max_context_tokens()));
  }
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tokenizer = LoadRunTokenizer(model);
  if (!tokenizer.ok()) {
    add(model.tokenizer_path().empty() ? "model.hf_model_dir" : "model.tokenizer_path",
        absl::StrCat(tokenizer.status().message(),
                     model.tokenizer_path().empty()
                         ? " (a model directory needs a tokenizer.json, or set model.tokenizer_path)"
                         : ""));
    return;
  }
  const std::string tokenizer_field =
      model.tokenizer_path().empty() ? "model.hf_model_dir" : "model.tokenizer_path";
  if ((*tokenizer)->vocab_size() > config->vocab_size) {
    add(tokenizer_field, absl::StrCat("the tokenizer has ", (*tokenizer)->vocab_size(),
                                      " tokens but the model's vocab_size is ", config->vocab_size,
                                      ": they do not belong together"));
  }
  if (StopTokenIds(*config, **tokenizer).empty()) {
    add(tokenizer_field,
        "no end-of-sequence token: neither config.json's eos_token_id nor a tokenizer token "
        "named <|im_end|>, <|eot_id|>, <|endoftext|>, <|end_of_text|>, </s> or <eos>");
  }
  if (spec.task().chat_template() == "chatml") {
    std::vector<std::string> missing;
    for (const char* token : {"<|im_start|>", "<|im_end|>"}) {
      if (!(*tokenizer)->TokenToId(token).has_value()) missing.push_back(token);
    }
    if (!missing.empty()) {
      add("task.chat_template",
          absl::StrCat("\"chatml\" needs the tokens ", absl::StrJoin(missing, " and "),
                       ", which the ", model_name, "'s tokenizer lacks"));
    }
  }
}

}  // namespace sluice::run
