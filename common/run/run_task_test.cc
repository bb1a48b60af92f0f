#include "common/run/run_task.h"

#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/task/arithmetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::run {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Key;
using ::testing::UnorderedElementsAre;

constexpr char kBoxedTemplate[] =
    "{question}\nPlease reason step by step, and put your final answer within \\boxed{}.";

std::string Data(const std::string& relative) {
  return std::string(SLUICE_TESTDATA_DIR) + "/" + relative;
}

v1::RunSpec DatasetSpec(v1::DatasetFormat format, const std::string& path, uint64_t seed = 1) {
  v1::RunSpec spec;
  spec.set_seed(seed);
  spec.mutable_task()->mutable_dataset()->set_format(format);
  spec.mutable_task()->mutable_dataset()->set_path(path);
  return spec;
}

v1::RunSpec Gsm8kSpec(uint64_t seed = 1) {
  return DatasetSpec(v1::DATASET_FORMAT_GSM8K, Data("datasets/gsm8k/test.jsonl"), seed);
}

std::string WriteJsonl(const std::string& name, const std::vector<std::string>& lines) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream out(path);
  for (const std::string& line : lines) out << line << "\n";
  return path;
}

std::vector<std::string> Ids(const std::vector<task::TaskItem>& items) {
  std::vector<std::string> ids;
  for (const task::TaskItem& item : items) ids.push_back(item.prompt_id);
  return ids;
}

std::vector<std::string> Problems(const v1::RunSpec& spec) {
  std::vector<std::string> problems;
  ValidateRunTask(spec, &problems);
  return problems;
}

// --- FormatPrompt ---

TEST(FormatPromptTest, ReplacesEveryPlaceholder) {
  EXPECT_EQ(*FormatPrompt("2+2", "Q: {question}\nA:", "", ""), "Q: 2+2\nA:");
  EXPECT_EQ(*FormatPrompt("x", "{question} and {question}", "none", ""), "x and x");
}

TEST(FormatPromptTest, EmptyTemplateIsTheQuestion) {
  EXPECT_EQ(*FormatPrompt("07+45=", "", "", ""), "07+45=");
}

TEST(FormatPromptTest, QuestionSpellingThePlaceholderIsNotExpandedAgain) {
  EXPECT_EQ(*FormatPrompt("say {question}", "<{question}>", "", ""), "<say {question}>");
}

