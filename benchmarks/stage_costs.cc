#include "benchmarks/stage_costs.h"

#include <chrono>
#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "benchmarks/bench_group.h"
#include "benchmarks/raw_stream.pb.h"
#include "prometheus/registry.h"
#include "replay_buffer/proto_convert.h"
#include "replay_buffer/replay_buffer.h"
#include "replay_buffer/replay_buffer_metrics.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace sluice::bench {
namespace {

using replay_buffer::InsertStatus;
using replay_buffer::ReplayBuffer;
using replay_buffer::RunConfig;

// Calls `op` (which does `items_per_call` items) in rounds until `min_time`
// has passed; returns microseconds per item. `prepare(n)` runs untimed
// before each round of n calls.
template <typename Prepare, typename Op>
double TimePerItem(absl::Duration min_time, int items_per_call, Prepare prepare, Op op) {
  using Clock = std::chrono::steady_clock;
  const double budget_s = absl::ToDoubleSeconds(min_time);
  double timed_s = 0;
  int64_t calls = 0;
  int round = 4;
  while (timed_s < budget_s || calls < 8) {
    prepare(round);
    const Clock::time_point begin = Clock::now();
    for (int i = 0; i < round; ++i) op(i);
    timed_s += std::chrono::duration<double>(Clock::now() - begin).count();
    calls += round;
    if (round < 1024) round *= 2;
  }
  return timed_s * 1e6 / static_cast<double>(calls * items_per_call);
}

constexpr auto kNoPrepare = [](int) {};

}  // namespace

