#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/task/arithmetic.h"
#include "common/task/char_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::task {
namespace {

using ::testing::HasSubstr;

TEST(CharTokenizerTest, IdsAreTheDocumentedOnes) {
  CharTokenizer tokenizer;
  EXPECT_EQ(tokenizer.vocab_size(), 24);
  EXPECT_EQ(tokenizer.pad_id(), 0);
  EXPECT_EQ(tokenizer.bos_id(), 1);
  EXPECT_EQ(tokenizer.eos_id(), 2);
  EXPECT_EQ(tokenizer.IdToToken(0), "<pad>");
  EXPECT_EQ(tokenizer.IdToToken(1), "<bos>");
  EXPECT_EQ(tokenizer.IdToToken(2), "<eos>");
  const std::string alphabet = "0123456789+-*=() .,?:";
  for (size_t i = 0; i < alphabet.size(); ++i) {
    EXPECT_EQ(tokenizer.IdToToken(static_cast<int32_t>(3 + i)), std::string(1, alphabet[i]));
  }
  EXPECT_EQ(tokenizer.IdToToken(24), "");
  EXPECT_EQ(tokenizer.IdToToken(-1), "");
}

TEST(CharTokenizerTest, EncodesAndDecodesRoundTrip) {
  CharTokenizer tokenizer;
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode("07+45=");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<int32_t>{3, 10, 13, 7, 8, 16}));
  absl::StatusOr<std::string> text = tokenizer.Decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "07+45=");
  absl::StatusOr<std::vector<int32_t>> all = tokenizer.Encode("0123456789+-*=() .,?:");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*tokenizer.Decode(*all), "0123456789+-*=() .,?:");
  EXPECT_TRUE(tokenizer.Encode("")->empty());
}

TEST(CharTokenizerTest, SpecialTokensDecodeToNothing) {
  CharTokenizer tokenizer;
  EXPECT_EQ(*tokenizer.Decode({1, 8, 3, 2, 0, 0}), "50");
}

TEST(CharTokenizerTest, RejectsUnknownCharacterNamingItAndItsOffset) {
  CharTokenizer tokenizer;
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode("12+a");
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("'a'"));
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("offset 3"));
  EXPECT_FALSE(tokenizer.Encode("1\n").ok());
  EXPECT_FALSE(tokenizer.Encode("\xff").ok());
}

TEST(CharTokenizerTest, DecodeRejectsOutOfRangeIds) {
  CharTokenizer tokenizer;
  absl::StatusOr<std::string> text = tokenizer.Decode({3, 24});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()), HasSubstr("24"));
  EXPECT_FALSE(tokenizer.Decode({-1}).ok());
}

// Evaluates "a op b op c ... =" with the usual precedence, independently of
// the implementation (two passes).
long long Reference(const std::string& prompt) {
  std::vector<long long> values;
  std::vector<char> ops;
  long long current = 0;
  for (char c : prompt) {
    if (c >= '0' && c <= '9') {
      current = current * 10 + (c - '0');
    } else {
      values.push_back(current);
      current = 0;
      if (c != '=') ops.push_back(c);
    }
  }
  std::vector<long long> terms = {values[0]};
  std::vector<char> additive;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i] == '*') {
      terms.back() *= values[i + 1];
    } else {
      additive.push_back(ops[i]);
      terms.push_back(values[i + 1]);
    }
  }
  long long result = terms[0];
  for (size_t i = 0; i < additive.size(); ++i) {
    result += additive[i] == '+' ? terms[i + 1] : -terms[i + 1];
  }
  return result;
}

TEST(ArithmeticTaskTest, DefaultTaskHasFixedWidthPromptsAndCorrectAnswers) {
  ArithmeticOptions options;  // 2-digit addition, 500 eval, 10,000 asked for
  absl::StatusOr<ArithmeticTask> task = ArithmeticTask::Generate(options);
  ASSERT_TRUE(task.ok()) << task.status();
  // 100 * 100 problems exist: the training pool gets what is left.
  EXPECT_EQ(task->eval.size(), 500u);
  EXPECT_EQ(task->train.size(), 9500u);
  for (const auto* split : {&task->eval, &task->train}) {
    for (const TaskItem& item : *split) {
      ASSERT_EQ(item.prompt.size(), 6u) << item.prompt;
      EXPECT_EQ(item.prompt[2], '+');
      EXPECT_EQ(item.prompt[5], '=');
      EXPECT_EQ(item.reference_answer, std::to_string(Reference(item.prompt))) << item.prompt;
    }
  }
  EXPECT_EQ(task->eval[0].prompt_id, "arith-000000");
  EXPECT_EQ(task->eval[499].prompt_id, "arith-000499");
  EXPECT_EQ(task->train[0].prompt_id, "arith-000500");
  EXPECT_EQ(task->train.back().prompt_id, "arith-009999");
}

