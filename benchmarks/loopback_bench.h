#ifndef SLUICE_BENCHMARKS_LOOPBACK_BENCH_H_
#define SLUICE_BENCHMARKS_LOOPBACK_BENCH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/v1/common.pb.h"

namespace sluice::bench {

struct LoopbackOptions {
  // Measured time per (concurrency, path), after `warmup`.
  absl::Duration duration = absl::Seconds(3);
  absl::Duration warmup = absl::Milliseconds(500);
  // Groups per Sample request (and per raw Pull).
  int sample_batch_groups = 4;
  // InsertGroups requests (one group each) a writer keeps in flight. 1 is
  // what a rollout worker does: it waits for the acknowledgement of one
  // insert before it sends the next.
  int insert_window = 1;
  // Groups held by each measured run when sampling starts, and its capacity
  // (the oldest groups are evicted as writers insert), so that samplers never
  // wait and memory stays bounded.
  int held_groups = 256;
  // Also measure the service through the shipped client library
  // (sluice_clients), as rollout workers and the trainer call it.
  bool client_library = true;
};

// Throughput of one path (the service, or raw gRPC) at one concurrency:
// `concurrency` writers and as many samplers, all at once, each on its own
// connection as separate processes would be.
struct PathThroughput {
  int64_t inserted_items = 0;  // acknowledged groups (STORED) / acked chunks
  int64_t sampled_items = 0;   // groups received by samplers / pulled items
  double seconds = 0;
  double insert_items_per_s = 0;
  double sample_items_per_s = 0;
  // Inserted plus sampled items per second; MB/s = that times item_bytes / 1e6.
  double items_per_s = 0;
  double mb_per_s = 0;
  // CPU time of the whole process (clients, server, gRPC) in the window, and
  // per item moved. Unlike items/s it hardly depends on what else the
  // machine runs: on a shared machine, compare paths by this.
  double cpu_seconds = 0;
  double cpu_us_per_item = 0;
};

struct LoopbackMeasurement {
  int concurrency = 0;
  PathThroughput service;
  PathThroughput raw_grpc;
  double service_vs_raw_grpc = 0;  // service.items_per_s / raw_grpc.items_per_s
  // The service through sluice_clients (when LoopbackOptions::client_library):
  // a new stream per InsertGroups call; and, since every client of one
  // process shares gRPC's global subchannel pool, one TCP connection for all
  // of them.
  PathThroughput service_client_library;
  double service_client_library_vs_raw_grpc = 0;
};

// The replay buffer service (ReplayBufferServiceImpl over ReplayBuffer, with
// the RPC metrics interceptor the real binary has) and the raw baseline
// (benchmarks/raw_stream.proto) on one gRPC server on 127.0.0.1, an ephemeral
// port; and the clients that load them.
class LoopbackBench {
 public:
  // Starts the server. `group` is the item: its serialized bytes are what the
  // raw baseline streams, and writers insert copies of it under new keys.
  static absl::StatusOr<std::unique_ptr<LoopbackBench>> Start(const v1::Group& group,
                                                              const LoopbackOptions& options);
  ~LoopbackBench();

  int64_t item_bytes() const;
  std::string target() const;

  // Measures the paths at `concurrency`: raw gRPC, the service, and the
  // service through sluice_clients if asked, in that order. Each service
  // measurement uses a fresh run. INTERNAL when a call fails or an insert is
  // not STORED.
  absl::StatusOr<LoopbackMeasurement> Measure(int concurrency);

 private:
  struct State;
  explicit LoopbackBench(std::unique_ptr<State> state);

  // On long-lived streams of the generated stub, or through sluice_clients.
  absl::StatusOr<PathThroughput> MeasureService(int concurrency, bool client_library);
  absl::StatusOr<PathThroughput> MeasureRaw(int concurrency);

  std::unique_ptr<State> state_;
};

}  // namespace sluice::bench

#endif  // SLUICE_BENCHMARKS_LOOPBACK_BENCH_H_
