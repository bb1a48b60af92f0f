#include "reward_server/code_verifier.h"

#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "reward_server/builtin_verifiers.h"

namespace sluice::reward_server {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr char kAddTest[] = R"py(
def check(candidate):
    assert candidate(2, 3) == 5
    assert candidate(-1, 1) == 0
)py";

VerifyRequest AddRequest(std::string response, absl::Duration timeout = absl::Seconds(20)) {
  VerifyRequest request;
  request.prompt = "def add(a, b):\n";
  request.response = std::move(response);
  request.test = kAddTest;
  request.entry_point = "add";
  request.deadline = absl::Now() + timeout;
  return request;
}

CodeVerifierOptions WithSlots(int slots) {
  CodeVerifierOptions options;
  options.sandbox_slots = slots;
  return options;
}

// Every case through the pool of prepared sandboxes (the default, 2 slots)
// and through a fresh sandbox per program (0).
class CodeVerifierTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    // Fails (never skips) where namespaces are refused, with the hint.
    const absl::Status status = CheckSandboxAvailable(CodeVerifierOptions());
    ASSERT_TRUE(status.ok()) << status;
  }

  VerifyOutcome Verify(const VerifyRequest& request) { return verifier_.Verify(request); }

  CodeVerifier verifier_{WithSlots(GetParam())};
};

INSTANTIATE_TEST_SUITE_P(Sandboxes, CodeVerifierTest, ::testing::Values(2, 0),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param > 0 ? std::string("Pooled") : std::string("PerRun");
                         });

// A pool whose slots are all busy until an item's deadline fails the item as
// unavailable (retryable: the server's load), not as the model's fault.
TEST(CodeVerifierPoolTest, NoFreeSlotBeforeTheDeadlineIsUnavailable) {
  CodeVerifier verifier(WithSlots(1));
  std::thread busy([&] {
    const VerifyOutcome slow =
        verifier.Verify(AddRequest("    import time\n    time.sleep(3)\n    return a + b\n"));
    EXPECT_EQ(slow.reward, 1.0) << slow.detail;
  });
  // Its one slot taken (however long that takes here), and held for seconds
  // after: far more than the 300 ms the next item may wait.
  EXPECT_NE(verifier.pool(), nullptr);
  if (verifier.pool() != nullptr) {
    EXPECT_TRUE(verifier.pool()->AwaitBusy(1, absl::Seconds(60)));
  }
  const VerifyOutcome waited =
      verifier.Verify(AddRequest("    return a + b\n", absl::Milliseconds(300)));
  EXPECT_EQ(waited.error_kind, VerifierErrorKind::kUnavailable) << waited.detail;
  EXPECT_TRUE(IsRetryable(waited.error_kind));
  busy.join();
  EXPECT_EQ(verifier.Verify(AddRequest("    return a + b\n")).reward, 1.0);
  ASSERT_NE(verifier.pool(), nullptr);
  EXPECT_EQ(CodeVerifier(WithSlots(0)).pool(), nullptr);
}

TEST(CodeVerifierOptionsTest, ValidateNamesTheField) {
  CodeVerifierOptions options;
  EXPECT_TRUE(options.Validate().ok());
  options.python_path = "python3";
  EXPECT_THAT(options.Validate().message(), HasSubstr("python_path"));
  options = CodeVerifierOptions();
  options.sandbox.max_processes = 0;
  EXPECT_THAT(options.Validate().message(), HasSubstr("sandbox.max_processes"));
  options = CodeVerifierOptions();
  options.sandbox_slots = -1;
  EXPECT_THAT(options.Validate().message(), HasSubstr("sandbox_slots"));
  options = CodeVerifierOptions();
  options.sandbox_preload_modules = {"json", "os; import evil"};
  EXPECT_THAT(options.Validate().message(), HasSubstr("sandbox_preload_modules"));
  options.sandbox_slots = 0;  // No pool, nothing preloaded.
  EXPECT_TRUE(options.Validate().ok());
  options = CodeVerifierOptions();
  options.max_timeout = absl::Seconds(1);
  EXPECT_THAT(options.Validate().message(), HasSubstr("max_timeout"));
  options = CodeVerifierOptions();
  options.default_timeout = absl::ZeroDuration();
  EXPECT_THAT(options.Validate().message(), HasSubstr("default_timeout"));
}

