// MathVerifier, the code the reward server runs for "math", on the reference
// answers of MATH-500 and GSM8K as the dataset readers hand them to a run
// (common/task/datasets.h). A response that boxes a problem's own answer must
// score 1; one that boxes another problem's answer must score 0 unless the
// two answers are the same answer written differently (listed below, each
// with why).

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/task/datasets.h"
#include "gtest/gtest.h"
#include "reward_server/math_verifier.h"

namespace sluice::reward_server {
namespace {

// Failures reported one by one at most; the count is always reported.
constexpr size_t kMaxReported = 20;

std::vector<task::DatasetRecord> Read(const std::string& relative, task::DatasetKind kind) {
  absl::StatusOr<std::vector<task::DatasetRecord>> records =
      task::ReadDataset(std::string(SLUICE_TESTDATA_DIR) + "/" + relative, kind);
  EXPECT_TRUE(records.ok()) << records.status();
  return records.ok() ? *std::move(records) : std::vector<task::DatasetRecord>{};
}

std::string BoxedResponse(const std::string& answer) {
  return absl::StrCat("The answer is $\\boxed{", answer, "}$.");
}

double Reward(const MathVerifier& verifier, const std::string& response,
              const std::string& reference, bool reference_is_solution) {
  VerifyRequest request;
  request.response = response;
  request.reference_answer = reference;
  request.reference_is_solution = reference_is_solution;
  const VerifyOutcome outcome = verifier.Verify(request);
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone)
      << "reference " << reference << ": " << outcome.detail;
  return outcome.reward;
}

std::string WithoutSpaces(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) out.push_back(c);
  }
  return out;
}

// Pairs (response row, reference row) of distinct rows: each row against the
// next (shifted by one, wrapping) and against its image under three seeded
// shuffles.
std::vector<std::pair<size_t, size_t>> CrossPairs(size_t rows) {
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t i = 0; i < rows; ++i) pairs.push_back({i, (i + 1) % rows});
  for (const uint32_t seed : {1u, 2u, 3u}) {
    std::vector<size_t> image(rows);
    for (size_t i = 0; i < rows; ++i) image[i] = i;
    std::mt19937 rng(seed);
    std::shuffle(image.begin(), image.end(), rng);
    for (size_t i = 0; i < rows; ++i) {
      if (image[i] != i) pairs.push_back({i, image[i]});
    }
  }
  return pairs;
}

struct CrossPairTally {
  int pairs = 0;
  int identical = 0;   // The same answer string (up to spaces): reward 1.
  int equivalent = 0;  // Listed as equivalent: reward 1.
  int wrong = 0;       // Disagreements with the expectation.
};

// Scores every cross pair; `expected_equal(a, b)` says whether the answers
// of rows a and b are the same answer. Reports each disagreement.
template <typename Answer, typename Expected>
CrossPairTally ScoreCrossPairs(const std::vector<task::DatasetRecord>& records,
                               const Answer& response_answer, bool reference_is_solution,
                               const Expected& expected_equal) {
  const MathVerifier verifier;
  CrossPairTally tally;
  for (const auto& [from, to] : CrossPairs(records.size())) {
    const task::DatasetRecord& response_row = records[from];
    const task::DatasetRecord& reference_row = records[to];
    const std::string reference = reference_is_solution
                                      ? reference_row.metadata.at("solution")
                                      : reference_row.reference_answer;
    const double reward = Reward(verifier, BoxedResponse(response_answer(response_row)),
                                 reference, reference_is_solution);
    const int expected = expected_equal(response_row, reference_row);
    ++tally.pairs;
    if (expected == 1) ++tally.identical;
    if (expected == 2) ++tally.equivalent;
    if ((reward == 1.0) != (expected > 0)) {
      if (++tally.wrong <= static_cast<int>(kMaxReported)) {
        ADD_FAILURE() << "response boxing " << response_answer(response_row) << " ("
                      << response_row.id << ") against reference "
                      << reference_row.reference_answer << " (" << reference_row.id
                      << "): reward " << reward << ", expected " << (expected > 0 ? 1 : 0);
      }
    }
  }
  return tally;
}

// ---------------------------------------------------------------------------
// MATH-500

// Answers of different MATH-500 problems that are one answer written two
// ways, and why. Pairs the same up to spaces ("2\sqrt{5}", "2 \sqrt{5}")
// need no entry.
struct EquivalentAnswers {
  std::string a;
  std::string b;
  std::string why;
};