TEST(ArithmeticTaskTest, EvalAndTrainAreDisjointAndDistinct) {
  ArithmeticOptions options;
  options.num_prompts = 2000;
  options.seed = 7;
  ArithmeticTask task = *ArithmeticTask::Generate(options);
  std::set<std::string> eval_prompts;
  for (const TaskItem& item : task.eval) eval_prompts.insert(item.prompt);
  EXPECT_EQ(eval_prompts.size(), task.eval.size());
  std::set<std::string> train_prompts;
  for (const TaskItem& item : task.train) {
    EXPECT_EQ(eval_prompts.count(item.prompt), 0u) << item.prompt;
    train_prompts.insert(item.prompt);
  }
  EXPECT_EQ(train_prompts.size(), 2000u);
}

TEST(ArithmeticTaskTest, SameSeedSameItemsDifferentSeedDifferentOrder) {
  ArithmeticOptions options;
  options.num_prompts = 100;
  options.eval_size = 50;
  options.seed = 3;
  ArithmeticTask first = *ArithmeticTask::Generate(options);
  ArithmeticTask second = *ArithmeticTask::Generate(options);
  ASSERT_EQ(first.train.size(), second.train.size());
  for (size_t i = 0; i < first.train.size(); ++i) {
    EXPECT_EQ(first.train[i].prompt, second.train[i].prompt);
    EXPECT_EQ(first.train[i].prompt_id, second.train[i].prompt_id);
  }
  for (size_t i = 0; i < first.eval.size(); ++i) EXPECT_EQ(first.eval[i].prompt, second.eval[i].prompt);

  options.seed = 4;
  ArithmeticTask other = *ArithmeticTask::Generate(options);
  int same = 0;
  for (size_t i = 0; i < first.train.size(); ++i) same += first.train[i].prompt == other.train[i].prompt;
  EXPECT_LT(same, 10);
}

// Pins the shuffle: the items must be the same on every machine and standard
// library, so a change here breaks reproducibility of held-out splits.
TEST(ArithmeticTaskTest, ItemsArePinnedForSeedZero) {
  ArithmeticOptions options;
  options.num_prompts = 3;
  options.eval_size = 2;
  ArithmeticTask task = *ArithmeticTask::Generate(options);
  ASSERT_EQ(task.eval.size(), 2u);
  ASSERT_EQ(task.train.size(), 3u);
  std::vector<std::string> prompts;
  for (const TaskItem& item : task.eval) prompts.push_back(item.prompt);
  for (const TaskItem& item : task.train) prompts.push_back(item.prompt);
  EXPECT_EQ(prompts, (std::vector<std::string>{"96+71=", "70+29=", "65+49=", "47+77=", "90+16="}));
}

TEST(ArithmeticTaskTest, SubtractionAndMultiplicationAnswers) {
  ArithmeticOptions options;
  options.min_operand = 0;
  options.max_operand = 9;
  options.num_operands = 3;
  options.operators = {"+", "-", "*"};
  options.eval_size = 10;
  options.num_prompts = 100000;
  ArithmeticTask task = *ArithmeticTask::Generate(options);
  // 10^3 operands x 3^2 operator pairs.
  EXPECT_EQ(task.eval.size() + task.train.size(), 9000u);
  bool saw_negative = false;
  for (const TaskItem& item : task.train) {
    ASSERT_EQ(item.prompt.size(), 6u);
    EXPECT_EQ(item.reference_answer, std::to_string(Reference(item.prompt))) << item.prompt;
    saw_negative |= item.reference_answer[0] == '-';
  }
  EXPECT_TRUE(saw_negative);
  // Spot checks of the precedence rule.
  std::map<std::string, std::string> answers;
  for (const auto* split : {&task.eval, &task.train}) {
    for (const TaskItem& item : *split) answers[item.prompt] = item.reference_answer;
  }
  EXPECT_EQ(answers["2+3*4="], "14");
  EXPECT_EQ(answers["2-3-4="], "-5");
  EXPECT_EQ(answers["9*9-9="], "72");
  EXPECT_EQ(answers["0-9*9="], "-81");
}

