#include "replay_buffer/proto_convert.h"

namespace sluice::replay_buffer {
namespace {

void HistogramToProto(const StalenessHistogram& histogram, v1::StalenessHistogram* proto) {
  for (int64_t bound : histogram.bucket_upper_bounds()) proto->add_bucket_upper_bounds(bound);
  for (int64_t count : histogram.counts()) proto->add_counts(count);
  proto->set_sum(histogram.sum());
}

void AddEviction(v1::EvictionReason reason, int64_t groups, v1::BufferStats* proto) {
  v1::EvictionCount* count = proto->add_evictions();
  count->set_reason(reason);
  count->set_groups(groups);
}

}  // namespace

void TimeToProto(absl::Time time, google::protobuf::Timestamp* timestamp) {
  const int64_t seconds = absl::ToUnixSeconds(time);
  timestamp->set_seconds(seconds);
  timestamp->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(time - absl::FromUnixSeconds(seconds))));
}

void RunStatsToProto(const RunStats& stats, v1::BufferStats* proto) {
  proto->set_run_id(stats.run_id);
  proto->set_size_groups(stats.size_groups);
  proto->set_size_trajectories(stats.size_trajectories);
  proto->set_size_bytes(stats.size_bytes);
  proto->set_inserted_groups(stats.inserted_groups);
  proto->set_duplicate_inserts(stats.duplicate_inserts);
  proto->set_rejected_inserts(stats.rejected_stale_inserts + stats.invalid_inserts);
  proto->set_sampled_groups(stats.sampled_groups);
  AddEviction(v1::EVICTION_REASON_STALE, stats.evictions.stale, proto);
  AddEviction(v1::EVICTION_REASON_MAX_TIMES_SAMPLED, stats.evictions.max_times_sampled, proto);
  AddEviction(v1::EVICTION_REASON_CAPACITY, stats.evictions.capacity, proto);
  AddEviction(v1::EVICTION_REASON_UNIFORM_REWARD, stats.evictions.uniform_reward, proto);
  HistogramToProto(stats.sampled_group_staleness, proto->mutable_sampled_group_staleness());
  HistogramToProto(stats.sampled_token_staleness, proto->mutable_sampled_token_staleness());
  proto->set_policy_version(stats.gate.policy_version);
  proto->set_running(stats.gate.running);
  proto->set_accepted(stats.gate.accepted);
  proto->set_admission_limit(stats.gate.admission_limit);
  proto->set_admission_blocked_ms(absl::ToInt64Milliseconds(stats.admission_blocked));
  proto->set_rate_limiter_insert_blocked_ms(
      absl::ToInt64Milliseconds(stats.rate_limiter_insert_blocked));
  proto->set_rate_limiter_sample_blocked_ms(
      absl::ToInt64Milliseconds(stats.rate_limiter_sample_blocked));
  *proto->mutable_config() = stats.config.buffer;
  proto->set_batch_size_groups(stats.config.batch_size_groups);
  proto->set_max_staleness(stats.config.max_staleness);
  proto->set_retained_groups(stats.retained_groups);
  proto->set_retained_bytes(stats.retained_bytes);
  proto->set_committed_step(stats.committed_step);
  proto->set_last_recorded_step(stats.last_recorded_step);
  proto->set_replayed_batches(stats.replayed_batches);
}

AcquireRequest AcquireRequestFromProto(const v1::AcquireGenerationSlotsRequest& request) {
  AcquireRequest core;
  core.worker_id = request.worker_id();
  core.worker_incarnation = request.worker_incarnation();
  core.num_groups = request.num_groups();
  core.wait_timeout = absl::Milliseconds(request.wait_timeout_ms());
  core.renew_lease_ids.assign(request.renew_lease_ids().begin(), request.renew_lease_ids().end());
  return core;
}

