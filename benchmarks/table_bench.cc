#include "benchmarks/table_bench.h"

#include <benchmark/benchmark.h>

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/bench_group.h"
#include "replay_buffer/run_table.h"

namespace sluice::bench {
namespace {

using replay_buffer::InsertResult;
using replay_buffer::InsertStatus;
using replay_buffer::RunConfig;
using replay_buffer::RunTable;
using replay_buffer::SampleRequest;

constexpr char kRun[] = "bench-table";
// Copies prepared per pause of the timer; the pause costs about a
// microsecond, so it is amortized over this many inserts.
constexpr int kPreparedPerPause = 512;
// Capacity of the "insert_at_capacity" benchmark: every insert also evicts
// (and frees) the oldest group, as in a buffer that stays full.
constexpr int kFullCapacityGroups = 4096;

RunConfig TableConfig(int group_size, int capacity_groups) {
  RunConfig config;
  config.run_id = kRun;
  config.batch_size_groups = 32;
  // The gate and the staleness filter never act: versions stay at 0.
  config.max_staleness = 1'000'000;
  config.group_size = group_size;
  // Sampled groups stay, so a sample benchmark never drains its table.
  config.buffer.set_max_times_sampled(1 << 30);
  config.buffer.set_capacity_groups(capacity_groups);
  return config;
}

// The table the threads of one benchmark run share. Thread 0 creates it
// before its timed loop and destroys it after: Google Benchmark starts and
// ends every thread's loop at a barrier, and the other threads touch it only
// inside the loop. Destroying it untimed keeps the frees of thousands of
// groups (and the allocator's consolidation after them) out of the next
// run's figures.
struct SharedTable {
  std::unique_ptr<RunTable> table;
};

void DestroyAfterLoop(benchmark::State& state, SharedTable* shared) {
  if (state.thread_index() == 0) shared->table.reset();
}

// Records what Google Benchmark reports and prints its usual table.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  CollectingReporter() : benchmark::ConsoleReporter(OO_Tabular) {}

  void ReportRuns(const std::vector<Run>& reports) override {
    for (const Run& run : reports) runs_.push_back(run);
    ConsoleReporter::ReportRuns(reports);
  }

  const std::vector<Run>& runs() const { return runs_; }

