#include "cli/score_command.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/proto_convert.h"
#include "reward_server/scorer.h"
#include "services/clients/clients.h"
#include "services/clients/grpc_clients.h"

namespace sluice::cli {
namespace {

using nlohmann::json;

std::string ErrorKindName(v1::VerifierError kind) {
  std::string name = v1::VerifierError_Name(kind);
  constexpr absl::string_view kPrefix = "VERIFIER_ERROR_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  absl::AsciiStrToLower(&name);
  return name;
}

json ResultJson(const v1::VerifierResult& result) {
  json out = json::object();
  out["reward"] = result.reward();
  out["error_kind"] = ErrorKindName(result.error_kind());
  out["extracted_answer"] = result.extracted_answer();
  out["detail"] = result.detail();
  out["verifier"] = result.verifier_name();
  out["duration_ms"] = result.duration_ms();
  if (result.tests_total() > 0) {
    out["tests_passed"] = result.tests_passed();
    out["tests_total"] = result.tests_total();
  }
  if (result.components_size() > 0) {
    json components = json::array();
    for (const v1::VerifierResult& component : result.components()) {
      json entry = ResultJson(component);
      entry["weight"] = component.weight();
      components.push_back(std::move(entry));
    }
    out["components"] = std::move(components);
  }
  return out;
}

// A JSON value as the string a verifier field expects: strings as they are,
// anything else in its JSON spelling (a numeric reference 42 -> "42").
std::string AsText(const json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// One input line: either an item to score, or the reason it cannot be one.
struct Line {
  int64_t number = 0;
  json object;                // The parsed input (null when not an object).
  std::string raw;            // Kept only when `object` is null.
  std::string invalid;        // Non-empty: why this line is not scored.
  std::optional<v1::ScoreItem> item;
};

Line ParseLine(int64_t number, const std::string& text, const ScoreFlags& flags) {
  Line line;
  line.number = number;
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    line.raw = text;
    line.invalid = parsed.is_discarded() ? "not valid JSON" : "not a JSON object";
    return line;
  }
  line.object = std::move(parsed);
  const json& o = line.object;
  const auto field = [&o](const char* name) -> std::optional<std::string> {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return std::nullopt;
    return AsText(*it);
  };
  std::optional<std::string> response = field("response");
  if (!response.has_value()) {
    line.invalid = "no \"response\"";
    return line;
  }
  v1::ScoreItem item;
  item.set_item_id(absl::StrCat(number));
  item.set_response(*std::move(response));
  item.set_verifier(field("verifier").value_or(flags.verifier));
  // The reference is an answer unless the line says it is a solution, or
  // gives only a "solution".
  if (auto reference = field("reference")) {
    item.set_reference_answer(*reference);
  } else if (auto reference_answer = field("reference_answer")) {
    item.set_reference_answer(*reference_answer);
  } else if (auto solution = field("solution")) {
    item.set_reference_answer(*solution);
    item.set_reference_is_solution(true);
  }
  if (auto it = o.find("reference_is_solution"); it != o.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      line.invalid = "\"reference_is_solution\" must be true or false";
      return line;
    }
    item.set_reference_is_solution(it->get<bool>());
  }
  if (auto prompt = field("prompt")) item.set_prompt(*prompt);
  if (auto test = field("test")) item.set_test(*test);
  if (auto entry_point = field("entry_point")) item.set_entry_point(*entry_point);
  item.set_timeout_ms(flags.timeout_ms);
  if (auto it = o.find("timeout_ms"); it != o.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      line.invalid = "\"timeout_ms\" must be an integer >= 0";
      return line;
    }
    item.set_timeout_ms(it->get<int64_t>());
  }
  if (auto it = o.find("metadata"); it != o.end() && !it->is_null()) {
    if (!it->is_object()) {
      line.invalid = "\"metadata\" must be an object";
      return line;
    }
    for (const auto& [key, value] : it->items()) (*item.mutable_metadata())[key] = AsText(value);
  }
  line.item = std::move(item);
  return line;
}

void WriteLine(const Line& line, const v1::VerifierResult* result, std::ostream& out,
               ScoreSummary* summary) {
  json written = line.object.is_object() ? line.object : json::object();
  if (!line.object.is_object()) {
    written["line"] = line.number;
    written["input"] = line.raw;
  }
  if (result != nullptr) {
    json scored = ResultJson(*result);  // Named: items() would dangle on a temporary.
    for (auto& [key, value] : scored.items()) written[key] = std::move(value);
    const std::string kind = ErrorKindName(result->error_kind());
    ++summary->error_kinds[kind];
    summary->reward_sum += result->reward();
    auto& verifier = summary->by_verifier[result->verifier_name()];
    ++verifier.first;
    verifier.second += result->reward();
  } else {
    written["reward"] = 0.0;
    written["error_kind"] = "invalid_input";
    written["detail"] = absl::StrCat("line ", line.number, ": ", line.invalid);
    ++summary->invalid_lines;
    ++summary->error_kinds["invalid_input"];
  }
  // Invalid UTF-8 in a response is replaced rather than failing the dump.
  out << written.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
}

