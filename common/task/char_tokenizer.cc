#include "common/task/char_tokenizer.h"

#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sluice::task {
namespace {

// Order is the id order (3, 4, ...): changing it breaks every checkpoint.
constexpr char kAlphabet[] = "0123456789+-*=() .,?:";

// "'a'" for printable characters, "byte 0x07" otherwise.
std::string DescribeByte(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return absl::StrCat("'", std::string(1, static_cast<char>(c)), "'");
  char hex[8];
  std::snprintf(hex, sizeof(hex), "0x%02x", c);
  return absl::StrCat("byte ", hex);
}

}  // namespace

CharTokenizer::CharTokenizer() {
  vocab_ = {"<pad>", "<bos>", "<eos>"};
  for (int i = 0; i < 256; ++i) char_to_id_[i] = -1;
  for (const char* p = kAlphabet; *p != '\0'; ++p) {
    char_to_id_[static_cast<unsigned char>(*p)] = static_cast<int32_t>(vocab_.size());
    vocab_.emplace_back(1, *p);
  }
}

absl::StatusOr<std::vector<int32_t>> CharTokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const int32_t id = char_to_id_[c];
    if (id < 0) {
      return absl::InvalidArgumentError(absl::StrCat("character ", DescribeByte(c), " at offset ",
                                                     i, " is not in the tokenizer's alphabet \"",
                                                     kAlphabet, "\""));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::string> CharTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at index ", i,
                                                     " is out of range [0, ", vocab_size(), ")"));
    }
    if (id <= kEosId) continue;  // specials decode to nothing
    text += vocab_[id];
  }
  return text;
}

std::string CharTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return vocab_[id];
}

std::string CharTokenizer::ToHfTokenizerJson() const {
  using nlohmann::ordered_json;
  ordered_json added = ordered_json::array();
  ordered_json vocab = ordered_json::object();
  for (int32_t id = 0; id < vocab_size(); ++id) {
    std::string token = vocab_[id];
    if (id <= kEosId) {
      added.push_back({{"id", id},
                       {"content", token},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", true}});
    } else if (token == " ") {
      token = "\xc4\xa0";  // U+0120 'Ġ': the GPT-2 byte-level spelling of a space.
    }
    // Every other alphabet character is printable ASCII, which the
    // byte-level table maps to itself.
    vocab[token] = id;
  }
  const ordered_json byte_level = {{"type", "ByteLevel"},
                                   {"add_prefix_space", false},
                                   {"trim_offsets", true},
                                   {"use_regex", false}};
  const ordered_json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level},
      {"post_processor", nullptr},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", ordered_json::array()}}}};
  return root.dump(2);
}

}  // namespace sluice::task
