// bench_reward: what the reward server's verifiers cost, against baselines
// measured in the same run on the same inputs.
//
//   math: CompareMathAnswers over Math-Verify's 270 labelled cases (each with
//         its own options), repeated for --math-seconds, on 1 and 2 threads,
//         against benchmarks/sympy_math_checker.py (Debian's python3-sympy)
//         doing the same comparisons for the same time. Agreement with the
//         cases' labels is reported for both.
//   code: HumanEval canonical solutions through the "code" verifier with the
//         sandbox on (bwrap, namespaces, seccomp, rlimits), at concurrency 1
//         and 2: through the pool of prepared sandboxes (the default) and
//         through a fresh sandbox per run (sandbox_slots 0, the verifier
//         before the pool), against the same programs run by a bare python3
//         process.
//
//   bench_reward [--json FILE] [--quick]
//
// Prints a table and, with --json, writes the figures. Not a test: its smoke
// test checks that it runs and reports, never how fast.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/task/datasets.h"
#include "nlohmann/json.hpp"
#include "reward_server/code_verifier.h"
#include "reward_server/math/math_equivalence.h"
#include "reward_server/math/math_verify_cases.h"

extern char** environ;

namespace {

namespace reward = sluice::reward_server;
using nlohmann::json;

struct Flags {
  std::string json_path;
  std::string cases = SLUICE_TESTDATA_DIR "/math_verify/cases.jsonl";
  std::string humaneval = SLUICE_TESTDATA_DIR "/datasets/humaneval/HumanEval.jsonl.gz";
  std::string sympy_checker = SLUICE_SOURCE_DIR "/benchmarks/sympy_math_checker.py";
  std::string python = "/usr/bin/python3";
  double math_seconds = 3.0;
  int code_programs = 40;
  std::vector<std::string> preload = reward::CodeVerifierOptions().sandbox_preload_modules;
  bool quick = false;
};

using MathCase = reward::MathVerifyCase;

// Comparisons per second on `threads` threads, each cycling through the
// cases from a different start, for `seconds`.
double MathRate(const std::vector<MathCase>& cases, int threads, double seconds) {
  std::atomic<int64_t> done{0};
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      size_t i = static_cast<size_t>(t) * cases.size() / threads;
      int64_t local = 0;
      while (absl::Now() < end) {
        const MathCase& c = cases[i++ % cases.size()];
        reward::CompareMathAnswers(c.gold, c.prediction, c.options);
        ++local;
      }
      done += local;
    });
  }
  for (auto& w : workers) w.join();
  return static_cast<double>(done.load()) / absl::ToDoubleSeconds(absl::Now() - start);
}

absl::StatusOr<json> RunSympy(const Flags& flags, double seconds) {
  const std::string out =
      (std::filesystem::temp_directory_path() / absl::StrCat("bench_reward_sympy_", getpid()))
          .string();
  const std::string command =
      absl::StrCat(flags.python, " ", flags.sympy_checker, " --cases ", flags.cases,
                   " --seconds ", seconds, " --json ", out);
  const int status = std::system(command.c_str());
  if (status != 0) {
    return absl::UnavailableError(absl::StrCat("the sympy checker failed (", command,
                                               "): is python3-sympy installed?"));
  }
  std::ifstream in(out);
  json result = json::parse(in, nullptr, false);
  std::filesystem::remove(out);
  if (!result.is_object()) return absl::InternalError("the sympy checker wrote no JSON");
  return result;
}

struct Program {
  std::string id;
  reward::VerifyRequest request;
  std::string source;  // For the bare baseline.
};

std::vector<Program> LoadPrograms(const Flags& flags, int count) {
  sluice::task::DatasetReadOptions options;
  options.max_records = count;
  auto records = sluice::task::ReadDataset(flags.humaneval, sluice::task::DatasetKind::kHumanEval,
                                           options);
  std::vector<Program> programs;
  if (!records.ok()) {
    std::cerr << "bench_reward: " << records.status().message() << "\n";
    return programs;
  }
  for (const auto& record : *records) {
    Program p;
    p.id = record.id;
    p.request.prompt = record.metadata.at("prompt");
    p.request.response = record.metadata.at("canonical_solution");
    p.request.test = record.metadata.at("test");
    p.request.entry_point = record.metadata.at("entry_point");
    p.source = absl::StrCat(p.request.prompt, p.request.response, "\n", p.request.test, "\n",
                            "check(", p.request.entry_point, ")\n");
    programs.push_back(std::move(p));
  }
  return programs;
}

