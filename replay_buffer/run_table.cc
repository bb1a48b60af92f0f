#include "replay_buffer/run_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/run/run_buffer.h"
#include "common/run/run_memory.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "replay_buffer/wire.h"

namespace sluice::replay_buffer {
namespace {

void SetTimestamp(absl::Time time, google::protobuf::Timestamp* timestamp) {
  const int64_t seconds = absl::ToUnixSeconds(time);
  timestamp->set_seconds(seconds);
  timestamp->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(time - absl::FromUnixSeconds(seconds))));
}

}  // namespace

// ---------------------------------------------------------------------------
// Options (the run's configuration: run_config.cc)
// ---------------------------------------------------------------------------

absl::Status RunTableOptions::Validate() const {
  if (lease_ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease_ttl_ms: must be > 0, got ", absl::ToInt64Milliseconds(lease_ttl)));
  }
  if (!clock) return absl::InvalidArgumentError("clock: required");
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Construction, configuration, journaling
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RunTable>> RunTable::Create(RunConfig config,
                                                           RunTableOptions options,
                                                           uint64_t replayed_lsn) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(const SamplerOptions sampler_options,
                   SamplerOptions::FromConfig(config.buffer, config.seed));
  ASSIGN_OR_RETURN(std::unique_ptr<Sampler> sampler, CreateSampler(sampler_options));
  std::unique_ptr<RunTable> table(
      new RunTable(std::move(config), std::move(options), std::move(sampler)));
  absl::MutexLock lock(&table->mu_);
  if (replayed_lsn > 0) {
    table->last_lsn_ = replayed_lsn;
  } else {
    v1::storage::WalRecord record;
    *record.mutable_configured() = RunConfigToProto(table->config_);
    RETURN_IF_ERROR(table->JournalLocked(record).status());
  }
  return table;
}

RunTable::RunTable(RunConfig config, RunTableOptions options, std::unique_ptr<Sampler> sampler)
    : run_id_(config.run_id),
      batch_size_groups_(config.batch_size_groups),
      max_staleness_(config.max_staleness),
      staleness_bound_(config.resolved_staleness_bound()),
      group_size_(config.group_size),
      options_(std::move(options)),
      rate_limiter_(RateLimiter::OptionsFrom(config.buffer, config.batch_size_groups)),
      gate_({.run_id = config.run_id,
             .batch_size_groups = config.batch_size_groups,
             .max_staleness = config.max_staleness,
             .lease_ttl = options_.lease_ttl,
             .clock = options_.clock},
            config.initial_policy_version) {
  absl::MutexLock lock(&mu_);
  sampler_ = std::move(sampler);
  config_ = std::move(config);
  SetGroupLimitsLocked(config_);
}

RunTable::~RunTable() {
  absl::MutexLock lock(&mu_);
  if (options_.memory != nullptr) options_.memory->Release(size_bytes_ + retained_only_bytes_);
}

absl::StatusOr<uint64_t> RunTable::JournalLocked(v1::storage::WalRecord& record,
                                                 std::string prefix) {
  if (options_.journal == nullptr) return uint64_t{0};
  record.set_run_id(run_id_);
  absl::StatusOr<uint64_t> lsn = options_.journal->Append(std::move(prefix), record);
  if (!lsn.ok()) {
    return absl::UnavailableError(
        absl::StrCat("replay buffer write-ahead log failed (", lsn.status().message(),
                     "); nothing was changed; retry once the data directory is writable"));
  }
  last_lsn_ = *lsn;
  return lsn;
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
  RETURN_IF_ERROR(
      fixed("staleness_bound", staleness_bound_, config.resolved_staleness_bound()));
  ASSIGN_OR_RETURN(const SamplerOptions sampler_options,
                   SamplerOptions::FromConfig(config.buffer, config.seed));
  ASSIGN_OR_RETURN(std::unique_ptr<Sampler> sampler, CreateSampler(sampler_options));

  absl::MutexLock lock(&mu_);
  const v1::ConfigureRunRequest now = RunConfigToProto(config_);
  v1::storage::WalRecord record;
  *record.mutable_configured() = RunConfigToProto(config);
  if (record.configured().SerializeAsString() == now.SerializeAsString() &&
      config.initial_policy_version <= gate_.policy_version()) {
    return absl::OkStatus();  // nothing changes
  }
  RETURN_IF_ERROR(JournalLocked(record).status());
  ApplyConfigLocked(config, std::move(sampler));
  return absl::OkStatus();
}

