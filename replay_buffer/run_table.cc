#include "replay_buffer/run_table.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace sluice::replay_buffer {
namespace {

constexpr char kShuttingDown[] = "replay buffer is shutting down";

void SetTimestamp(absl::Time time, google::protobuf::Timestamp* timestamp) {
  const int64_t seconds = absl::ToUnixSeconds(time);
  timestamp->set_seconds(seconds);
  timestamp->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(time - absl::FromUnixSeconds(seconds))));
}

std::string NewLeaseIdPrefix() {
  absl::BitGen random;
  return absl::StrFormat("lease-%012x-", absl::Uniform<uint64_t>(random) >> 16);
}

}  // namespace

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

int32_t RunConfig::max_times_sampled() const {
  return buffer.max_times_sampled() > 0 ? buffer.max_times_sampled() : 1;
}

absl::Status RunConfig::Validate() const {
  std::vector<std::string> problems;
  if (run_id.empty()) problems.push_back("run_id: required");
  if (batch_size_groups <= 0) {
    problems.push_back(absl::StrCat("batch_size_groups: must be > 0, got ", batch_size_groups));
  }
  if (max_staleness < 0) {
    problems.push_back(absl::StrCat("max_staleness: must be >= 0, got ", max_staleness));
  }
  if (group_size <= 0) {
    problems.push_back(absl::StrCat("group_size: must be > 0, got ", group_size));
  }
  if (initial_policy_version < 0) {
    problems.push_back(
        absl::StrCat("initial_policy_version: must be >= 0, got ", initial_policy_version));
  }
  if (absl::Status sampler = CheckSamplerAvailable(buffer.sampler(), "buffer.sampler");
      !sampler.ok()) {
    problems.emplace_back(sampler.message());
  }
  if (buffer.max_times_sampled() < 0) {
    problems.push_back(absl::StrCat("buffer.max_times_sampled: must be >= 0 (0 = 1), got ",
                                    buffer.max_times_sampled()));
  }
  if (buffer.min_size_to_sample_groups() < 0) {
    problems.push_back(absl::StrCat("buffer.min_size_to_sample_groups: must be >= 0, got ",
                                    buffer.min_size_to_sample_groups()));
  }
  const int64_t batch_minimum =
      std::max<int64_t>(batch_size_groups, buffer.min_size_to_sample_groups());
  if (buffer.capacity_groups() < 0) {
    problems.push_back(absl::StrCat("buffer.capacity_groups: must be >= 0 (0 = unbounded), got ",
                                    buffer.capacity_groups()));
  } else if (buffer.capacity_groups() > 0 && buffer.capacity_groups() < batch_minimum) {
    problems.push_back(
        absl::StrCat("buffer.capacity_groups: must be 0 (unbounded) or >= max(batch_size_groups, "
                     "min_size_to_sample_groups) = ",
                     batch_minimum, ", got ", buffer.capacity_groups(),
                     "; a smaller table could never fill a batch"));
  }
  if (buffer.samples_per_insert() != 0) {
    problems.push_back(absl::StrCat(
        "buffer.samples_per_insert: rate limiting is not available yet; this release needs 0 "
        "(off), got ",
        buffer.samples_per_insert()));
  }
  if (!(buffer.samples_per_insert_tolerance() >= 0)) {
    problems.push_back(absl::StrCat("buffer.samples_per_insert_tolerance: must be >= 0, got ",
                                    buffer.samples_per_insert_tolerance()));
  }
  if (!(buffer.recency_probability() >= 0 && buffer.recency_probability() <= 1)) {
    problems.push_back(absl::StrCat("buffer.recency_probability: must be in [0, 1], got ",
                                    buffer.recency_probability()));
  }
  if (buffer.has_priority_alpha() && !(buffer.priority_alpha() >= 0)) {
    problems.push_back(
        absl::StrCat("buffer.priority_alpha: must be >= 0, got ", buffer.priority_alpha()));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

absl::Status RunTableOptions::Validate() const {
  if (lease_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ttl_ms: must be > 0, got ", absl::ToInt64Milliseconds(lease_ttl)));
  }
  if (!clock) return absl::InvalidArgumentError("clock: required");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Construction and configuration
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RunTable>> RunTable::Create(RunConfig config,
                                                           RunTableOptions options) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(std::unique_ptr<Sampler> sampler, CreateSampler(config.buffer.sampler()));
  return std::unique_ptr<RunTable>(
      new RunTable(std::move(config), std::move(options), std::move(sampler)));
}

RunTable::RunTable(RunConfig config, RunTableOptions options, std::unique_ptr<Sampler> sampler)
    : run_id_(config.run_id),
      batch_size_groups_(config.batch_size_groups),
      max_staleness_(config.max_staleness),
      group_size_(config.group_size),
      options_(std::move(options)),
      lease_id_prefix_(NewLeaseIdPrefix()) {
  absl::MutexLock lock(&mu_);
  policy_version_ = config.initial_policy_version;
  accepted_ = config.initial_policy_version * config.batch_size_groups;
  sampler_ = std::move(sampler);
  config_ = std::move(config);
}

absl::Status RunTable::Reconfigure(const RunConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  const auto fixed = [&](const char* field, int64_t now, int64_t wanted) -> absl::Status {
    if (now == wanted) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": run ", run_id_, " is configured with ", now, "; it cannot change to ", wanted,
        " (the admission gate and the stored groups depend on it)"));
  };
  if (config.run_id != run_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("run_id: table is for run ", run_id_, ", not ", config.run_id));
  }
  RETURN_IF_ERROR(fixed("batch_size_groups", batch_size_groups_, config.batch_size_groups));
  RETURN_IF_ERROR(fixed("max_staleness", max_staleness_, config.max_staleness));
  RETURN_IF_ERROR(fixed("group_size", group_size_, config.group_size));
  ASSIGN_OR_RETURN(std::unique_ptr<Sampler> sampler, CreateSampler(config.buffer.sampler()));

  absl::MutexLock lock(&mu_);
  if (sampler->kind() != sampler_->kind()) {
    for (const auto& [sequence, item] : items_) sampler->Insert(sequence);
    sampler_ = std::move(sampler);
  }
  config_.buffer = config.buffer;
  AdvanceVersionLocked(config.initial_policy_version);
  EnforceCapacityLocked();
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// The admission gate
// ---------------------------------------------------------------------------

