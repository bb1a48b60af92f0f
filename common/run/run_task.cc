#include "common/run/run_task.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/task/datasets.h"
#include "common/task/shuffle.h"
#include "common/tokenizer/chat_template.h"

namespace sluice::run {
namespace {

constexpr absl::string_view kPlaceholder = "{question}";
// Qwen2.5-Math's chain-of-thought instruction; the math verifier reads the
// last \boxed{} of the response.
constexpr absl::string_view kBoxedAnswerTemplate =
    "{question}\nPlease reason step by step, and put your final answer within \\boxed{}.";
constexpr int kDefaultEvalSplitSize = 200;

bool IsPlain(absl::string_view chat_template) {
  return chat_template.empty() || chat_template == "none";
}

// The reader for a dataset format; INVALID_ARGUMENT "task.dataset.format: ...".
absl::StatusOr<task::DatasetKind> DatasetKindFor(v1::DatasetFormat format) {
  switch (format) {
    case v1::DATASET_FORMAT_JSONL:
      return task::DatasetKind::kJsonl;
    case v1::DATASET_FORMAT_GSM8K:
      return task::DatasetKind::kGsm8k;
    case v1::DATASET_FORMAT_MATH:
      return task::DatasetKind::kMath;
    case v1::DATASET_FORMAT_HUMANEVAL:
      return task::DatasetKind::kHumanEval;
    case v1::DATASET_FORMAT_MBPP:
      return absl::InvalidArgumentError(
          "task.dataset.format: MBPP is not supported yet; use DATASET_FORMAT_JSONL (with "
          "reward.verifiers), _GSM8K, _MATH or _HUMANEVAL");
    default: {
      const std::string& name = v1::DatasetFormat_Name(format);
      return absl::InvalidArgumentError(absl::StrCat(
          "task.dataset.format: must be DATASET_FORMAT_JSONL, _GSM8K, _MATH or _HUMANEVAL, got ",
          name.empty() ? std::to_string(static_cast<int>(format)) : name));
    }
  }
}

// The template and chat-template problems ("path: problem" lines).
void ValidateTemplates(const v1::TaskConfig& task, std::vector<std::string>* problems) {
  if (!task.prompt_template().empty() && !absl::StrContains(task.prompt_template(), kPlaceholder)) {
    problems->push_back(absl::StrCat("task.prompt_template: must contain \"", kPlaceholder,
                                     "\" (where the question goes)"));
  }
  if (!IsPlain(task.chat_template()) && task.chat_template() != "chatml") {
    problems->push_back(absl::StrCat("task.chat_template: unknown \"", task.chat_template(),
                                     "\"; known: none, chatml"));
  }
  if (!task.system_prompt().empty() && IsPlain(task.chat_template())) {
    problems->push_back(
        "task.system_prompt: needs a task.chat_template (plain prompts have no system turn)");
  }
}

// The held-out split of a dataset of `rows` rows: eval_split_size (0 = 200)
// but at most 10% of the rows, and at least one.
int64_t EvalSplitSize(int64_t rows, int32_t eval_split_size) {
  const int64_t wanted = eval_split_size > 0 ? eval_split_size : kDefaultEvalSplitSize;
  return std::min(wanted, std::max<int64_t>(1, rows / 10));
}

// The dataset's rows as the run uses them: read, ids made unique (in file
// order, so that they do not depend on the seed), shuffled with the seed,
// cut to max_prompts.
absl::StatusOr<std::vector<task::DatasetRecord>> ReadRows(const v1::RunSpec& spec) {
  const v1::DatasetTaskConfig& dataset = spec.task().dataset();
  ASSIGN_OR_RETURN(const task::DatasetKind kind, DatasetKindFor(dataset.format()));
  if (dataset.max_prompts() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "task.dataset.max_prompts: must be >= 0 (0 = all), got ", dataset.max_prompts()));
  }
  task::DatasetReadOptions options;
  if (!dataset.prompt_field().empty()) options.question_field = dataset.prompt_field();
  if (!dataset.answer_field().empty()) options.answer_field = dataset.answer_field();
  options.answer_is_solution = dataset.answer_is_solution();
  ASSIGN_OR_RETURN(std::vector<task::DatasetRecord> rows,
                   task::ReadDataset(dataset.path(), kind, options));

