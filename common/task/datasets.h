#ifndef SLUICE_COMMON_TASK_DATASETS_H_
#define SLUICE_COMMON_TASK_DATASETS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sluice::task {

// Readers for the datasets RL-on-verifiable-rewards runs train and evaluate
// on, turning each row into what a verifier needs: the question, the
// reference answer, and the columns a verifier reads from metadata.
//
//   GSM8K      {"question", "answer": "...worked solution...\n#### 1,234"}
//              -> reference "1234" (after "####", thousands separators gone)
//   MATH       {"problem", "solution", ["answer"], "subject", "level",
//              "unique_id"} (MATH-500 and Hendrycks MATH) -> reference =
//              "answer" when present, else the last \boxed{...} of the
//              solution
//   HumanEval  {"task_id", "prompt", "test", "entry_point",
//              "canonical_solution"} -> metadata prompt/test/entry_point
//   JSONL      any objects: the question and answer columns are named by
//              the caller, other string columns go to metadata; the answer
//              column holds bare answers unless the caller says it holds
//              solutions (DatasetReadOptions::answer_is_solution)
//
// Files may be gzip-compressed (HumanEval ships as .jsonl.gz); zlib reads
// plain files unchanged. Blank lines are skipped. A malformed row is an
// INVALID_ARGUMENT naming the file, the line and the missing column; the
// reader never guesses. So is a row over 16 MiB (real rows are a few KB; a
// small gzip file can inflate to one line of gigabytes).

enum class DatasetKind { kJsonl, kGsm8k, kMath, kHumanEval };

// "jsonl", "gsm8k", "math", "humaneval".
absl::string_view DatasetKindName(DatasetKind kind);
// The inverse; INVALID_ARGUMENT listing the names for anything else.
absl::StatusOr<DatasetKind> ParseDatasetKind(absl::string_view name);

struct DatasetRecord {
  std::string id;                // task_id / unique_id / "<kind>-<line>"
  std::string question;          // What the model is asked.
  std::string reference_answer;  // Empty for HumanEval (verified by running).
  // Whether reference_answer is a full worked solution, from which a
  // verifier extracts the final answer, rather than the bare answer. Only a
  // JSONL answer column can be one: GSM8K and MATH references are extracted
  // here.
  bool reference_is_solution = false;
  // Verifier inputs and remaining string columns: for HumanEval "prompt",
  // "test", "entry_point", "canonical_solution"; for MATH "solution",
  // "subject", "level"; for GSM8K "solution" (the worked answer).
  std::map<std::string, std::string> metadata;
};

struct DatasetReadOptions {
  // JSONL only: the columns holding the question and the answer.
  std::string question_field = "prompt";
  std::string answer_field = "answer";
  // JSONL only: the answer column holds full worked solutions
  // (DatasetRecord::reference_is_solution).
  bool answer_is_solution = false;
  // Stop after this many records; 0 = all.
  int64_t max_records = 0;
};

// Reads a whole dataset file. Errors: NOT_FOUND when the file cannot be
// opened, INVALID_ARGUMENT "<path>:<line>: ..." for a malformed row, DATA_LOSS
// for a corrupt gzip stream.
absl::StatusOr<std::vector<DatasetRecord>> ReadDataset(const std::string& path, DatasetKind kind,
                                                       const DatasetReadOptions& options = {});

// One row (a JSON object's text), as ReadDataset parses it; `line` numbers
// the default id and the errors.
absl::StatusOr<DatasetRecord> ParseDatasetRow(absl::string_view json_text, DatasetKind kind,
                                              int64_t line, const DatasetReadOptions& options = {});

// The GSM8K reference in a worked solution: the text after the last "####",
// trimmed, with thousands separators removed ("#### 1,234" -> "1234");
// nullopt when there is no "####" or nothing after it.
std::optional<std::string> Gsm8kFinalAnswer(absl::string_view solution);

// The body of the last balanced \boxed{...} (or \fbox{...}) in `text`;
// nullopt when there is none.
std::optional<std::string> LastBoxedContent(absl::string_view text);

}  // namespace sluice::task

#endif  // SLUICE_COMMON_TASK_DATASETS_H_