TEST(FormatPromptTest, ChatMlWrapsOneUserTurnAndOpensTheAssistantTurn) {
  EXPECT_EQ(*FormatPrompt("What is 2+2?", "{question}", "chatml", ""),
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
}

TEST(FormatPromptTest, ChatMlPutsTheSystemTurnFirst) {
  EXPECT_EQ(*FormatPrompt("What is 2+2?", "Q: {question}", "chatml", "Be brief."),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nQ: What is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(FormatPromptTest, UnknownChatTemplateIsInvalid) {
  absl::StatusOr<std::string> text = FormatPrompt("q", "", "llama3", "");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(),
              HasSubstr("task.chat_template: unknown \"llama3\"; known: none, chatml"));
}

// --- DefaultPromptTemplate ---

TEST(DefaultPromptTemplateTest, PerFormat) {
  v1::TaskConfig task;
  task.mutable_arithmetic();
  EXPECT_EQ(DefaultPromptTemplate(task), "{question}");
  task.mutable_dataset()->set_format(v1::DATASET_FORMAT_GSM8K);
  EXPECT_EQ(DefaultPromptTemplate(task), kBoxedTemplate);
  task.mutable_dataset()->set_format(v1::DATASET_FORMAT_MATH);
  EXPECT_EQ(DefaultPromptTemplate(task), kBoxedTemplate);
  task.mutable_dataset()->set_format(v1::DATASET_FORMAT_HUMANEVAL);
  EXPECT_EQ(DefaultPromptTemplate(task), "{question}");
  task.mutable_dataset()->set_format(v1::DATASET_FORMAT_JSONL);
  EXPECT_EQ(DefaultPromptTemplate(task), "{question}");
}

// --- LoadRunTask: arithmetic ---

v1::RunSpec ArithmeticSpec() {
  v1::RunSpec spec;
  spec.set_seed(11);
  v1::ArithmeticTaskConfig& arithmetic = *spec.mutable_task()->mutable_arithmetic();
  arithmetic.set_max_operand(99);
  arithmetic.set_num_operands(2);
  arithmetic.add_operators("+");
  arithmetic.add_operators("*");
  arithmetic.set_num_prompts(300);
  spec.mutable_task()->set_eval_split_size(20);
  return spec;
}

TEST(LoadRunTaskTest, ArithmeticIsTheTaskUnchanged) {
  const v1::RunSpec spec = ArithmeticSpec();
  absl::StatusOr<RunTask> loaded = LoadRunTask(spec);
  absl::StatusOr<task::ArithmeticTask> expected =
      task::ArithmeticTask::Generate(ArithmeticOptionsFor(spec));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(loaded->train.size(), 300u);
  ASSERT_EQ(loaded->eval.size(), 20u);
  for (auto [got, want] :
       {std::pair{&loaded->train, &expected->train}, std::pair{&loaded->eval, &expected->eval}}) {
    ASSERT_EQ(got->size(), want->size());
    for (size_t i = 0; i < got->size(); ++i) {
      EXPECT_EQ((*got)[i].prompt_id, (*want)[i].prompt_id);
      EXPECT_EQ((*got)[i].prompt, (*want)[i].prompt);
      EXPECT_EQ((*got)[i].reference_answer, (*want)[i].reference_answer);
      EXPECT_EQ((*got)[i].verifier, "");
      EXPECT_THAT((*got)[i].metadata, IsEmpty());
    }
  }
}

TEST(LoadRunTaskTest, ArithmeticOptionsComeFromTheSpec) {
  const task::ArithmeticOptions options = ArithmeticOptionsFor(ArithmeticSpec());
  EXPECT_EQ(options.max_operand, 99);
  EXPECT_EQ(options.num_operands, 2);
  EXPECT_THAT(options.operators, ElementsAre("+", "*"));
  EXPECT_EQ(options.num_prompts, 300);
  EXPECT_EQ(options.eval_size, 20);
  EXPECT_EQ(options.seed, 11u);
}

TEST(LoadRunTaskTest, ArithmeticWithTemplatesIsTemplated) {
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_task()->set_prompt_template("Compute {question}");
  spec.mutable_task()->set_chat_template("chatml");
  absl::StatusOr<RunTask> plain = LoadRunTask(ArithmeticSpec());
  absl::StatusOr<RunTask> templated = LoadRunTask(spec);
  ASSERT_TRUE(plain.ok() && templated.ok());
  EXPECT_EQ(templated->train[0].prompt,
            absl::StrCat("<|im_start|>user\nCompute ", plain->train[0].prompt,
                         "<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_EQ(templated->eval[0].prompt_id, plain->eval[0].prompt_id);
}

// --- LoadRunTask: datasets ---

TEST(LoadRunTaskTest, Gsm8kSplitsAreDisjointAndTheTenPercentRuleApplies) {
  absl::StatusOr<RunTask> task = LoadRunTask(Gsm8kSpec());
  ASSERT_TRUE(task.ok()) << task.status();
  // eval_split_size 0 = 200, but at most 10% of 1319 rows.
  EXPECT_EQ(task->eval.size(), 131u);
  EXPECT_EQ(task->train.size(), 1319u - 131u);
  std::set<std::string> ids;
  for (const auto* split : {&task->train, &task->eval}) {
    for (const task::TaskItem& item : *split) {
      EXPECT_TRUE(ids.insert(item.prompt_id).second) << "duplicate " << item.prompt_id;
      EXPECT_THAT(item.prompt_id, HasSubstr("gsm8k-"));
      EXPECT_EQ(item.verifier, "");
      EXPECT_FALSE(item.reference_answer.empty());
      EXPECT_THAT(item.prompt,
                  HasSubstr("\nPlease reason step by step, and put your final answer within "
                            "\\boxed{}."));
      EXPECT_THAT(item.metadata, ElementsAre(Key("solution")));
    }
  }
  EXPECT_EQ(ids.size(), 1319u);
}

TEST(LoadRunTaskTest, EvalSplitSizeIsKeptWhenTheDatasetIsLargeEnough) {
  v1::RunSpec spec = Gsm8kSpec();
  spec.mutable_task()->set_eval_split_size(100);
  absl::StatusOr<RunTask> task = LoadRunTask(spec);
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->eval.size(), 100u);
  EXPECT_EQ(task->train.size(), 1219u);
}

TEST(LoadRunTaskTest, SplitIsDeterministicInTheSeed) {
  absl::StatusOr<RunTask> a = LoadRunTask(Gsm8kSpec(5));
  absl::StatusOr<RunTask> b = LoadRunTask(Gsm8kSpec(5));
  absl::StatusOr<RunTask> other = LoadRunTask(Gsm8kSpec(6));
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  EXPECT_EQ(Ids(a->eval), Ids(b->eval));
  EXPECT_EQ(Ids(a->train), Ids(b->train));
  EXPECT_NE(Ids(a->eval), Ids(other->eval));
  EXPECT_NE(Ids(a->train), Ids(other->train));
}

TEST(LoadRunTaskTest, ShuffleIsPinned) {
  // The order is part of a run's identity (resume, the trainer's eval split):
  // it must not change with the standard library or a refactoring.
  absl::StatusOr<RunTask> task = LoadRunTask(Gsm8kSpec(0));
  ASSERT_TRUE(task.ok()) << task.status();
  const std::vector<std::string> eval = Ids(task->eval);
  const std::vector<std::string> train = Ids(task->train);
  EXPECT_THAT(std::vector<std::string>(eval.begin(), eval.begin() + 3),
              ElementsAre("gsm8k-217", "gsm8k-571", "gsm8k-389"));
  EXPECT_THAT(std::vector<std::string>(train.begin(), train.begin() + 3),
              ElementsAre("gsm8k-432", "gsm8k-998", "gsm8k-541"));
}

TEST(LoadRunTaskTest, MaxPromptsCutsBeforeTheSplit) {
  v1::RunSpec spec = Gsm8kSpec();
  spec.mutable_task()->mutable_dataset()->set_max_prompts(50);
  absl::StatusOr<RunTask> task = LoadRunTask(spec);
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->eval.size(), 5u);
  EXPECT_EQ(task->train.size(), 45u);
  // The cut is a prefix of the shuffled order: the eval split of a larger
  // cut starts the same way.
  spec.mutable_task()->mutable_dataset()->set_max_prompts(60);
  absl::StatusOr<RunTask> larger = LoadRunTask(spec);
  ASSERT_TRUE(larger.ok());
  ASSERT_EQ(larger->eval.size(), 6u);
  const std::vector<std::string> larger_eval = Ids(larger->eval);
  EXPECT_EQ(Ids(task->eval),
            std::vector<std::string>(larger_eval.begin(), larger_eval.begin() + 5));
}

TEST(LoadRunTaskTest, Math500) {
  absl::StatusOr<RunTask> task =
      LoadRunTask(DatasetSpec(v1::DATASET_FORMAT_MATH, Data("datasets/math500/test.jsonl")));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->eval.size(), 50u);
  EXPECT_EQ(task->train.size(), 450u);
  std::set<std::string> ids;
  for (const auto* split : {&task->train, &task->eval}) {
    for (const task::TaskItem& item : *split) {
      ids.insert(item.prompt_id);
      EXPECT_THAT(item.prompt_id, HasSubstr("test/"));  // MATH unique_id "test/algebra/1.json"
      EXPECT_EQ(item.verifier, "");
      EXPECT_FALSE(item.reference_answer.empty());
      EXPECT_TRUE(item.metadata.count("solution")) << item.prompt_id;
      EXPECT_THAT(item.prompt, HasSubstr("\\boxed{}."));
    }
  }
  EXPECT_EQ(ids.size(), 500u);
}

TEST(LoadRunTaskTest, HumanEvalIsCompletionStyleWithTheCodeVerifiersInputs) {
  absl::StatusOr<RunTask> task = LoadRunTask(
      DatasetSpec(v1::DATASET_FORMAT_HUMANEVAL, Data("datasets/humaneval/HumanEval.jsonl.gz")));
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->eval.size(), 16u);
  EXPECT_EQ(task->train.size(), 148u);
  for (const auto* split : {&task->train, &task->eval}) {
    for (const task::TaskItem& item : *split) {
      EXPECT_THAT(item.prompt_id, HasSubstr("HumanEval/"));
      EXPECT_EQ(item.verifier, "");
      EXPECT_EQ(item.reference_answer, "");
      EXPECT_EQ(item.prompt, item.metadata.at("prompt"));
      EXPECT_THAT(item.metadata.at("test"), HasSubstr("def check"));
      EXPECT_FALSE(item.metadata.at("entry_point").empty());
    }
  }
}