int64_t RunTable::AdmissionLimitLocked() const {
  return (int64_t{max_staleness_} + policy_version_ + 1) * batch_size_groups_;
}

int64_t RunTable::CapacityLocked() const {
  return AdmissionLimitLocked() - accepted_ - static_cast<int64_t>(leases_.size());
}

GateState RunTable::GateLocked() const {
  return GateState{.policy_version = policy_version_,
                   .accepted = accepted_,
                   .running = static_cast<int64_t>(leases_.size()),
                   .admission_limit = AdmissionLimitLocked()};
}

bool RunTable::CanGrantOrShutdown() const { return shutdown_ || CapacityLocked() > 0; }

void RunTable::ExpireLeasesLocked() {
  const absl::Time now = options_.clock();
  while (!lease_expiry_.empty() && lease_expiry_.begin()->first <= now) {
    leases_.erase(lease_expiry_.begin()->second);
    lease_expiry_.erase(lease_expiry_.begin());
  }
}

void RunTable::EraseLeaseLocked(absl::flat_hash_map<std::string, Lease>::iterator it) {
  lease_expiry_.erase({it->second.expires_at, it->first});
  leases_.erase(it);
}

bool RunTable::ReleaseLeaseLocked(const std::string& lease_id) {
  if (lease_id.empty()) return false;
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return false;
  EraseLeaseLocked(it);
  return true;
}

absl::Time RunTable::NextExpiryRealTimeLocked() const {
  if (lease_expiry_.empty()) return absl::InfiniteFuture();
  return absl::Now() + (lease_expiry_.begin()->first - options_.clock());
}