// Every such pair among the 300 distinct answers (the exhaustive test below
// keeps the list complete).
const std::vector<EquivalentAnswers>& Math500EquivalentAnswers() {
  static const auto* const kAnswers = new std::vector<EquivalentAnswers>{
      {"1,-2", "-2,1", "the same two solutions (\"enter all the roots\"), in another order"},
      {"-2,1", "(-2,1)", "the same numbers in the same order, with and without parentheses"},
      {"\\frac14", "\\frac{1}{4}", "LaTeX's \\frac14 shorthand for \\frac{1}{4}"},
      {"10,\\!080", "10080", "a thousands separator (\",\\!\")"},
      {"x=5", "5", "x = 5 gives the value 5 (an assignment answers with its value)"},
      {"30^\\circ", "30", "30 degrees: the unit left out"},
      {"36^\\circ", "36", "36 degrees: the unit left out"},
      {"90^\\circ", "90", "90 degrees: the unit left out"},
      {"120^\\circ", "120", "120 degrees: the unit left out"},
      {"\\$36", "36", "36 dollars: the unit left out"},
      {"15\\mbox{ cm}^2", "15", "15 square centimetres: the unit left out"},
      {"52_8", "42", "52 in base 8 is 42"},
      {"204_5", "54", "204 in base 5 is 54"},
      {"40_9", "36", "40 in base 9 is 36"},
      {"40_9", "36^\\circ", "40 in base 9 is 36 (the degrees left out)"},
      {"40_9", "\\$36", "40 in base 9 is 36 (the dollars left out)"},
  };
  return *kAnswers;
}

// 0: different answers; 1: the same string up to spaces; 2: listed above.
int Math500Expected(const task::DatasetRecord& a, const task::DatasetRecord& b) {
  const std::string x = WithoutSpaces(a.reference_answer);
  const std::string y = WithoutSpaces(b.reference_answer);
  if (x == y) return 1;
  for (const EquivalentAnswers& pair : Math500EquivalentAnswers()) {
    const std::string p = WithoutSpaces(pair.a);
    const std::string q = WithoutSpaces(pair.b);
    if ((x == p && y == q) || (x == q && y == p)) return 2;
  }
  return 0;
}

TEST(MathVerifierDatasetsTest, EveryMath500AnswerBoxedScoresOneAgainstItself) {
  const std::vector<task::DatasetRecord> records =
      Read("datasets/math500/test.jsonl", task::DatasetKind::kMath);
  ASSERT_EQ(records.size(), 500u);
  const MathVerifier verifier;
  int correct = 0;
  size_t reported = 0;
  for (const task::DatasetRecord& record : records) {
    const double reward = Reward(verifier, BoxedResponse(record.reference_answer),
                                 record.reference_answer, /*reference_is_solution=*/false);
    if (reward == 1.0) {
      ++correct;
    } else if (++reported <= kMaxReported) {
      ADD_FAILURE() << record.id << ": reference " << record.reference_answer << " scored "
                    << reward;
    }
  }
  std::printf("MATH-500 self-pairs: %d/%zu score 1\n", correct, records.size());
  EXPECT_EQ(correct, 500);
}

TEST(MathVerifierDatasetsTest, Math500AnswersOfOtherProblemsScoreZeroUnlessEquivalent) {
  const std::vector<task::DatasetRecord> records =
      Read("datasets/math500/test.jsonl", task::DatasetKind::kMath);
  ASSERT_EQ(records.size(), 500u);
  const CrossPairTally tally = ScoreCrossPairs(
      records, [](const task::DatasetRecord& row) { return row.reference_answer; },
      /*reference_is_solution=*/false, Math500Expected);
  std::printf(
      "MATH-500 cross pairs: %d, of which %d share the answer string and %d are listed "
      "equivalents; %d disagreements\n",
      tally.pairs, tally.identical, tally.equivalent, tally.wrong);
  EXPECT_EQ(tally.wrong, 0);
}