TEST(LoadRunTaskTest, JsonlWithCustomFieldsAndNoVerifier) {
  std::vector<std::string> lines;
  for (int i = 0; i < 30; ++i) {
    lines.push_back(absl::StrCat(R"({"id": "q)", i, R"(", "q": "What is )", i, R"(+1?", "a": ")",
                                 i + 1, R"(", "topic": "sums"})"));
  }
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_JSONL, WriteJsonl("custom.jsonl", lines));
  spec.mutable_task()->mutable_dataset()->set_prompt_field("q");
  spec.mutable_task()->mutable_dataset()->set_answer_field("a");
  spec.mutable_task()->set_prompt_template("Question: {question}\nAnswer:");
  absl::StatusOr<RunTask> task = LoadRunTask(spec);
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_EQ(task->eval.size(), 3u);
  EXPECT_EQ(task->train.size(), 27u);
  for (const auto* split : {&task->train, &task->eval}) {
    for (const task::TaskItem& item : *split) {
      const int n = std::stoi(item.prompt_id.substr(1));
      EXPECT_EQ(item.prompt, absl::StrCat("Question: What is ", n, "+1?\nAnswer:"));
      EXPECT_EQ(item.reference_answer, std::to_string(n + 1));
      EXPECT_FALSE(item.reference_is_solution);
      EXPECT_EQ(item.verifier, "");
      EXPECT_THAT(item.metadata, UnorderedElementsAre(Key("id"), Key("topic")));
    }
  }
}