absl::StatusOr<std::vector<StageCost>> MeasureStageCosts(const v1::Group& prototype,
                                                         int sample_batch_groups,
                                                         absl::Duration min_time) {
  std::vector<StageCost> costs;
  const int batch = sample_batch_groups;

  // --- The insert path: client serialize, server parse, core insert,
  // metrics sync, ack.
  v1::InsertGroupsRequest insert_request;
  *insert_request.add_groups() = prototype;
  const std::string insert_bytes = insert_request.SerializeAsString();
  std::string scratch;
  costs.push_back(
      {"insert.client_serialize", "service_insert", TimePerItem(min_time, 1, kNoPrepare, [&](int) {
         scratch.clear();
         insert_request.SerializeToString(&scratch);
       })});
  v1::InsertGroupsRequest parsed;
  costs.push_back(
      {"insert.server_parse", "service_insert",
       TimePerItem(min_time, 1, kNoPrepare, [&](int) { parsed.ParseFromString(insert_bytes); })});

  absl::StatusOr<std::unique_ptr<ReplayBuffer>> buffer = ReplayBuffer::Create();
  if (!buffer.ok()) return buffer.status();
  RunConfig config;
  config.run_id = prototype.run_id();
  config.batch_size_groups = batch;
  config.max_staleness = 1'000'000;
  config.group_size = prototype.trajectories_size();
  config.buffer.set_max_times_sampled(1 << 30);
  config.buffer.set_capacity_groups(std::max(256, batch));
  if (auto configured = (*buffer)->ConfigureRun(config); !configured.ok()) {
    return configured.status();
  }
  absl::StatusOr<std::shared_ptr<replay_buffer::RunTable>> table = (*buffer)->GetRun(config.run_id);
  if (!table.ok()) return table.status();
  std::vector<std::vector<v1::Group>> prepared;
  int64_t counter = 0;
  bool all_stored = true;
  costs.push_back({"insert.core_insert", "service_insert",
                   TimePerItem(
                       min_time, 1,
                       [&](int n) {
                         prepared.assign(static_cast<size_t>(n), {});
                         for (std::vector<v1::Group>& one : prepared) {
                           one.push_back(prototype);
                           RenameGroup(absl::StrCat("stage-", counter++), &one.back());
                         }
                       },
                       [&](int i) {
                         all_stored &= (*buffer)->Insert(std::move(prepared[i]))[0].status ==
                                       InsertStatus::kStored;
                       })});
  if (!all_stored) return absl::InternalError("stage costs: an insert was not stored");

  prometheus::Registry registry;
  replay_buffer::ReplayBufferMetrics metrics(registry);
  costs.push_back({"insert.metrics_sync", "service_insert",
                   TimePerItem(min_time, 1, kNoPrepare, [&](int) { metrics.Sync(**table); })});
  v1::InsertGroupsResponse ack;
  v1::InsertGroupResult* result = ack.add_results();
  result->set_idempotency_key(prototype.idempotency_key());
  result->set_status(v1::INSERT_STATUS_STORED);
  result->set_buffer_sequence(123456);
  costs.push_back({"insert.ack_serialize_parse", "service_insert",
                   TimePerItem(min_time, 1, kNoPrepare, [&](int) {
                     scratch.clear();
                     ack.SerializeToString(&scratch);
                     v1::InsertGroupsResponse back;
                     back.ParseFromString(scratch);
                   })});

  // --- The sample path: core sample, the response aliasing the groups, server
  // serialize, metrics sync, client parse.
  replay_buffer::SampleRequest sample;
  sample.batch_size_groups = batch;
  sample.timeout = absl::Seconds(10);
  replay_buffer::SampleResult sampled;
  bool all_sampled = true;
  costs.push_back(
      {"sample.core_sample", "service_sample", TimePerItem(min_time, batch, kNoPrepare, [&](int) {
         absl::StatusOr<replay_buffer::SampleResult> result = (*table)->Sample(sample);
         all_sampled &= result.ok();
         if (result.ok()) sampled = *std::move(result);
       })});
  if (!all_sampled) return absl::InternalError("stage costs: a sample failed");
  // The service answers with the stored groups aliased, not copied.
  costs.push_back(
      {"sample.to_proto_alias", "service_sample", TimePerItem(min_time, batch, kNoPrepare, [&](int) {
         const replay_buffer::AliasedSampleResponse timed(sampled);
       })});
  const replay_buffer::AliasedSampleResponse aliased(sampled);
  const v1::SampleResponse& response = aliased.get();
  costs.push_back({"sample.server_serialize", "service_sample",
                   TimePerItem(min_time, batch, kNoPrepare, [&](int) {
                     scratch.clear();
                     response.SerializeToString(&scratch);
                   })});
  costs.push_back(
      {"sample.metrics_sync", "service_sample", TimePerItem(min_time, batch, kNoPrepare, [&](int) {
         metrics.ObserveDelivered(config.run_id, sampled);
         metrics.Sync(**table);
       })});
  const std::string response_bytes = response.SerializeAsString();
  v1::SampleResponse received;
  costs.push_back({"sample.client_parse", "service_sample",
                   TimePerItem(min_time, batch, kNoPrepare,
                               [&](int) { received.ParseFromString(response_bytes); })});

  // --- The raw baseline: the same bytes, no structure.
  raw::Chunk push;
  push.set_payload(prototype.SerializeAsString());
  push.set_items(1);
  const std::string push_bytes = push.SerializeAsString();
  raw::Chunk raw_parsed;
  costs.push_back(
      {"push.client_serialize", "raw_push", TimePerItem(min_time, 1, kNoPrepare, [&](int) {
         scratch.clear();
         push.SerializeToString(&scratch);
       })});
  costs.push_back({"push.server_parse", "raw_push", TimePerItem(min_time, 1, kNoPrepare, [&](int) {
                     raw_parsed.ParseFromString(push_bytes);
                   })});
  raw::Chunk pull;
  for (int i = 0; i < batch; ++i) pull.mutable_payload()->append(push.payload());
  pull.set_items(batch);
  const std::string pull_bytes = pull.SerializeAsString();
  costs.push_back(
      {"pull.server_serialize", "raw_pull", TimePerItem(min_time, batch, kNoPrepare, [&](int) {
         scratch.clear();
         pull.SerializeToString(&scratch);
       })});
  costs.push_back({"pull.client_parse", "raw_pull",
                   TimePerItem(min_time, batch, kNoPrepare,
                               [&](int) { raw_parsed.ParseFromString(pull_bytes); })});
  return costs;
}

}  // namespace sluice::bench
