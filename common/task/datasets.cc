#include "common/task/datasets.h"

#include <zlib.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace sluice::task {
namespace {

using nlohmann::json;

absl::Status RowError(int64_t line, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", message));
}

// The string column `name` of `row`; an error naming it when it is missing or
// not a string.
absl::StatusOr<std::string> Column(const json& row, const std::string& name, int64_t line) {
  auto it = row.find(name);
  if (it == row.end() || it->is_null()) return RowError(line, absl::StrCat("no \"", name, "\" column"));
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number()) return it->dump();  // A numeric answer column: 42.
  return RowError(line, absl::StrCat("column \"", name, "\" is not a string"));
}

void CopyOtherStrings(const json& row, std::initializer_list<absl::string_view> skip,
                      std::map<std::string, std::string>* metadata) {
  for (const auto& [key, value] : row.items()) {
    bool skipped = false;
    for (absl::string_view s : skip) skipped |= key == s;
    if (!skipped && value.is_string()) (*metadata)[key] = value.get<std::string>();
  }
}

}  // namespace

absl::string_view DatasetKindName(DatasetKind kind) {
  switch (kind) {
    case DatasetKind::kJsonl:
      return "jsonl";
    case DatasetKind::kGsm8k:
      return "gsm8k";
    case DatasetKind::kMath:
      return "math";
    case DatasetKind::kHumanEval:
      return "humaneval";
  }
  return "unknown";
}

absl::StatusOr<DatasetKind> ParseDatasetKind(absl::string_view name) {
  for (DatasetKind kind :
       {DatasetKind::kJsonl, DatasetKind::kGsm8k, DatasetKind::kMath, DatasetKind::kHumanEval}) {
    if (absl::AsciiStrToLower(name) == DatasetKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dataset format \"", name, "\" (want jsonl, gsm8k, math or humaneval)"));
}

std::optional<std::string> Gsm8kFinalAnswer(absl::string_view solution) {
  const size_t marker = solution.rfind("####");
  if (marker == absl::string_view::npos) return std::nullopt;
  std::string answer(absl::StripAsciiWhitespace(solution.substr(marker + 4)));
  std::string cleaned;
  for (size_t i = 0; i < answer.size(); ++i) {
    // "1,234" -> "1234"; a comma between digits only.
    if (answer[i] == ',' && i > 0 && i + 1 < answer.size() && absl::ascii_isdigit(answer[i - 1]) &&
        absl::ascii_isdigit(answer[i + 1])) {
      continue;
    }
    cleaned.push_back(answer[i]);
  }
  if (cleaned.empty()) return std::nullopt;
  return cleaned;
}

std::optional<std::string> LastBoxedContent(absl::string_view text) {
  // The balanced body starting at `open`, or nullopt when it never closes.
  const auto body = [text](size_t open) -> std::optional<std::string> {
    int depth = 1;
    for (size_t i = open; i < text.size(); ++i) {
      if (text[i] == '{') ++depth;
      if (text[i] == '}' && --depth == 0) return std::string(text.substr(open, i - open));
    }
    return std::nullopt;
  };
  // Scan backwards for the last marker of either kind that is balanced.
  size_t from = text.size();
  while (from > 0) {
    size_t boxed = text.rfind("\\boxed{", from - 1);
    size_t fbox = text.rfind("\\fbox{", from - 1);
    size_t at = absl::string_view::npos;
    size_t open = 0;
    if (boxed != absl::string_view::npos && (fbox == absl::string_view::npos || boxed > fbox)) {
      at = boxed;
      open = boxed + 7;
    } else if (fbox != absl::string_view::npos) {
      at = fbox;
      open = fbox + 6;
    }
    if (at == absl::string_view::npos) return std::nullopt;
    if (std::optional<std::string> found = body(open)) return found;
    from = at;
  }
  return std::nullopt;
}