  // Duplicate ids (a JSONL "id" column repeated, say) get "#2", "#3", ...
  std::set<std::string> seen;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string& id = rows[i].id;
    if (id.empty()) id = absl::StrCat(task::DatasetKindName(kind), "-row", i + 1);
    if (seen.insert(id).second) continue;
    for (int n = 2;; ++n) {
      std::string candidate = absl::StrCat(id, "#", n);
      if (seen.insert(candidate).second) {
        id = std::move(candidate);
        break;
      }
    }
  }

  std::mt19937_64 rng(spec.seed());
  task::Shuffle(rows, rng);
  if (dataset.max_prompts() > 0 && static_cast<int64_t>(rows.size()) > dataset.max_prompts()) {
    rows.resize(static_cast<size_t>(dataset.max_prompts()));
  }
  return rows;
}

absl::Status TooFewRows(const v1::DatasetTaskConfig& dataset, size_t rows) {
  const bool cut = dataset.max_prompts() > 0 && static_cast<int64_t>(rows) == dataset.max_prompts();
  return absl::InvalidArgumentError(absl::StrCat(
      cut ? "task.dataset.max_prompts" : "task.dataset.path", ": ", rows,
      rows == 1 ? " row leaves" : " rows leave",
      " nothing to train on; a dataset task needs at least 2 (one for the eval split, one "
      "for training)"));
}

}  // namespace

absl::string_view DefaultPromptTemplate(const v1::TaskConfig& task) {
  if (task.has_dataset()) {
    switch (task.dataset().format()) {
      case v1::DATASET_FORMAT_GSM8K:
      case v1::DATASET_FORMAT_MATH:
        return kBoxedAnswerTemplate;
      default:
        // HumanEval is completion style: the prompt is the signature and the
        // docstring, and the model continues it.
        break;
    }
  }
  return kPlaceholder;
}

absl::StatusOr<std::string> FormatPrompt(absl::string_view question,
                                         absl::string_view prompt_template,
                                         absl::string_view chat_template,
                                         absl::string_view system_prompt) {
  // One left-to-right pass: a question that itself spells "{question}" is
  // not expanded again.
  std::string text = prompt_template.empty()
                         ? std::string(question)
                         : absl::StrReplaceAll(prompt_template, {{kPlaceholder, question}});
  if (IsPlain(chat_template)) return text;
  if (chat_template != "chatml") {
    return absl::InvalidArgumentError(
        absl::StrCat("task.chat_template: unknown \"", chat_template, "\"; known: none, chatml"));
  }
  std::vector<tokenizer::ChatMessage> messages;
  if (!system_prompt.empty()) messages.push_back({"system", std::string(system_prompt)});
  messages.push_back({"user", std::move(text)});
  return tokenizer::ApplyChatMlTemplate(messages, /*add_generation_prompt=*/true);
}

task::ArithmeticOptions ArithmeticOptionsFor(const v1::RunSpec& spec) {
  const v1::ArithmeticTaskConfig& arithmetic = spec.task().arithmetic();
  task::ArithmeticOptions options;
  options.min_operand = arithmetic.min_operand();
  options.max_operand = arithmetic.max_operand();
  options.num_operands = arithmetic.num_operands();
  options.max_operands = arithmetic.max_operands();
  options.show_work = arithmetic.show_work();
  options.operators.assign(arithmetic.operators().begin(), arithmetic.operators().end());
  options.num_prompts = arithmetic.num_prompts();
  options.eval_size = spec.task().eval_split_size();
  options.seed = spec.seed();
  return options;
}

