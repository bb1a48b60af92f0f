#include "replay_buffer/replay_buffer_metrics.h"

#include <algorithm>

#include "services/runtime/metrics.h"

namespace sluice::replay_buffer {
namespace {

prometheus::Histogram::BucketBoundaries StalenessBuckets() { return {0, 1, 2, 3, 4, 6, 8, 16, 32}; }

// A counter that follows a cumulative value from the table, never backwards.
struct MirroredCounter {
  prometheus::Counter* counter = nullptr;
  int64_t exported = 0;
  double scale = 1;

  void Follow(int64_t value) {
    if (value <= exported) return;
    counter->Increment(static_cast<double>(value - exported) * scale);
    exported = value;
  }
};

}  // namespace

struct ReplayBufferMetrics::RunSeries {
  prometheus::Gauge* groups = nullptr;
  prometheus::Gauge* policy_version = nullptr;
  prometheus::Gauge* admission_running = nullptr;
  prometheus::Gauge* admission_accepted = nullptr;
  prometheus::Gauge* admission_limit = nullptr;
  prometheus::Gauge* max_staleness = nullptr;
  prometheus::Histogram* sampled_staleness = nullptr;
  MirroredCounter stored, duplicate, rejected_stale, invalid, retryable_error;
  MirroredCounter sampled;
  MirroredCounter evicted_stale, evicted_max_times_sampled, evicted_capacity,
      evicted_uniform_reward;
  prometheus::Gauge* size_bytes = nullptr;
  MirroredCounter insert_blocked_ms, sample_blocked_ms;
  prometheus::Gauge* retained_groups = nullptr;
  prometheus::Gauge* committed_step = nullptr;
  MirroredCounter replayed_batches;
};

ReplayBufferMetrics::ReplayBufferMetrics(prometheus::Registry& registry)
    : groups_(prometheus::BuildGauge()
                  .Name("sluice_buffer_groups")
                  .Help("Groups held in the run's table.")
                  .Register(registry)),
      inserts_(prometheus::BuildCounter()
                   .Name("sluice_buffer_inserts_total")
                   .Help("Groups inserted, by outcome.")
                   .Register(registry)),
      sampled_groups_(prometheus::BuildCounter()
                          .Name("sluice_buffer_sampled_groups_total")
                          .Help("Group samples handed to the trainer.")
                          .Register(registry)),
      evictions_(prometheus::BuildCounter()
                     .Name("sluice_buffer_evictions_total")
                     .Help("Groups that left the table, by reason.")
                     .Register(registry)),
      policy_version_(prometheus::BuildGauge()
                          .Name("sluice_buffer_policy_version")
                          .Help("Latest policy version known to the buffer.")
                          .Register(registry)),
      admission_running_(prometheus::BuildGauge()
                             .Name("sluice_buffer_admission_running")
                             .Help("Live generation-slot leases.")
                             .Register(registry)),
      admission_accepted_(prometheus::BuildGauge()
                              .Name("sluice_buffer_admission_accepted")
                              .Help("Accepted groups counted by the admission gate.")
                              .Register(registry)),
      admission_limit_(prometheus::BuildGauge()
                           .Name("sluice_buffer_admission_limit")
                           .Help("Admission limit (eta + v + 1) * B.")
                           .Register(registry)),
      max_staleness_(prometheus::BuildGauge()
                         .Name("sluice_buffer_max_staleness")
                         .Help("The run's staleness bound eta (versions): what "
                               "sluice_buffer_sampled_staleness may reach.")
                         .Register(registry)),
      sampled_staleness_(prometheus::BuildHistogram()
                             .Name("sluice_buffer_sampled_staleness")
                             .Help("Staleness in versions of groups delivered to the trainer.")
                             .Register(registry)),
      admission_wait_seconds_(prometheus::BuildHistogram()
                                  .Name("sluice_buffer_admission_wait_seconds")
                                  .Help("Time AcquireGenerationSlots calls waited at the gate.")
                                  .Register(registry)
                                  .Add({}, runtime::LatencyBucketsSeconds())),
      size_bytes_(prometheus::BuildGauge()
                      .Name("sluice_buffer_size_bytes")
                      .Help("Serialized bytes of the groups held in the run's table.")
                      .Register(registry)),
      rate_limiter_blocked_(prometheus::BuildCounter()
                                .Name("sluice_buffer_rate_limiter_blocked_seconds_total")
                                .Help("Time inserts and samples waited for the rate limiter.")
                                .Register(registry)),
      wal_bytes_(prometheus::BuildCounter()
                     .Name("sluice_buffer_wal_bytes_total")
                     .Help("Bytes appended to the write-ahead log since start.")
                     .Register(registry)
                     .Add({})),
      wal_records_(prometheus::BuildCounter()
                       .Name("sluice_buffer_wal_records_total")
                       .Help("Records appended to the write-ahead log since start.")
                       .Register(registry)
                       .Add({})),
      wal_disk_bytes_(prometheus::BuildGauge()
                          .Name("sluice_buffer_wal_disk_bytes")
                          .Help("Size of the write-ahead log's segments on disk.")
                          .Register(registry)
                          .Add({})),
      retained_groups_(prometheus::BuildGauge()
                           .Name("sluice_buffer_retained_groups")
                           .Help("Groups kept for trainer steps its checkpoint does not cover yet.")
                           .Register(registry)),
      committed_step_(prometheus::BuildGauge()
                          .Name("sluice_buffer_committed_step")
                          .Help("Highest trainer step committed (covered by a checkpoint).")
                          .Register(registry)),
      replayed_batches_(prometheus::BuildCounter()
                            .Name("sluice_buffer_replayed_batches_total")
                            .Help("Recorded step batches handed out again (a resumed trainer).")
                            .Register(registry)) {}

ReplayBufferMetrics::~ReplayBufferMetrics() = default;

ReplayBufferMetrics::RunSeries& ReplayBufferMetrics::SeriesLocked(const std::string& run_id) {
  std::unique_ptr<RunSeries>& series = runs_[run_id];
  if (series != nullptr) return *series;
  series = std::make_unique<RunSeries>();
  const prometheus::Labels run = {{"run_id", run_id}};
  const auto with = [&](const char* key, const char* value) {
    prometheus::Labels labels = run;
    labels.emplace(key, value);
    return labels;
  };
  series->groups = &groups_.Add(run);
  series->policy_version = &policy_version_.Add(run);
  series->admission_running = &admission_running_.Add(run);
  series->admission_accepted = &admission_accepted_.Add(run);
  series->admission_limit = &admission_limit_.Add(run);
  series->max_staleness = &max_staleness_.Add(run);
  series->sampled_staleness = &sampled_staleness_.Add(run, StalenessBuckets());
  series->stored.counter = &inserts_.Add(with("status", "stored"));
  series->duplicate.counter = &inserts_.Add(with("status", "duplicate"));
  series->rejected_stale.counter = &inserts_.Add(with("status", "rejected_stale"));
  series->invalid.counter = &inserts_.Add(with("status", "invalid"));
  series->retryable_error.counter = &inserts_.Add(with("status", "retryable_error"));
  series->sampled.counter = &sampled_groups_.Add(run);
  series->evicted_stale.counter = &evictions_.Add(with("reason", "stale"));
  series->evicted_max_times_sampled.counter = &evictions_.Add(with("reason", "max_times_sampled"));
  series->evicted_capacity.counter = &evictions_.Add(with("reason", "capacity"));
  series->evicted_uniform_reward.counter = &evictions_.Add(with("reason", "uniform_reward"));
  series->size_bytes = &size_bytes_.Add(run);
  series->insert_blocked_ms.counter = &rate_limiter_blocked_.Add(with("side", "insert"));
  series->insert_blocked_ms.scale = 1e-3;
  series->sample_blocked_ms.counter = &rate_limiter_blocked_.Add(with("side", "sample"));
  series->sample_blocked_ms.scale = 1e-3;
  series->retained_groups = &retained_groups_.Add(run);
  series->committed_step = &committed_step_.Add(run);
  series->replayed_batches.counter = &replayed_batches_.Add(run);
  return *series;
}

void ReplayBufferMetrics::Sync(RunTable& table) {
  absl::MutexLock lock(&mu_);
  const RunStats stats = table.Stats();
  RunSeries& series = SeriesLocked(stats.run_id);
  series.groups->Set(static_cast<double>(stats.size_groups));
  series.policy_version->Set(static_cast<double>(stats.gate.policy_version));
  series.admission_running->Set(static_cast<double>(stats.gate.running));
  series.admission_accepted->Set(static_cast<double>(stats.gate.accepted));
  series.admission_limit->Set(static_cast<double>(stats.gate.admission_limit));
  series.max_staleness->Set(static_cast<double>(stats.config.max_staleness));
  series.stored.Follow(stats.inserted_groups);
  series.duplicate.Follow(stats.duplicate_inserts);
  series.rejected_stale.Follow(stats.rejected_stale_inserts);
  series.invalid.Follow(stats.invalid_inserts);
  series.retryable_error.Follow(stats.retryable_insert_errors);
  series.sampled.Follow(stats.sampled_groups);
  series.evicted_stale.Follow(stats.evictions.stale);
  series.evicted_max_times_sampled.Follow(stats.evictions.max_times_sampled);
  series.evicted_capacity.Follow(stats.evictions.capacity);
  series.evicted_uniform_reward.Follow(stats.evictions.uniform_reward);
  series.size_bytes->Set(static_cast<double>(stats.size_bytes));
  series.insert_blocked_ms.Follow(absl::ToInt64Milliseconds(stats.rate_limiter_insert_blocked));
  series.sample_blocked_ms.Follow(absl::ToInt64Milliseconds(stats.rate_limiter_sample_blocked));
  series.retained_groups->Set(static_cast<double>(stats.retained_groups));
  series.committed_step->Set(static_cast<double>(stats.committed_step));
  series.replayed_batches.Follow(stats.replayed_batches);
}

void ReplayBufferMetrics::SyncDurability(const DurabilityStats& stats) {
  absl::MutexLock lock(&mu_);
  if (stats.wal.bytes_appended > wal_bytes_exported_) {
    wal_bytes_.Increment(static_cast<double>(stats.wal.bytes_appended - wal_bytes_exported_));
    wal_bytes_exported_ = stats.wal.bytes_appended;
  }
  if (stats.wal.records_appended > wal_records_exported_) {
    wal_records_.Increment(static_cast<double>(stats.wal.records_appended - wal_records_exported_));
    wal_records_exported_ = stats.wal.records_appended;
  }
  wal_disk_bytes_.Set(static_cast<double>(stats.wal.disk_bytes));
}

DurabilityMetrics::DurabilityMetrics(prometheus::Registry& registry)
    : fsync_seconds_(prometheus::BuildHistogram()
                         .Name("sluice_buffer_wal_fsync_seconds")
                         .Help("Latency of the write-ahead log's fdatasyncs.")
                         .Register(registry)
                         .Add({}, runtime::LatencyBucketsSeconds())),
      snapshot_seconds_(prometheus::BuildHistogram()
                            .Name("sluice_buffer_snapshot_seconds")
                            .Help("Time to write and commit one snapshot of every table.")
                            .Register(registry)
                            .Add({}, runtime::LatencyBucketsSeconds())),
      snapshot_bytes_(prometheus::BuildGauge()
                          .Name("sluice_buffer_snapshot_bytes")
                          .Help("Size of the latest snapshot.")
                          .Register(registry)
                          .Add({})) {}

void DurabilityMetrics::ObserveFsync(absl::Duration latency) {
  fsync_seconds_.Observe(absl::ToDoubleSeconds(latency));
}

void DurabilityMetrics::ObserveSnapshot(const durability::SnapshotInfo& info) {
  snapshot_seconds_.Observe(absl::ToDoubleSeconds(info.duration));
  snapshot_bytes_.Set(static_cast<double>(info.size_bytes));
}

void ReplayBufferMetrics::ObserveDelivered(const std::string& run_id, const SampleResult& batch) {
  absl::MutexLock lock(&mu_);
  prometheus::Histogram* histogram = SeriesLocked(run_id).sampled_staleness;
  for (const SampledGroup& sampled : batch.groups) {
    histogram->Observe(static_cast<double>(sampled.staleness));
  }
}

void ReplayBufferMetrics::ObserveAdmissionWait(absl::Duration waited) {
  admission_wait_seconds_.Observe(absl::ToDoubleSeconds(waited));
}

}  // namespace sluice::replay_buffer
