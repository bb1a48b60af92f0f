#ifndef SLUICE_COMMON_RUN_RUN_TASK_H_
#define SLUICE_COMMON_RUN_RUN_TASK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/task/arithmetic.h"
#include "sluice/v1/common.pb.h"

// A run's task, as its (resolved) RunSpec describes it: the training pool
// the controller hands to rollout workers and the held-out split the trainer
// evaluates on. The controller and the trainer both call LoadRunTask with
// the same spec and get the same items, so that nothing but the spec has to
// travel between them.
namespace sluice::run {

struct RunTask {
  // Items in task order (the controller's prompt feed shuffles). Each item's
  // `prompt` is the final text the model sees: task.prompt_template applied,
  // then the chat template; `reference_answer`, `verifier` and `metadata` are
  // what the reward server needs.
  std::vector<task::TaskItem> train;
  std::vector<task::TaskItem> eval;
};

// The default task.prompt_template of each dataset format (what a user gets
// when the field is empty); "{question}" for the arithmetic task and JSONL.
absl::string_view DefaultPromptTemplate(const v1::TaskConfig& task);

// The prompt text of one question: `prompt_template` with every "{question}"
// replaced (an empty template means "{question}"), then, when chat_template
// is "chatml", wrapped as one user turn (after a system turn when
// system_prompt is non-empty) with the assistant header appended
// (tokenizer::ApplyChatMlTemplate). "" and "none" leave the text plain.
// INVALID_ARGUMENT for another chat template name.
absl::StatusOr<std::string> FormatPrompt(absl::string_view question,
                                         absl::string_view prompt_template,
                                         absl::string_view chat_template,
                                         absl::string_view system_prompt);

// The arithmetic task options a (resolved) spec describes: the arithmetic
// fields, eval_size = task.eval_split_size, seed = the run seed. Requires
// spec.task().has_arithmetic().
task::ArithmeticOptions ArithmeticOptionsFor(const v1::RunSpec& spec);

// Checks spec.task() beyond field ranges, adding one "path: problem" line
// per problem (the controller joins them into its INVALID_ARGUMENT):
// the dataset file exists and parses, the format is supported, the split
// leaves training items, the prompt template names "{question}", the chat
// template is known, a system prompt comes with a chat template, the JSONL
// column names and answer_is_solution are only set for JSONL, max_prompts
// >= 0. Reads the dataset file (O(file size)). Leaves to the caller what the
// controller already checks field by field: the arithmetic options,
// eval_split_size >= 0, and reward.verifiers (a JSONL dataset needs them).
void ValidateRunTask(const v1::RunSpec& spec, std::vector<std::string>* problems);

// Builds the run's task from a resolved spec.
//   arithmetic: task::ArithmeticTask::Generate with the spec's seed and
//     eval_split_size; verifier empty (the run's composition scores it).
//   dataset: task::ReadDataset, then the rows are shuffled with the run seed
//     (the same mt19937_64-only shuffle on every machine), cut to
//     dataset.max_prompts (0 = all), and the first
//       min(eval_split_size, max(1, rows / 10))
//     of them become the eval split (eval_split_size 0 = 200; rows counted
//     after the max_prompts cut): 200 from 2,000 rows up, 10% below that,
//     e.g. 50 of MATH-500, 16 of HumanEval's 164. The cut and the split are
//     prefixes of the shuffled order, so a larger max_prompts keeps the
//     eval items as long as the 10% rule does not shrink the split. Each
//     item keeps the row's id (made unique by appending "#2", "#3", ... to
//     repeats, in file order), reference answer and metadata (HumanEval:
//     "prompt", "test", "entry_point", which the code verifier runs as
//     prompt + response + test), and whether the reference is a solution
//     (JSONL with answer_is_solution). Items name no verifier: the run's
//     composition scores them (ResolveDefaults makes it math for GSM8K and
//     MATH, code for HumanEval), since an item's own verifier would bypass
//     the composition (a format bonus, say).
//   Both: the prompt is FormatPrompt(question, task.prompt_template or
//     DefaultPromptTemplate, chat_template, system_prompt); for arithmetic
//     with neither template set that is the task's own "07+45=".
// Errors: INVALID_ARGUMENT "task...: ..." for a bad template, chat template,
// dataset format (MBPP has no reader yet) or max_prompts, and for fewer than
// two rows (nothing left to train on); the dataset reader's own (NOT_FOUND,
// INVALID_ARGUMENT naming file:line, DATA_LOSS); the arithmetic task's.
// O(dataset size) or O(arithmetic pool); thread-safe.
absl::StatusOr<RunTask> LoadRunTask(const v1::RunSpec& spec);

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_TASK_H_
