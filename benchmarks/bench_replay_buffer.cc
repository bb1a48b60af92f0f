// bench_replay_buffer: what the replay buffer costs, against baselines
// measured in the same run (see benchmarks/README.md).
//
//   bench_replay_buffer [--json FILE] [--quick] ...
//       The table core (RunTable Insert/Sample, no RPC, Google Benchmark,
//       swept over threads), the cost of each stage of an item's way through
//       the service, and the service over loopback against raw gRPC
//       streaming of the same bytes. Prints a table; writes JSON to FILE.
//
//   bench_replay_buffer --target ADDR --insert-groups N --group-bytes B --ack-log FILE
//       Load mode (the durability test's client): see load_mode.h.
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmarks/bench_group.h"
#include "benchmarks/load_mode.h"
#include "benchmarks/loopback_bench.h"
#include "benchmarks/stage_costs.h"
#include "benchmarks/table_bench.h"
#include "nlohmann/json.hpp"

namespace sluice::bench {
namespace {

using nlohmann::json;

struct BenchFlags {
  std::string json_path;
  bool quick = false;
  double duration_s = 3.0;
  double warmup_s = 0.5;
  std::vector<int> concurrency = {1, 4, 16};
  int headline_concurrency = 4;
  int sample_batch = 4;
  int insert_window = 1;
  int64_t group_bytes = 65536;
  int group_size = 8;
  int held_groups = 256;
  double table_min_time_s = 0.5;
  std::vector<int> table_threads = {1, 2, 4};
  int table_sample_batch = 32;
  double stage_min_time_s = 0.2;
  bool client_library = true;
  std::vector<std::string> sections = {"table", "stages", "loopback"};
};

double LoadAverage() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

json ThroughputJson(const PathThroughput& t) {
  return {{"inserted_items", t.inserted_items},
          {"sampled_items", t.sampled_items},
          {"seconds", t.seconds},
          {"insert_items_per_s", t.insert_items_per_s},
          {"sample_items_per_s", t.sample_items_per_s},
          {"items_per_s", t.items_per_s},
          {"mb_per_s", t.mb_per_s},
          {"cpu_seconds", t.cpu_seconds},
          {"cpu_us_per_item", t.cpu_us_per_item}};
}

absl::Status RunTableSection(const BenchFlags& flags, json* out) {
  std::cout << "== table core: RunTable::Insert / RunTable::Sample, no RPC ==\n" << std::flush;
  TableBenchOptions options;
  options.min_time_s = flags.table_min_time_s;
  options.threads = flags.table_threads;
  options.sample_batches = {1, flags.table_sample_batch};
  options.group_size = flags.group_size;
  absl::StatusOr<TableBenchResult> table = RunTableBenchmarks(options);
  if (!table.ok()) return table.status();
  json runs = json::array();
  double insert_us = 0, insert_at_capacity_us = 0, sample_us = 0, sample_batch1_us = 0;
  for (const TableBenchRun& run : table->runs) {
    runs.push_back({{"name", run.name},
                    {"op", run.op},
                    {"threads", run.threads},
                    {"batch_groups", run.batch_groups},
                    {"iterations", run.iterations},
                    {"us_per_call", run.us_per_call},
                    {"us_per_group", run.us_per_group},
                    {"groups_per_s", run.groups_per_s}});
    if (run.threads != 1) continue;
    if (run.op == "insert") insert_us = run.us_per_group;
    if (run.op == "insert_at_capacity") insert_at_capacity_us = run.us_per_group;
    if (run.op == "sample" && run.batch_groups == flags.table_sample_batch) {
      sample_us = run.us_per_group;
    }
    if (run.op == "sample" && run.batch_groups == 1) sample_batch1_us = run.us_per_group;
  }
  (*out)["table_insert_us"] = insert_us;
  (*out)["table_insert_at_capacity_us"] = insert_at_capacity_us;
  (*out)["table_sample_us"] = sample_us;
  (*out)["table_sample_batch1_us"] = sample_batch1_us;
  (*out)["table"] = {{"group_bytes", table->group_bytes},
                     {"group_size", options.group_size},
                     {"completion_tokens", options.completion_tokens},
                     {"sample_batch_groups", flags.table_sample_batch},
                     {"sample_table_groups", options.sample_table_groups},
                     {"min_time_s", options.min_time_s},
                     {"runs", runs}};
  return absl::OkStatus();
}

absl::Status RunStagesSection(const BenchFlags& flags, const v1::Group& group, json* out) {
  std::cout << "\n== stages: one " << group.ByteSizeLong()
            << "-byte item through each path, one thread, no RPC ==\n"
            << std::flush;
  absl::StatusOr<std::vector<StageCost>> stages =
      MeasureStageCosts(group, flags.sample_batch, absl::Seconds(flags.stage_min_time_s));
  if (!stages.ok()) return stages.status();
  json stages_json = json::array();
  std::map<std::string, double> path_totals;
  for (const StageCost& stage : *stages) {
    stages_json.push_back(
        {{"name", stage.name}, {"path", stage.path}, {"us_per_item", stage.us_per_item}});
    path_totals[stage.path] += stage.us_per_item;
    std::cout << absl::StrFormat("  %-28s %-15s %9.2f us/item\n", stage.name, stage.path,
                                 stage.us_per_item);
  }
  for (const auto& [path, total] : path_totals) {
    std::cout << absl::StrFormat("  %-28s %-15s %9.2f us/item\n", "total", path, total);
  }
  (*out)["stages"] = stages_json;
  (*out)["stage_totals_us_per_item"] = path_totals;
  return absl::OkStatus();
}

absl::Status RunLoopbackSection(const BenchFlags& flags, const v1::Group& group, json* out) {
  LoopbackOptions options;
  options.duration = absl::Seconds(flags.duration_s);
  options.warmup = absl::Seconds(flags.warmup_s);
  options.sample_batch_groups = flags.sample_batch;
  options.insert_window = flags.insert_window;
  options.held_groups = flags.held_groups;
  options.client_library = flags.client_library;
  absl::StatusOr<std::unique_ptr<LoopbackBench>> bench = LoopbackBench::Start(group, options);
  if (!bench.ok()) return bench.status();
  const int64_t item_bytes = (*bench)->item_bytes();
  std::cout << "\n== loopback " << (*bench)->target() << ": " << item_bytes
            << "-byte groups (G = " << flags.group_size << "); at concurrency c, c writers"
            << " (window " << flags.insert_window << ") and c samplers (batch "
            << flags.sample_batch << ") at once, " << flags.duration_s << " s each ==\n"
            << absl::StrFormat("  %4s  %-18s %9s %8s %9s %9s %12s %8s\n", "c", "path", "items/s",
                               "MB/s", "insert/s", "sample/s", "cpu us/item", "vs raw")
            << std::flush;
  json measurements = json::array();
  json ratios = json::object();
  std::vector<LoopbackMeasurement> results;
  for (int concurrency : flags.concurrency) {
    absl::StatusOr<LoopbackMeasurement> m = (*bench)->Measure(concurrency);
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("concurrency ", concurrency, ": ", m.status().message()));
    }
    auto row = [&](const char* path, const PathThroughput& t, double vs_raw) {
      std::cout << absl::StrFormat(
          "  %4d  %-18s %9.0f %8.1f %9.0f %9.0f %12.1f %8.2f\n", concurrency, path, t.items_per_s,
          t.mb_per_s, t.insert_items_per_s, t.sample_items_per_s, t.cpu_us_per_item, vs_raw);
    };
    row("raw gRPC", m->raw_grpc, 1.0);
    row("service", m->service, m->service_vs_raw_grpc);
    if (flags.client_library) {
      row("via sluice_clients", m->service_client_library, m->service_client_library_vs_raw_grpc);
    }
    std::cout << std::flush;
    json measurement = {{"concurrency", concurrency},
                        {"service", ThroughputJson(m->service)},
                        {"raw_grpc", ThroughputJson(m->raw_grpc)},
                        {"service_vs_raw_grpc", m->service_vs_raw_grpc}};
    if (flags.client_library) {
      measurement["service_client_library"] = ThroughputJson(m->service_client_library);
      measurement["service_client_library_vs_raw_grpc"] = m->service_client_library_vs_raw_grpc;
    }
    measurements.push_back(std::move(measurement));
    ratios[std::to_string(concurrency)] = m->service_vs_raw_grpc;
    results.push_back(*std::move(m));
  }
  const LoopbackMeasurement* headline = &results.back();
  for (const LoopbackMeasurement& m : results) {
    if (m.concurrency == flags.headline_concurrency) headline = &m;
  }
  (*out)["item_bytes"] = item_bytes;
  (*out)["headline_concurrency"] = headline->concurrency;
  (*out)["service_items_per_s"] = headline->service.items_per_s;
  (*out)["raw_grpc_items_per_s"] = headline->raw_grpc.items_per_s;
  (*out)["service_mb_per_s"] = headline->service.mb_per_s;
  (*out)["raw_grpc_mb_per_s"] = headline->raw_grpc.mb_per_s;
  (*out)["service_vs_raw_grpc"] = headline->service_vs_raw_grpc;
  (*out)["service_vs_raw_grpc_by_concurrency"] = ratios;
  (*out)["loopback"] = {{"address", (*bench)->target()},
                        {"group_size", flags.group_size},
                        {"sample_batch_groups", flags.sample_batch},
                        {"insert_window", flags.insert_window},
                        {"held_groups", flags.held_groups},
                        {"duration_s", flags.duration_s},
                        {"warmup_s", flags.warmup_s},
                        {"measurements", measurements}};
  return absl::OkStatus();
}