void AcquireResultToProto(const AcquireResult& result,
                          v1::AcquireGenerationSlotsResponse* response) {
  response->set_granted(static_cast<int32_t>(result.lease_ids.size()));
  for (const std::string& id : result.lease_ids) response->add_lease_ids(id);
  TimeToProto(result.lease_expires_at, response->mutable_lease_expires_at());
  response->set_lease_ttl_ms(absl::ToInt64Milliseconds(result.lease_ttl));
  response->set_policy_version(result.gate.policy_version);
  response->set_accepted(result.gate.accepted);
  response->set_running(result.gate.running);
  response->set_admission_limit(result.gate.admission_limit);
  for (const std::string& id : result.expired_lease_ids) response->add_expired_lease_ids(id);
}

ReleaseRequest ReleaseRequestFromProto(const v1::ReleaseGenerationSlotsRequest& request) {
  ReleaseRequest core;
  core.worker_id = request.worker_id();
  core.worker_incarnation = request.worker_incarnation();
  core.lease_ids.assign(request.lease_ids().begin(), request.lease_ids().end());
  core.release_all = request.release_all();
  return core;
}

v1::InsertStatus InsertStatusToProto(InsertStatus status) {
  switch (status) {
    case InsertStatus::kStored:
      return v1::INSERT_STATUS_STORED;
    case InsertStatus::kDuplicate:
      return v1::INSERT_STATUS_DUPLICATE;
    case InsertStatus::kRejectedStale:
      return v1::INSERT_STATUS_REJECTED_STALE;
    case InsertStatus::kInvalid:
      return v1::INSERT_STATUS_INVALID;
    case InsertStatus::kUnknownRun:
      return v1::INSERT_STATUS_UNKNOWN_RUN;
    case InsertStatus::kRetryableError:
      return v1::INSERT_STATUS_RETRYABLE_ERROR;
    case InsertStatus::kQuarantined:
      return v1::INSERT_STATUS_REFUSED_QUARANTINED;
  }
  return v1::INSERT_STATUS_UNSPECIFIED;
}

void InsertResultToProto(const InsertResult& result, v1::InsertGroupResult* proto) {
  proto->set_idempotency_key(result.idempotency_key);
  proto->set_status(InsertStatusToProto(result.status));
  proto->set_message(result.message);
  proto->set_buffer_sequence(result.buffer_sequence);
}

SampleRequest SampleRequestFromProto(const v1::SampleRequest& request,
                                     absl::Duration default_timeout) {
  SampleRequest core;
  core.batch_size_groups = request.batch_size_groups();
  if (request.has_max_staleness()) core.max_staleness = request.max_staleness();
  core.trainer_policy_version = request.trainer_policy_version();
  core.sampler_override = request.sampler_override();
  core.timeout =
      request.timeout_ms() == 0 ? default_timeout : absl::Milliseconds(request.timeout_ms());
  core.step = request.step();
  core.drop_uniform_reward_groups = request.drop_uniform_reward_groups();
  return core;
}

AliasedSampleResponse::AliasedSampleResponse(const SampleResult& result) {
  response_.mutable_groups()->Reserve(static_cast<int>(result.groups.size()));
  for (const SampledGroup& sampled : result.groups) {
    v1::SampledGroup* out = response_.add_groups();
    // The table's group is immutable once stored and outlives this object
    // (`result` holds a reference); protobuf only reads it to serialize
    // (its cached sizes are atomics, so concurrent streams may share it).
    out->unsafe_arena_set_allocated_group(const_cast<v1::Group*>(sampled.group.get()));
    out->set_times_sampled(sampled.times_sampled);
    out->set_staleness(sampled.staleness);
  }
  response_.set_buffer_version(result.buffer_version);
  response_.set_policy_version(result.policy_version);
  response_.set_replayed(result.replayed);
  response_.set_uniform_reward_groups_dropped(result.uniform_reward_groups_dropped);
}

AliasedSampleResponse::~AliasedSampleResponse() {
  for (v1::SampledGroup& out : *response_.mutable_groups()) out.unsafe_arena_release_group();
}

}  // namespace sluice::replay_buffer