absl::StatusOr<AcquireResult> RunTable::AcquireSlots(const AcquireRequest& request) {
  if (request.worker_id.empty()) return absl::InvalidArgumentError("worker_id: required");
  if (request.num_groups < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_groups: must be >= 0, got ", request.num_groups));
  }
  if (request.wait_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wait_timeout_ms: must be >= 0, got ", absl::ToInt64Milliseconds(request.wait_timeout)));
  }
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + request.wait_timeout;

  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError(kShuttingDown);
  ExpireLeasesLocked();

  const auto [known, first_call] =
      worker_incarnations_.try_emplace(request.worker_id, request.worker_incarnation);
  if (!first_call && request.worker_incarnation < known->second) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker_incarnation: worker ", request.worker_id, " incarnation ",
                     request.worker_incarnation, " is older than incarnation ", known->second,
                     " already seen; a restarted worker must use a higher incarnation"));
  }
  if (!first_call && request.worker_incarnation > known->second) {
    known->second = request.worker_incarnation;
    for (auto it = leases_.begin(); it != leases_.end();) {
      auto current = it++;
      if (current->second.worker_id == request.worker_id &&
          current->second.incarnation < request.worker_incarnation) {
        EraseLeaseLocked(current);
      }
    }
  }

  AcquireResult result;
  // Renewing before a wait keeps the leases alive through it; renewing again
  // after makes lease_expires_at true for all of them.
  const auto renew = [&](std::vector<std::string>* unknown) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time expires_at = options_.clock() + options_.lease_ttl;
    for (const std::string& id : request.renew_lease_ids) {
      auto it = leases_.find(id);
      if (it == leases_.end() || it->second.worker_id != request.worker_id) {
        if (unknown != nullptr) unknown->push_back(id);
        continue;
      }
      lease_expiry_.erase({it->second.expires_at, id});
      it->second.expires_at = expires_at;
      lease_expiry_.emplace(expires_at, id);
    }
  };
  renew(&result.expired_lease_ids);

  if (request.num_groups > 0 && CapacityLocked() <= 0 &&
      request.wait_timeout > absl::ZeroDuration()) {
    while (!shutdown_) {
      ExpireLeasesLocked();
      if (CapacityLocked() > 0 || absl::Now() >= deadline) break;
      // Wakes on anything that frees capacity; expiries are timed, not signalled.
      mu_.AwaitWithDeadline(absl::Condition(this, &RunTable::CanGrantOrShutdown),
                            std::min(deadline, NextExpiryRealTimeLocked()));
    }
    result.waited = absl::Now() - start;
    admission_blocked_ += result.waited;
    if (shutdown_) return absl::UnavailableError(kShuttingDown);
    renew(nullptr);
  }

  const int64_t granted =
      std::min<int64_t>(request.num_groups, std::max<int64_t>(0, CapacityLocked()));
  const absl::Time expires_at = options_.clock() + options_.lease_ttl;
  result.lease_ids.reserve(static_cast<size_t>(granted));
  for (int64_t i = 0; i < granted; ++i) {
    std::string id = absl::StrCat(lease_id_prefix_, next_lease_number_++);
    leases_.emplace(id, Lease{.worker_id = request.worker_id,
                              .incarnation = request.worker_incarnation,
                              .expires_at = expires_at});
    lease_expiry_.emplace(expires_at, id);
    result.lease_ids.push_back(std::move(id));
  }
  result.lease_expires_at = expires_at;
  result.lease_ttl = options_.lease_ttl;
  result.gate = GateLocked();
  return result;
}

ReleaseResult RunTable::ReleaseSlots(const ReleaseRequest& request) {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  ReleaseResult result;
  if (request.release_all) {
    for (auto it = leases_.begin(); it != leases_.end();) {
      auto current = it++;
      if (current->second.worker_id == request.worker_id) {
        EraseLeaseLocked(current);
        ++result.released;
      }
    }
  } else {
    for (const std::string& id : request.lease_ids) {
      auto it = leases_.find(id);
      if (it == leases_.end() || it->second.worker_id != request.worker_id) continue;
      EraseLeaseLocked(it);
      ++result.released;
    }
  }
  result.running = static_cast<int64_t>(leases_.size());
  return result;
}

// ---------------------------------------------------------------------------
// Inserts
// ---------------------------------------------------------------------------