absl::Status Flush(std::vector<Line>* pending, const std::vector<v1::WeightedVerifier>& composition,
                   const ScoreBatchFn& score, std::ostream& out, ScoreSummary* summary) {
  if (pending->empty()) return absl::OkStatus();
  v1::ScoreBatchRequest request;
  for (const auto& entry : composition) *request.add_composition() = entry;
  for (const Line& line : *pending) {
    if (line.item.has_value()) *request.add_items() = *line.item;
  }
  v1::ScoreBatchResponse response;
  if (request.items_size() > 0) {
    absl::StatusOr<v1::ScoreBatchResponse> scored = score(request);
    if (!scored.ok()) return scored.status();
    if (scored->results_size() != request.items_size()) {
      return absl::InternalError(absl::StrCat("the scorer answered ", scored->results_size(),
                                              " results for ", request.items_size(), " items"));
    }
    response = *std::move(scored);
  }
  int next = 0;
  for (const Line& line : *pending) {
    WriteLine(line, line.item.has_value() ? &response.results(next++).result() : nullptr, out,
              summary);
  }
  out.flush();
  pending->clear();
  if (!out) return absl::DataLossError("writing the output failed");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<v1::WeightedVerifier>> ParseComposition(const std::string& text) {
  std::vector<v1::WeightedVerifier> composition;
  if (absl::StripAsciiWhitespace(text).empty()) return composition;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    std::pair<absl::string_view, absl::string_view> parts = absl::StrSplit(entry, ':');
    v1::WeightedVerifier verifier;
    verifier.set_name(std::string(absl::StripAsciiWhitespace(parts.first)));
    double weight = 1.0;
    if (!parts.second.empty() &&
        (!absl::SimpleAtod(parts.second, &weight) || !(weight > 0) || weight > 1e9)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--composition: \"", entry, "\": the weight must be a number > 0"));
    }
    if (verifier.name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--composition: \"", entry, "\": want NAME or NAME:WEIGHT"));
    }
    verifier.set_weight(weight);
    composition.push_back(std::move(verifier));
  }
  return composition;
}

absl::StatusOr<ScoreSummary> ScoreJsonl(const ScoreFlags& flags, std::istream& in,
                                        std::ostream& out, const ScoreBatchFn& score) {
  absl::StatusOr<std::vector<v1::WeightedVerifier>> composition =
      ParseComposition(flags.composition);
  if (!composition.ok()) return composition.status();
  ScoreSummary summary;
  std::vector<Line> pending;
  std::string text;
  int64_t number = 0;
  const size_t batch = static_cast<size_t>(std::max(1, flags.batch_size));
  while (std::getline(in, text)) {
    ++number;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (absl::StripAsciiWhitespace(text).empty()) continue;
    ++summary.lines;
    pending.push_back(ParseLine(number, text, flags));
    if (pending.size() >= batch) {
      if (absl::Status flushed = Flush(&pending, *composition, score, out, &summary);
          !flushed.ok()) {
        return flushed;
      }
    }
  }
  if (in.bad()) return absl::DataLossError("reading the input failed");
  if (absl::Status flushed = Flush(&pending, *composition, score, out, &summary); !flushed.ok()) {
    return flushed;
  }
  return summary;
}