// Runs every program `concurrency` at a time; returns {executions/s, passed}.
template <typename Run>
std::pair<double, int> CodeRate(const std::vector<Program>& programs, int concurrency, Run run) {
  std::atomic<size_t> next{0};
  std::atomic<int> passed{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < concurrency; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < programs.size(); i = next++) passed += run(programs[i]) ? 1 : 0;
    });
  }
  for (auto& w : workers) w.join();
  return {static_cast<double>(programs.size()) / absl::ToDoubleSeconds(absl::Now() - start),
          passed.load()};
}

bool RunBare(const Flags& flags, const Program& program) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            absl::StrCat("bench_reward_", getpid(), "_",
                                         std::hash<std::thread::id>()(std::this_thread::get_id()),
                                         ".py"))
                               .string();
  std::ofstream(path) << program.source;
  std::vector<std::string> args = {flags.python, path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 1;
  if (spawned == 0) waitpid(pid, &status, 0);
  std::filesystem::remove(path);
  return spawned == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"bench_reward: math verifications/s vs a sympy checker, sandboxed code "
               "executions/s vs bare python3"};
  app.add_option("--json", flags.json_path, "write the figures as JSON to this file");
  app.add_option("--cases", flags.cases, "Math-Verify cases (JSONL)")->capture_default_str();
  app.add_option("--humaneval", flags.humaneval, "HumanEval JSONL(.gz)")->capture_default_str();
  app.add_option("--sympy-checker", flags.sympy_checker, "the baseline script")
      ->capture_default_str();
  app.add_option("--python", flags.python, "python3 with sympy (Debian's)")->capture_default_str();
  app.add_option("--math-seconds", flags.math_seconds, "measured seconds per math rate")
      ->capture_default_str();
  app.add_option("--code-programs", flags.code_programs, "HumanEval programs per code rate")
      ->capture_default_str();
  app.add_option("--sandbox-preload", flags.preload,
                 "modules the pool's warm interpreters import once (comma-separated; \"\" = "
                 "none, to see what the fork alone gives)")
      ->delimiter(',');
  app.add_flag("--quick", flags.quick, "short runs (for the smoke test)");
  CLI11_PARSE(app, argc, argv);
  if (flags.quick) {
    flags.math_seconds = 0.3;
    flags.code_programs = 4;
  }

  json out;
  // ---- math ---------------------------------------------------------------
  absl::StatusOr<std::vector<MathCase>> loaded = reward::LoadMathVerifyCases(flags.cases);
  if (!loaded.ok() || loaded->empty()) {
    std::cerr << "bench_reward: no cases in " << flags.cases << "\n";
    return 1;
  }
  const std::vector<MathCase>& cases = *loaded;
  int agree = 0;
  for (const MathCase& c : cases) {
    agree += reward::CompareMathAnswers(c.gold, c.prediction, c.options).equal == c.expected;
  }
  const double rate1 = MathRate(cases, 1, flags.math_seconds);
  const double rate2 = MathRate(cases, 2, flags.math_seconds);
  json math = {{"cases", cases.size()},
               {"agreement", static_cast<double>(agree) / cases.size()},
               {"verifications_per_s", rate1},
               {"verifications_per_s_2_threads", rate2}};
  absl::StatusOr<json> sympy = RunSympy(flags, flags.math_seconds);
  if (sympy.ok()) {
    math["sympy"] = *sympy;
    const double base = (*sympy)["verifications_per_s"].get<double>();
    math["ratio_vs_sympy"] = base > 0 ? rate1 / base : 0.0;
  } else {
    std::cerr << "bench_reward: " << sympy.status().message() << "\n";
    math["sympy_error"] = std::string(sympy.status().message());
  }
  out["math"] = math;
  std::cout << absl::StrFormat(
      "math: %d cases, agreement %.3f; %.0f verifications/s (1 thread), %.0f (2 threads)\n",
      cases.size(), math["agreement"].get<double>(), rate1, rate2);
  if (sympy.ok()) {
    std::cout << absl::StrFormat(
        "      sympy checker: %.1f verifications/s, agreement %.3f; ratio %.1fx\n",
        (*sympy)["verifications_per_s"].get<double>(), (*sympy)["agreement"].get<double>(),
        math["ratio_vs_sympy"].get<double>());
  }

  // ---- code ---------------------------------------------------------------
  const std::vector<Program> programs = LoadPrograms(flags, flags.code_programs);
  reward::CodeVerifierOptions code_options;
  code_options.python_path = flags.python;
  json code = {{"programs", programs.size()}};
  if (absl::Status available = reward::CheckSandboxAvailable(code_options); !available.ok()) {
    std::cerr << "bench_reward: sandbox unavailable: " << available.message() << "\n";
    code["sandbox_error"] = std::string(available.message());
  } else if (!programs.empty()) {
    // The pool (the default, one slot per concurrent run) and a fresh
    // sandbox per run (what the verifier did before the pool, sandbox_slots
    // 0), each against bare python3 at the same concurrency.
    reward::CodeVerifierOptions per_run_options = code_options;
    per_run_options.sandbox_slots = 0;
    reward::CodeVerifier per_run(per_run_options);
    code_options.sandbox_slots = 2;
    code_options.sandbox_preload_modules = flags.preload;
    code_options.sandbox_preload_modules.erase(
        std::remove(code_options.sandbox_preload_modules.begin(),
                    code_options.sandbox_preload_modules.end(), ""),
        code_options.sandbox_preload_modules.end());
    code["preload_modules"] = code_options.sandbox_preload_modules;
    reward::CodeVerifier pooled(code_options);
    // Measure the pool's steady state: its slots are started at a server's
    // start-up, not per program.
    if (absl::Status warm = pooled.pool()->Warm(); !warm.ok()) {
      std::cerr << "bench_reward: " << warm.message() << "\n";
    }
    const auto through = [](const reward::CodeVerifier& verifier) {
      return [&verifier](const Program& p) {
        reward::VerifyRequest request = p.request;
        request.deadline = absl::Now() + absl::Seconds(30);
        return verifier.Verify(request).reward == 1.0;
      };
    };
    const auto bare = [&flags](const Program& p) { return RunBare(flags, p); };
    json per_run_json;
    for (int concurrency : {1, 2}) {
      const auto [old_rate, old_passed] = CodeRate(programs, concurrency, through(per_run));
      const auto [bare_rate, bare_passed] = CodeRate(programs, concurrency, bare);
      const auto [rate, passed] = CodeRate(programs, concurrency, through(pooled));
      const std::string key = absl::StrCat("concurrency_", concurrency);
      code[key] = {{"executions_per_s", rate},
                   {"passed", passed},
                   {"bare_python_executions_per_s", bare_rate},
                   {"bare_passed", bare_passed},
                   {"ratio_vs_bare_python", bare_rate > 0 ? rate / bare_rate : 0.0},
                   {"ratio_vs_per_run_sandbox", old_rate > 0 ? rate / old_rate : 0.0}};
      per_run_json[key] = {{"executions_per_s", old_rate},
                           {"passed", old_passed},
                           {"ratio_vs_bare_python", bare_rate > 0 ? old_rate / bare_rate : 0.0}};
      std::cout << absl::StrFormat(
          "code: concurrency %d: %.1f executions/s pooled sandbox (%d/%d passed), %.1f fresh "
          "sandbox per run (%d/%d), %.1f bare python3; ratio vs bare %.2f (per run %.2f)\n",
          concurrency, rate, passed, programs.size(), old_rate, old_passed, programs.size(),
          bare_rate, bare_rate > 0 ? rate / bare_rate : 0.0,
          bare_rate > 0 ? old_rate / bare_rate : 0.0);
    }
    code["per_run_sandbox"] = per_run_json;
    code["executions_per_s"] = code["concurrency_2"]["executions_per_s"];
    code["ratio_vs_bare_python"] = code["concurrency_2"]["ratio_vs_bare_python"];
    const sluice::reward_server::sandbox::SandboxPoolStats stats = pooled.pool()->GetStats();
    code["pool"] = {{"slots", stats.slots},
                    {"slots_started", stats.slots_started},
                    {"runs", stats.runs},
                    {"recycled", stats.recycled},
                    {"killed", stats.killed}};
  }
  out["code"] = code;

  if (!flags.json_path.empty()) {
    std::ofstream file(flags.json_path);
    file << out.dump(2) << "\n";
    if (!file) {
      std::cerr << "bench_reward: cannot write " << flags.json_path << "\n";
      return 1;
    }
  }
  return 0;
}