TEST(ArithmeticTaskTest, OperandsAreZeroPaddedToTheWidthOfMaxOperand) {
  ArithmeticOptions options;
  options.min_operand = 5;
  options.max_operand = 120;
  options.operators = {"-"};
  options.eval_size = 0;
  options.num_prompts = 50;
  ArithmeticTask task = *ArithmeticTask::Generate(options);
  ASSERT_EQ(task.train.size(), 50u);
  EXPECT_TRUE(task.eval.empty());
  for (const TaskItem& item : task.train) {
    ASSERT_EQ(item.prompt.size(), 8u) << item.prompt;
    EXPECT_EQ(item.prompt[3], '-');
    const int a = std::stoi(item.prompt.substr(0, 3));
    const int b = std::stoi(item.prompt.substr(4, 3));
    EXPECT_GE(a, 5);
    EXPECT_LE(b, 120);
    EXPECT_EQ(item.reference_answer, std::to_string(a - b));
  }
}

TEST(ArithmeticTaskTest, LargeSpacesAreDrawnWithoutReplacement) {
  ArithmeticOptions options;
  options.max_operand = 99999;  // 10^10 problems: drawn, not enumerated
  options.operators = {"*"};
  options.eval_size = 100;
  options.num_prompts = 1000;
  options.seed = 11;
  ArithmeticTask task = *ArithmeticTask::Generate(options);
  ArithmeticTask again = *ArithmeticTask::Generate(options);
  ASSERT_EQ(task.train.size(), 1000u);
  std::set<std::string> prompts;
  for (const auto* split : {&task.eval, &task.train}) {
    for (const TaskItem& item : *split) {
      prompts.insert(item.prompt);
      ASSERT_EQ(item.prompt.size(), 12u);
      EXPECT_EQ(item.reference_answer, std::to_string(Reference(item.prompt)));
    }
  }
  EXPECT_EQ(prompts.size(), 1100u);
  for (size_t i = 0; i < task.train.size(); ++i) EXPECT_EQ(task.train[i].prompt, again.train[i].prompt);
}

TEST(ArithmeticTaskTest, ValidationNamesEveryBadField) {
  ArithmeticOptions options;
  options.min_operand = -1;
  options.max_operand = -2;
  options.num_operands = 5;
  options.operators = {"+", "/", "+"};
  options.num_prompts = 0;
  options.eval_size = -3;
  absl::Status status = ValidateArithmeticOptions(options);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const std::string message(status.message());
  EXPECT_THAT(message, HasSubstr("min_operand: must be >= 0, got -1"));
  EXPECT_THAT(message, HasSubstr("max_operand: must be >= min_operand (-1), got -2"));
  EXPECT_THAT(message, HasSubstr("num_operands: must be in [2, 4], got 5"));
  EXPECT_THAT(message, HasSubstr("operators[1]: must be \"+\", \"-\" or \"*\", got \"/\""));
  EXPECT_THAT(message, HasSubstr("operators[2]: duplicate \"+\""));
  EXPECT_THAT(message, HasSubstr("num_prompts: must be > 0, got 0"));
  EXPECT_THAT(message, HasSubstr("eval_size: must be >= 0, got -3"));
  EXPECT_EQ(ArithmeticTask::Generate(options).status().code(), absl::StatusCode::kInvalidArgument);

  ArithmeticOptions no_operators;
  no_operators.operators.clear();
  EXPECT_THAT(std::string(ValidateArithmeticOptions(no_operators).message()),
              HasSubstr("operators: must name at least one"));

  ArithmeticOptions huge;
  huge.max_operand = 1'000'000'000;
  EXPECT_THAT(std::string(ValidateArithmeticOptions(huge).message()), HasSubstr("max_operand: must be <="));
}