TEST(CodeVerifierInfoTest, DescribesItself) {
  CodeVerifier verifier;
  EXPECT_EQ(verifier.name(), "code");
  EXPECT_EQ(verifier.default_timeout(), absl::Seconds(10));
  EXPECT_EQ(verifier.max_timeout(), absl::Seconds(60));
  EXPECT_THAT(verifier.required_fields(), ::testing::ElementsAre("test", "entry_point"));
}

TEST(CodeVerifierInfoTest, IsABuiltinVerifier) {
  absl::StatusOr<VerifierRegistry> registry = MakeBuiltinVerifierRegistry();
  ASSERT_TRUE(registry.ok()) << registry.status();
  EXPECT_NE(registry->Find("code"), nullptr);
}

TEST_P(CodeVerifierTest, SelfCheckPasses) {
  const absl::Status status = CheckSandboxAvailable(CodeVerifierOptions());
  EXPECT_TRUE(status.ok()) << status;
}

TEST_P(CodeVerifierTest, PassingSolutionGetsOne) {
  const VerifyOutcome outcome = Verify(AddRequest("    return a + b\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone) << outcome.detail;
  EXPECT_EQ(outcome.reward, 1.0) << outcome.detail;
  EXPECT_EQ(outcome.tests_passed, 1);
  EXPECT_EQ(outcome.tests_total, 1);
}

TEST_P(CodeVerifierTest, FailingAssertionGetsZeroWithTheTraceback) {
  const VerifyOutcome outcome = Verify(AddRequest("    return a - b\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_EQ(outcome.tests_passed, 0);
  EXPECT_EQ(outcome.tests_total, 1);
  EXPECT_THAT(outcome.detail, HasSubstr("AssertionError"));
  // The traceback quotes the failing line of the test.
  EXPECT_THAT(outcome.detail, HasSubstr("assert candidate(2, 3) == 5"));
}

TEST_P(CodeVerifierTest, ExceptionGetsZero) {
  const VerifyOutcome outcome = Verify(AddRequest("    return {}[a]\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_THAT(outcome.detail, HasSubstr("KeyError"));
}

TEST_P(CodeVerifierTest, SyntaxErrorIsAParseError) {
  const VerifyOutcome outcome = Verify(AddRequest("    return a +\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kParse);
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_FALSE(outcome.retryable);
  EXPECT_THAT(outcome.detail, HasSubstr("SyntaxError"));
}

TEST_P(CodeVerifierTest, ExitingZeroBeforeTheTestsGetsZero) {
  for (const char* response : {
           "    return a + b\nimport sys\nsys.exit(0)\n",             // Top level.
           "    return a + b\nquit()\n",                              // Top level.
           "    import os\n    os._exit(0)\n",                        // In the solution.
           "    import sys\n    sys.exit(0)\n",                       // In the solution.
           "    raise SystemExit\n",                                  // In the solution.
           "    import os\n    os.write(4, b'0' * 32)\n    os._exit(0)\n",  // Forged result.
       }) {
    const VerifyOutcome outcome = Verify(AddRequest(response));
    EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone) << response;
    EXPECT_EQ(outcome.reward, 0.0) << response;
    EXPECT_THAT(outcome.detail, HasSubstr("before the tests finished")) << response;
  }
}

TEST_P(CodeVerifierTest, ExitingZeroAfterFailingTheTestsGetsZero) {
  // atexit handlers never run: the harness leaves with os._exit.
  const VerifyOutcome outcome = Verify(AddRequest(
      "    return a - b\nimport atexit, os\natexit.register(lambda: os._exit(0))\n"));
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_THAT(outcome.detail, HasSubstr("AssertionError"));
}

TEST_P(CodeVerifierTest, MissingEntryPointGetsZero) {
  VerifyRequest request = AddRequest("    return a + b\n");
  request.entry_point = "plus";
  const VerifyOutcome outcome = Verify(request);
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kNone);
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_THAT(outcome.detail, HasSubstr("'plus' is not defined"));
}

TEST_P(CodeVerifierTest, TopLevelAssertsServeWhenThereIsNoCheck) {
  VerifyRequest request = AddRequest("    return a + b\n");
  request.test = "assert add(1, 2) == 3\n";
  EXPECT_EQ(Verify(request).reward, 1.0);
  request.test = "assert add(1, 2) == 4\n";
  EXPECT_EQ(Verify(request).reward, 0.0);
}

TEST_P(CodeVerifierTest, MissingFieldsAreInvalidInput) {
  VerifyRequest request = AddRequest("    return a + b\n");
  request.test.clear();
  EXPECT_EQ(Verify(request).error_kind, VerifierErrorKind::kInvalidInput);
  request = AddRequest("    return a + b\n");
  request.entry_point = "add; import os";
  EXPECT_EQ(Verify(request).error_kind, VerifierErrorKind::kInvalidInput);
}

TEST_P(CodeVerifierTest, InfiniteLoopTimesOut) {
  const absl::Time start = absl::Now();
  const VerifyOutcome outcome = Verify(AddRequest("    while True:\n        pass\n", absl::Seconds(1)));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kTimeout) << outcome.detail;
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_FALSE(outcome.retryable);
  // Bounded, not a speed assertion: killed near the deadline, not at the
  // default 10 s.
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
}

TEST_P(CodeVerifierTest, ForkBombTimesOutContained) {
  const VerifyOutcome outcome = Verify(AddRequest(
      "    import os\n    while True:\n        try:\n            os.fork()\n"
      "        except OSError:\n            pass\n",
      absl::Seconds(2)));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kTimeout) << outcome.detail;
  EXPECT_EQ(outcome.reward, 0.0);
}

TEST_P(CodeVerifierTest, MemoryBombIsResourceExhausted) {
  const VerifyOutcome outcome =
      Verify(AddRequest("    chunks = []\n    while True:\n        chunks.append(bytearray(1 << 26))\n"));
  EXPECT_THAT(outcome.error_kind,
              AnyOf(VerifierErrorKind::kResourceExhausted, VerifierErrorKind::kCrash))
      << outcome.detail;
  EXPECT_EQ(outcome.reward, 0.0);
}

TEST_P(CodeVerifierTest, OutputFloodIsResourceExhausted) {
  const VerifyOutcome outcome = Verify(AddRequest(
      "    import sys\n    while True:\n        sys.stdout.write('x' * 65536)\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kResourceExhausted) << outcome.detail;
  EXPECT_EQ(outcome.reward, 0.0);
}

TEST_P(CodeVerifierTest, HugeFileIsResourceExhausted) {
  const VerifyOutcome outcome = Verify(AddRequest(
      "    open('/tmp/big', 'wb').write(b'x' * (64 << 20))\n    return a + b\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kResourceExhausted) << outcome.detail;
}

TEST_P(CodeVerifierTest, SegfaultIsACrash) {
  const VerifyOutcome outcome = Verify(AddRequest("    import ctypes\n    ctypes.string_at(0)\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kCrash) << outcome.detail;
  EXPECT_THAT(outcome.detail, HasSubstr("signal 11"));
}

TEST_P(CodeVerifierTest, NetworkIsUnavailable) {
  const VerifyOutcome outcome = Verify(AddRequest(
      "    import socket\n    socket.create_connection(('8.8.8.8', 53), timeout=2)\n"
      "    return a + b\n"));
  EXPECT_EQ(outcome.reward, 0.0);
  EXPECT_THAT(outcome.detail, HasSubstr("PermissionError"));
}

TEST_P(CodeVerifierTest, KillingEverythingHarmsOnlyTheSandbox) {
  const VerifyOutcome outcome = Verify(AddRequest(
      "    import os, signal\n"
      "    for target in (os.getppid(), 1, -1):\n"
      "        try:\n            os.kill(target, signal.SIGKILL)\n"
      "        except OSError:\n            pass\n"
      "    return a + b\n"));
  EXPECT_EQ(outcome.reward, 1.0) << outcome.detail;
  EXPECT_EQ(kill(getpid(), 0), 0);
}

TEST(CodeVerifierSetupTest, MissingBwrapIsARetryableSandboxError) {
  CodeVerifierOptions options;
  options.sandbox.bwrap_path = "/nonexistent/bwrap";
  CodeVerifier verifier(options);
  const VerifyOutcome outcome = verifier.Verify(AddRequest("    return a + b\n"));
  EXPECT_EQ(outcome.error_kind, VerifierErrorKind::kSandbox);
  EXPECT_TRUE(outcome.retryable);
  EXPECT_THAT(outcome.detail, HasSubstr("apt-get install bubblewrap"));
  const absl::Status status = CheckSandboxAvailable(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("bwrap"));
}

TEST(CodeVerifierSetupTest, MissingInterpreterIsASandboxError) {
  CodeVerifierOptions options;
  options.python_path = "/usr/bin/no-such-python";
  const absl::Status status = CheckSandboxAvailable(options);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no-such-python"));
}

// --- HumanEval.

struct HumanEvalProblem {
  std::string task_id;
  std::string prompt;
  std::string canonical_solution;
  std::string test;
  std::string entry_point;
};

std::vector<HumanEvalProblem> LoadHumanEval() {
  const std::string path =
      absl::StrCat(SLUICE_TESTDATA_DIR, "/datasets/humaneval/HumanEval.jsonl.gz");
  std::vector<HumanEvalProblem> problems;
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    ADD_FAILURE() << "cannot open " << path;
    return problems;
  }
  std::string text;
  char buffer[1 << 16];
  int n;
  while ((n = gzread(file, buffer, sizeof(buffer))) > 0) text.append(buffer, n);
  gzclose(file);
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const nlohmann::json row = nlohmann::json::parse(line);
    problems.push_back({row.at("task_id"), row.at("prompt"), row.at("canonical_solution"),
                        row.at("test"), row.at("entry_point")});
  }
  return problems;
}

// Verifies `response_for(problem)` for every problem on `threads` threads
// (several sandboxes at once) and returns the task ids that passed and the
// details of those that did not, in order.
template <typename ResponseFn>
std::vector<VerifyOutcome> VerifyAll(const CodeVerifier& verifier,
                                     const std::vector<HumanEvalProblem>& problems,
                                     ResponseFn response_for, int threads) {
  std::vector<VerifyOutcome> outcomes(problems.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < problems.size(); i = next++) {
        VerifyRequest request;
        request.prompt = problems[i].prompt;
        request.response = response_for(problems[i]);
        request.test = problems[i].test;
        request.entry_point = problems[i].entry_point;
        request.deadline = absl::Now() + absl::Seconds(30);
        outcomes[i] = verifier.Verify(request);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  return outcomes;
}

TEST_P(CodeVerifierTest, EveryHumanEvalCanonicalSolutionPasses) {
  const std::vector<HumanEvalProblem> problems = LoadHumanEval();
  ASSERT_EQ(problems.size(), 164u);
  const std::vector<VerifyOutcome> outcomes = VerifyAll(
      verifier_, problems, [](const HumanEvalProblem& p) { return p.canonical_solution; }, 3);
  std::vector<std::string> failed;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (outcomes[i].reward != 1.0) {
      failed.push_back(absl::StrCat(problems[i].task_id, " (",
                                    VerifierErrorKindName(outcomes[i].error_kind),
                                    "): ", outcomes[i].detail));
    }
  }
  EXPECT_THAT(failed, ::testing::IsEmpty()) << absl::StrJoin(failed, "\n");
}

TEST_P(CodeVerifierTest, HumanEvalStubsAndWrongSolutionsFail) {
  const std::vector<HumanEvalProblem> problems = LoadHumanEval();
  ASSERT_EQ(problems.size(), 164u);
  // An empty body, and each problem answered with the next one's solution
  // (valid code, wrong function).
  const std::vector<VerifyOutcome> stubs =
      VerifyAll(verifier_, problems, [](const HumanEvalProblem&) { return "    pass\n"; }, 3);
  std::vector<std::string> passed;
  for (size_t i = 0; i < problems.size(); ++i) {
    EXPECT_NE(stubs[i].error_kind, VerifierErrorKind::kSandbox) << stubs[i].detail;
    if (stubs[i].reward != 0.0) passed.push_back(problems[i].task_id);
  }
  EXPECT_THAT(passed, ::testing::IsEmpty());
}

}  // namespace
}  // namespace sluice::reward_server
