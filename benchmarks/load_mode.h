#ifndef SLUICE_BENCHMARKS_LOAD_MODE_H_
#define SLUICE_BENCHMARKS_LOAD_MODE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace sluice::bench {

// bench_replay_buffer's load mode, the client side of the durability test:
// inserts groups into a running replay buffer and records which ones it
// acknowledged.
struct LoadOptions {
  // The replay buffer, "host:port".
  std::string target;
  // Groups to insert (> 0), each about group_bytes serialized.
  int64_t insert_groups = 0;
  int64_t group_bytes = 65536;
  int group_size = 8;
  // Receives the idempotency key of each acknowledged group, one per line.
  std::string ack_log;
  std::string run_id = "bench-load";
  // Keys are "<run_id>/<key_prefix>-<i>", i = 0..insert_groups-1. Empty =
  // "load-<unix ms>-<pid>", unique per invocation.
  std::string key_prefix;
  // How long ConfigureRun waits for the server to come up.
  absl::Duration connect_timeout = absl::Seconds(10);
  // InsertGroups requests (one group each) in flight; 1 = a rollout worker.
  int window = 1;

  // INVALID_ARGUMENT naming each bad field.
  absl::Status Validate() const;
};

// Configures options.run_id on the target (B = 16, a max_staleness no
// version gap reaches, G = group_size, unbounded capacity; an existing run
// with another configuration is used as it is, with a warning), then inserts
// the groups on one InsertGroups stream. Once a group's STORED or DUPLICATE
// result has arrived, and only then, its key is appended to the ack log with
// one write(2) on an O_APPEND descriptor, so a kill -9 of this process or of
// the server never leaves a key there that was not acknowledged; the log
// survives this process's death (it is not fsynced: a machine crash may lose
// its tail, never add to it). RETRYABLE_ERROR results are sent again with the
// same key (up to 20 times, with a short backoff).
//
// Blocks until every group is acknowledged (OK), the server goes away
// (UNAVAILABLE saying how many were acknowledged), a group is refused for
// good (FAILED_PRECONDITION naming its key and status), or the ack log cannot
// be written. Progress and a summary go to stderr.
absl::Status RunLoad(const LoadOptions& options);

}  // namespace sluice::bench

#endif  // SLUICE_BENCHMARKS_LOAD_MODE_H_