void RunTable::ApplyConfigLocked(const RunConfig& config, std::unique_ptr<Sampler> sampler) {
  const bool sampler_changed =
      config.buffer.sampler() != config_.buffer.sampler() ||
      config.buffer.priority_alpha() != config_.buffer.priority_alpha() ||
      config.buffer.has_priority_alpha() != config_.buffer.has_priority_alpha() ||
      config.buffer.recency_probability() != config_.buffer.recency_probability() ||
      config.buffer.reward_inverse_temperature() !=
          config_.buffer.reward_inverse_temperature() ||
      config.seed != config_.seed;
  const bool priorities_changed =
      config.buffer.priority_source() != config_.buffer.priority_source() ||
      config.buffer.priority_epsilon() != config_.buffer.priority_epsilon();
  config_.buffer = config.buffer;
  config_.seed = config.seed;
  config_.vocab_size = config.vocab_size;
  config_.max_sequence_tokens = config.max_sequence_tokens;
  config_.retained_step_batches = config.retained_step_batches;
  config_.min_reward = config.min_reward;
  config_.max_reward = config.max_reward;
  SetGroupLimitsLocked(config_);
  rate_limiter_.set_options(RateLimiter::OptionsFrom(config_.buffer, batch_size_groups_));
  if (sampler_changed || priorities_changed) {
    for (auto& [sequence, item] : items_) item.priority = PriorityForLocked(*item.group);
  }
  if (sampler_changed || priorities_changed) {
    for (const auto& [sequence, item] : items_) {
      sampler->Insert(sequence, SamplerPriority(sampler->kind(), item));
    }
    sampler_ = std::move(sampler);
  }
  ApplyVersionLocked(config.initial_policy_version);
  EnforceCapacityLocked();
}

double RunTable::SamplerPriority(v1::SamplerKind kind, const Item& item) {
  // The oldest-policy sampler orders by the group's behaviour version, fixed
  // at insert whatever the priority source says (client updates included).
  if (kind == v1::SAMPLER_KIND_OLDEST_POLICY) return static_cast<double>(item.min_policy_version);
  return item.priority;
}

double RunTable::PriorityForLocked(const v1::Group& group) const {
  const v1::BufferConfig& buffer = config_.buffer;
  if (buffer.priority_source() == v1::PRIORITY_SOURCE_CLIENT) {
    if (group.has_priority()) return group.priority();
    return max_client_priority_ > 0 ? max_client_priority_ : 1.0;
  }
  double mean = 0;
  for (const v1::Trajectory& trajectory : group.trajectories()) mean += trajectory.reward();
  if (group.trajectories_size() > 0) mean /= group.trajectories_size();
  double value = mean;
  if (buffer.priority_source() == v1::PRIORITY_SOURCE_ABS_ADVANTAGE) {
    double spread = 0;
    for (const v1::Trajectory& trajectory : group.trajectories()) {
      spread += std::fabs(trajectory.reward() - mean);
    }
    value = group.trajectories_size() > 0 ? spread / group.trajectories_size() : 0;
  }
  if (!std::isfinite(value)) value = 0;
  if (buffer.sampler() == v1::SAMPLER_KIND_RECENCY) return value;  // a reward, any sign
  const double epsilon = buffer.priority_epsilon() > 0 ? buffer.priority_epsilon() : 0.01;
  return std::max(0.0, value) + epsilon;
}

// ---------------------------------------------------------------------------
// Inserts
// ---------------------------------------------------------------------------

