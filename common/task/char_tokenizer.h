#ifndef SLUICE_COMMON_TASK_CHAR_TOKENIZER_H_
#define SLUICE_COMMON_TASK_CHAR_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::task {

// The built-in models' tokenizer: one token per character of a small fixed
// alphabet, plus special tokens. Ids are stable (they are baked into
// checkpoints):
//   0 <pad>, 1 <bos>, 2 <eos>, then the alphabet in order:
//   "0123456789+-*=() .,?:" (3..23)
// Thread-safe (immutable).
class CharTokenizer {
 public:
  static constexpr int32_t kPadId = 0;
  static constexpr int32_t kBosId = 1;
  static constexpr int32_t kEosId = 2;

  CharTokenizer();

  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.size()); }
  int32_t pad_id() const { return kPadId; }
  int32_t bos_id() const { return kBosId; }
  int32_t eos_id() const { return kEosId; }

  // Error (INVALID_ARGUMENT) naming the first character outside the alphabet
  // and its byte offset.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;
  // Special tokens decode to nothing; ids out of range are an error.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;
  // The token's string ("<eos>" for specials); "" when out of range.
  std::string IdToToken(int32_t id) const;

  // This tokenizer as a Hugging Face tokenizer.json: a byte-level BPE with
  // the same ids, no merges, and the three specials as added special tokens
  // (so Encode of alphabet text gives the same ids; characters outside the
  // alphabet are dropped there, as `tokenizers` does without an unk token).
  // It is what makes a built-in model an ordinary Hugging Face directory.
  std::string ToHfTokenizerJson() const;

 private:
  std::vector<std::string> vocab_;
  int32_t char_to_id_[256];
};

}  // namespace sluice::task

#endif  // SLUICE_COMMON_TASK_CHAR_TOKENIZER_H_