TEST(LoadRunTaskTest, JsonlAnswerColumnOfSolutionsIsMarked) {
  // GSM8K's own file read as JSONL: the "answer" column is the worked
  // solution, which the math verifier must extract from.
  v1::RunSpec spec = DatasetSpec(v1::DATASET_FORMAT_JSONL, Data("datasets/gsm8k/test.jsonl"));
  spec.mutable_task()->mutable_dataset()->set_prompt_field("question");
  spec.mutable_task()->mutable_dataset()->set_answer_is_solution(true);
  absl::StatusOr<RunTask> task = LoadRunTask(spec);
  ASSERT_TRUE(task.ok()) << task.status();
  for (const auto* split : {&task->train, &task->eval}) {
    for (const task::TaskItem& item : *split) {
      EXPECT_TRUE(item.reference_is_solution) << item.prompt_id;
      EXPECT_THAT(item.reference_answer, HasSubstr("####"));
    }
  }
  // GSM8K read as GSM8K has its final answers extracted already.
  absl::StatusOr<RunTask> gsm8k =
      LoadRunTask(DatasetSpec(v1::DATASET_FORMAT_GSM8K, Data("datasets/gsm8k/test.jsonl")));
  ASSERT_TRUE(gsm8k.ok()) << gsm8k.status();
  EXPECT_FALSE(gsm8k->train.at(0).reference_is_solution);
}