absl::Status RunTable::ValidateGroup(v1::Group& group) const {
  if (group.idempotency_key().empty()) {
    return absl::InvalidArgumentError("idempotency_key: required");
  }
  if (group.run_id() != run_id_) {
    return absl::InvalidArgumentError(absl::StrCat("run_id: group is for run \"", group.run_id(),
                                                   "\", this table is run \"", run_id_, "\""));
  }
  if (group.trajectories_size() != group_size_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trajectories: expected group_size = ", group_size_, ", got ", group.trajectories_size()));
  }
  int64_t min_version = std::numeric_limits<int64_t>::max();
  int64_t max_version = std::numeric_limits<int64_t>::min();
  for (int i = 0; i < group.trajectories_size(); ++i) {
    const v1::Trajectory& trajectory = group.trajectories(i);
    const int tokens = trajectory.completion_token_ids_size();
    if (trajectory.behaviour_logprobs_size() != tokens ||
        trajectory.token_policy_versions_size() != tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("trajectories[", i, "]: completion_token_ids has ", tokens,
                       " entries, behaviour_logprobs ", trajectory.behaviour_logprobs_size(),
                       " and token_policy_versions ", trajectory.token_policy_versions_size(),
                       "; each needs one entry per completion token"));
    }
    const auto& versions = trajectory.token_policy_versions();
    for (int t = 0; t < versions.size(); ++t) {
      if (versions[t] < 0) {
        return absl::InvalidArgumentError(absl::StrCat("trajectories[", i,
                                                       "].token_policy_versions[", t,
                                                       "]: must be >= 0, got ", versions[t]));
      }
      if (t > 0 && versions[t] < versions[t - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "trajectories[", i, "].token_policy_versions: must be non-decreasing; entry ", t,
            " is ", versions[t], " after ", versions[t - 1]));
      }
    }
    if (tokens > 0) {
      min_version = std::min<int64_t>(min_version, versions[0]);
      max_version = std::max<int64_t>(max_version, versions[tokens - 1]);
    }
  }
  if (min_version == std::numeric_limits<int64_t>::max()) {
    return absl::InvalidArgumentError(
        "trajectories: the group has no completion tokens, so its policy version is undefined");
  }
  group.set_min_policy_version(min_version);
  group.set_max_policy_version(max_version);
  return absl::OkStatus();
}

RunTable::Item RunTable::MakeItem(std::shared_ptr<const v1::Group> group) {
  Item item;
  item.min_policy_version = group->min_policy_version();
  item.size_bytes = static_cast<int64_t>(group->ByteSizeLong());
  item.trajectories = group->trajectories_size();
  std::vector<std::pair<int64_t, int64_t>>& tokens = item.tokens_per_version;
  for (const v1::Trajectory& trajectory : group->trajectories()) {
    const auto& versions = trajectory.token_policy_versions();
    // Non-decreasing: one entry per run of equal versions, not per token.
    for (int t = 0; t < versions.size();) {
      int end = t;
      while (end < versions.size() && versions[end] == versions[t]) ++end;
      tokens.emplace_back(versions[t], end - t);
      t = end;
    }
  }
  std::sort(tokens.begin(), tokens.end());
  size_t merged = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (merged > 0 && tokens[merged - 1].first == tokens[i].first) {
      tokens[merged - 1].second += tokens[i].second;
    } else {
      tokens[merged++] = tokens[i];
    }
  }
  tokens.resize(merged);
  item.group = std::move(group);
  return item;
}

InsertResult RunTable::Insert(v1::Group group) {
  InsertResult result;
  result.idempotency_key = group.idempotency_key();
  const std::string lease_id = group.slot_lease_id();
  // Everything that needs no lock happens here: validation, the copy-free
  // move to the heap, the token summary.
  const absl::Status valid = ValidateGroup(group);
  group.set_times_sampled(0);
  auto stored = std::make_shared<v1::Group>(std::move(group));
  Item item;
  if (valid.ok()) item = MakeItem(stored);

  absl::MutexLock lock(&mu_);
  if (shutdown_) {
    ++retryable_insert_errors_;
    result.status = InsertStatus::kRetryableError;
    result.message = absl::StrCat(kShuttingDown, "; retry with the same idempotency key");
    return result;
  }
  ExpireLeasesLocked();
  if (!result.idempotency_key.empty()) {
    if (auto it = stored_keys_.find(result.idempotency_key); it != stored_keys_.end()) {
      ++duplicate_inserts_;
      ReleaseLeaseLocked(lease_id);
      result.status = InsertStatus::kDuplicate;
      result.buffer_sequence = it->second;
      return result;
    }
  }
  if (!valid.ok()) {
    ++invalid_inserts_;
    ReleaseLeaseLocked(lease_id);
    result.status = InsertStatus::kInvalid;
    result.message = std::string(valid.message());
    return result;
  }
  if (const int64_t staleness = policy_version_ - item.min_policy_version;
      staleness > max_staleness_) {
    ++rejected_stale_inserts_;
    ReleaseLeaseLocked(lease_id);
    result.status = InsertStatus::kRejectedStale;
    result.message =
        absl::StrCat("group is ", staleness, " versions stale (policy version ", policy_version_,
                     ", min_policy_version ", item.min_policy_version, ") and max_staleness is ",
                     max_staleness_, "; it can never be trained");
    return result;
  }

  ReleaseLeaseLocked(lease_id);  // running - 1 when live; stored either way
  ++accepted_;
  ++inserted_groups_;
  const int64_t sequence = next_sequence_++;
  stored->set_buffer_sequence(sequence);
  SetTimestamp(options_.clock(), stored->mutable_inserted_at());
  stored_keys_.emplace(result.idempotency_key, sequence);
  AddItemLocked(sequence, std::move(item));
  EnforceCapacityLocked();
  result.status = InsertStatus::kStored;
  result.buffer_sequence = sequence;
  return result;
}