absl::StatusOr<DatasetRecord> ParseDatasetRow(absl::string_view json_text, DatasetKind kind,
                                              int64_t line, const DatasetReadOptions& options) {
  json row = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (row.is_discarded()) return RowError(line, "not valid JSON");
  if (!row.is_object()) return RowError(line, "not a JSON object");
  DatasetRecord record;
  record.id = absl::StrCat(DatasetKindName(kind), "-", line);
  switch (kind) {
    case DatasetKind::kGsm8k: {
      absl::StatusOr<std::string> question = Column(row, "question", line);
      if (!question.ok()) return question.status();
      absl::StatusOr<std::string> solution = Column(row, "answer", line);
      if (!solution.ok()) return solution.status();
      std::optional<std::string> answer = Gsm8kFinalAnswer(*solution);
      if (!answer.has_value()) return RowError(line, "\"answer\" has no \"#### <answer>\" line");
      record.question = *std::move(question);
      record.reference_answer = *std::move(answer);
      record.metadata["solution"] = *std::move(solution);
      break;
    }
    case DatasetKind::kMath: {
      absl::StatusOr<std::string> problem = Column(row, "problem", line);
      if (!problem.ok()) return problem.status();
      record.question = *std::move(problem);
      auto solution = row.find("solution");
      if (auto answer = row.find("answer"); answer != row.end() && answer->is_string() &&
                                            !answer->get<std::string>().empty()) {
        record.reference_answer = answer->get<std::string>();
      } else if (solution != row.end() && solution->is_string()) {
        std::optional<std::string> boxed = LastBoxedContent(solution->get<std::string>());
        if (!boxed.has_value()) {
          return RowError(line, "no \"answer\" column and no \\boxed{} answer in \"solution\"");
        }
        record.reference_answer = *std::move(boxed);
      } else {
        return RowError(line, "neither an \"answer\" nor a \"solution\" column");
      }
      if (auto id = row.find("unique_id"); id != row.end() && id->is_string()) {
        record.id = id->get<std::string>();
      }
      CopyOtherStrings(row, {"problem", "answer", "unique_id"}, &record.metadata);
      break;
    }
    case DatasetKind::kHumanEval: {
      for (const char* name : {"task_id", "prompt", "test", "entry_point"}) {
        absl::StatusOr<std::string> value = Column(row, name, line);
        if (!value.ok()) return value.status();
        if (value->empty()) return RowError(line, absl::StrCat("column \"", name, "\" is empty"));
        record.metadata[name] = *std::move(value);
      }
      record.id = record.metadata["task_id"];
      record.question = record.metadata["prompt"];
      CopyOtherStrings(row, {"task_id"}, &record.metadata);
      break;
    }
    case DatasetKind::kJsonl: {
      absl::StatusOr<std::string> question = Column(row, options.question_field, line);
      if (!question.ok()) return question.status();
      absl::StatusOr<std::string> answer = Column(row, options.answer_field, line);
      if (!answer.ok()) return answer.status();
      record.question = *std::move(question);
      record.reference_answer = *std::move(answer);
      record.reference_is_solution = options.answer_is_solution;
      for (const char* name : {"id", "task_id", "unique_id"}) {
        if (auto id = row.find(name); id != row.end() && id->is_string()) {
          record.id = id->get<std::string>();
          break;
        }
      }
      CopyOtherStrings(row, {options.question_field, options.answer_field}, &record.metadata);
      break;
    }
  }
  return record;
}

// A row longer than this is refused before it is held whole: a gzip file of
// a few MB can inflate to one line of gigabytes. Real rows are a few KB.
constexpr size_t kMaxRowBytes = size_t{16} << 20;

absl::StatusOr<std::vector<DatasetRecord>> ReadDataset(const std::string& path, DatasetKind kind,
                                                       const DatasetReadOptions& options) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot open dataset ", path, ": ", strerror(errno)));
  }
  std::vector<DatasetRecord> records;
  std::string line;
  int64_t number = 0;
  char buffer[1 << 16];
  absl::Status status;
  const auto take_line = [&]() -> bool {
    ++number;
    if (absl::StripAsciiWhitespace(line).empty()) return true;
    absl::StatusOr<DatasetRecord> record = ParseDatasetRow(line, kind, number, options);
    if (!record.ok()) {
      status = absl::InvalidArgumentError(absl::StrCat(path, ":", record.status().message()));
      return false;
    }
    records.push_back(*std::move(record));
    return options.max_records <= 0 || static_cast<int64_t>(records.size()) < options.max_records;
  };
  bool more = true;
  while (more) {
    const int n = gzread(file, buffer, sizeof(buffer));
    if (n < 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      status = absl::DataLossError(absl::StrCat("reading dataset ", path, ": ", message));
      break;
    }
    if (n == 0) {
      if (!line.empty()) more = take_line();
      break;
    }
    for (int i = 0; i < n && more; ++i) {
      if (buffer[i] == '\n') {
        more = take_line();
        line.clear();
      } else if (line.size() < kMaxRowBytes) {
        line.push_back(buffer[i]);
      } else {
        status = absl::InvalidArgumentError(absl::StrCat(
            path, ":line ", number + 1, ": longer than ", kMaxRowBytes >> 20,
            " MiB, the most a row may hold"));
        more = false;
      }
    }
  }
  gzclose(file);
  if (!status.ok()) return status;
  return records;
}

}  // namespace sluice::task