void ValidateRunTask(const v1::RunSpec& spec, std::vector<std::string>* problems) {
  const v1::TaskConfig& task = spec.task();
  ValidateTemplates(task, problems);
  if (!task.has_dataset()) return;

  const v1::DatasetTaskConfig& dataset = task.dataset();
  if (dataset.format() == v1::DATASET_FORMAT_HUMANEVAL && spec.warm_start().sft_steps() > 0) {
    problems->push_back(
        "warm_start.sft_steps: HumanEval has no reference answers to fine-tune on; set it to 0");
  }
  bool readable = true;
  if (dataset.path().empty()) {
    problems->push_back("task.dataset.path: must name a dataset file");
    readable = false;
  }
  if (absl::StatusOr<task::DatasetKind> kind = DatasetKindFor(dataset.format()); !kind.ok()) {
    problems->push_back(std::string(kind.status().message()));
    readable = false;
  } else if (*kind != task::DatasetKind::kJsonl) {
    for (const auto& [path, value] :
         {std::pair{"task.dataset.prompt_field", dataset.prompt_field()},
          std::pair{"task.dataset.answer_field", dataset.answer_field()}}) {
      if (!value.empty()) {
        problems->push_back(absl::StrCat(path, ": only for DATASET_FORMAT_JSONL (",
                                         v1::DatasetFormat_Name(dataset.format()),
                                         " has fixed columns); leave it empty"));
      }
    }
    if (dataset.answer_is_solution()) {
      problems->push_back(absl::StrCat(
          "task.dataset.answer_is_solution: only for DATASET_FORMAT_JSONL (",
          v1::DatasetFormat_Name(dataset.format()),
          " references are the final answers, already extracted); leave it false"));
    }
  }
  if (dataset.max_prompts() < 0) {
    problems->push_back(absl::StrCat("task.dataset.max_prompts: must be >= 0 (0 = all), got ",
                                     dataset.max_prompts()));
    readable = false;
  }
  if (!readable) return;

  absl::StatusOr<std::vector<task::DatasetRecord>> rows = ReadRows(spec);
  if (!rows.ok()) {
    // The reader names the file ("<path>:line 3: ..."); it is already named.
    absl::string_view message = rows.status().message();
    if (!absl::ConsumePrefix(&message, absl::StrCat("cannot open dataset ", dataset.path(), ":"))) {
      absl::ConsumePrefix(&message, absl::StrCat(dataset.path(), ":"));
    }
    problems->push_back(absl::StrCat("task.dataset.path: cannot read \"", dataset.path(),
                                     "\": ", absl::StripLeadingAsciiWhitespace(message)));
  } else if (rows->size() < 2) {
    problems->push_back(std::string(TooFewRows(dataset, rows->size()).message()));
  }
}

absl::StatusOr<RunTask> LoadRunTask(const v1::RunSpec& spec) {
  const v1::TaskConfig& task = spec.task();
  std::vector<std::string> problems;
  ValidateTemplates(task, &problems);
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
  const absl::string_view prompt_template =
      task.prompt_template().empty() ? DefaultPromptTemplate(task) : task.prompt_template();

  RunTask run_task;
  switch (task.source_case()) {
    case v1::TaskConfig::SOURCE_NOT_SET:
      return absl::InvalidArgumentError("task: exactly one of arithmetic or dataset must be set");
    case v1::TaskConfig::kArithmetic: {
      ASSIGN_OR_RETURN(task::ArithmeticTask arithmetic,
                       task::ArithmeticTask::Generate(ArithmeticOptionsFor(spec)));
      run_task.train = std::move(arithmetic.train);
      run_task.eval = std::move(arithmetic.eval);
      // The default template and no chat template leave "07+45=" as is.
      for (std::vector<task::TaskItem>* split : {&run_task.train, &run_task.eval}) {
        for (task::TaskItem& item : *split) {
          ASSIGN_OR_RETURN(item.prompt, FormatPrompt(item.prompt, prompt_template,
                                                     task.chat_template(), task.system_prompt()));
        }
      }
      return run_task;
    }
    case v1::TaskConfig::kDataset:
      break;
  }

  const v1::DatasetTaskConfig& dataset = task.dataset();
  ASSIGN_OR_RETURN(std::vector<task::DatasetRecord> rows, ReadRows(spec));
  if (rows.size() < 2) return TooFewRows(dataset, rows.size());
  const int64_t eval_size =
      EvalSplitSize(static_cast<int64_t>(rows.size()), task.eval_split_size());
  run_task.eval.reserve(static_cast<size_t>(eval_size));
  run_task.train.reserve(rows.size() - static_cast<size_t>(eval_size));
  for (size_t i = 0; i < rows.size(); ++i) {
    task::DatasetRecord& row = rows[i];
    task::TaskItem item;
    item.prompt_id = std::move(row.id);
    ASSIGN_OR_RETURN(item.prompt, FormatPrompt(row.question, prompt_template, task.chat_template(),
                                               task.system_prompt()));
    item.reference_answer = std::move(row.reference_answer);
    item.reference_is_solution = row.reference_is_solution;
    // No per-item verifier: the run's reward composition (math for GSM8K
    // and MATH, code for HumanEval by default, plus whatever the user adds,
    // e.g. format) scores every item; a per-item one would bypass it.
    item.metadata = std::move(row.metadata);
    (static_cast<int64_t>(i) < eval_size ? run_task.eval : run_task.train)
        .push_back(std::move(item));
  }
  return run_task;
}

}  // namespace sluice::run