GroupLimits RunTable::CurrentGroupLimits() const {
  GroupLimits limits;
  limits.run_id = run_id_;
  limits.group_size = group_size_;
  limits.vocab_size = vocab_size_.load(std::memory_order_relaxed);
  const double min_reward = min_reward_.load(std::memory_order_relaxed);
  const double max_reward = max_reward_.load(std::memory_order_relaxed);
  if (std::isfinite(min_reward)) limits.min_reward = min_reward;
  if (std::isfinite(max_reward)) limits.max_reward = max_reward;
  return limits;
}

void RunTable::SetGroupLimitsLocked(const RunConfig& config) {
  vocab_size_.store(config.vocab_size, std::memory_order_relaxed);
  min_reward_.store(config.min_reward.value_or(-std::numeric_limits<double>::infinity()),
                    std::memory_order_relaxed);
  max_reward_.store(config.max_reward.value_or(std::numeric_limits<double>::infinity()),
                    std::memory_order_relaxed);
}

RunTable::Item RunTable::MakeItem(std::shared_ptr<const v1::Group> group) {
  Item item;
  item.min_policy_version = group->min_policy_version();
  item.max_policy_version = group->max_policy_version();
  // Without the fields the buffer sets (sequence, insert time), so that a
  // group counts the same whether stored, replayed or restored.
  size_t bytes = group->ByteSizeLong();
  if (group->buffer_sequence() != 0) {
    bytes -= 1 + google::protobuf::io::CodedOutputStream::VarintSize64(
                     static_cast<uint64_t>(group->buffer_sequence()));
  }
  if (group->has_inserted_at()) {
    const size_t timestamp = group->inserted_at().ByteSizeLong();
    bytes -= 1 + google::protobuf::io::CodedOutputStream::VarintSize32(
                     static_cast<uint32_t>(timestamp)) + timestamp;
  }
  item.size_bytes = static_cast<int64_t>(bytes);
  item.trajectories = group->trajectories_size();
  item.uniform_rewards = true;
  for (const v1::Trajectory& trajectory : group->trajectories()) {
    if (trajectory.reward() != group->trajectories(0).reward()) item.uniform_rewards = false;
  }
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

InsertResult RunTable::Insert(v1::Group group, absl::Duration rate_limit_wait) {
  InsertResult result;
  result.idempotency_key = group.idempotency_key();
  const std::string lease_id = group.slot_lease_id();
  // Everything that needs no lock happens here: validation, the move to the
  // heap, the token summary and the serialization of the journal record's
  // bulk (the group without its sequence and insert time).
  absl::StatusOr<GroupVersions> versions = ValidateGroup(group, CurrentGroupLimits());
  absl::Status valid = versions.status();
  if (valid.ok()) {
    group.set_min_policy_version(versions->min_policy_version);
    group.set_max_policy_version(versions->max_policy_version);
  }
  if (valid.ok() && group.has_priority() &&
      !(std::isfinite(group.priority()) && group.priority() >= 0)) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("priority: must be finite and >= 0, got ", group.priority()));
  }
  group.set_times_sampled(0);
  group.clear_buffer_sequence();
  group.clear_inserted_at();
  auto stored = std::make_shared<v1::Group>(std::move(group));
  Item item;
  std::string prefix;
  if (valid.ok()) {
    item = MakeItem(stored);
    if (options_.journal != nullptr) {
      // WalRecord.stored (3) { group (1) }, without copying the group; room
      // for the small fields appended under the lock (JournalLocked), so
      // that appending them does not reallocate.
      prefix.reserve(stored->ByteSizeLong() + 512);
      wire::AppendNested(3, 1, *stored, /*extra=*/"", &prefix);
    }
  }
  const absl::Time deadline = absl::Now() + rate_limit_wait;

  absl::MutexLock lock(&mu_);
  const auto retryable = [&](std::string message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++retryable_insert_errors_;
    result.status = InsertStatus::kRetryableError;
    result.message = absl::StrCat(message, "; retry with the same idempotency key");
    return result;
  };
  const auto refuse = [&](InsertStatus status, v1::InsertStatus proto_status,
                          std::string message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::storage::WalRecord record;
    record.mutable_refused()->set_status(proto_status);
    if (gate_.HasLease(lease_id)) record.mutable_refused()->set_released_lease_id(lease_id);
    if (absl::Status journaled = JournalLocked(record).status(); !journaled.ok()) {
      return retryable(std::string(journaled.message()));
    }
    ApplyRefusedLocked(proto_status, record.refused().released_lease_id());
    result.status = status;
    result.message = std::move(message);
    return result;
  };

  if (shutdown_) return retryable(kRunTableShuttingDown);
  gate_.ExpireLeases();
  if (absl::Status allowed = gate_.CheckGroupNotQuarantined(*stored); !allowed.ok()) {
    return refuse(InsertStatus::kQuarantined, v1::INSERT_STATUS_REFUSED_QUARANTINED,
                  std::string(allowed.message()));
  }
  if (!result.idempotency_key.empty()) {
    if (auto it = stored_keys_.find(result.idempotency_key); it != stored_keys_.end()) {
      result.buffer_sequence = it->second;
      return refuse(InsertStatus::kDuplicate, v1::INSERT_STATUS_DUPLICATE, "");
    }
  }
  if (!valid.ok()) {
    return refuse(InsertStatus::kInvalid, v1::INSERT_STATUS_INVALID,
                  std::string(valid.message()));
  }

  // The rate limiter: wait (not reading the client's stream meanwhile, which
  // is the push-back) until the trainer has caught up with the ratio.
  if (!rate_limiter_.CanInsert(static_cast<int64_t>(items_.size()))) {
    const absl::Time start = absl::Now();
    while (!shutdown_ && !rate_limiter_.CanInsert(static_cast<int64_t>(items_.size())) &&
           absl::Now() < deadline) {
      mu_.AwaitWithDeadline(absl::Condition(this, &RunTable::CanInsertOrShutdown), deadline);
    }
    insert_blocked_ += absl::Now() - start;
    if (shutdown_) return retryable(kRunTableShuttingDown);
    if (!rate_limiter_.CanInsert(static_cast<int64_t>(items_.size()))) {
      return retryable(absl::StrCat(
          "rate limited: samples_per_insert ", rate_limiter_.options().samples_per_insert,
          " allows no more inserts until the trainer samples (", rate_limiter_.inserts(),
          " inserted, ", rate_limiter_.samples(), " sampled)"));
    }
    // Another insert of the same key may have landed while this one waited.
    if (auto it = stored_keys_.find(result.idempotency_key); it != stored_keys_.end()) {
      result.buffer_sequence = it->second;
      return refuse(InsertStatus::kDuplicate, v1::INSERT_STATUS_DUPLICATE, "");
    }
  }

  // Under the lock: the version only goes up, so checking after the rate
  // limiter's wait refuses no more than checking before it would. The
  // trainer makes version v + 1 downloadable before it tells the buffer, so
  // tokens of v + 1 can legitimately arrive first; nothing newer can.
  const int64_t policy_version = gate_.policy_version();
  if (const int64_t newest = policy_version + 1; stored->max_policy_version() > newest) {
    return refuse(InsertStatus::kInvalid, v1::INSERT_STATUS_INVALID,
                  std::string(CheckVersionsNotAhead(*stored, newest).message()));
  }
  if (const int64_t staleness = policy_version - StalenessVersion(item);
      staleness > max_staleness_) {
    return refuse(
        InsertStatus::kRejectedStale, v1::INSERT_STATUS_REJECTED_STALE,
        absl::StrCat("group is ", staleness, " versions stale (policy version ", policy_version,
                     staleness_bound_ == v1::STALENESS_BOUND_TOKEN ? ", max_policy_version "
                                                                   : ", min_policy_version ",
                     StalenessVersion(item), ") and max_staleness is ", max_staleness_,
                     "; it can never be trained"));
  }

  // The memory budget, last: a group refused for any other reason must not
  // be told to come back. Charged now, so that concurrent inserts into other
  // tables cannot take the same bytes.
  const bool charged = options_.memory != nullptr;
  if (charged && !options_.memory->TryCharge(item.size_bytes)) {
    return retryable(absl::StrCat(
        "over the memory budget: storing this group (", run::FormatBytes(item.size_bytes),
        ") would take the replay buffer past its ",
        run::FormatBytes(options_.memory->budget_bytes()), " budget (",
        run::FormatBytes(options_.memory->used_bytes()),
        " held); space comes back as the trainer samples"));
  }
  const int64_t sequence = next_sequence_;
  const absl::Time inserted_at = options_.clock();
  v1::storage::WalRecord record;
  v1::storage::GroupStored& stored_record = *record.mutable_stored();
  stored_record.set_sequence(sequence);
  stored_record.set_priority(PriorityForLocked(*stored));
  stored_record.set_inserted_at_micros(absl::ToUnixMicros(inserted_at));
  if (gate_.HasLease(lease_id)) stored_record.set_consumed_lease_id(lease_id);
  absl::StatusOr<uint64_t> lsn = JournalLocked(record, std::move(prefix));
  if (!lsn.ok()) {
    if (charged) options_.memory->Release(item.size_bytes);
    return retryable(std::string(lsn.status().message()));
  }

  stored->set_buffer_sequence(sequence);
  SetTimestamp(inserted_at, stored->mutable_inserted_at());
  item.priority = stored_record.priority();
  ApplyStoredLocked(stored, std::move(item), sequence, stored_record.consumed_lease_id(),
                    charged);
  result.status = InsertStatus::kStored;
  result.buffer_sequence = sequence;
  result.lsn = *lsn;
  return result;
}