TEST(ArithmeticTaskTest, ValidationNeedsOneTrainingProblemBeyondTheEvalSplit) {
  ArithmeticOptions options;
  options.max_operand = 2;  // 3 x 3 = 9 problems
  options.eval_size = 9;
  absl::Status status = ValidateArithmeticOptions(options);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("eval_size: only 9 distinct problems"));
  options.eval_size = 8;
  ArithmeticTask task = *ArithmeticTask::Generate(options);
  EXPECT_EQ(task.eval.size(), 8u);
  EXPECT_EQ(task.train.size(), 1u);
}

// The long-tail variant: operand counts from num_operands up, halving in
// probability per extra operand, and answers that show every step.
TEST(ArithmeticTaskTest, LongTailShowsTheWorkAndMostExpressionsAreShort) {
  ArithmeticOptions options;
  options.num_operands = 2;
  options.max_operands = 6;
  options.operators = {"+", "-"};
  options.show_work = true;
  options.num_prompts = 4000;
  options.eval_size = 200;
  options.seed = 5;
  absl::StatusOr<ArithmeticTask> task = ArithmeticTask::Generate(options);
  ASSERT_TRUE(task.ok()) << task.status();
  ASSERT_EQ(task->train.size(), 4000u);
  std::map<int, int> by_count;
  std::set<std::string> prompts;
  for (const TaskItem& item : task->train) {
    EXPECT_TRUE(prompts.insert(item.prompt).second) << item.prompt;
    // Operands and the running results, recomputed here.
    std::vector<long long> operands;
    std::vector<char> ops;
    long long current = 0;
    for (char c : item.prompt) {
      if (c >= '0' && c <= '9') {
        current = current * 10 + (c - '0');
      } else {
        operands.push_back(current);
        current = 0;
        if (c != '=') ops.push_back(c);
      }
    }
    ++by_count[static_cast<int>(operands.size())];
    std::string expected;
    long long total = operands[0];
    for (size_t i = 0; i < ops.size(); ++i) {
      total += ops[i] == '+' ? operands[i + 1] : -operands[i + 1];
      expected += (i > 0 ? "," : "") + std::to_string(total);
    }
    EXPECT_EQ(item.reference_answer, expected) << item.prompt;
    // The final result is the expression's value.
    EXPECT_EQ(std::to_string(Reference(item.prompt)),
              expected.substr(expected.rfind(',') == std::string::npos ? 0 : expected.rfind(',') + 1));
  }
  // P(2) = 1/2, P(3) = 1/4, ... P(6) = 1/16 (the tail's rest folds into 6).
  EXPECT_NEAR(by_count[2] / 4000.0, 0.5, 0.04);
  EXPECT_NEAR(by_count[3] / 4000.0, 0.25, 0.03);
  EXPECT_NEAR(by_count[6] / 4000.0, 0.0625, 0.02);
  EXPECT_EQ(by_count.count(7), 0u);
  EXPECT_EQ(by_count.begin()->first, 2);

  // Deterministic in the options.
  absl::StatusOr<ArithmeticTask> again = ArithmeticTask::Generate(options);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->train[17].prompt, task->train[17].prompt);
  EXPECT_EQ(again->eval[3].reference_answer, task->eval[3].reference_answer);
}

TEST(ArithmeticTaskTest, LongTailValidation) {
  ArithmeticOptions options;
  options.num_operands = 3;
  options.max_operands = 2;
  EXPECT_THAT(std::string(ValidateArithmeticOptions(options).message()),
              HasSubstr("max_operands: must be 0 (= num_operands) or in [num_operands (3), 8], got 2"));
  options.max_operands = 9;
  EXPECT_THAT(std::string(ValidateArithmeticOptions(options).message()), HasSubstr("got 9"));
  options.max_operands = 6;
  options.max_operand = 5000;
  EXPECT_THAT(std::string(ValidateArithmeticOptions(options).message()),
              HasSubstr("max_operand: must be <= 999 with more than 4 operands"));
  ArithmeticOptions product;
  product.operators = {"+", "*"};
  product.show_work = true;
  EXPECT_THAT(std::string(ValidateArithmeticOptions(product).message()),
              HasSubstr("show_work: needs operators among"));
  // Two operands with show_work: the one step is the answer.
  ArithmeticOptions two;
  two.show_work = true;
  two.num_prompts = 10;
  ArithmeticTask task = *ArithmeticTask::Generate(two);
  for (const TaskItem& item : task.train) {
    EXPECT_EQ(item.reference_answer, std::to_string(Reference(item.prompt)));
  }
}

}  // namespace
}  // namespace sluice::task
