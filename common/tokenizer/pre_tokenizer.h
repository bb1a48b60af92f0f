#ifndef SLUICE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define SLUICE_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::tokenizer {

// The split patterns of the models we know (Hugging Face `tokenizers`
// syntax, i.e. Oniguruma's).
inline constexpr absl::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr absl::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// What a ByteLevel pre-tokenizer with use_regex splits by.
inline constexpr absl::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One split stage: cuts a piece of text into pre-tokens.
class Splitter {
 public:
  virtual ~Splitter() = default;
  // Appends the pre-tokens of `text` to `out`: non-empty views into `text`
  // that cover it, in order, with nothing left out. Any bytes are accepted:
  // an invalid UTF-8 byte is one character, classified as U+FFFD.
  // Thread-safe.
  virtual void Split(absl::string_view text, std::vector<absl::string_view>* out) const = 0;
};

// A Split pre-tokenizer with behavior Isolated: every match of `pattern` is a
// pre-token, and so is every gap between matches. `pattern` is in Oniguruma
// syntax as tokenizers writes it; it runs on ICU's regex engine, with \s and
// \S meaning Unicode White_Space (as in Oniguruma) rather than ICU's
// narrower set. For kQwen2Pattern and kLlama3Pattern a hand-written scanner
// gives the same splits several times faster (unless `allow_fast_path` is
// false, which tests use to compare the two). INVALID_ARGUMENT when ICU
// cannot compile the pattern. A match that backtracks past ICU's time limit
// (a pathological pattern, ~10^7 engine operations) ends the splitting: the
// rest of the text is one pre-token, so that no tokenizer.json can hang
// encoding.
absl::StatusOr<std::unique_ptr<Splitter>> MakeRegexSplitter(absl::string_view pattern,
                                                            bool allow_fast_path = true);

// Quotes `literal` so that it matches itself as a pattern (a Split with a
// String pattern).
std::string QuoteRegex(absl::string_view literal);

}  // namespace sluice::tokenizer

#endif  // SLUICE_COMMON_TOKENIZER_PRE_TOKENIZER_H_