void PrintSummary(const BenchFlags& flags, const json& out) {
  auto number = [&](const char* key) {
    return out.contains(key) ? out[key].get<double>() : std::nan("");
  };
  auto line = [&](const char* key, const char* format, const std::string& note) {
    std::cout << absl::StrFormat("  %-28s ", key)
              << absl::StrFormat(*absl::ParsedFormat<'f'>::New(format), number(key)) << "  " << note
              << "\n";
  };
  const double sample_us = number("table_sample_us");
  const double ratio = number("service_vs_raw_grpc");
  const std::string group_bytes =
      out.contains("table") ? out["table"]["group_bytes"].dump() : std::string("?");
  const int headline = out.contains("headline_concurrency") ? out["headline_concurrency"].get<int>()
                                                            : flags.headline_concurrency;
  std::cout << "\n== summary ==\n";
  line("table_insert_us", "%10.3f", absl::StrCat("1 thread, ", group_bytes, "-byte group"));
  line("table_insert_at_capacity_us", "%10.3f", "the same, each insert evicting the oldest");
  line("table_sample_us", "%10.3f",
       absl::StrCat("1 thread, per group in a batch of ", flags.table_sample_batch,
                    "; target < 1: ", sample_us < 1 ? "met" : "NOT met"));
  line("table_sample_batch1_us", "%10.3f", "1 thread, a batch of 1");
  line("item_bytes", "%10.0f", "loopback group, serialized");
  line("service_items_per_s", "%10.0f", absl::StrCat("c = ", headline));
  line("raw_grpc_items_per_s", "%10.0f", absl::StrCat("c = ", headline));
  line("service_vs_raw_grpc", "%10.2f",
       absl::StrCat("target >= 0.5: ", ratio >= 0.5 ? "met" : "NOT met"));
  std::cout << absl::StrFormat(
      "  load average (1 min)         %.2f at start, %.2f at end, %d cpus\n",
      out["machine"]["load_average_1m_at_start"].get<double>(),
      out["machine"]["load_average_1m_at_end"].get<double>(), out["machine"]["cpus"].get<int>());
}