CLI::App* AddScoreCommand(CLI::App& app, ScoreFlags* flags) {
  CLI::App* command = app.add_subcommand(
      "score",
      "Score JSONL records offline with the reward server's verifiers (math, code, format, "
      "length, exact_match), writing each line back with \"reward\" and details. A line's "
      "\"reference\" is the bare answer, compared as a whole; a full worked solution goes in "
      "\"solution\" (or \"reference\" with \"reference_is_solution\": true) and has its "
      "final answer extracted");
  command->add_option("--input", flags->input, "input JSONL, or - for stdin")->required();
  command->add_option("--output", flags->output, "output JSONL, or - for stdout")->required();
  command->add_option("--verifier", flags->verifier,
                      "verifier for lines without a \"verifier\" key");
  command->add_option("--composition", flags->composition,
                      "weighted composition for lines without a verifier, e.g. math:1,format:0.1");
  command->add_option("--target", flags->target,
                      "score on the reward server at HOST:PORT instead of in this process");
  command->add_option("--workers", flags->workers, "verifier threads (in-process scoring)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  command->add_option("--batch-size", flags->batch_size, "lines per scoring batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  command->add_option("--timeout-ms", flags->timeout_ms,
                      "deadline per item; 0 = each verifier's default (math 5 s, code 10 s)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_flag("--quiet", flags->quiet, "no summary on stderr");
  return command;
}

int RunScore(const ScoreFlags& flags, std::ostream& err) {
  std::ifstream in_file;
  std::istream* in = &std::cin;
  if (flags.input != "-") {
    in_file.open(flags.input);
    if (!in_file) {
      err << "sluice score: cannot open --input " << flags.input << ": " << std::strerror(errno)
          << "\n";
      return 1;
    }
    in = &in_file;
  }
  std::ofstream out_file;
  std::ostream* out = &std::cout;
  if (flags.output != "-") {
    out_file.open(flags.output, std::ios::trunc);
    if (!out_file) {
      err << "sluice score: cannot open --output " << flags.output << ": "
          << std::strerror(errno) << "\n";
      return 1;
    }
    out = &out_file;
  }

  ScoreBatchFn score;
  std::shared_ptr<reward_server::Scorer> scorer;
  std::shared_ptr<clients::RewardClient> client;
  if (flags.target.empty()) {
    // One prepared sandbox per scoring thread.
    reward_server::BuiltinVerifierOptions verifiers;
    verifiers.code.sandbox_slots = std::clamp(flags.workers, 1, 1024);
    absl::StatusOr<reward_server::VerifierRegistry> registry =
        reward_server::MakeBuiltinVerifierRegistry(verifiers);
    if (!registry.ok()) {
      err << "sluice score: " << registry.status().message() << "\n";
      return 1;
    }
    reward_server::ScorerOptions options;
    options.num_workers = flags.workers;
    absl::StatusOr<std::unique_ptr<reward_server::Scorer>> created = reward_server::Scorer::Create(
        std::make_shared<const reward_server::VerifierRegistry>(*std::move(registry)), options);
    if (!created.ok()) {
      err << "sluice score: " << created.status().message() << "\n";
      return 1;
    }
    scorer = *std::move(created);
    score = [scorer](const v1::ScoreBatchRequest& request)
        -> absl::StatusOr<v1::ScoreBatchResponse> {
      std::vector<reward_server::ScoreItem> items;
      items.reserve(request.items_size());
      for (const v1::ScoreItem& item : request.items()) {
        items.push_back(reward_server::ScoreItemFromProto(item));
      }
      absl::StatusOr<reward_server::BatchScores> scores = scorer->ScoreBatch(
          std::move(items), reward_server::CompositionFromProto(request.composition()));
      if (!scores.ok()) return scores.status();
      v1::ScoreBatchResponse response;
      reward_server::BatchScoresToProto(*scores, &response);
      return response;
    };
  } else {
    client = clients::NewGrpcRewardClient(flags.target);
    score = [client, target = flags.target](const v1::ScoreBatchRequest& request)
        -> absl::StatusOr<v1::ScoreBatchResponse> {
      absl::StatusOr<v1::ScoreBatchResponse> response =
          client->ScoreBatch(request, absl::Seconds(300));
      if (!response.ok()) {
        return absl::Status(response.status().code(),
                            absl::StrCat("the reward server at ", target, ": ",
                                         response.status().message()));
      }
      return response;
    };
  }

  const absl::Time start = absl::Now();
  absl::StatusOr<ScoreSummary> summary = ScoreJsonl(flags, *in, *out, score);
  if (scorer != nullptr) scorer->Shutdown();
  if (!summary.ok()) {
    err << "sluice score: " << summary.status().message() << "\n";
    return 1;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!flags.quiet) {
    const int64_t written = summary->lines;
    err << absl::StrFormat("sluice score: %d lines in %.1f s, mean reward %.4f\n", written,
                           seconds, written > 0 ? summary->reward_sum / written : 0.0);
    for (const auto& [verifier, stats] : summary->by_verifier) {
      err << absl::StrFormat("  %-12s %6d lines, mean reward %.4f\n",
                             verifier.empty() ? "(none)" : verifier, stats.first,
                             stats.second / std::max<int64_t>(1, stats.first));
    }
    std::string kinds;
    for (const auto& [kind, count] : summary->error_kinds) {
      absl::StrAppend(&kinds, kinds.empty() ? "" : ", ", kind, " ", count);
    }
    err << "  error kinds: " << kinds << "\n";
  }
  if (summary->invalid_lines > 0) {
    err << "sluice score: " << summary->invalid_lines
        << " line(s) were not valid input; see their \"detail\"\n";
    return 3;
  }
  return 0;
}

}  // namespace sluice::cli