// Every ordered pair of distinct answers (up to spaces), so that the list of
// equivalents above is complete and each entry holds both ways. "36^\circ"
// and "\$36" are the one pair of equal numbers not listed: both carry a unit
// and not the same one.
TEST(MathVerifierDatasetsTest, EveryPairOfDistinctMath500AnswersScoresZeroUnlessListed) {
  const std::vector<task::DatasetRecord> records =
      Read("datasets/math500/test.jsonl", task::DatasetKind::kMath);
  std::vector<task::DatasetRecord> distinct;
  std::set<std::string> seen;
  for (const task::DatasetRecord& record : records) {
    if (seen.insert(WithoutSpaces(record.reference_answer)).second) distinct.push_back(record);
  }
  ASSERT_EQ(distinct.size(), 300u);
  const MathVerifier verifier;
  std::set<std::pair<std::string, std::string>> scored_one;
  int pairs = 0, wrong = 0;
  for (const task::DatasetRecord& response_row : distinct) {
    for (const task::DatasetRecord& reference_row : distinct) {
      if (&response_row == &reference_row) continue;
      ++pairs;
      const double reward = Reward(verifier, BoxedResponse(response_row.reference_answer),
                                   reference_row.reference_answer,
                                   /*reference_is_solution=*/false);
      if (reward == 1.0) {
        scored_one.insert({WithoutSpaces(response_row.reference_answer),
                           WithoutSpaces(reference_row.reference_answer)});
      }
      if ((reward == 1.0) != (Math500Expected(response_row, reference_row) > 0) &&
          ++wrong <= static_cast<int>(kMaxReported)) {
        ADD_FAILURE() << "response boxing " << response_row.reference_answer
                      << " against reference " << reference_row.reference_answer << ": reward "
                      << reward;
      }
    }
  }
  // Each listed pair is in the data and scored 1 both ways.
  for (const EquivalentAnswers& pair : Math500EquivalentAnswers()) {
    const std::string a = WithoutSpaces(pair.a);
    const std::string b = WithoutSpaces(pair.b);
    EXPECT_TRUE(scored_one.count({a, b}) && scored_one.count({b, a}))
        << pair.a << " and " << pair.b << " (" << pair.why << ")";
  }
  std::printf("MATH-500 distinct answers: %zu, ordered pairs %d, scored 1: %zu (%zu listed "
              "pairs, both ways); %d disagreements\n",
              distinct.size(), pairs, scored_one.size(), Math500EquivalentAnswers().size(),
              wrong);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(scored_one.size(), 2 * Math500EquivalentAnswers().size());
}

// ---------------------------------------------------------------------------
// GSM8K: every reference is an integer; two answers are the same when their
// numbers are.

int Gsm8kExpected(const task::DatasetRecord& a, const task::DatasetRecord& b) {
  return NumbersEqual(a.reference_answer, b.reference_answer) ? 1 : 0;
}

// The final answer as the solution writes it after "####" ("1,600").
std::string Gsm8kWrittenAnswer(const task::DatasetRecord& row) {
  const std::string& solution = row.metadata.at("solution");
  return std::string(absl::StripAsciiWhitespace(
      absl::string_view(solution).substr(solution.rfind("####") + 4)));
}

TEST(MathVerifierDatasetsTest, EveryGsm8kAnswerBoxedScoresOneAgainstItsAnswerAndItsSolution) {
  const std::vector<task::DatasetRecord> records =
      Read("datasets/gsm8k/test.jsonl", task::DatasetKind::kGsm8k);
  ASSERT_EQ(records.size(), 1319u);
  const MathVerifier verifier;
  int against_answer = 0, against_solution = 0;
  for (const task::DatasetRecord& record : records) {
    const std::string written = Gsm8kWrittenAnswer(record);
    const double by_answer = Reward(verifier, BoxedResponse(written), record.reference_answer,
                                    /*reference_is_solution=*/false);
    const double by_solution = Reward(verifier, BoxedResponse(written),
                                      record.metadata.at("solution"),
                                      /*reference_is_solution=*/true);
    against_answer += by_answer == 1.0;
    against_solution += by_solution == 1.0;
    EXPECT_EQ(by_answer, 1.0) << record.id << ": " << written << " vs "
                              << record.reference_answer;
    EXPECT_EQ(by_solution, 1.0) << record.id << ": " << written << " vs its solution";
    // Unmarked, a solution does not parse as one answer, so it is still
    // extracted from.
    EXPECT_EQ(Reward(verifier, BoxedResponse(written), record.metadata.at("solution"),
                     /*reference_is_solution=*/false),
              1.0)
        << record.id << ": " << written << " vs its unmarked solution";
  }
  std::printf("GSM8K self-pairs: %d/%zu against the answer, %d/%zu against the solution\n",
              against_answer, records.size(), against_solution, records.size());
}

TEST(MathVerifierDatasetsTest, Gsm8kAnswersOfOtherProblemsScoreZeroUnlessTheSameNumber) {
  const std::vector<task::DatasetRecord> records =
      Read("datasets/gsm8k/test.jsonl", task::DatasetKind::kGsm8k);
  ASSERT_EQ(records.size(), 1319u);
  for (const bool solution : {false, true}) {
    SCOPED_TRACE(solution ? "reference: the solution" : "reference: the answer");
    const CrossPairTally tally =
        ScoreCrossPairs(records, Gsm8kWrittenAnswer, solution, Gsm8kExpected);
    std::printf("GSM8K cross pairs against the %s: %d, of which %d have the same number; "
                "%d disagreements\n",
                solution ? "solution" : "answer", tally.pairs, tally.identical, tally.wrong);
    EXPECT_EQ(tally.wrong, 0);
  }
}

}  // namespace
}  // namespace sluice::reward_server