int RunBench(const BenchFlags& flags) {
  json out;
  out["benchmark"] = "bench_replay_buffer";
  out["schema_version"] = 1;
  out["quick"] = flags.quick;
  out["machine"] = {{"cpus", std::thread::hardware_concurrency()},
                    {"load_average_1m_at_start", LoadAverage()}};
  const v1::Group group = MakeBenchGroup("bench", "prototype", flags.group_size, flags.group_bytes);
  auto enabled = [&](const std::string& section) {
    return std::find(flags.sections.begin(), flags.sections.end(), section) != flags.sections.end();
  };
  absl::Status status = absl::OkStatus();
  if (status.ok() && enabled("table")) status = RunTableSection(flags, &out);
  if (status.ok() && enabled("stages")) status = RunStagesSection(flags, group, &out);
  if (status.ok() && enabled("loopback")) status = RunLoopbackSection(flags, group, &out);
  if (!status.ok()) {
    std::cerr << "bench_replay_buffer: " << status.message() << "\n";
    return 1;
  }
  out["machine"]["load_average_1m_at_end"] = LoadAverage();
  PrintSummary(flags, out);

  if (!flags.json_path.empty()) {
    std::ofstream file(flags.json_path);
    file << out.dump(2) << "\n";
    file.close();
    if (!file) {
      std::cerr << "bench_replay_buffer: cannot write " << flags.json_path << "\n";
      return 1;
    }
    std::cout << "  wrote " << flags.json_path << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  using sluice::bench::BenchFlags;
  using sluice::bench::LoadOptions;
  BenchFlags flags;
  LoadOptions load;
  double connect_timeout_s = 10;

  CLI::App app{
      "bench_replay_buffer: the replay buffer's table core (RunTable Insert/Sample, no RPC), the "
      "stages of an item's way through the service, and the service over loopback against raw "
      "gRPC streaming of the same bytes. With --target: load mode, for durability tests."};
  app.add_option("--json", flags.json_path, "write the figures as JSON to this file");
  app.add_flag("--quick", flags.quick,
               "short measurements (a few seconds in all) for smoke tests; figures are noisy");
  app.add_option("--duration-s", flags.duration_s, "measured seconds per loopback measurement")
      ->capture_default_str();
  app.add_option("--warmup-s", flags.warmup_s, "unmeasured seconds before each")
      ->capture_default_str();
  app.add_option("--concurrency", flags.concurrency,
                 "writer (and sampler) counts to measure, e.g. 1,4,16")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--headline-concurrency", flags.headline_concurrency,
                 "concurrency of service_items_per_s, raw_grpc_items_per_s, service_vs_raw_grpc")
      ->capture_default_str();
  app.add_option("--sample-batch", flags.sample_batch, "groups per Sample request (and raw Pull)")
      ->capture_default_str();
  app.add_option("--insert-window", flags.insert_window,
                 "InsertGroups requests a writer keeps unacknowledged (1 = a rollout worker)")
      ->capture_default_str();
  app.add_option("--group-bytes", flags.group_bytes, "serialized size of a group, about")
      ->capture_default_str();
  app.add_option("--group-size", flags.group_size, "G: trajectories per group")
      ->capture_default_str();
  app.add_option("--held-groups", flags.held_groups,
                 "groups each loopback run holds (its capacity) so samplers never wait")
      ->capture_default_str();
  app.add_option("--table-min-time-s", flags.table_min_time_s,
                 "Google Benchmark min time per table benchmark")
      ->capture_default_str();
  app.add_option("--table-threads", flags.table_threads, "thread counts of the table sweep")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--table-sample-batch", flags.table_sample_batch,
                 "B of table_sample_us (per group); batch 1 is always measured too")
      ->capture_default_str();
  app.add_option("--stage-min-time-s", flags.stage_min_time_s, "time per stage measurement")
      ->capture_default_str();
  app.add_option("--sections", flags.sections,
                 "what to measure: table, stages, loopback (the JSON lacks the others' keys)")
      ->delimiter(',')
      ->check(CLI::IsMember({"table", "stages", "loopback"}))
      ->capture_default_str();
  app.add_flag("--client-library,!--no-client-library", flags.client_library,
               "also measure the service through sluice_clients, as workers and the trainer "
               "call it (default on)");

  auto* target = app.add_option("--target", load.target,
                                "load mode: the replay buffer to insert into (host:port)");
  app.add_option("--insert-groups", load.insert_groups, "load mode: groups to insert");
  app.add_option("--ack-log", load.ack_log,
                 "load mode: append each acknowledged group's key here, one per line");
  app.add_option("--run-id", load.run_id, "load mode: the run to insert into")
      ->capture_default_str();
  app.add_option("--key-prefix", load.key_prefix,
                 "load mode: keys are <run-id>/<prefix>-<i> (default: load-<unix ms>-<pid>)");
  app.add_option("--connect-timeout-s", connect_timeout_s,
                 "load mode: how long to wait for the server to come up")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (target->count() > 0) {
    load.group_bytes = flags.group_bytes;
    load.group_size = flags.group_size;
    load.window = flags.insert_window;
    load.connect_timeout = absl::Seconds(connect_timeout_s);
    const absl::Status status = sluice::bench::RunLoad(load);
    if (!status.ok()) {
      std::cerr << "bench_replay_buffer: " << status.message() << "\n";
      return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    return 0;
  }

  if (flags.quick) {
    if (app.count("--duration-s") == 0) flags.duration_s = 0.3;
    if (app.count("--warmup-s") == 0) flags.warmup_s = 0.1;
    if (app.count("--table-min-time-s") == 0) flags.table_min_time_s = 0.02;
    if (app.count("--stage-min-time-s") == 0) flags.stage_min_time_s = 0.01;
  }
  std::vector<std::string> problems;
  if (flags.duration_s <= 0) problems.push_back("--duration-s: must be > 0");
  if (flags.warmup_s < 0) problems.push_back("--warmup-s: must be >= 0");
  if (flags.concurrency.empty()) problems.push_back("--concurrency: at least one count");
  for (int c : flags.concurrency) {
    if (c <= 0 || c > 256)
      problems.push_back(absl::StrCat("--concurrency: must be in [1, 256], got ", c));
  }
  for (int t : flags.table_threads) {
    if (t <= 0 || t > 64)
      problems.push_back(absl::StrCat("--table-threads: must be in [1, 64], got ", t));
  }
  if (flags.sample_batch <= 0 || flags.sample_batch > flags.held_groups) {
    problems.push_back(absl::StrCat("--sample-batch: must be in [1, --held-groups = ",
                                    flags.held_groups, "], got ", flags.sample_batch));
  }
  if (flags.table_sample_batch <= 0 || flags.table_sample_batch > 4096) {
    problems.push_back(
        absl::StrCat("--table-sample-batch: must be in [1, 4096], got ", flags.table_sample_batch));
  }
  if (flags.insert_window <= 0) problems.push_back("--insert-window: must be > 0");
  if (flags.group_bytes <= 0 || flags.group_bytes > (16 << 20)) {
    problems.push_back(
        absl::StrCat("--group-bytes: must be in [1, 16 MiB], got ", flags.group_bytes));
  }
  if (flags.group_size <= 0) problems.push_back("--group-size: must be > 0");
  if (flags.table_min_time_s <= 0) problems.push_back("--table-min-time-s: must be > 0");
  if (!problems.empty()) {
    for (const std::string& problem : problems)
      std::cerr << "bench_replay_buffer: " << problem << "\n";
    return 2;
  }
  // Google Benchmark reads its own flags here; it gets none of ours.
  int benchmark_argc = 1;
  benchmark::Initialize(&benchmark_argc, argv);
  return sluice::bench::RunBench(flags);
}
