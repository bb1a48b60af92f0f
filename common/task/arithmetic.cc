#include "common/task/arithmetic.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/task/shuffle.h"

namespace sluice::task {
namespace {

// Results are computed exactly in 128 bits: with operands below 1e9 and at
// most four of them, |result| <= 4e36 < 2^127.
constexpr int64_t kMaxOperandLimit = 999'999'999;
constexpr int kMinOperands = 2;
constexpr int kMaxOperands = 4;
// The long-tail variant: up to 8 operands below 1000 (|result| < 1e24).
constexpr int kMaxLongOperands = 8;
constexpr int64_t kMaxLongOperand = 999;
// Up to this many distinct problems the whole space is enumerated and
// shuffled; above it, problems are drawn without replacement.
constexpr int64_t kEnumerationLimit = 1'000'000;

int DecimalWidth(int64_t value) {
  int width = 1;
  while (value >= 10) {
    value /= 10;
    ++width;
  }
  return width;
}

std::string Int128ToString(__int128 value) {
  if (value == 0) return "0";
  const bool negative = value < 0;
  unsigned __int128 magnitude =
      negative ? -static_cast<unsigned __int128>(value) : static_cast<unsigned __int128>(value);
  std::string digits;
  while (magnitude > 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(magnitude % 10)));
    magnitude /= 10;
  }
  if (negative) digits.push_back('-');
  return std::string(digits.rbegin(), digits.rend());
}

// Number of distinct problems, saturated at `cap` (enough to compare with the
// sizes asked for).
int64_t CountProblems(const ArithmeticOptions& options, int64_t cap) {
  const int64_t range = options.max_operand - options.min_operand + 1;
  const int64_t ops = static_cast<int64_t>(options.operators.size());
  int64_t count = 1;
  auto multiply = [&](int64_t factor) {
    if (count > cap / factor) {
      count = cap;
    } else {
      count = std::min(cap, count * factor);
    }
  };
  for (int i = 0; i < options.num_operands; ++i) multiply(range);
  for (int i = 0; i + 1 < options.num_operands; ++i) multiply(ops);
  return count;
}

// Distinct problems over every operand count the options allow,
// saturated at `cap`.
int64_t CountAllProblems(const ArithmeticOptions& options, int64_t cap) {
  int64_t count = 0;
  ArithmeticOptions fixed = options;
  for (int k = options.num_operands; k <= std::max(options.num_operands, options.max_operands); ++k) {
    fixed.num_operands = k;
    count = std::min(cap, count + CountProblems(fixed, cap));
  }
  return count;
}

struct Problem {
  std::vector<int64_t> operands;
  std::vector<char> operators;  // operands.size() - 1 of '+', '-', '*'
};

// Usual precedence: '*' binds tighter than '+' and '-', which associate left.
__int128 Evaluate(const Problem& problem) {
  __int128 total = 0;
  __int128 term = problem.operands[0];
  int sign = 1;
  for (size_t i = 0; i < problem.operators.size(); ++i) {
    const char op = problem.operators[i];
    const __int128 next = problem.operands[i + 1];
    if (op == '*') {
      term *= next;
    } else {
      total += sign * term;
      sign = op == '+' ? 1 : -1;
      term = next;
    }
  }
  return total + sign * term;
}

// "52,65" for 07+45+13: the result after each operator, left to right
// (show_work; '+' and '-' only, which associate left).
std::string WorkedAnswer(const Problem& problem) {
  std::string answer;
  __int128 total = problem.operands[0];
  for (size_t i = 0; i < problem.operators.size(); ++i) {
    total += problem.operators[i] == '-' ? -problem.operands[i + 1] : problem.operands[i + 1];
    if (i > 0) answer += ',';
    answer += Int128ToString(total);
  }
  return answer;
}

std::string FormatPrompt(const Problem& problem, int width) {
  std::string prompt;
  char buffer[32];
  for (size_t i = 0; i < problem.operands.size(); ++i) {
    std::snprintf(buffer, sizeof(buffer), "%0*lld", width,
                  static_cast<long long>(problem.operands[i]));
    prompt += buffer;
    prompt += i + 1 < problem.operands.size() ? problem.operators[i] : '=';
  }
  return prompt;
}

// The problem with index `index` in the mixed-radix enumeration: operand 0
// varies slowest, the last operator fastest.
Problem DecodeProblem(uint64_t index, const ArithmeticOptions& options) {
  const uint64_t range = static_cast<uint64_t>(options.max_operand - options.min_operand + 1);
  const uint64_t ops = options.operators.size();
  Problem problem;
  problem.operands.resize(options.num_operands);
  problem.operators.resize(options.num_operands - 1);
  for (int i = options.num_operands - 2; i >= 0; --i) {
    problem.operators[i] = options.operators[index % ops][0];
    index /= ops;
  }
  for (int i = options.num_operands - 1; i >= 0; --i) {
    problem.operands[i] = options.min_operand + static_cast<int64_t>(index % range);
    index /= range;
  }
  return problem;
}

// Operands for the long-tail variant: num_operands + j, P(j) ~ 2^-j.
int DrawOperandCount(std::mt19937_64& rng, const ArithmeticOptions& options) {
  int count = options.num_operands;
  while (count < options.max_operands && UniformBelow(rng, 2) == 1) ++count;
  return count;
}

Problem DrawProblem(std::mt19937_64& rng, const ArithmeticOptions& options) {
  const uint64_t range = static_cast<uint64_t>(options.max_operand - options.min_operand + 1);
  const int count = options.max_operands > options.num_operands ? DrawOperandCount(rng, options)
                                                                  : options.num_operands;
  Problem problem;
  for (int i = 0; i < count; ++i) {
    problem.operands.push_back(options.min_operand + static_cast<int64_t>(UniformBelow(rng, range)));
  }
  for (int i = 0; i + 1 < count; ++i) {
    problem.operators.push_back(options.operators[UniformBelow(rng, options.operators.size())][0]);
  }
  return problem;
}

}  // namespace

