#ifndef SLUICE_COMMON_RUN_RUN_MODEL_H_
#define SLUICE_COMMON_RUN_RUN_MODEL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "sluice/v1/common.pb.h"

// What a run spec's `model` section resolves to, without LibTorch: the
// model's config, its tokenizer and the files that travel with it. The
// controller validates with it, the trainer and the rollout workers load
// with it, so that all three agree.
//
// Every model is a Hugging Face directory:
//   model.hf_model_dir: config.json, *.safetensors, tokenizer.json (or
//     model.tokenizer_path: a tokenizer.json or the directory holding one);
//   model.builtin ("tiny", "micro"): BuiltinModelConfig's config, random
//     weights from the run seed, and the character tokenizer written as a
//     byte-level tokenizer.json (task::CharTokenizer::ToHfTokenizerJson).
//     Its checkpoints are complete HF directories, which a later run can
//     name as hf_model_dir.
namespace sluice::run {

// The longest context model.max_context_tokens may give a builtin model
// (its default is BuiltinModelConfig's 32).
inline constexpr int64_t kMaxBuiltinContext = 1024;

// The tokenizer.json path a spec names: tokenizer_path (a file, or a
// directory holding tokenizer.json), else <hf_model_dir>/tokenizer.json;
// "" for a builtin model (whatever tokenizer_path says; ValidateRunModel
// refuses one).
std::string TokenizerPath(const v1::ModelConfig& model);

// The run's tokenizer. NOT_FOUND / INVALID_ARGUMENT (naming the file) when
// it cannot be read or parsed.
absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> LoadRunTokenizer(
    const v1::ModelConfig& model);

// The run's model config: the builtin's, or <hf_model_dir>/config.json
// parsed by ModelConfig::FromJson. Errors name the file and field.
absl::StatusOr<model::ModelConfig> LoadRunModelConfig(const v1::ModelConfig& model);

// A prompt's ids as the model expects them: the tokenizer's post-processor
// prefix (Llama-3's <|begin_of_text|>; nothing for Qwen2 or the builtin
// tokenizer), unless the text already starts with it, then the text with
// special tokens recognised (so a chat template's markers become their ids).
std::vector<int32_t> EncodePrompt(const tokenizer::BpeTokenizer& tokenizer,
                                  absl::string_view text);

// The token ids generation stops at: the tokenizer's end-of-turn / end-of-text
// token and config.json's eos_token_id (they differ for instruct models:
// <|im_end|> and <|endoftext|>), without duplicates or ids outside the
// model's vocabulary. Never empty for a valid run (see ValidateRunModel).
std::vector<int32_t> StopTokenIds(const model::ModelConfig& config,
                                  const tokenizer::BpeTokenizer& tokenizer);

// The id padded positions hold (they are masked out of every loss and never
// attended to, but must be a valid embedding row): config.json's
// pad_token_id, else the first stop token, else 0.
int32_t PadTokenId(const model::ModelConfig& config, const tokenizer::BpeTokenizer& tokenizer);

// The files a checkpoint of this run carries besides config.json and the
// weights, by base name: the tokenizer files of the model directory
// (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// generation_config.json, vocab.json, merges.txt, whichever exist; the
// tokenizer_path file as tokenizer.json), or the builtin tokenizer's
// tokenizer.json and tokenizer_config.json. Contents, not paths, so that the
// builtin ones need no file. NOT_FOUND when a named tokenizer file cannot be
// read.
absl::StatusOr<std::map<std::string, std::string>> CheckpointSideFiles(
    const v1::ModelConfig& model);

// Checks spec.model() against the files it names and the task: the config
// parses (an unknown architecture or a missing field is named), the
// tokenizer loads, its vocabulary fits the model's embedding, there is a
// stop token, max_context_tokens fits, chat_template "chatml" has its
// tokens. Adds one "path: problem" line per problem.
void ValidateRunModel(const v1::RunSpec& spec, std::vector<std::string>* problems);

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_MODEL_H_