void RunTable::EnforceCapacityLocked() {
  const int64_t capacity = config_.buffer.capacity_groups();
  if (capacity <= 0) return;
  while (static_cast<int64_t>(items_.size()) > capacity) {
    RemoveItemLocked(items_.begin()->first, EvictionReason::kCapacity);
    --accepted_;  // dropped untrained, like a stale group: its slot goes back
  }
}

void RunTable::AddItemLocked(int64_t sequence, Item item) {
  by_min_version_.emplace(item.min_policy_version, sequence);
  sampler_->Insert(sequence);
  size_trajectories_ += item.trajectories;
  size_bytes_ += item.size_bytes;
  items_.emplace(sequence, std::move(item));
  ++buffer_version_;
}

void RunTable::RemoveItemLocked(int64_t sequence, EvictionReason reason) {
  auto it = items_.find(sequence);
  if (it == items_.end()) return;
  by_min_version_.erase({it->second.min_policy_version, sequence});
  sampler_->Delete(sequence);
  size_trajectories_ -= it->second.trajectories;
  size_bytes_ -= it->second.size_bytes;
  items_.erase(it);
  switch (reason) {
    case EvictionReason::kStale:
      ++evictions_.stale;
      break;
    case EvictionReason::kMaxTimesSampled:
      ++evictions_.max_times_sampled;
      break;
    case EvictionReason::kCapacity:
      ++evictions_.capacity;
      break;
  }
  ++buffer_version_;
}

// ---------------------------------------------------------------------------
// Versions, eviction, sampling
// ---------------------------------------------------------------------------

int64_t RunTable::EvictStaleLocked(int64_t reference_version, int64_t max_staleness) {
  int64_t evicted = 0;
  while (!by_min_version_.empty() &&
         reference_version - by_min_version_.begin()->first > max_staleness) {
    RemoveItemLocked(by_min_version_.begin()->second, EvictionReason::kStale);
    --accepted_;  // gives its capacity back to the gate
    ++evicted;
  }
  return evicted;
}

int64_t RunTable::AdvanceVersionLocked(int64_t policy_version) {
  if (policy_version <= policy_version_) return 0;
  policy_version_ = policy_version;
  return EvictStaleLocked(policy_version_, max_staleness_);
}

absl::StatusOr<UpdateVersionResult> RunTable::UpdatePolicyVersion(int64_t policy_version) {
  if (policy_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy_version: must be >= 0, got ", policy_version));
  }
  absl::MutexLock lock(&mu_);
  UpdateVersionResult result;
  result.evicted_stale_groups = AdvanceVersionLocked(policy_version);
  result.policy_version = policy_version_;
  result.admission_limit = AdmissionLimitLocked();
  return result;
}

bool RunTable::EnoughGroupsOrShutdown(SampleWait* wait) {
  return wait->table->shutdown_ || static_cast<int64_t>(wait->table->items_.size()) >= wait->needed;
}

void RunTable::RecordSampleLocked(const Item& item, int64_t trainer_version, int64_t sign) {
  sampled_groups_ += sign;
  sampled_group_staleness_.Add(trainer_version - item.min_policy_version, sign);
  for (const auto& [version, tokens] : item.tokens_per_version) {
    sampled_token_staleness_.Add(trainer_version - version, sign * tokens);
  }
}

