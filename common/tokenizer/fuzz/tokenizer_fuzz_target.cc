// libFuzzer target for tokenizer.json (BpeTokenizer::FromJson): the
// controller, the trainer and every rollout worker load the tokenizer of the
// model directory (or tokenizer_path) a run spec names. Arbitrary text must
// give an error, never a crash; a tokenizer that loads must then encode and
// decode text (its split regexes, normalisers, added tokens and merges all
// from the input) without crashing or hanging.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/tokenizer/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace tokenizer = sluice::tokenizer;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> loaded =
      tokenizer::BpeTokenizer::FromJson(input);
  if (!loaded.ok()) return 0;
  const tokenizer::BpeTokenizer& bpe = **loaded;
  // Prose, digits, code, whitespace runs, non-Latin scripts, ChatML markers
  // and invalid UTF-8, then the input's own tail (its tokens and patterns).
  const std::string texts[] = {
      "Hello world! What is 12 + 7? The answer is 19.\n\n",
      "def f(x):\n    return x ** 2  # squares   \t\r\n",
      "<|im_start|>user\nÉcrire 数学 题目 🙂 ½ ﬁ<|im_end|>\n<|endoftext|>",
      std::string("\xff\xfe\xc3(\xe2\x82 \x80\x00 a", 11),
      std::string(input.substr(input.size() > 256 ? input.size() - 256 : 0)),
  };
  for (const std::string& text : texts) {
    for (const bool allow_special : {true, false}) {
      const std::vector<int32_t> ids = bpe.Encode(text, allow_special);
      for (const int32_t id : ids) {
        if (id < 0 || id >= bpe.vocab_size()) __builtin_trap();
      }
      if (!bpe.Decode(ids).ok()) __builtin_trap();  // Its own ids always decode.
      (void)bpe.Decode(ids, /*skip_special=*/true);
    }
  }
  (void)bpe.Decode({-1, 0, 1, bpe.vocab_size(), 0x7fffffff});
  for (int32_t id = 0; id < bpe.vocab_size() && id < 512; ++id) {
    if (std::optional<std::string> token = bpe.IdToToken(id)) (void)bpe.TokenToId(*token);
    (void)bpe.IdToBytes(id);
  }
  (void)bpe.bos_id();
  (void)bpe.eos_id();
  return 0;
}