bool RunTable::CanInsertOrShutdown() const {
  return shutdown_ || rate_limiter_.CanInsert(static_cast<int64_t>(items_.size()));
}

void RunTable::ApplyStoredLocked(std::shared_ptr<const v1::Group> group, Item item,
                                 int64_t sequence, const std::string& consumed_lease_id,
                                 bool charged) {
  gate_.Release(consumed_lease_id);  // running - 1 when live; stored either way
  gate_.OnAccepted();
  ++inserted_groups_;
  if (group->has_priority()) max_client_priority_ = std::max(max_client_priority_, group->priority());
  stored_keys_.emplace(group->idempotency_key(), sequence);
  held_group_ids_[group->group_id()] = sequence;
  next_sequence_ = std::max(next_sequence_, sequence + 1);
  item.group = std::move(group);
  AddItemLocked(sequence, std::move(item), charged);
  rate_limiter_.OnInsert();
  EnforceCapacityLocked();
}

void RunTable::ApplyRefusedLocked(v1::InsertStatus status, const std::string& lease_id) {
  gate_.Release(lease_id);
  switch (status) {
    case v1::INSERT_STATUS_DUPLICATE:
      ++duplicate_inserts_;
      break;
    case v1::INSERT_STATUS_REJECTED_STALE:
      ++rejected_stale_inserts_;
      break;
    default:
      ++invalid_inserts_;
      break;
  }
}

