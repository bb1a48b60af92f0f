#ifndef SLUICE_COMMON_TOKENIZER_BPE_TOKENIZER_H_
#define SLUICE_COMMON_TOKENIZER_BPE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace sluice::tokenizer {

// A byte-level BPE tokenizer (GPT-2 / Qwen2 / Llama-3 style) loaded from a
// Hugging Face `tokenizers` JSON file, giving the same ids as that library
// (checked against llama.cpp's oracle cases for Qwen2 and Llama-3).
//
// Encode runs the same pipeline as `tokenizers`:
//   1. added tokens (`added_tokens`) are cut out first, leftmost-longest, and
//      kept whole as their own ids;
//   2. every other piece is normalised (`normalizer`: null, NFC, NFD, NFKC,
//      NFKD or a Sequence of those);
//   3. split into pre-tokens (`pre_tokenizer`: Split with a Regex or String
//      pattern and behavior Isolated, ByteLevel with or without its GPT-2
//      regex, or a Sequence of those);
//   4. each pre-token's bytes are mapped through the GPT-2 byte->unicode
//      table and merged by BPE, lowest merge rank first (with
//      `ignore_merges`, a pre-token that is itself in the vocab is one id).
// Decode maps ids back to their exact bytes (the `decoder` must be null or
// ByteLevel), so Decode(Encode(text)) == text for every input, invalid UTF-8
// included, when there is no normalizer; with one it is the normalised text
// (Qwen2: NFC), for which the same holds.
//
// Not supported (FromJson rejects them with INVALID_ARGUMENT naming the JSON
// path): models other than BPE, BPE dropout, byte_fallback,
// continuing_subword_prefix / end_of_word_suffix, other normalizers and
// pre-tokenizers. Read but not applied by Encode: `post_processor` (no
// BOS/EOS is ever added; prefix_ids() says what it would prepend), the
// added-token flags lstrip/rstrip/single_word/normalized (every added token is
// matched on the raw text, which is what Qwen2 and Llama-3 declare).
//
// Invalid UTF-8 in the input never fails: each invalid byte is its own
// character (classified like U+FFFD for the split regex) and is kept as is by
// normalisation, so its byte still gets its byte-level token.
//
// Thread-safe: every method is const; Encode shares a bounded cache of
// pre-token results behind a mutex.
class BpeTokenizer {
 public:
  // Reads and parses `path` (see FromJson). NOT_FOUND when the file cannot
  // be read.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromFile(const std::string& path);
  // Parses tokenizer.json text. INVALID_ARGUMENT, naming the JSON path, for
  // malformed JSON, unsupported components, merges whose parts or result are
  // not in the vocab, duplicate ids.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromJson(absl::string_view json);

  ~BpeTokenizer();
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  // Text -> ids, no BOS/EOS added. With `allow_special` false, special added
  // tokens in `text` are not recognised and are encoded as ordinary text
  // (non-special added tokens still are). O(n) in the text length plus BPE
  // cost per distinct pre-token (cached).
  std::vector<int32_t> Encode(absl::string_view text, bool allow_special = true) const;

  // Ids -> the exact bytes. Added tokens decode to their content.
  // INVALID_ARGUMENT naming the first id that is not a token. With
  // `skip_special` (what a generated completion's text wants, as
  // transformers' skip_special_tokens), special added tokens decode to
  // nothing and so do ids that are no token at all (a model's embedding
  // often has more rows than its tokenizer has tokens), so it never fails.
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids,
                                     bool skip_special = false) const;

  // Token string (as spelled in tokenizer.json: byte-level for the vocab,
  // verbatim for added tokens) <-> id.
  std::optional<int32_t> TokenToId(absl::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // The raw bytes token `id` decodes to; nullopt when not a token.
  std::optional<std::string> IdToBytes(int32_t id) const;

  // One past the largest id (vocab and added tokens together).
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  // Whether `id` is an added token declared "special".
  bool IsSpecial(int32_t id) const;

  // The first of the usual names present as an added token; nullopt when none.
  //   bos: <|begin_of_text|>, <s>, <|startoftext|>, <bos>
  //   eos: <|im_end|>, <|eot_id|>, <|endoftext|>, <|end_of_text|>, </s>, <eos>
  // (<bos> / <eos> are the built-in models' character tokenizer's.)
  // (Chat-tuned Qwen2 and Llama-3 end a turn with <|im_end|> / <|eot_id|>;
  // a run that needs a different stop token should look it up by name.)
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  // The ids the tokenizer's post-processor puts before every encoded text
  // (a TemplateProcessing "single" template, alone or in a Sequence:
  // Llama-3's <|begin_of_text|>); empty when it adds none (Qwen2). Encode
  // never adds them: a caller encoding a model's prompt prepends them, as
  // transformers does with add_special_tokens.
  const std::vector<int32_t>& prefix_ids() const { return prefix_ids_; }

  // Number of merges (their rank is their index in tokenizer.json).
  int64_t num_merges() const { return num_merges_; }

 private:
  struct AddedToken {
    std::string content;
    int32_t id = 0;
    bool special = false;
  };
  struct Merge {
    int32_t rank = 0;
    int32_t merged_id = 0;
  };

  BpeTokenizer();

  // Appends the ids of one normalised, pre-tokenized piece.
  void EncodePreToken(absl::string_view bytes, std::vector<int32_t>* ids) const;
  // BPE over the bytes of one pre-token (no cache).
  void BytePairMerge(absl::string_view bytes, std::vector<int32_t>* ids) const;
  // Normalises, pre-tokenizes and BPE-encodes text holding no added token.
  void EncodeOrdinary(absl::string_view text, std::vector<int32_t>* ids) const;
  std::optional<std::string> Normalize(absl::string_view text) const;

  // Every id: its token string, and whether it is a token at all.
  std::vector<std::string> id_to_token_;
  std::vector<std::string> id_to_bytes_;
  std::vector<uint8_t> id_kind_;  // 0 none, 1 vocab, 2 added, 3 added special.
  absl::flat_hash_map<std::string, int32_t> token_to_id_;  // Vocab tokens.
  absl::flat_hash_map<std::string, int32_t> bytes_to_id_;  // Raw bytes -> vocab id.
  int32_t byte_id_[256];  // Vocab id of each single byte; -1 when absent.
  // (left id << 32 | right id) -> merge.
  absl::flat_hash_map<uint64_t, Merge> merges_;
  int64_t num_merges_ = 0;
  std::vector<int32_t> prefix_ids_;
  bool ignore_merges_ = false;

  std::vector<AddedToken> added_tokens_;
  // First byte -> indices into added_tokens_, longest content first.
  std::vector<std::vector<int32_t>> added_by_first_byte_;
  absl::flat_hash_map<std::string, int32_t> added_to_id_;

  // Normalisers applied in order (ICU Normalizer2 instances, not owned).
  std::vector<const void*> normalizers_;
  // Split stages applied in order; none = the whole piece is one pre-token.
  std::vector<std::unique_ptr<Splitter>> splitters_;
  bool add_prefix_space_ = false;  // ByteLevel's add_prefix_space.

  static constexpr size_t kMaxCacheEntries = 1 << 16;
  static constexpr size_t kMaxCachedPreTokenBytes = 256;
  mutable absl::Mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_ ABSL_GUARDED_BY(cache_mu_);
};

}  // namespace sluice::tokenizer

#endif  // SLUICE_COMMON_TOKENIZER_BPE_TOKENIZER_H_
