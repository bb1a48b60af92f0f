#ifndef SLUICE_CLI_TOKENIZE_COMMAND_H_
#define SLUICE_CLI_TOKENIZE_COMMAND_H_

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

// `sluice tokenize --tokenizer tokenizer.json` and `sluice detokenize
// --tokenizer tokenizer.json`: a Hugging Face byte-level BPE tokenizer
// (common/tokenizer) as a JSONL filter, stdin to stdout.
//
//   tokenize:    {"text": "Hello world"}  ->  {"ids": [9707, 1879]}
//   detokenize:  {"ids": [9707, 1879]}    ->  {"text": "Hello world"}
//
// One output line per valid input line, in order; blank lines are skipped.
// No BOS/EOS is added. Special tokens written in the text ("<|im_end|>")
// become their ids unless --no-special. A decoded text that is not valid
// UTF-8 (ids that cut a character in two) is written with U+FFFD in place
// of the bad bytes, since JSON strings cannot hold them.
//
// A line that is not a JSON object with the right key (or whose ids are not
// all token ids) writes nothing to stdout and one line to stderr,
// "line N: <why>", and the command goes on; the exit code is then 1.
namespace sluice::cli {

struct TokenizeFlags {
  std::string tokenizer;    // Path of tokenizer.json.
  bool no_special = false;  // tokenize: special tokens in the text are plain text.
};

struct TokenizeCommands {
  CLI::App* tokenize = nullptr;
  CLI::App* detokenize = nullptr;
};

// Adds `tokenize` and `detokenize` to `app`, both parsing into `flags`.
// When one was given, call RunTokenize / RunDetokenize.
TokenizeCommands AddTokenizeCommands(CLI::App& app, TokenizeFlags* flags);

// Run the commands on `in`/`out`, errors on `err`. Exit code: 0; 1 when the
// tokenizer cannot be loaded (nothing is read) or some line was bad.
int RunTokenize(const TokenizeFlags& flags, std::istream& in, std::ostream& out, std::ostream& err);
int RunDetokenize(const TokenizeFlags& flags, std::istream& in, std::ostream& out,
                  std::ostream& err);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_TOKENIZE_COMMAND_H_