void RunTable::DropUntrainedLocked() {
  gate_.OnDroppedUntrained();  // gives its capacity back to the gate
  rate_limiter_.OnDroppedUntrained();
}

void RunTable::EnforceCapacityLocked() {
  const int64_t capacity = config_.buffer.capacity_groups();
  if (capacity <= 0) return;
  while (static_cast<int64_t>(items_.size()) > capacity) {
    RemoveItemLocked(items_.begin()->first, EvictionReason::kCapacity);
    DropUntrainedLocked();  // dropped untrained, like a stale group
  }
}

void RunTable::AddItemLocked(int64_t sequence, Item item, bool charged) {
  if (steps_.Retains(sequence)) {
    // Back from a recorded step's keeping (a returned batch): its bytes
    // stayed charged.
    retained_only_bytes_ -= item.size_bytes;
  } else if (!charged && options_.memory != nullptr) {
    options_.memory->Charge(item.size_bytes);
  }
  by_staleness_version_.emplace(StalenessVersion(item), sequence);
  sampler_->Insert(sequence, SamplerPriority(sampler_->kind(), item));
  size_trajectories_ += item.trajectories;
  size_bytes_ += item.size_bytes;
  held_group_ids_[item.group->group_id()] = sequence;
  if (item.uniform_rewards) uniform_items_.insert(sequence);
  items_.emplace(sequence, std::move(item));
  ++buffer_version_;
}

