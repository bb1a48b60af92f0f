#include "common/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <queue>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "unicode/bytestream.h"
#include "unicode/normalizer2.h"
#include "unicode/stringpiece.h"
#include "unicode/utf8.h"

namespace sluice::tokenizer {
namespace {

using nlohmann::json;

// Ids above this are refused: tables are sized by the largest id.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// GPT-2's byte -> unicode table: printable Latin-1 bytes stand for
// themselves, the others are shifted to U+0100 and up, in byte order.
struct ByteLevelTable {
  UChar32 byte_to_char[256];
  int16_t char_to_byte[512];  // -1 when the character stands for no byte.

  ByteLevelTable() {
    std::fill(std::begin(char_to_byte), std::end(char_to_byte), -1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_char[b] = printable ? b : next++;
      char_to_byte[byte_to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTable& ByteLevel() {
  static const ByteLevelTable* table = new ByteLevelTable();
  return *table;
}

// A byte-level token string -> its raw bytes; nullopt when it holds a
// character that stands for no byte (or is not UTF-8).
std::optional<std::string> ByteLevelDecode(absl::string_view token) {
  const ByteLevelTable& table = ByteLevel();
  std::string bytes;
  bytes.reserve(token.size());
  const auto* data = reinterpret_cast<const uint8_t*>(token.data());
  const int32_t length = static_cast<int32_t>(token.size());
  int32_t i = 0;
  while (i < length) {
    UChar32 c;
    U8_NEXT(data, i, length, c);
    if (c < 0 || c >= 512 || table.char_to_byte[c] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(table.char_to_byte[c]));
  }
  return bytes;
}

absl::Status Invalid(absl::string_view path, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", message));
}

std::string TypeOf(const json& value) {
  if (value.is_object() && value.contains("type") && value["type"].is_string()) {
    return value["type"].get<std::string>();
  }
  return "";
}

// The optional boolean `key` of `object` (`fallback` when absent or null).
absl::StatusOr<bool> OptionalBool(const json& object, const char* key, bool fallback,
                                  absl::string_view path) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Invalid(absl::StrCat(path, ".", key), "must be a boolean");
  return it->get<bool>();
}

absl::StatusOr<int32_t> TokenId(const json& value, absl::string_view path) {
  if (!value.is_number_integer()) return Invalid(path, "id must be an integer");
  const int64_t id = value.get<int64_t>();
  if (id < 0 || id > kMaxTokenId) {
    return Invalid(path, absl::StrCat("id ", id, " is out of range [0, ", kMaxTokenId, "]"));
  }
  return static_cast<int32_t>(id);
}

absl::Status ParseNormalizer(const json& config, const std::string& path,
                             std::vector<const void*>* normalizers) {
  if (config.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    auto it = config.find("normalizers");
    if (it == config.end() || !it->is_array()) {
      return Invalid(path + ".normalizers", "must be an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      RETURN_IF_ERROR(
          ParseNormalizer((*it)[i], absl::StrCat(path, ".normalizers[", i, "]"), normalizers));
    }
    return absl::OkStatus();
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  if (type == "NFC") {
    normalizer = icu::Normalizer2::getNFCInstance(status);
  } else if (type == "NFD") {
    normalizer = icu::Normalizer2::getNFDInstance(status);
  } else if (type == "NFKC") {
    normalizer = icu::Normalizer2::getNFKCInstance(status);
  } else if (type == "NFKD") {
    normalizer = icu::Normalizer2::getNFKDInstance(status);
  } else {
    return Invalid(path + ".type", absl::StrCat("unsupported normalizer \"", type,
                                                "\" (supported: NFC, NFD, NFKC, NFKD, Sequence)"));
  }
  if (U_FAILURE(status) || normalizer == nullptr) {
    return absl::InternalError(
        absl::StrCat(path, ": ICU normalizer unavailable: ", u_errorName(status)));
  }
  normalizers->push_back(normalizer);
  return absl::OkStatus();
}

struct PreTokenizerConfig {
  std::vector<std::unique_ptr<Splitter>> splitters;
  bool byte_level = false;
  bool add_prefix_space = false;
};

absl::Status ParsePreTokenizer(const json& config, const std::string& path,
                               PreTokenizerConfig* out) {
  if (config.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(config);
  if (type == "Sequence") {
    auto it = config.find("pretokenizers");
    if (it == config.end() || !it->is_array()) {
      return Invalid(path + ".pretokenizers", "must be an array");
    }
    for (size_t i = 0; i < it->size(); ++i) {
      RETURN_IF_ERROR(
          ParsePreTokenizer((*it)[i], absl::StrCat(path, ".pretokenizers[", i, "]"), out));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    auto pattern = config.find("pattern");
    std::string regex;
    if (pattern != config.end() && pattern->is_object() && pattern->contains("Regex") &&
        (*pattern)["Regex"].is_string()) {
      regex = (*pattern)["Regex"].get<std::string>();
    } else if (pattern != config.end() && pattern->is_object() && pattern->contains("String") &&
               (*pattern)["String"].is_string()) {
      regex = QuoteRegex((*pattern)["String"].get<std::string>());
    } else {
      return Invalid(path + ".pattern", "must be {\"Regex\": string} or {\"String\": string}");
    }
    auto behavior = config.find("behavior");
    if (behavior == config.end() || !behavior->is_string() ||
        behavior->get<std::string>() != "Isolated") {
      return Invalid(path + ".behavior", absl::StrCat("only Isolated is supported, got ",
                                                      behavior == config.end() ? std::string("none")
                                                                               : behavior->dump()));
    }
    ASSIGN_OR_RETURN(const bool invert, OptionalBool(config, "invert", false, path));
    if (invert) return Invalid(path + ".invert", "inverted splits are not supported");
    absl::StatusOr<std::unique_ptr<Splitter>> splitter = MakeRegexSplitter(regex);
    if (!splitter.ok()) return Invalid(path + ".pattern", splitter.status().message());
    out->splitters.push_back(*std::move(splitter));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    out->byte_level = true;
    ASSIGN_OR_RETURN(out->add_prefix_space,
                     OptionalBool(config, "add_prefix_space", out->add_prefix_space, path));
    ASSIGN_OR_RETURN(const bool use_regex, OptionalBool(config, "use_regex", true, path));
    if (use_regex) {
      ASSIGN_OR_RETURN(std::unique_ptr<Splitter> splitter, MakeRegexSplitter(kGpt2Pattern));
      out->splitters.push_back(std::move(splitter));
    }
    return absl::OkStatus();
  }
  return Invalid(path + ".type", absl::StrCat("unsupported pre-tokenizer \"", type,
                                              "\" (supported: ByteLevel, Split, Sequence)"));
}

}  // namespace

// The special tokens a TemplateProcessing post-processor puts before the
// sequence of its "single" template (Llama-3: <|begin_of_text|>), looked up
// in its "special_tokens" (or, failing that, as tokens); a Sequence of
// processors is searched. Everything else adds nothing.
static absl::Status ParsePrefixIds(const json& processor, const std::string& path,
                                   const BpeTokenizer& tokenizer, std::vector<int32_t>* prefix) {
  if (!processor.is_object()) return absl::OkStatus();
  const std::string type = TypeOf(processor);
  if (type == "Sequence" && processor.contains("processors") &&
      processor["processors"].is_array()) {
    for (size_t i = 0; i < processor["processors"].size(); ++i) {
      RETURN_IF_ERROR(ParsePrefixIds(processor["processors"][i],
                                     absl::StrCat(path, ".processors[", i, "]"), tokenizer, prefix));
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing" || !processor.contains("single") ||
      !processor["single"].is_array()) {
    return absl::OkStatus();
  }
  for (const json& piece : processor["single"]) {
    if (!piece.is_object() || piece.contains("Sequence")) break;
    if (!piece.contains("SpecialToken")) continue;
    const std::string name = piece["SpecialToken"].value("id", "");
    const json* special = nullptr;
    if (processor.contains("special_tokens") && processor["special_tokens"].contains(name)) {
      special = &processor["special_tokens"][name];
    }
    if (special != nullptr && special->contains("ids") && (*special)["ids"].is_array()) {
      for (const json& id : (*special)["ids"]) prefix->push_back(id.get<int32_t>());
    } else if (std::optional<int32_t> id = tokenizer.TokenToId(name)) {
      prefix->push_back(*id);
    } else {
      return Invalid(absl::StrCat(path, ".single"),
                     absl::StrCat("special token \"", name, "\" is not a token"));
    }
  }
  for (int32_t id : *prefix) {
    if (!tokenizer.IdToToken(id).has_value()) {
      return Invalid(absl::StrCat(path, ".special_tokens"),
                     absl::StrCat("id ", id, " is not a token"));
    }
  }
  return absl::OkStatus();
}

BpeTokenizer::BpeTokenizer() { std::fill(std::begin(byte_id_), std::end(byte_id_), -1); }
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read tokenizer file ", path));
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer = FromJson(contents.str());
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(absl::string_view text) {
  const json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Invalid("tokenizer.json", "not valid JSON");
  if (!root.is_object()) return Invalid("tokenizer.json", "must be a JSON object");
  std::unique_ptr<BpeTokenizer> tokenizer(new BpeTokenizer());
  try {
    // model
    auto model_it = root.find("model");
    if (model_it == root.end() || !model_it->is_object()) {
      return Invalid("model", "missing (must be an object)");
    }
    const json& model = *model_it;
    if (model.contains("type")) {
      const std::string type = TypeOf(model);
      if (type != "BPE") {
        return Invalid("model.type", absl::StrCat("only BPE is supported, got ",
                                                  type.empty() ? model["type"].dump() : type));
      }
    }
    if (model.contains("dropout") && !model["dropout"].is_null()) {
      return Invalid("model.dropout", "BPE dropout is not supported");
    }
    ASSIGN_OR_RETURN(const bool byte_fallback,
                     OptionalBool(model, "byte_fallback", false, "model"));
    if (byte_fallback) return Invalid("model.byte_fallback", "byte_fallback is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      auto it = model.find(key);
      if (it != model.end() && !it->is_null() &&
          !(it->is_string() && it->get<std::string>().empty())) {
        return Invalid(absl::StrCat("model.", key), "must be empty (not supported)");
      }
    }
    ASSIGN_OR_RETURN(tokenizer->ignore_merges_,
                     OptionalBool(model, "ignore_merges", false, "model"));

    auto vocab_it = model.find("vocab");
    if (vocab_it == model.end() || !vocab_it->is_object()) {
      return Invalid("model.vocab", "missing (must be an object of token: id)");
    }
    int64_t max_id = -1;
    std::vector<std::pair<int32_t, std::string>> vocab;
    vocab.reserve(vocab_it->size());
    for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
      ASSIGN_OR_RETURN(const int32_t id,
                       TokenId(it.value(), absl::StrCat("model.vocab[\"", it.key(), "\"]")));
      vocab.emplace_back(id, it.key());
      max_id = std::max<int64_t>(max_id, id);
    }
    auto added_it = root.find("added_tokens");
    if (added_it != root.end() && !added_it->is_null() && !added_it->is_array()) {
      return Invalid("added_tokens", "must be an array");
    }
    std::vector<AddedToken> added;
    if (added_it != root.end() && added_it->is_array()) {
      for (size_t i = 0; i < added_it->size(); ++i) {
        const json& entry = (*added_it)[i];
        const std::string path = absl::StrCat("added_tokens[", i, "]");
        if (!entry.is_object()) return Invalid(path, "must be an object");
        if (!entry.contains("id")) return Invalid(path + ".id", "missing");
        ASSIGN_OR_RETURN(const int32_t id, TokenId(entry["id"], path + ".id"));
        if (!entry.contains("content") || !entry["content"].is_string() ||
            entry["content"].get<std::string>().empty()) {
          return Invalid(path + ".content", "must be a non-empty string");
        }
        ASSIGN_OR_RETURN(const bool special, OptionalBool(entry, "special", false, path));
        added.push_back(AddedToken{entry["content"].get<std::string>(), id, special});
        max_id = std::max<int64_t>(max_id, id);
      }
    }

    const size_t size = static_cast<size_t>(max_id + 1);
    tokenizer->id_to_token_.resize(size);
    tokenizer->id_to_bytes_.resize(size);
    tokenizer->id_kind_.assign(size, 0);
    tokenizer->token_to_id_.reserve(vocab.size());
    tokenizer->bytes_to_id_.reserve(vocab.size());
    for (auto& [id, token] : vocab) {
      if (tokenizer->id_kind_[id] != 0) {
        return Invalid(
            absl::StrCat("model.vocab[\"", token, "\"]"),
            absl::StrCat("id ", id, " is also used by \"", tokenizer->id_to_token_[id], "\""));
      }
      tokenizer->id_kind_[id] = 1;
      std::optional<std::string> bytes = ByteLevelDecode(token);
      if (bytes.has_value()) {
        tokenizer->bytes_to_id_.emplace(*bytes, id);
        if (bytes->size() == 1) tokenizer->byte_id_[static_cast<uint8_t>((*bytes)[0])] = id;
        tokenizer->id_to_bytes_[id] = *std::move(bytes);
      } else {
        tokenizer->id_to_bytes_[id] = token;  // Not byte-level: decodes verbatim.
      }
      tokenizer->token_to_id_.emplace(token, id);
      tokenizer->id_to_token_[id] = std::move(token);
    }
    vocab.clear();

    // Added tokens may reuse a vocab id (GPT-2's <|endoftext|>); they decode
    // to their content either way.
    tokenizer->added_by_first_byte_.resize(256);
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& token = added[i];
      if (tokenizer->added_to_id_.contains(token.content)) {
        return Invalid(absl::StrCat("added_tokens[", i, "].content"),
                       absl::StrCat("\"", token.content, "\" is declared twice"));
      }
      tokenizer->added_to_id_.emplace(token.content, token.id);
      tokenizer->id_kind_[token.id] = token.special ? 3 : 2;
      tokenizer->id_to_token_[token.id] = token.content;
      tokenizer->id_to_bytes_[token.id] = token.content;
      tokenizer->added_by_first_byte_[static_cast<uint8_t>(token.content[0])].push_back(
          static_cast<int32_t>(i));
    }
    tokenizer->added_tokens_ = std::move(added);
    for (std::vector<int32_t>& candidates : tokenizer->added_by_first_byte_) {
      std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
        return tokenizer->added_tokens_[a].content.size() >
               tokenizer->added_tokens_[b].content.size();
      });
    }

    // merges: "left right" strings or [left, right] pairs; rank = index.
    auto merges_it = model.find("merges");
    if (merges_it == model.end() || !merges_it->is_array()) {
      return Invalid("model.merges", "missing (must be an array)");
    }
    tokenizer->merges_.reserve(merges_it->size());
    for (size_t rank = 0; rank < merges_it->size(); ++rank) {
      const json& merge = (*merges_it)[rank];
      const std::string path = absl::StrCat("model.merges[", rank, "]");
      std::string left, right;
      if (merge.is_string()) {
        const std::string& both = merge.get_ref<const std::string&>();
        const size_t space = both.find(' ');
        if (space == std::string::npos || both.find(' ', space + 1) != std::string::npos) {
          return Invalid(path,
                         absl::StrCat("\"", both, "\" is not two tokens separated by a space"));
        }
        left = both.substr(0, space);
        right = both.substr(space + 1);
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        left = merge[0].get<std::string>();
        right = merge[1].get<std::string>();
      } else {
        return Invalid(path, "must be \"left right\" or [left, right]");
      }
      auto left_id = tokenizer->token_to_id_.find(left);
      auto right_id = tokenizer->token_to_id_.find(right);
      auto merged_id = tokenizer->token_to_id_.find(left + right);
      if (left_id == tokenizer->token_to_id_.end()) {
        return Invalid(path, absl::StrCat("\"", left, "\" is not in the vocab"));
      }
      if (right_id == tokenizer->token_to_id_.end()) {
        return Invalid(path, absl::StrCat("\"", right, "\" is not in the vocab"));
      }
      if (merged_id == tokenizer->token_to_id_.end()) {
        return Invalid(path,
                       absl::StrCat("the merged token \"", left, right, "\" is not in the vocab"));
      }
      const uint64_t key =
          (static_cast<uint64_t>(left_id->second) << 32) | static_cast<uint32_t>(right_id->second);
      // A repeated pair keeps its first (lowest) rank.
      tokenizer->merges_.emplace(key, Merge{static_cast<int32_t>(rank), merged_id->second});
    }
    tokenizer->num_merges_ = static_cast<int64_t>(merges_it->size());

    // normalizer, pre_tokenizer, decoder
    if (root.contains("normalizer")) {
      RETURN_IF_ERROR(ParseNormalizer(root["normalizer"], "normalizer", &tokenizer->normalizers_));
    }
    PreTokenizerConfig pre_tokenizer;
    if (root.contains("pre_tokenizer")) {
      RETURN_IF_ERROR(ParsePreTokenizer(root["pre_tokenizer"], "pre_tokenizer", &pre_tokenizer));
    }
    if (!pre_tokenizer.byte_level) {
      return Invalid("pre_tokenizer", "a byte-level BPE needs a ByteLevel pre-tokenizer");
    }
    tokenizer->splitters_ = std::move(pre_tokenizer.splitters);
    tokenizer->add_prefix_space_ = pre_tokenizer.add_prefix_space;
    if (root.contains("decoder") && !root["decoder"].is_null() &&
        TypeOf(root["decoder"]) != "ByteLevel") {
      return Invalid("decoder.type", absl::StrCat("only ByteLevel is supported, got \"",
                                                  TypeOf(root["decoder"]), "\""));
    }
    if (root.contains("post_processor")) {
      RETURN_IF_ERROR(ParsePrefixIds(root["post_processor"], "post_processor", *tokenizer,
                                     &tokenizer->prefix_ids_));
    }
  } catch (const json::exception& e) {
    return Invalid("tokenizer.json", e.what());
  }
  return tokenizer;
}

std::optional<std::string> BpeTokenizer::Normalize(absl::string_view text) const {
  bool ascii = true;
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return std::nullopt;  // ASCII is invariant under every normal form.
  std::string current(text);
  for (const void* opaque : normalizers_) {
    const auto* normalizer = static_cast<const icu::Normalizer2*>(opaque);
    std::string next;
    next.reserve(current.size());
    // Normalise each run of valid UTF-8; invalid bytes pass through as they are.
    const auto* data = reinterpret_cast<const uint8_t*>(current.data());
    const int32_t length = static_cast<int32_t>(current.size());
    int32_t run_start = 0;
    int32_t i = 0;
    auto flush = [&](int32_t end) {
      if (end <= run_start) return;
      UErrorCode status = U_ZERO_ERROR;
      icu::StringByteSink<std::string> sink(&next);
      normalizer->normalizeUTF8(0, icu::StringPiece(current.data() + run_start, end - run_start),
                                sink, nullptr, status);
      if (U_FAILURE(status)) next.append(current, run_start, end - run_start);
    };
    while (i < length) {
      const int32_t start = i;
      UChar32 c;
      U8_NEXT(data, i, length, c);
      if (c < 0) {
        flush(start);
        next.push_back(current[start]);
        i = start + 1;
        run_start = i;
      }
    }
    flush(length);
    current = std::move(next);
  }
  return current;
}

void BpeTokenizer::BytePairMerge(absl::string_view bytes, std::vector<int32_t>* ids) const {
  const int32_t n = static_cast<int32_t>(bytes.size());
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;  // n when last.
    bool alive;
  };
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = Symbol{byte_id_[static_cast<uint8_t>(bytes[i])], i - 1, i + 1, true};
  }
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right >= n) return;
    const int32_t left_id = symbols[left].id;
    const int32_t right_id = symbols[right].id;
    if (left_id < 0 || right_id < 0) return;
    auto it =
        merges_.find((static_cast<uint64_t>(left_id) << 32) | static_cast<uint32_t>(right_id));
    if (it == merges_.end()) return;
    queue.push(Candidate{it->second.rank, left, right, left_id, right_id, it->second.merged_id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i, i + 1);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    // Stale when either side has been merged into something else since.
    if (!left.alive || left.id != top.left_id || left.next != top.right) continue;
    Symbol& right = symbols[top.right];
    if (!right.alive || right.id != top.right_id) continue;
    left.id = top.merged_id;
    left.next = right.next;
    right.alive = false;
    if (right.next < n) symbols[right.next].prev = top.left;
    push_pair(left.prev, top.left);
    push_pair(top.left, left.next);
  }
  // Bytes missing from the vocab (none in a complete byte-level vocab) are
  // dropped, as tokenizers does without an unk token.
  for (int32_t i = 0; i < n; i = symbols[i].next) {
    if (symbols[i].id >= 0) ids->push_back(symbols[i].id);
  }
}

void BpeTokenizer::EncodePreToken(absl::string_view bytes, std::vector<int32_t>* ids) const {
  if (bytes.size() == 1) {
    const int32_t id = byte_id_[static_cast<uint8_t>(bytes[0])];
    if (id >= 0) ids->push_back(id);
    return;
  }
  if (ignore_merges_) {
    auto it = bytes_to_id_.find(bytes);
    if (it != bytes_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const bool cacheable = bytes.size() <= kMaxCachedPreTokenBytes;
  if (cacheable) {
    absl::MutexLock lock(&cache_mu_);
    auto it = cache_.find(bytes);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  BytePairMerge(bytes, ids);
  if (cacheable) {
    std::vector<int32_t> result(ids->begin() + static_cast<std::ptrdiff_t>(first), ids->end());
    absl::MutexLock lock(&cache_mu_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(bytes), std::move(result));
  }
}

void BpeTokenizer::EncodeOrdinary(absl::string_view text, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  std::optional<std::string> normalized;
  if (!normalizers_.empty()) normalized = Normalize(text);
  absl::string_view view = normalized.has_value() ? absl::string_view(*normalized) : text;
  std::string prefixed;
  if (add_prefix_space_ && !view.empty() && view[0] != ' ') {
    prefixed = absl::StrCat(" ", view);
    view = prefixed;
  }
  std::vector<absl::string_view> pieces = {view};
  std::vector<absl::string_view> next;
  for (const std::unique_ptr<Splitter>& splitter : splitters_) {
    next.clear();
    for (absl::string_view piece : pieces) splitter->Split(piece, &next);
    pieces.swap(next);
  }
  for (absl::string_view piece : pieces) {
    if (!piece.empty()) EncodePreToken(piece, ids);
  }
}

std::vector<int32_t> BpeTokenizer::Encode(absl::string_view text, bool allow_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  size_t start = 0;  // Start of the text not yet encoded.
  size_t i = 0;
  while (i < text.size() && !added_tokens_.empty()) {
    const std::vector<int32_t>& candidates = added_by_first_byte_[static_cast<uint8_t>(text[i])];
    const AddedToken* match = nullptr;
    for (int32_t index : candidates) {
      const AddedToken& token = added_tokens_[index];
      if (!allow_special && token.special) continue;
      if (absl::StartsWith(text.substr(i), token.content)) {
        match = &token;
        break;  // Longest first.
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    EncodeOrdinary(text.substr(start, i - start), &ids);
    ids.push_back(match->id);
    i += match->content.size();
    start = i;
  }
  EncodeOrdinary(text.substr(start), &ids);
  return ids;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(const std::vector<int32_t>& ids,
                                                  bool skip_special) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    const bool known = id >= 0 && id < vocab_size() && id_kind_[id] != 0;
    if (skip_special && (!known || id_kind_[id] == 3)) continue;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "]: ", id, " is not a token id (vocab size ", vocab_size(), ")"));
    }
    text += id_to_bytes_[id];
  }
  return text;
}

std::optional<int32_t> BpeTokenizer::TokenToId(absl::string_view token) const {
  if (auto it = added_to_id_.find(token); it != added_to_id_.end()) return it->second;
  if (auto it = token_to_id_.find(token); it != token_to_id_.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> BpeTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || id_kind_[id] == 0) return std::nullopt;
  return id_to_token_[id];
}

std::optional<std::string> BpeTokenizer::IdToBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || id_kind_[id] == 0) return std::nullopt;
  return id_to_bytes_[id];
}

bool BpeTokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && id_kind_[id] == 3;
}

std::optional<int32_t> BpeTokenizer::bos_id() const {
  for (const char* name : {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>"}) {
    if (auto it = added_to_id_.find(name); it != added_to_id_.end()) return it->second;
  }
  return std::nullopt;
}

std::optional<int32_t> BpeTokenizer::eos_id() const {
  for (const char* name :
       {"<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    if (auto it = added_to_id_.find(name); it != added_to_id_.end()) return it->second;
  }
  return std::nullopt;
}

}  // namespace sluice::tokenizer