TEST(LoadRunTaskTest, RepeatedIdsAreMadeUnique) {
  v1::RunSpec spec =
      DatasetSpec(v1::DATASET_FORMAT_JSONL,
                  WriteJsonl("repeated.jsonl", {R"({"id": "a", "prompt": "1", "answer": "1"})",
                                                R"({"id": "a", "prompt": "2", "answer": "2"})",
                                                R"({"id": "a#2", "prompt": "3", "answer": "3"})",
                                                R"({"id": "b", "prompt": "4", "answer": "4"})"}));
  absl::StatusOr<RunTask> task = LoadRunTask(spec);
  ASSERT_TRUE(task.ok()) << task.status();
  std::vector<std::string> ids = Ids(task->train);
  ids.push_back(task->eval.at(0).prompt_id);
  EXPECT_THAT(ids, UnorderedElementsAre("a", "a#2", "a#2#2", "b"));
}

TEST(LoadRunTaskTest, ChatTemplateWrapsDatasetPrompts) {
  v1::RunSpec spec = Gsm8kSpec();
  spec.mutable_task()->set_chat_template("chatml");
  spec.mutable_task()->set_system_prompt("You are a helpful assistant.");
  absl::StatusOr<RunTask> plain = LoadRunTask(Gsm8kSpec());
  absl::StatusOr<RunTask> chat = LoadRunTask(spec);
  ASSERT_TRUE(plain.ok() && chat.ok());
  EXPECT_EQ(chat->eval[0].prompt,
            absl::StrCat("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                         "<|im_start|>user\n",
                         plain->eval[0].prompt, "<|im_end|>\n<|im_start|>assistant\n"));
}

