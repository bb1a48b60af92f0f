// bench_async_vs_sync: the product's headline. Runs the same spec on the real
// services (`sluice quickstart --spec`, one stack per run) synchronously
// (eta = 0) and asynchronously (--eta, default 4: the best bound measured on
// the long-tail task, benchmarks/README.md), for each --seeds, and
// reports how much sooner the asynchronous runs reach the target held-out
// accuracy.
//
//   time to target  the run's RL wall time (from the end of the warm start)
//                   at the first periodic evaluation whose accuracy is at
//                   least the target; none when it never gets there.
//   target          --target-accuracy, else the synchronous runs' mean final
//                   accuracy minus --target-margin (0.02): "as good as
//                   synchronous, within two points".
//   speedup         time_to_target_speedup = mean time to target of the
//                   synchronous runs / the same of the asynchronous ones
//                   (> 1: asynchronous is faster); 0 when an asynchronous run
//                   never reaches the target.
//
// Also per run: final accuracy, wall and RL seconds, the trainer's share of
// RL time spent waiting for groups (metrics.jsonl trainer_wait_seconds), the
// worker's share of its generation loop spent idle (its "rollouts over" log
// line), the mean staleness of trained groups, and the run's summary path.
//
//   bench_async_vs_sync --spec configs/longtail.yaml [--eta 4] [--seeds 0,1,2]
//                       [--json FILE] [--runs-dir DIR]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Flags {
  std::string spec;
  int eta = 4;
  std::vector<uint64_t> seeds = {0};
  double target_accuracy = 0;  // 0 = sync final - margin
  double target_margin = 0.02;
  std::string json_path;
  std::string runs_dir;
  std::string sluice = SLUICE_BIN_DIR "/sluice";
  std::string bin_dir = SLUICE_BIN_DIR;
  int torch_threads = 1;
};

struct RunFigures {
  uint64_t seed = 0;
  int eta = 0;
  std::string run_dir;
  bool succeeded = false;
  std::string error;
  double final_accuracy = 0;
  double wall_seconds = 0;
  double rl_seconds = 0;
  double warm_start_seconds = 0;
  double trainer_wait_fraction = 0;
  double staleness_mean = 0;
  // The rollout worker's generation loop (its "rollouts over" log line):
  // seconds decoding, idle (waiting for slots, weights, prompts or its
  // finisher) and finishing (scoring, inserting, reporting, on its own
  // thread); worker_idle_fraction = idle / (decode + idle).
  double worker_decode_seconds = 0;
  double worker_idle_seconds = 0;
  double worker_finish_seconds = 0;
  double worker_idle_fraction = 0;
  // (step, accuracy, RL seconds at that step) of each periodic and final eval.
  std::vector<std::tuple<int64_t, double, double>> evals;
  std::optional<double> time_to_target;
};

std::vector<json> ReadJsonLines(const fs::path& path) {
  std::vector<json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    json value = json::parse(line, nullptr, false);
    if (value.is_object()) lines.push_back(std::move(value));
  }
  return lines;
}

// The value of `key=` in a log line ("key=1.5 ..."), 0 when absent.
double LogField(const std::string& line, const std::string& key) {
  const size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return 0;
  return std::atof(line.c_str() + at + key.size() + 2);
}

// The worker's account of its loop: the last "rollouts over" line of
// rollout_worker-0's log under the stack's state directory.
void ReadWorkerSeconds(const fs::path& runs_dir, RunFigures* figures) {
  std::ifstream log(runs_dir / "stack" / "logs" / "rollout_worker-0.log");
  std::string line, last;
  while (std::getline(log, line)) {
    if (line.find("rollouts over") != std::string::npos) last = line;
  }
  if (last.empty()) return;
  figures->worker_decode_seconds = LogField(last, "decode_seconds");
  figures->worker_idle_seconds = LogField(last, "idle_seconds");
  figures->worker_finish_seconds = LogField(last, "finish_seconds");
  const double loop = figures->worker_decode_seconds + figures->worker_idle_seconds;
  if (loop > 0) figures->worker_idle_fraction = figures->worker_idle_seconds / loop;
}