absl::Status ValidateArithmeticOptions(const ArithmeticOptions& options) {
  std::vector<std::string> problems;
  if (options.min_operand < 0) {
    problems.push_back(absl::StrCat("min_operand: must be >= 0, got ", options.min_operand));
  }
  if (options.max_operand < options.min_operand) {
    problems.push_back(absl::StrCat("max_operand: must be >= min_operand (", options.min_operand,
                                    "), got ", options.max_operand));
  }
  if (options.max_operand > kMaxOperandLimit) {
    problems.push_back(
        absl::StrCat("max_operand: must be <= ", kMaxOperandLimit, ", got ", options.max_operand));
  }
  if (options.num_operands < kMinOperands || options.num_operands > kMaxOperands) {
    problems.push_back(absl::StrCat("num_operands: must be in [", kMinOperands, ", ", kMaxOperands,
                                    "], got ", options.num_operands));
  }
  if (options.max_operands != 0 &&
      (options.max_operands < options.num_operands || options.max_operands > kMaxLongOperands)) {
    problems.push_back(absl::StrCat("max_operands: must be 0 (= num_operands) or in [num_operands (",
                                    options.num_operands, "), ", kMaxLongOperands, "], got ",
                                    options.max_operands));
  }
  if (options.max_operands > kMaxOperands && options.max_operand > kMaxLongOperand) {
    problems.push_back(absl::StrCat("max_operand: must be <= ", kMaxLongOperand, " with more than ",
                                    kMaxOperands, " operands (max_operands ", options.max_operands,
                                    "), got ", options.max_operand));
  }
  if (options.show_work) {
    for (const std::string& op : options.operators) {
      if (op == "*") {
        problems.push_back("show_work: needs operators among \"+\" and \"-\" (running results "
                           "of a product would not be the expression's steps), got \"*\"");
      }
    }
  }
  if (options.operators.empty()) {
    problems.push_back("operators: must name at least one of \"+\", \"-\", \"*\"");
  }
  bool operators_ok = !options.operators.empty();
  for (size_t i = 0; i < options.operators.size(); ++i) {
    const std::string& op = options.operators[i];
    if (op != "+" && op != "-" && op != "*") {
      problems.push_back(absl::StrCat("operators[", i, "]: must be \"+\", \"-\" or \"*\", got \"",
                                      op, "\""));
      operators_ok = false;
      continue;
    }
    for (size_t j = 0; j < i; ++j) {
      if (options.operators[j] == op) {
        problems.push_back(absl::StrCat("operators[", i, "]: duplicate \"", op, "\""));
        operators_ok = false;
        break;
      }
    }
  }
  if (options.num_prompts <= 0) {
    problems.push_back(absl::StrCat("num_prompts: must be > 0, got ", options.num_prompts));
  }
  if (options.eval_size < 0) {
    problems.push_back(absl::StrCat("eval_size: must be >= 0, got ", options.eval_size));
  }
  // The space can only be sized once the fields it depends on are sound.
  if (problems.empty() && operators_ok) {
    const int64_t needed = options.eval_size + 1;
    const int64_t available = CountAllProblems(options, needed);
    if (available < needed) {
      problems.push_back(absl::StrCat("eval_size: only ", available,
                                      " distinct problems exist, which leaves no training "
                                      "problem after holding out eval_size = ",
                                      options.eval_size));
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("invalid arithmetic task options: ", absl::StrJoin(problems, "; ")));
}

absl::StatusOr<ArithmeticTask> ArithmeticTask::Generate(const ArithmeticOptions& options) {
  RETURN_IF_ERROR(ValidateArithmeticOptions(options));

  const int64_t wanted = options.eval_size + options.num_prompts;
  const int64_t total = CountAllProblems(options, std::numeric_limits<int64_t>::max());
  const int64_t taken = std::min(wanted, total);
  std::mt19937_64 rng(options.seed);

  std::vector<Problem> problems;
  problems.reserve(static_cast<size_t>(taken));
  const bool long_tail = options.max_operands > options.num_operands;
  if (total <= kEnumerationLimit && !long_tail) {
    std::vector<uint32_t> order(static_cast<size_t>(total));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
    Shuffle(order, rng);
    for (int64_t i = 0; i < taken; ++i) problems.push_back(DecodeProblem(order[i], options));
  } else {
    // More problems than we enumerate: draw until `taken` distinct ones. The
    // draw order is itself uniformly random, so no shuffle is needed.
    const int width = DecimalWidth(options.max_operand);
    std::unordered_set<std::string> seen;
    while (static_cast<int64_t>(problems.size()) < taken) {
      Problem problem = DrawProblem(rng, options);
      if (seen.insert(FormatPrompt(problem, width)).second) problems.push_back(std::move(problem));
    }
  }

  const int width = DecimalWidth(options.max_operand);
  ArithmeticTask task;
  task.eval.reserve(static_cast<size_t>(options.eval_size));
  task.train.reserve(static_cast<size_t>(taken - options.eval_size));
  char id[32];
  for (int64_t i = 0; i < taken; ++i) {
    std::snprintf(id, sizeof(id), "arith-%06lld", static_cast<long long>(i));
    TaskItem item{id, FormatPrompt(problems[i], width),
                  options.show_work ? WorkedAnswer(problems[i])
                                    : Int128ToString(Evaluate(problems[i]))};
    (i < options.eval_size ? task.eval : task.train).push_back(std::move(item));
  }
  return task;
}

}  // namespace sluice::task
