#ifndef SLUICE_CLI_MODEL_COMMAND_H_
#define SLUICE_CLI_MODEL_COMMAND_H_

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace CLI {
class App;
}  // namespace CLI

// `sluice logits` and `sluice generate`: run a Hugging Face model directory
// (config.json + safetensors, see common/model/hf_checkpoint.h) on CPU, in
// float32, to check a checkpoint by hand or against another implementation.
//
//   sluice logits --model DIR --ids 1,2,3
//     -> {"logits": [[...vocab floats...] per position]}
//   sluice generate --model DIR (--ids 1,2,3 | --prompt TEXT) --max-new-tokens N
//                   [--greedy | --temperature T --top-p P] [--seed S] [--ignore-eos]
//     -> {"ids": [new ids], "finish": "stop" | "length", "text": "..."}
//
// Output is one JSON line on stdout. Generation stops at the config's
// eos_token_id (kept in "ids") unless --ignore-eos. "text" (and --prompt)
// need DIR/tokenizer.json and a TokenizerLoader; without them "text" is
// omitted and --prompt is an error.
namespace sluice::cli {

struct ModelFlags {
  std::string model_dir;
  std::string ids;     // "1,2,3"
  std::string prompt;  // Text; needs a tokenizer.
  int64_t max_new_tokens = 16;
  bool greedy = false;       // Overrides temperature / top_p.
  double temperature = 1.0;  // 0 = greedy.
  double top_p = 1.0;
  uint64_t seed = 0;
  bool ignore_eos = false;
};

// The text side of a tokenizer, so that this library does not depend on a
// particular tokenizer implementation.
class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const = 0;
  virtual absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const = 0;
};

// Builds a tokenizer from a tokenizer.json path. The `sluice` binary passes
// one wrapping common/tokenizer; an empty function = no tokenizer support.
using TokenizerLoader =
    std::function<absl::StatusOr<std::unique_ptr<TextTokenizer>>(const std::string& path)>;

// common/tokenizer's BpeTokenizer::FromFile.
TokenizerLoader DefaultTokenizerLoader();

struct ModelCommands {
  CLI::App* logits = nullptr;
  CLI::App* generate = nullptr;
  CLI::App* init_model = nullptr;
};

// `sluice init-model --builtin NAME --out DIR [--seed S] [--dtype float32|bfloat16]`:
// writes a builtin model ("tiny", "micro") with the random weights a run of
// seed S starts from, as a complete Hugging Face directory (config.json,
// model.safetensors, tokenizer.json, tokenizer_config.json) that a run spec
// can name as model.hf_model_dir and transformers can load.
struct InitModelFlags {
  std::string builtin;
  std::string out_dir;
  uint64_t seed = 0;
  std::string dtype = "float32";
};

// Adds `logits` and `generate` to `app`, both parsing into `flags`, and
// `init-model`, parsing into `init_flags`.
ModelCommands AddModelCommands(CLI::App& app, ModelFlags* flags, InitModelFlags* init_flags);

// Runs `sluice init-model`; prints {"dir": ..., "parameters": N} on success.
// Exit code 0; 2 for an unknown model or dtype; 1 when the directory
// cannot be written.
int RunInitModel(const InitModelFlags& flags, std::ostream& out, std::ostream& err);

// "1, 2,3" -> {1, 2, 3}. INVALID_ARGUMENT naming the bad entry; an empty
// list is an error.
absl::StatusOr<std::vector<int32_t>> ParseIds(absl::string_view text);

// Runs `sluice logits`: loads flags.model_dir, one full forward pass over
// --ids (or --prompt, tokenized), writes the JSON to `out`. Exit code 0; 1
// when the model cannot be loaded; 2 for bad flags (ids out of range or
// unparsable, no --ids / --prompt, both, a prompt longer than the context).
int RunLogits(const ModelFlags& flags, std::ostream& out, std::ostream& err,
              const TokenizerLoader& tokenizer_loader = DefaultTokenizerLoader());

// Runs `sluice generate` with the batched KV-cache sampler of
// common/model/generation.h (deterministic for a given --seed). Exit codes as
// RunLogits; also 2 for out-of-range sampling flags.
int RunGenerate(const ModelFlags& flags, std::ostream& out, std::ostream& err,
                const TokenizerLoader& tokenizer_loader = DefaultTokenizerLoader());

}  // namespace sluice::cli

#endif  // SLUICE_CLI_MODEL_COMMAND_H_