// Runs the spec once; reads the run's files.
RunFigures RunOnce(const Flags& flags, uint64_t seed, int eta, const fs::path& runs_dir) {
  RunFigures figures;
  figures.seed = seed;
  figures.eta = eta;
  fs::remove_all(runs_dir);
  fs::create_directories(runs_dir);
  sluice::SubprocessOptions options;
  options.argv = {flags.sluice,   "quickstart",
                  "--spec",       flags.spec,
                  "--seed",       std::to_string(seed),
                  "--max-staleness", std::to_string(eta),
                  "--runs-dir",   runs_dir.string(),
                  "--bin-dir",    flags.bin_dir,
                  "--torch-threads", std::to_string(flags.torch_threads)};
  options.log_path = (runs_dir / "quickstart.log").string();
  auto child = sluice::Subprocess::Start(options);
  if (!child.ok()) {
    figures.error = std::string(child.status().message());
    return figures;
  }
  auto exit = (*child)->Wait(absl::InfiniteFuture());
  if (!exit.ok() || !exit->success()) {
    figures.error = absl::StrCat("sluice quickstart ",
                                 exit.ok() ? exit->ToString() : std::string(exit.status().message()),
                                 "; see ", options.log_path);
    return figures;
  }
  fs::path run_dir;
  for (const auto& entry : fs::directory_iterator(runs_dir)) {
    if (entry.is_directory() && entry.path().filename().string().rfind("run-", 0) == 0) {
      run_dir = entry.path();
    }
  }
  if (run_dir.empty()) {
    figures.error = absl::StrCat("no run directory under ", runs_dir.string());
    return figures;
  }
  figures.run_dir = run_dir.string();
  std::ifstream summary_file(run_dir / "summary.json");
  const json summary = json::parse(summary_file, nullptr, false);
  if (!summary.is_object()) {
    figures.error = "summary.json unreadable";
    return figures;
  }
  figures.succeeded = summary.value("state", "") == "RUN_STATE_SUCCEEDED";
  figures.final_accuracy = summary.value("eval_after", 0.0);
  figures.wall_seconds = summary.value("wall_seconds", 0.0);
  figures.rl_seconds = summary.value("rl_seconds", 0.0);
  figures.warm_start_seconds = summary.value("warm_start_seconds", 0.0);
  // RL seconds at each step, from the step records (elapsed since the run
  // started, warm start included).
  std::map<int64_t, double> rl_at_step;
  double wait = 0;
  double staleness = 0;
  int64_t steps = 0;
  for (const json& step : ReadJsonLines(run_dir / "metrics.jsonl")) {
    if (!step.contains("step") || !step.contains("elapsed_seconds")) continue;
    rl_at_step[step["step"].get<int64_t>()] =
        step["elapsed_seconds"].get<double>() - figures.warm_start_seconds;
    wait += step.value("trainer_wait_seconds", 0.0);
    staleness += step.value("staleness_mean", 0.0);
    ++steps;
  }
  if (figures.rl_seconds > 0) figures.trainer_wait_fraction = wait / figures.rl_seconds;
  if (steps > 0) figures.staleness_mean = staleness / steps;
  for (const json& eval : ReadJsonLines(run_dir / "evals.jsonl")) {
    const std::string phase = eval.value("phase", "");
    if (phase != "periodic" && phase != "final" && phase != "after") continue;
    const int64_t step = eval.value("step", int64_t{0});
    auto at = rl_at_step.lower_bound(step);
    const double seconds = at != rl_at_step.end() ? at->second : figures.rl_seconds;
    figures.evals.emplace_back(step, eval.value("accuracy", 0.0), seconds);
  }
  ReadWorkerSeconds(runs_dir, &figures);
  return figures;
}

std::optional<double> TimeToTarget(const RunFigures& run, double target) {
  for (const auto& [step, accuracy, seconds] : run.evals) {
    if (accuracy >= target) return seconds;
  }
  return std::nullopt;
}

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