void RunTable::RemoveItemLocked(int64_t sequence, EvictionReason reason) {
  auto it = items_.find(sequence);
  if (it == items_.end()) return;
  by_staleness_version_.erase({StalenessVersion(it->second), sequence});
  sampler_->Delete(sequence);
  size_trajectories_ -= it->second.trajectories;
  size_bytes_ -= it->second.size_bytes;
  if (steps_.Retains(sequence)) {
    retained_only_bytes_ += it->second.size_bytes;  // a recorded step keeps it
  } else if (options_.memory != nullptr) {
    options_.memory->Release(it->second.size_bytes);
  }
  if (auto held = held_group_ids_.find(it->second.group->group_id());
      held != held_group_ids_.end() && held->second == sequence) {
    held_group_ids_.erase(held);
  }
  uniform_items_.erase(sequence);
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
    case EvictionReason::kUniformReward:
      ++evictions_.uniform_reward;
      break;
  }
  ++buffer_version_;
}

// ---------------------------------------------------------------------------
// The admission gate (admission_gate.h decides; here it is journaled and
// waited on)
// ---------------------------------------------------------------------------

bool RunTable::CanGrantOrShutdown() const { return shutdown_ || gate_.capacity() > 0; }

absl::Status RunTable::ReleaseLeasesLocked(const std::vector<std::string>& lease_ids) {
  if (lease_ids.empty()) return absl::OkStatus();
  v1::storage::WalRecord record;
  for (const std::string& id : lease_ids) record.mutable_leases_released()->add_lease_ids(id);
  RETURN_IF_ERROR(JournalLocked(record).status());
  for (const std::string& id : lease_ids) gate_.Release(id);
  return absl::OkStatus();
}

absl::StatusOr<AcquireResult> RunTable::AcquireSlots(const AcquireRequest& request) {
  RETURN_IF_ERROR(AdmissionGate::CheckRequest(request));
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + request.wait_timeout;

  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError(kRunTableShuttingDown);
  RETURN_IF_ERROR(gate_.CheckNotQuarantined(request.worker_id, request.caller));
  gate_.ExpireLeases();

  ASSIGN_OR_RETURN(const bool new_incarnation,
                   gate_.IsNewIncarnation(request.worker_id, request.worker_incarnation));
  if (new_incarnation) {
    // First call or a restart: recorded (and the older leases dropped) now.
    v1::storage::WalRecord record;
    record.mutable_leases_granted()->set_worker_id(request.worker_id);
    record.mutable_leases_granted()->set_worker_incarnation(request.worker_incarnation);
    RETURN_IF_ERROR(JournalLocked(record).status());
    gate_.Grant(record.leases_granted(), absl::InfinitePast());
  }

  AcquireResult result;
  // Renewing before a wait keeps the leases alive through it; renewing again
  // after makes lease_expires_at true for all of them.
  gate_.Renew(request.worker_id, request.renew_lease_ids, &result.expired_lease_ids);

  if (request.num_groups > 0 && gate_.capacity() <= 0 &&
      request.wait_timeout > absl::ZeroDuration()) {
    while (!shutdown_) {
      gate_.ExpireLeases();
      if (gate_.capacity() > 0 || absl::Now() >= deadline) break;
      // Wakes on anything that frees capacity; expiries are timed, not signalled.
      mu_.AwaitWithDeadline(absl::Condition(this, &RunTable::CanGrantOrShutdown),
                            std::min(deadline, gate_.NextExpiryRealTime()));
    }
    result.waited = absl::Now() - start;
    admission_blocked_ += result.waited;
    if (shutdown_) return absl::UnavailableError(kRunTableShuttingDown);
    gate_.Renew(request.worker_id, request.renew_lease_ids, nullptr);
  }

  const int64_t granted =
      std::min<int64_t>(request.num_groups, std::max<int64_t>(0, gate_.capacity()));
  const absl::Time expires_at = gate_.FreshExpiry();
  if (granted > 0) {
    v1::storage::WalRecord record;
    v1::storage::LeasesGranted& leases = *record.mutable_leases_granted();
    leases.set_worker_id(request.worker_id);
    leases.set_worker_incarnation(request.worker_incarnation);
    for (std::string& id : gate_.NextLeaseIds(granted)) leases.add_lease_ids(std::move(id));
    RETURN_IF_ERROR(JournalLocked(record).status());
    gate_.Grant(leases, expires_at);
    result.lease_ids.assign(leases.lease_ids().begin(), leases.lease_ids().end());
  }
  result.lease_expires_at = expires_at;
  result.lease_ttl = options_.lease_ttl;
  result.gate = gate_.state();
  return result;
}

