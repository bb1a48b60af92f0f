#ifndef SLUICE_BENCHMARKS_TABLE_BENCH_H_
#define SLUICE_BENCHMARKS_TABLE_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice::bench {

// The run table's core without RPC: Google Benchmark functions for
// RunTable::Insert (into a growing table, and into a full one where each
// insert evicts the oldest group) and RunTable::Sample, swept over threads
// sharing one table.
struct TableBenchOptions {
  // Google Benchmark's min time per benchmark, in seconds.
  double min_time_s = 0.5;
  // Threads sharing the table (ThreadRange).
  std::vector<int> threads = {1, 2, 4};
  // Sample batch sizes; the per-group time divides by the batch.
  std::vector<int> sample_batches = {1, 32};
  // Shape of the small prebuilt group.
  int group_size = 8;
  int completion_tokens = 16;
  // Groups held while sampling (max_times_sampled is huge, so they stay).
  int sample_table_groups = 4096;
};

// One benchmark run (one thread count of one benchmark).
struct TableBenchRun {
  std::string name;  // Google Benchmark's name, e.g. "table/sample/batch:32/threads:2"
  std::string op;    // "insert", "insert_at_capacity" or "sample"
  int threads = 0;
  int batch_groups = 1;    // groups per call (1 for insert)
  int64_t iterations = 0;  // calls, all threads together
  // Wall time / calls of all threads: the table's cost per call when `threads`
  // callers share it (for 1 thread, the latency of one call).
  double us_per_call = 0;
  double us_per_group = 0;  // us_per_call / batch_groups
  double groups_per_s = 0;  // all threads together
};

struct TableBenchResult {
  int64_t group_bytes = 0;  // serialized size of the benchmarked group
  std::vector<TableBenchRun> runs;
};

// Runs the benchmarks (printing Google Benchmark's console table to stdout).
// INTERNAL if a benchmark reported an error (a refused insert, say).
absl::StatusOr<TableBenchResult> RunTableBenchmarks(const TableBenchOptions& options);

}  // namespace sluice::bench

#endif  // SLUICE_BENCHMARKS_TABLE_BENCH_H_