TEST(LoadRunTaskTest, Errors) {
  EXPECT_EQ(LoadRunTask(DatasetSpec(v1::DATASET_FORMAT_GSM8K, Data("datasets/nope.jsonl")))
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<RunTask> mbpp = LoadRunTask(DatasetSpec(v1::DATASET_FORMAT_MBPP, "mbpp.jsonl"));
  EXPECT_EQ(mbpp.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mbpp.status().message(), HasSubstr("task.dataset.format: MBPP is not supported yet"));
  v1::RunSpec no_placeholder = Gsm8kSpec();
  no_placeholder.mutable_task()->set_prompt_template("Solve it.");
  EXPECT_EQ(LoadRunTask(no_placeholder).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadRunTask(v1::RunSpec()).status().code(), absl::StatusCode::kInvalidArgument);
  v1::RunSpec one_row = DatasetSpec(v1::DATASET_FORMAT_JSONL,
                                    WriteJsonl("one.jsonl", {R"({"prompt": "1", "answer": "1"})"}));
  EXPECT_THAT(LoadRunTask(one_row).status().message(), HasSubstr("nothing to train on"));
}

// --- ValidateRunTask ---

TEST(ValidateRunTaskTest, GoodSpecsHaveNoProblems) {
  EXPECT_THAT(Problems(Gsm8kSpec()), IsEmpty());
  v1::RunSpec spec = ArithmeticSpec();
  spec.mutable_task()->set_prompt_template("{question}");
  spec.mutable_task()->set_chat_template("none");
  EXPECT_THAT(Problems(spec), IsEmpty());
}

TEST(ValidateRunTaskTest, MissingFileNamesThePath) {
  const std::string path = Data("datasets/nope.jsonl");
  EXPECT_THAT(Problems(DatasetSpec(v1::DATASET_FORMAT_GSM8K, path)),
              ElementsAre(absl::StrCat("task.dataset.path: cannot read \"", path,
                                       "\": No such file or directory")));
}

TEST(ValidateRunTaskTest, MalformedRowNamesTheLine) {
  const std::string path =
      WriteJsonl("bad.jsonl", {R"({"question": "q", "answer": "#### 1"})", R"({"question": "q"})"});
  EXPECT_THAT(Problems(DatasetSpec(v1::DATASET_FORMAT_GSM8K, path)),
              ElementsAre(absl::StrCat("task.dataset.path: cannot read \"", path,
                                       "\": line 2: no \"answer\" column")));
}

TEST(ValidateRunTaskTest, FormatsWithoutAReader) {
  EXPECT_THAT(Problems(DatasetSpec(v1::DATASET_FORMAT_MBPP, "mbpp.jsonl")),
              ElementsAre(HasSubstr("task.dataset.format: MBPP is not supported yet; use")));
  EXPECT_THAT(Problems(DatasetSpec(v1::DATASET_FORMAT_UNSPECIFIED, "x.jsonl")),
              ElementsAre("task.dataset.format: must be DATASET_FORMAT_JSONL, _GSM8K, _MATH or "
                          "_HUMANEVAL, got DATASET_FORMAT_UNSPECIFIED"));
}

TEST(ValidateRunTaskTest, TemplateProblems) {
  v1::RunSpec spec = Gsm8kSpec();
  spec.mutable_task()->set_prompt_template("Solve:");
  spec.mutable_task()->set_chat_template("foo");
  EXPECT_THAT(Problems(spec),
              ElementsAre("task.prompt_template: must contain \"{question}\" (where the question "
                          "goes)",
                          "task.chat_template: unknown \"foo\"; known: none, chatml"));
  v1::RunSpec system_without_chat = ArithmeticSpec();
  system_without_chat.mutable_task()->set_system_prompt("Be brief.");
  EXPECT_THAT(Problems(system_without_chat),
              ElementsAre(HasSubstr("task.system_prompt: needs a task.chat_template")));
}

TEST(ValidateRunTaskTest, FieldProblems) {
  v1::RunSpec spec = Gsm8kSpec();
  spec.mutable_task()->mutable_dataset()->set_max_prompts(-3);
  spec.mutable_task()->mutable_dataset()->set_prompt_field("q");
  spec.mutable_task()->mutable_dataset()->set_answer_is_solution(true);
  spec.mutable_task()->mutable_dataset()->clear_path();
  EXPECT_THAT(Problems(spec),
              ElementsAre("task.dataset.path: must name a dataset file",
                          HasSubstr("task.dataset.prompt_field: only for DATASET_FORMAT_JSONL"),
                          HasSubstr("task.dataset.answer_is_solution: only for "
                                    "DATASET_FORMAT_JSONL"),
                          "task.dataset.max_prompts: must be >= 0 (0 = all), got -3"));
}

TEST(ValidateRunTaskTest, TooFewRowsForASplitAndTraining) {
  v1::RunSpec spec = Gsm8kSpec();
  spec.mutable_task()->mutable_dataset()->set_max_prompts(1);
  EXPECT_THAT(Problems(spec), ElementsAre(HasSubstr("task.dataset.max_prompts: 1 row leaves "
                                                    "nothing to train on")));
  spec.mutable_task()->mutable_dataset()->set_max_prompts(2);
  EXPECT_THAT(Problems(spec), IsEmpty());
}

TEST(ValidateRunTaskTest, HumanEvalHasNoAnswersToWarmStartOn) {
  v1::RunSpec spec;
  spec.mutable_task()->mutable_dataset()->set_format(v1::DATASET_FORMAT_HUMANEVAL);
  spec.mutable_task()->mutable_dataset()->set_path(std::string(SLUICE_TESTDATA_DIR) +
                                                   "/datasets/humaneval/HumanEval.jsonl.gz");
  spec.mutable_warm_start()->set_sft_steps(10);
  std::vector<std::string> problems;
  ValidateRunTask(spec, &problems);
  EXPECT_THAT(problems, ::testing::ElementsAre(::testing::HasSubstr(
                            "warm_start.sft_steps: HumanEval has no reference answers")));
}

}  // namespace
}  // namespace sluice::run
