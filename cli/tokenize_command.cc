#include "cli/tokenize_command.h"

#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "nlohmann/json.hpp"

namespace sluice::cli {
namespace {

using nlohmann::json;
using tokenizer::BpeTokenizer;

std::string Dump(const json& value) {
  // Replace, don't throw, should a string hold invalid UTF-8.
  return value.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

std::unique_ptr<BpeTokenizer> LoadTokenizer(const TokenizeFlags& flags, std::ostream& err) {
  if (flags.tokenizer.empty()) {
    err << "error: --tokenizer is required (a tokenizer.json file)\n";
    return nullptr;
  }
  absl::StatusOr<std::unique_ptr<BpeTokenizer>> tokenizer = BpeTokenizer::FromFile(flags.tokenizer);
  if (!tokenizer.ok()) {
    err << "error: cannot load tokenizer: " << tokenizer.status().message() << "\n";
    return nullptr;
  }
  return *std::move(tokenizer);
}

// Calls `handle(number, object)` for each non-blank line that is a JSON
// object; returns whether every line was good (`handle` returns an error
// message, empty when fine).
template <typename Handle>
bool ForEachObject(std::istream& in, std::ostream& err, const Handle& handle) {
  bool all_good = true;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json parsed = json::parse(line, nullptr, /*allow_exceptions=*/false);
    std::string problem;
    if (parsed.is_discarded()) {
      problem = "not valid JSON";
    } else if (!parsed.is_object()) {
      problem = "not a JSON object";
    } else {
      problem = handle(parsed);
    }
    if (!problem.empty()) {
      err << "line " << number << ": " << problem << "\n";
      all_good = false;
    }
  }
  return all_good;
}

}  // namespace

TokenizeCommands AddTokenizeCommands(CLI::App& app, TokenizeFlags* flags) {
  TokenizeCommands commands;
  commands.tokenize = app.add_subcommand(
      "tokenize", "Encode JSONL {\"text\": ...} on stdin to {\"ids\": [...]} on stdout");
  commands.tokenize->add_option("--tokenizer", flags->tokenizer, "Hugging Face tokenizer.json")
      ->required();
  commands.tokenize->add_flag("--no-special", flags->no_special,
                              "treat special tokens written in the text as plain text");
  commands.detokenize = app.add_subcommand(
      "detokenize", "Decode JSONL {\"ids\": [...]} on stdin to {\"text\": ...} on stdout");
  commands.detokenize->add_option("--tokenizer", flags->tokenizer, "Hugging Face tokenizer.json")
      ->required();
  return commands;
}

int RunTokenize(const TokenizeFlags& flags, std::istream& in, std::ostream& out,
                std::ostream& err) {
  const std::unique_ptr<BpeTokenizer> tokenizer = LoadTokenizer(flags, err);
  if (tokenizer == nullptr) return 1;
  const bool all_good = ForEachObject(in, err, [&](const json& object) -> std::string {
    auto text = object.find("text");
    if (text == object.end() || !text->is_string()) return "needs a string \"text\"";
    const std::vector<int32_t> ids =
        tokenizer->Encode(text->get_ref<const std::string&>(), !flags.no_special);
    json result = json::object();
    result["ids"] = ids;
    out << Dump(result) << "\n";
    return "";
  });
  out.flush();
  return all_good ? 0 : 1;
}

int RunDetokenize(const TokenizeFlags& flags, std::istream& in, std::ostream& out,
                  std::ostream& err) {
  const std::unique_ptr<BpeTokenizer> tokenizer = LoadTokenizer(flags, err);
  if (tokenizer == nullptr) return 1;
  const bool all_good = ForEachObject(in, err, [&](const json& object) -> std::string {
    auto ids_json = object.find("ids");
    if (ids_json == object.end() || !ids_json->is_array()) return "needs an array \"ids\"";
    std::vector<int32_t> ids;
    ids.reserve(ids_json->size());
    for (size_t i = 0; i < ids_json->size(); ++i) {
      const json& id = (*ids_json)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return "ids[" + std::to_string(i) + "]: " + Dump(id) + " is not a token id";
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    absl::StatusOr<std::string> text = tokenizer->Decode(ids);
    if (!text.ok()) return std::string(text.status().message());
    json result = json::object();
    result["text"] = *text;
    out << Dump(result) << "\n";
    return "";
  });
  out.flush();
  return all_good ? 0 : 1;
}

}  // namespace sluice::cli