absl::StatusOr<SampleResult> RunTable::Sample(const SampleRequest& request) {
  if (request.batch_size_groups < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size_groups: must be >= 0 (0 = the run's ", batch_size_groups_,
                     "), got ", request.batch_size_groups));
  }
  if (request.max_staleness.has_value() && *request.max_staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_staleness: must be >= 0, got ", *request.max_staleness));
  }
  if (request.trainer_policy_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_policy_version: must be >= 0, got ", request.trainer_policy_version));
  }
  if (request.timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms: must be >= 0, got ", absl::ToInt64Milliseconds(request.timeout)));
  }
  RETURN_IF_ERROR(CheckSamplerAvailable(request.sampler_override, "sampler_override"));
  const absl::Time deadline = absl::Now() + request.timeout;
  const int64_t batch =
      request.batch_size_groups > 0 ? request.batch_size_groups : batch_size_groups_;
  const int64_t max_staleness =
      std::min<int64_t>(request.max_staleness.value_or(max_staleness_), max_staleness_);
  const int64_t trainer_version = request.trainer_policy_version;

  absl::MutexLock lock(&mu_);
  SampleResult result;
  result.policy_version = trainer_version;
  result.evicted_stale_groups = AdvanceVersionLocked(trainer_version);
  const int64_t needed = std::max(batch, config_.buffer.min_size_to_sample_groups());
  while (true) {
    if (shutdown_) return absl::UnavailableError(kShuttingDown);
    result.evicted_stale_groups += EvictStaleLocked(trainer_version, max_staleness);
    if (static_cast<int64_t>(items_.size()) >= needed) break;
    if (absl::Now() >= deadline) {
      result.timed_out = true;
      result.buffer_version = buffer_version_;
      return result;
    }
    SampleWait wait{this, needed};
    mu_.AwaitWithDeadline(absl::Condition(&RunTable::EnoughGroupsOrShutdown, &wait), deadline);
  }

  const int32_t max_times_sampled = config_.max_times_sampled();
  for (const int64_t sequence : sampler_->Select(batch)) {
    Item& item = items_.at(sequence);
    ++item.times_sampled;
    RecordSampleLocked(item, trainer_version, +1);
    SampledGroup sampled{.group = item.group,
                         .times_sampled = item.times_sampled,
                         .staleness = trainer_version - item.min_policy_version,
                         .removed = item.times_sampled >= max_times_sampled};
    if (sampled.removed) RemoveItemLocked(sequence, EvictionReason::kMaxTimesSampled);
    result.groups.push_back(std::move(sampled));
  }
  ++buffer_version_;
  result.buffer_version = buffer_version_;
  return result;
}

void RunTable::ReturnUndelivered(const SampleResult& batch) {
  std::vector<Item> items;
  items.reserve(batch.groups.size());
  for (const SampledGroup& sampled : batch.groups) {
    items.push_back(MakeItem(sampled.group));
    items.back().times_sampled = sampled.times_sampled - 1;
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < batch.groups.size(); ++i) {
    const SampledGroup& sampled = batch.groups[i];
    const int64_t sequence = sampled.group->buffer_sequence();
    RecordSampleLocked(items[i], batch.policy_version, -1);
    if (sampled.removed) {
      if (items_.contains(sequence)) continue;
      --evictions_.max_times_sampled;
      AddItemLocked(sequence, std::move(items[i]));
    } else if (auto it = items_.find(sequence); it != items_.end()) {
      it->second.times_sampled = std::max(0, it->second.times_sampled - 1);
    }
  }
  ++buffer_version_;
}

absl::Status RunTable::UpdatePriorities() {
  absl::MutexLock lock(&mu_);
  return absl::InvalidArgumentError(absl::StrCat(
      "priorities: run ", run_id_, " samples with ", v1::SamplerKind_Name(sampler_->kind()),
      ", which does not use priorities; only SAMPLER_KIND_PRIORITIZED does"));
}

RunStats RunTable::Stats() {
  absl::MutexLock lock(&mu_);
  ExpireLeasesLocked();
  RunStats stats;
  stats.run_id = run_id_;
  stats.size_groups = static_cast<int64_t>(items_.size());
  stats.size_trajectories = size_trajectories_;
  stats.size_bytes = size_bytes_;
  stats.inserted_groups = inserted_groups_;
  stats.duplicate_inserts = duplicate_inserts_;
  stats.rejected_stale_inserts = rejected_stale_inserts_;
  stats.invalid_inserts = invalid_inserts_;
  stats.retryable_insert_errors = retryable_insert_errors_;
  stats.sampled_groups = sampled_groups_;
  stats.evictions = evictions_;
  stats.sampled_group_staleness = sampled_group_staleness_;
  stats.sampled_token_staleness = sampled_token_staleness_;
  stats.gate = GateLocked();
  stats.admission_blocked = admission_blocked_;
  stats.buffer_version = buffer_version_;
  stats.config = config_;
  return stats;
}

void RunTable::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;  // every Await condition includes it
}

}  // namespace sluice::replay_buffer