 private:
  std::vector<Run> runs_;
};

double ToMicroseconds(double value, benchmark::TimeUnit unit) {
  switch (unit) {
    case benchmark::kNanosecond:
      return value / 1e3;
    case benchmark::kMicrosecond:
      return value;
    case benchmark::kMillisecond:
      return value * 1e3;
    case benchmark::kSecond:
      return value * 1e6;
  }
  return value;
}

// capacity_groups 0: the table grows (about 2.5 KB per insert of the small
// group, freed when the run ends).
void BenchmarkInsert(benchmark::State& state, SharedTable* shared, const v1::Group* prototype,
                     int group_size, int capacity_groups) {
  if (state.thread_index() == 0) {
    absl::StatusOr<std::unique_ptr<RunTable>> table =
        RunTable::Create(TableConfig(group_size, capacity_groups));
    if (table.ok()) {
      shared->table = *std::move(table);
    } else {
      // Every thread still enters its loop (the barrier waits for all), and
      // finds no table there.
      state.SkipWithError(std::string(table.status().message()).c_str());
    }
  }
  // Insert takes the group by value: the copies (one per insert, each with
  // its own idempotency key) are made while the timer is paused, and moved
  // in, which costs a pointer swap.
  std::vector<v1::Group> prepared(kPreparedPerPause);
  size_t next = prepared.size();
  int64_t counter = 0;
  const std::string prefix = absl::StrCat("t", state.thread_index(), "-");
  auto refill = [&] {
    for (v1::Group& group : prepared) {
      group = *prototype;
      RenameGroup(absl::StrCat(prefix, counter++), &group);
    }
    next = 0;
  };
  refill();
  for (auto _ : state) {
    if (shared->table == nullptr) {
      state.SkipWithError("no table");
      break;
    }
    if (next == prepared.size()) {
      state.PauseTiming();
      refill();
      state.ResumeTiming();
    }
    InsertResult result = shared->table->Insert(std::move(prepared[next++]));
    if (result.status != InsertStatus::kStored) {
      state.SkipWithError(absl::StrCat("insert not stored: ", result.message).c_str());
      break;
    }
    benchmark::DoNotOptimize(result);
  }
  state.SetItemsProcessed(state.iterations());
  DestroyAfterLoop(state, shared);
}

void BenchmarkSample(benchmark::State& state, SharedTable* shared, const v1::Group* prototype,
                     int group_size, int batch, int held_groups) {
  if (state.thread_index() == 0) {
    absl::StatusOr<std::unique_ptr<RunTable>> table =
        RunTable::Create(TableConfig(group_size, /*capacity_groups=*/0));
    bool filled = table.ok();
    for (int i = 0; filled && i < held_groups; ++i) {
      v1::Group group = *prototype;
      RenameGroup(absl::StrCat("held-", i), &group);
      filled = (*table)->Insert(std::move(group)).status == InsertStatus::kStored;
    }
    if (filled) {
      shared->table = *std::move(table);
    } else {
      state.SkipWithError(table.ok() ? "prefill insert not stored"
                                     : std::string(table.status().message()).c_str());
    }
  }
  SampleRequest request;
  request.batch_size_groups = batch;
  // Never waits (the table holds held_groups >= batch); a bound all the same.
  request.timeout = absl::Seconds(10);
  if (state.thread_index() == 0 && shared->table != nullptr) {
    // Untimed: the first batches touch memory the prefill left cold.
    for (int i = 0; i < 64; ++i) benchmark::DoNotOptimize(shared->table->Sample(request));
  }
  for (auto _ : state) {
    if (shared->table == nullptr) {
      state.SkipWithError("no table");
      break;
    }
    absl::StatusOr<replay_buffer::SampleResult> result = shared->table->Sample(request);
    if (!result.ok() || static_cast<int>(result->groups.size()) != batch) {
      state.SkipWithError(result.ok() ? "sample returned a short batch"
                                      : std::string(result.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(result);
  }
  state.SetItemsProcessed(state.iterations() * batch);
  DestroyAfterLoop(state, shared);
}

}  // namespace

absl::StatusOr<TableBenchResult> RunTableBenchmarks(const TableBenchOptions& options) {
  const v1::Group prototype =
      MakeBenchGroupWithTokens(kRun, "prototype", options.group_size, options.completion_tokens);
  SharedTable shared;
  int max_batch = 1;
  for (int batch : options.sample_batches) max_batch = std::max(max_batch, batch);
  const int held = std::max(options.sample_table_groups, max_batch);

  benchmark::ClearRegisteredBenchmarks();
  auto configure = [&](benchmark::internal::Benchmark* b) {
    b->MinTime(options.min_time_s)->UseRealTime()->Unit(benchmark::kNanosecond);
    for (int threads : options.threads) b->Threads(threads);
  };
  configure(benchmark::RegisterBenchmark("table/insert", [&](benchmark::State& state) {
    BenchmarkInsert(state, &shared, &prototype, options.group_size, /*capacity_groups=*/0);
  }));
  configure(benchmark::RegisterBenchmark("table/insert_at_capacity", [&](benchmark::State& state) {
    BenchmarkInsert(state, &shared, &prototype, options.group_size, kFullCapacityGroups);
  }));
  for (int batch : options.sample_batches) {
    configure(benchmark::RegisterBenchmark(
        absl::StrCat("table/sample/batch:", batch).c_str(),
        [&shared, &prototype, &options, batch, held](benchmark::State& state) {
          BenchmarkSample(state, &shared, &prototype, options.group_size, batch, held);
        }));
  }
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::ClearRegisteredBenchmarks();
  shared.table.reset();

  TableBenchResult result;
  result.group_bytes = static_cast<int64_t>(prototype.ByteSizeLong());
  for (const benchmark::BenchmarkReporter::Run& run : reporter.runs()) {
    if (run.run_type != benchmark::BenchmarkReporter::Run::RT_Iteration) continue;
    if (run.error_occurred) {
      return absl::InternalError(
          absl::StrCat("benchmark ", run.benchmark_name(), " failed: ", run.error_message));
    }
    TableBenchRun out;
    out.name = run.benchmark_name();
    const bool insert = out.name.rfind("table/insert", 0) == 0;
    out.op = out.name.rfind("table/insert_at_capacity", 0) == 0 ? "insert_at_capacity"
             : insert                                           ? "insert"
                                                                : "sample";
    out.threads = static_cast<int>(run.threads);
    out.batch_groups = 1;
    if (!insert) {
      const std::string marker = "batch:";
      const size_t at = out.name.find(marker);
      out.batch_groups = std::stoi(out.name.substr(at + marker.size()));
    }
    out.iterations = run.iterations;
    // With several threads Google Benchmark divides the mean wall time of a
    // thread by the iterations of all threads: the time per call of the
    // table as a whole.
    out.us_per_call = ToMicroseconds(run.GetAdjustedRealTime(), run.time_unit);
    out.us_per_group = out.us_per_call / out.batch_groups;
    out.groups_per_s = out.us_per_group > 0 ? 1e6 / out.us_per_group : 0;
    result.runs.push_back(std::move(out));
  }
  return result;
}

}  // namespace sluice::bench