json RunJson(const RunFigures& run) {
  json evals = json::array();
  for (const auto& [step, accuracy, seconds] : run.evals) {
    evals.push_back({{"step", step}, {"accuracy", accuracy}, {"rl_seconds", seconds}});
  }
  return {{"seed", run.seed},
          {"eta", run.eta},
          {"succeeded", run.succeeded},
          {"error", run.error},
          {"summary", run.run_dir.empty() ? "" : run.run_dir + "/summary.json"},
          {"final_accuracy", run.final_accuracy},
          {"wall_seconds", run.wall_seconds},
          {"rl_seconds", run.rl_seconds},
          {"warm_start_seconds", run.warm_start_seconds},
          {"trainer_wait_fraction", run.trainer_wait_fraction},
          {"staleness_mean", run.staleness_mean},
          {"worker_decode_seconds", run.worker_decode_seconds},
          {"worker_idle_seconds", run.worker_idle_seconds},
          {"worker_finish_seconds", run.worker_finish_seconds},
          {"worker_idle_fraction", run.worker_idle_fraction},
          {"time_to_target_seconds", run.time_to_target ? json(*run.time_to_target) : json()},
          {"evals", evals}};
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"bench_async_vs_sync: time to the synchronous run's accuracy, synchronous (eta = "
               "0) against asynchronous, on the real services"};
  app.add_option("--spec", flags.spec, "run spec (YAML)")->required()->check(CLI::ExistingFile);
  app.add_option("--eta", flags.eta, "the asynchronous runs' max staleness")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--seeds", flags.seeds, "seeds, each run both ways")->delimiter(',')->capture_default_str();
  app.add_option("--target-accuracy", flags.target_accuracy,
                 "target held-out accuracy; 0 = the synchronous runs' mean final accuracy minus "
                 "--target-margin")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--target-margin", flags.target_margin, "see --target-accuracy")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--json", flags.json_path, "write the figures as JSON to this file");
  app.add_option("--runs-dir", flags.runs_dir, "where the runs go (default: a temporary directory)");
  app.add_option("--sluice", flags.sluice, "the sluice CLI")->capture_default_str();
  app.add_option("--bin-dir", flags.bin_dir, "the service binaries")->capture_default_str();
  app.add_option("--torch-threads", flags.torch_threads, "LibTorch threads per service")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (flags.seeds.empty()) {
    std::cerr << "bench_async_vs_sync: --seeds needs at least one seed\n";
    return 2;
  }
  const fs::path runs = flags.runs_dir.empty()
                            ? fs::temp_directory_path() / absl::StrCat("bench_async_vs_sync_", getpid())
                            : fs::path(flags.runs_dir);

  std::vector<RunFigures> sync_runs, async_runs;
  for (uint64_t seed : flags.seeds) {
    for (int eta : {0, flags.eta}) {
      std::cerr << absl::StrFormat("bench_async_vs_sync: seed %d, eta %d ...\n", seed, eta);
      RunFigures run = RunOnce(flags, seed, eta, runs / absl::StrCat("seed", seed, "-eta", eta));
      if (!run.succeeded) {
        std::cerr << "bench_async_vs_sync: the run failed: "
                  << (run.error.empty() ? "not SUCCEEDED (see its summary.json)" : run.error) << "\n";
        return 1;
      }
      std::cerr << absl::StrFormat(
          "  final accuracy %.3f, wall %.1f s (RL %.1f s); trainer waiting %.0f%% of RL, worker "
          "idle %.0f%% of its loop\n",
          run.final_accuracy, run.wall_seconds, run.rl_seconds, 100 * run.trainer_wait_fraction,
          100 * run.worker_idle_fraction);
      (eta == 0 ? sync_runs : async_runs).push_back(std::move(run));
    }
  }
  std::vector<double> sync_final, async_final, sync_wall, async_wall;
  for (const RunFigures& r : sync_runs) {
    sync_final.push_back(r.final_accuracy);
    sync_wall.push_back(r.wall_seconds);
  }
  for (const RunFigures& r : async_runs) {
    async_final.push_back(r.final_accuracy);
    async_wall.push_back(r.wall_seconds);
  }
  const double target =
      flags.target_accuracy > 0 ? flags.target_accuracy : Mean(sync_final) - flags.target_margin;
  std::vector<double> sync_ttt, async_ttt;
  bool async_reached = true;
  bool sync_reached = true;
  for (RunFigures& r : sync_runs) {
    r.time_to_target = TimeToTarget(r, target);
    if (r.time_to_target) sync_ttt.push_back(*r.time_to_target);
    else sync_reached = false;
  }
  for (RunFigures& r : async_runs) {
    r.time_to_target = TimeToTarget(r, target);
    if (r.time_to_target) async_ttt.push_back(*r.time_to_target);
    else async_reached = false;
  }
  const double speedup = async_reached && sync_reached && Mean(async_ttt) > 0
                             ? Mean(sync_ttt) / Mean(async_ttt)
                             : 0.0;
  json out = {{"spec", flags.spec},
              {"eta_async", flags.eta},
              {"seeds", flags.seeds},
              {"target_accuracy", target},
              {"time_to_target_speedup", speedup},
              {"time_to_target_seconds_sync", sync_reached ? json(Mean(sync_ttt)) : json()},
              {"time_to_target_seconds_async", async_reached ? json(Mean(async_ttt)) : json()},
              {"final_accuracy_sync", Mean(sync_final)},
              {"final_accuracy_async", Mean(async_final)},
              {"wall_seconds_sync", Mean(sync_wall)},
              {"wall_seconds_async", Mean(async_wall)},
              {"runs", json::array()}};
  for (const RunFigures& r : sync_runs) out["runs"].push_back(RunJson(r));
  for (const RunFigures& r : async_runs) out["runs"].push_back(RunJson(r));

  std::cout << absl::StrFormat(
      "target accuracy %.3f; sync (eta 0): final %.3f, wall %.1f s, to target %s; async (eta %d): "
      "final %.3f, wall %.1f s, to target %s; time_to_target_speedup %.2f\n",
      target, Mean(sync_final), Mean(sync_wall),
      sync_reached ? absl::StrFormat("%.1f s", Mean(sync_ttt)) : "never", flags.eta,
      Mean(async_final), Mean(async_wall),
      async_reached ? absl::StrFormat("%.1f s", Mean(async_ttt)) : "never", speedup);
  if (!flags.json_path.empty()) {
    std::ofstream file(flags.json_path);
    file << out.dump(2) << "\n";
    if (!file) return 1;
  }
  return 0;
}