ReleaseResult RunTable::ReleaseSlots(const ReleaseRequest& request) {
  absl::MutexLock lock(&mu_);
  gate_.ExpireLeases();
  const std::vector<std::string> ids = gate_.LeasesToRelease(request);
  ReleaseResult result;
  // A journal failure keeps the leases; they expire by TTL.
  if (ReleaseLeasesLocked(ids).ok()) result.released = static_cast<int32_t>(ids.size());
  result.running = gate_.running();
  return result;
}

std::vector<std::string> RunTable::QuarantineConnections(
    const std::vector<std::string>& connections) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> added;
  for (const std::string& connection : connections) {
    if (gate_.QuarantineConnection(connection)) added.push_back(connection);
  }
  return added;
}

absl::StatusOr<std::vector<std::string>> RunTable::QuarantineWorkers(
    const std::vector<std::string>& worker_ids) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> added = gate_.NotQuarantined(worker_ids);
  if (added.empty()) return added;
  v1::storage::WalRecord record;
  for (const std::string& id : added) record.mutable_quarantined()->add_worker_ids(id);
  RETURN_IF_ERROR(JournalLocked(record).status());
  gate_.QuarantineWorkers(record.quarantined());
  return added;
}

std::vector<std::string> RunTable::QuarantinedWorkers() const {
  absl::MutexLock lock(&mu_);
  return std::vector<std::string>(gate_.quarantined_workers().begin(),
                                  gate_.quarantined_workers().end());
}

// ---------------------------------------------------------------------------
// Stats (snapshots and journal replay: run_table_durability.cc)
// ---------------------------------------------------------------------------

RunStats RunTable::Stats() {
  absl::MutexLock lock(&mu_);
  gate_.ExpireLeases();
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
  stats.rate_limiter_insert_blocked = insert_blocked_;
  stats.rate_limiter_sample_blocked = sample_blocked_;
  stats.rate_limiter_inserts = rate_limiter_.inserts();
  stats.rate_limiter_samples = rate_limiter_.samples();
  stats.evictions = evictions_;
  stats.sampled_group_staleness = sampled_group_staleness_;
  stats.sampled_token_staleness = sampled_token_staleness_;
  stats.gate = gate_.state();
  stats.admission_blocked = admission_blocked_;
  stats.buffer_version = buffer_version_;
  stats.config = config_;
  stats.retained_groups = steps_.retained_groups();
  stats.retained_bytes = retained_only_bytes_;
  stats.committed_step = steps_.committed_step();
  stats.last_recorded_step = steps_.last_recorded_step();
  stats.replayed_batches = replayed_batches_;
  return stats;
}

void RunTable::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;  // every Await condition includes it
}

}  // namespace sluice::replay_buffer
