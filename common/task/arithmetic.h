#ifndef SLUICE_COMMON_TASK_ARITHMETIC_H_
#define SLUICE_COMMON_TASK_ARITHMETIC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::task {

// One task instance.
struct TaskItem {
  std::string prompt_id;         // "arith-000123" (index into the full pool)
  std::string prompt;            // "07+45=" exactly as fed to the model
  std::string reference_answer;  // "52"
  // Whether reference_answer is a full worked solution rather than the bare
  // answer (v1::ScoreItem.reference_is_solution).
  bool reference_is_solution = false;
  // Verifier for this item ("math", "code"); empty = the run's composition.
  std::string verifier;
  // Verifier inputs beyond the answer (code: "test", "entry_point",
  // "prompt"), and a dataset's remaining string columns.
  std::map<std::string, std::string> metadata;
};

struct ArithmeticOptions {
  int64_t min_operand = 0;
  int64_t max_operand = 99;
  int num_operands = 2;
  // 0 = num_operands. Larger: num_operands + j operands with probability
  // proportional to 2^-j, j = 0 .. max_operands - num_operands.
  int max_operands = 0;
  std::vector<std::string> operators = {"+"};  // each "+", "-" or "*"
  // The answer is every intermediate result, comma-separated ("07+45+13="
  // -> "52,65"); operators among "+" and "-" only.
  bool show_work = false;
  // Distinct problems in the training pool (capped by how many distinct
  // problems exist; see Generate).
  int64_t num_prompts = 10000;
  // Held out for evaluation; never in the training pool.
  int64_t eval_size = 500;
  uint64_t seed = 0;
};

// The built-in verifiable task: fixed-width arithmetic. Operands are
// zero-padded to the width of max_operand (and prefixed by nothing; negative
// operands are not supported, min_operand >= 0), so every prompt of a task
// has the same length, e.g. "07+45=" ; the answer is the exact integer result
// in decimal, most significant digit first, with a leading "-" when negative.
//
// With more than two operands the answer follows the usual precedence ('*'
// before '+' and '-', left to right), e.g. "2+3*4=" -> "14".
//
// The long-tail variant (max_operands > num_operands, usually with
// show_work): operand counts vary, most expressions short and a few long,
// and with show_work the answer spells every intermediate result, so
// completion lengths are long-tailed as reasoning traces are. Its problems
// are always drawn (without replacement; once the short ones run out, a
// duplicate draw is redrawn, so a small operand range shifts the counts
// toward longer expressions).
//
// Generation is deterministic in the options (same options, same items, on
// every machine): the distinct problems are enumerated (or drawn without
// replacement when there are more than 1e6), shuffled with the seed, the
// first eval_size become the held-out split and the next num_prompts the
// training pool. When fewer than eval_size + num_prompts distinct problems
// exist, the training pool gets what is left after the held-out split
// (Validate requires at least one). The shuffle is a Fisher-Yates over a
// std::mt19937_64 with our own uniform draw, because std::shuffle and the
// <random> distributions differ between standard libraries.
struct ArithmeticTask {
  std::vector<TaskItem> train;
  std::vector<TaskItem> eval;

  static absl::StatusOr<ArithmeticTask> Generate(const ArithmeticOptions& options);
};

// Validation with a message naming the field (e.g. "max_operand: must be >=
// min_operand (3), got 2"); every problem is reported, joined by "; ".
// Besides the field ranges documented above: max_operand <= 999,999,999 (so
// answers are exact; <= 999 above 4 operands), max_operands 0 or in
// [num_operands, 8], show_work only with "+" and "-", operators without
// duplicates, and enough distinct
// problems for eval_size plus one training item. Generate calls it.
absl::Status ValidateArithmeticOptions(const ArithmeticOptions& options);

}  // namespace sluice::task

#endif  // SLUICE_COMMON_TASK_ARITHMETIC_H_
