// The run table's policy versions, stale and uniform-reward eviction,
// sampling, recorded steps and priorities (run_table.h says the rules).
#include "replay_buffer/run_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace sluice::replay_buffer {

// ---------------------------------------------------------------------------
// Versions, eviction, sampling
// ---------------------------------------------------------------------------

bool RunTable::HasStaleLocked(int64_t reference_version, int64_t max_staleness) const {
  return !by_staleness_version_.empty() &&
         reference_version - by_staleness_version_.begin()->first > max_staleness;
}

int64_t RunTable::EvictStaleLocked(int64_t reference_version, int64_t max_staleness) {
  int64_t evicted = 0;
  while (HasStaleLocked(reference_version, max_staleness)) {
    RemoveItemLocked(by_staleness_version_.begin()->second, EvictionReason::kStale);
    DropUntrainedLocked();
    ++evicted;
  }
  return evicted;
}

absl::StatusOr<int64_t> RunTable::EvictUniformLocked() {
  if (uniform_items_.empty()) return 0;
  const std::vector<int64_t> sequences(uniform_items_.begin(), uniform_items_.end());
  v1::storage::WalRecord record;
  record.mutable_uniform_evicted()->mutable_sequences()->Add(sequences.begin(), sequences.end());
  RETURN_IF_ERROR(JournalLocked(record).status());
  ApplyUniformEvictedLocked(sequences);
  return static_cast<int64_t>(sequences.size());
}

void RunTable::ApplyUniformEvictedLocked(const std::vector<int64_t>& sequences) {
  for (const int64_t sequence : sequences) {
    RemoveItemLocked(sequence, EvictionReason::kUniformReward);
    DropUntrainedLocked();  // generation replaces it, as it does a stale group
  }
}

int64_t RunTable::ApplyVersionLocked(int64_t policy_version) {
  if (!gate_.AdvanceVersion(policy_version)) return 0;
  return EvictStaleLocked(policy_version, max_staleness_);
}

absl::StatusOr<int64_t> RunTable::AdvanceVersionLocked(int64_t policy_version) {
  if (policy_version <= gate_.policy_version()) return 0;
  v1::storage::WalRecord record;
  record.mutable_version()->set_policy_version(policy_version);
  RETURN_IF_ERROR(JournalLocked(record).status());
  return ApplyVersionLocked(policy_version);
}

absl::StatusOr<UpdateVersionResult> RunTable::UpdatePolicyVersion(int64_t policy_version) {
  if (policy_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy_version: must be >= 0, got ", policy_version));
  }
  absl::MutexLock lock(&mu_);
  UpdateVersionResult result;
  ASSIGN_OR_RETURN(result.evicted_stale_groups, AdvanceVersionLocked(policy_version));
  result.policy_version = gate_.policy_version();
  result.admission_limit = gate_.admission_limit();
  return result;
}

bool RunTable::CanSampleOrShutdown(SampleWait* wait) {
  const RunTable& table = *wait->table;
  const int64_t held =
      static_cast<int64_t>(table.items_.size()) -
      (wait->informative_only ? static_cast<int64_t>(table.uniform_items_.size()) : 0);
  return table.shutdown_ || (table.rate_limiter_.HasEnough(held, wait->needed) &&
                             table.rate_limiter_.RatioAllowsSample(wait->needed));
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
  if (!v1::SamplerKind_IsValid(request.sampler_override)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler_override: unknown sampler kind ", static_cast<int>(request.sampler_override)));
  }
  if (request.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: must be >= 0 (0 = none), got ", request.step));
  }
  const absl::Time deadline = absl::Now() + request.timeout;
  const int64_t batch =
      request.batch_size_groups > 0 ? request.batch_size_groups : batch_size_groups_;
  const int64_t max_staleness =
      std::min<int64_t>(request.max_staleness.value_or(max_staleness_), max_staleness_);
  const int64_t trainer_version = request.trainer_policy_version;

  absl::MutexLock lock(&mu_);
  if (request.sampler_override != v1::SAMPLER_KIND_UNSPECIFIED &&
      request.sampler_override != sampler_->kind()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampler_override: run ", run_id_, " samples with ",
        v1::SamplerKind_Name(sampler_->kind()), "; a per-request ",
        v1::SamplerKind_Name(request.sampler_override),
        " is not supported (set buffer.sampler in the run's configuration)"));
  }
  if (request.step > 0) {
    ASSIGN_OR_RETURN(std::optional<SampleResult> recorded, RecordedStepLocked(request.step));
    if (recorded.has_value()) return *std::move(recorded);
  }
  SampleResult result;
  result.policy_version = trainer_version;
  result.step = request.step;
  ASSIGN_OR_RETURN(result.evicted_stale_groups, AdvanceVersionLocked(trainer_version));
  SampleWait wait{this, batch, request.drop_uniform_reward_groups};
  bool waited = false;
  while (true) {
    if (shutdown_) return absl::UnavailableError(kRunTableShuttingDown);
    if (request.step > 0 && waited) {
      // Another Sample of the same step (a retry on a new stream) may have
      // recorded it while this one waited.
      ASSIGN_OR_RETURN(std::optional<SampleResult> recorded, RecordedStepLocked(request.step));
      if (recorded.has_value()) return *std::move(recorded);
    }
    if (HasStaleLocked(trainer_version, max_staleness)) {
      v1::storage::WalRecord record;
      record.mutable_stale_evicted()->set_reference_version(trainer_version);
      record.mutable_stale_evicted()->set_max_staleness(max_staleness);
      RETURN_IF_ERROR(JournalLocked(record).status());
      result.evicted_stale_groups += EvictStaleLocked(trainer_version, max_staleness);
    }
    if (request.drop_uniform_reward_groups) {
      ASSIGN_OR_RETURN(const int64_t dropped, EvictUniformLocked());
      result.uniform_reward_groups_dropped += dropped;
    }
    const bool enough = rate_limiter_.HasEnough(static_cast<int64_t>(items_.size()), batch);
    const bool ratio = rate_limiter_.RatioAllowsSample(batch);
    if (enough && ratio) break;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      if (!enough) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no batch within ", absl::FormatDuration(request.timeout), ": ", items_.size(),
            " groups held, a batch needs ",
            rate_limiter_.NeededFor(batch),
            " (max of batch size and min_size_to_sample_groups)"));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "no batch within ", absl::FormatDuration(request.timeout),
          ": the rate limiter (samples_per_insert ", rate_limiter_.options().samples_per_insert,
          ", tolerance ", rate_limiter_.options().tolerance, ") waits for inserts (",
          rate_limiter_.inserts(), " inserted, ", rate_limiter_.samples(), " sampled)"));
    }
    mu_.AwaitWithDeadline(absl::Condition(&RunTable::CanSampleOrShutdown, &wait), deadline);
    waited = true;
    if (enough && !ratio) sample_blocked_ += absl::Now() - now;
  }

  std::vector<int64_t> sequences = sampler_->Select(batch);
  v1::storage::WalRecord record;
  record.mutable_sampled()->set_trainer_policy_version(trainer_version);
  record.mutable_sampled()->mutable_sequences()->Add(sequences.begin(), sequences.end());
  record.mutable_sampled()->set_step(request.step);
  RETURN_IF_ERROR(JournalLocked(record).status());
  ApplySampledLocked(trainer_version, sequences, request.step, &result);
  result.buffer_version = buffer_version_;
  return result;
}

absl::StatusOr<std::optional<SampleResult>> RunTable::RecordedStepLocked(int64_t step) {
  switch (steps_.Locate(step)) {
    case StepBatches::Position::kNext:
      return std::nullopt;
    case StepBatches::Position::kGone:
      return absl::FailedPreconditionError(absl::StrCat(
          "step: step ", step, " of run ", run_id_,
          " was committed (the trainer's checkpoint covers every step up to ",
          steps_.committed_step(),
          ") and its batch let go; a trainer resumed from a checkpoint asks for the steps "
          "after it"));
    case StepBatches::Position::kAhead:
      return absl::FailedPreconditionError(absl::StrCat(
          "step: step ", step, " of run ", run_id_, " is ahead of the next step to sample, ",
          steps_.next_step(), " (last recorded ", steps_.last_recorded_step(), ", committed ",
          steps_.committed_step(), "); steps are sampled in order"));
    case StepBatches::Position::kRecorded:
      break;
  }
  const StepBatches::Batch& batch = *steps_.Find(step);
  SampleResult result;
  result.step = step;
  result.replayed = true;
  result.policy_version = batch.trainer_policy_version;
  result.buffer_version = batch.buffer_version;
  result.groups.reserve(batch.entries.size());
  for (const StepBatches::Entry& entry : batch.entries) {
    const StepBatches::RetainedGroup* kept = steps_.Retained(entry.sequence);
    result.groups.push_back(
        SampledGroup{.group = kept->group,
                     .times_sampled = entry.times_sampled,
                     .staleness = batch.trainer_policy_version - kept->group->min_policy_version(),
                     .removed = entry.removed});
  }
  ++replayed_batches_;
  return result;
}

absl::StatusOr<CommitResult> RunTable::CommitTrainedSteps(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step: must be >= 0, got ", step));
  }
  absl::MutexLock lock(&mu_);
  CommitResult result;
  if (step > steps_.committed_step()) {
    v1::storage::WalRecord record;
    record.mutable_committed()->set_step(step);
    RETURN_IF_ERROR(JournalLocked(record).status());
    result.released_groups = ApplyCommittedLocked(step);
  }
  result.committed_step = steps_.committed_step();
  return result;
}

int64_t RunTable::ApplyCommittedLocked(int64_t step) {
  const std::vector<std::pair<int64_t, StepBatches::RetainedGroup>> released = steps_.Commit(step);
  for (const auto& [sequence, kept] : released) {
    if (items_.contains(sequence)) continue;  // still sampleable: items_ keeps the charge
    retained_only_bytes_ -= kept.size_bytes;
    if (options_.memory != nullptr) options_.memory->Release(kept.size_bytes);
  }
  return static_cast<int64_t>(released.size());
}

void RunTable::ApplySampledLocked(int64_t trainer_version, const std::vector<int64_t>& sequences,
                                  int64_t step, SampleResult* result) {
  const int32_t max_times_sampled = config_.max_times_sampled();
  result->groups.reserve(sequences.size());
  StepBatches::Batch recorded;
  recorded.trainer_policy_version = trainer_version;
  for (const int64_t sequence : sequences) {
    auto it = items_.find(sequence);
    if (it == items_.end()) continue;  // ApplyRecord checks before calling
    Item& item = it->second;
    ++item.times_sampled;
    RecordSampleLocked(item, trainer_version, +1);
    SampledGroup sampled{.group = item.group,
                         .times_sampled = item.times_sampled,
                         .staleness = trainer_version - item.min_policy_version,
                         .removed = item.times_sampled >= max_times_sampled};
    if (step > 0) {
      // Kept before it may leave items_, so that its bytes stay charged.
      steps_.Keep(sequence, item.group, item.size_bytes);
      recorded.entries.push_back(
          {.sequence = sequence, .times_sampled = sampled.times_sampled, .removed = sampled.removed});
    }
    if (sampled.removed) RemoveItemLocked(sequence, EvictionReason::kMaxTimesSampled);
    result->groups.push_back(std::move(sampled));
  }
  rate_limiter_.OnSample(static_cast<int64_t>(sequences.size()));
  ++buffer_version_;
  if (step > 0) {
    recorded.buffer_version = buffer_version_;
    steps_.Add(step, std::move(recorded));
  }
}

void RunTable::ReturnUndelivered(const SampleResult& batch) {
  // A step's batch stays recorded: the trainer's next Sample of the step
  // (on a new stream, or after a restart) is answered with it.
  if (batch.step > 0) return;
  std::vector<Item> items;
  items.reserve(batch.groups.size());
  v1::storage::WalRecord record;
  v1::storage::BatchReturned& returned = *record.mutable_returned();
  returned.set_policy_version(batch.policy_version);
  for (const SampledGroup& sampled : batch.groups) {
    items.push_back(MakeItem(sampled.group));
    v1::storage::BatchReturned::Returned& entry = *returned.add_groups();
    entry.set_sequence(sampled.group->buffer_sequence());
    entry.set_times_sampled(sampled.times_sampled);
    entry.set_removed(sampled.removed);
    if (options_.journal != nullptr) *entry.mutable_group() = *sampled.group;
  }
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < returned.groups_size(); ++i) {
    auto it = items_.find(returned.groups(i).sequence());
    returned.mutable_groups(i)->set_priority(it != items_.end()
                                                 ? it->second.priority
                                                 : PriorityForLocked(*batch.groups[i].group));
  }
  // Applied even when the journal fails: the batch is in memory either way,
  // and the failed journal refuses every later mutation.
  (void)JournalLocked(record);
  ApplyReturnedLocked(returned, &items);
}

void RunTable::ApplyReturnedLocked(const v1::storage::BatchReturned& returned,
                                   std::vector<Item>* items) {
  for (int i = 0; i < returned.groups_size(); ++i) {
    const auto& entry = returned.groups(i);
    Item& item = (*items)[i];
    RecordSampleLocked(item, returned.policy_version(), -1);
    rate_limiter_.OnReturned(1);
    if (entry.removed()) {
      if (items_.contains(entry.sequence())) continue;
      --evictions_.max_times_sampled;
      item.times_sampled = entry.times_sampled() - 1;
      item.priority = entry.priority();
      AddItemLocked(entry.sequence(), std::move(item));
    } else if (auto it = items_.find(entry.sequence()); it != items_.end()) {
      it->second.times_sampled = std::max(0, it->second.times_sampled - 1);
    }
  }
  ++buffer_version_;
}

absl::StatusOr<UpdatePrioritiesResult> RunTable::UpdatePriorities(
    const std::vector<std::pair<std::string, double>>& priorities) {
  for (const auto& [group_id, priority] : priorities) {
    if (!std::isfinite(priority) || priority < 0) {
      return absl::InvalidArgumentError(absl::StrCat("priorities[", group_id,
                                                     "]: must be finite and >= 0, got ",
                                                     priority, "; nothing was updated"));
    }
  }
  absl::MutexLock lock(&mu_);
  UpdatePrioritiesResult result;
  v1::storage::WalRecord record;
  auto& by_sequence = *record.mutable_priorities()->mutable_priorities();
  for (const auto& [group_id, priority] : priorities) {
    auto it = held_group_ids_.find(group_id);
    if (it == held_group_ids_.end()) {
      result.not_found_group_ids.push_back(group_id);
      continue;
    }
    by_sequence[it->second] = priority;
  }
  if (!by_sequence.empty()) {
    RETURN_IF_ERROR(JournalLocked(record).status());
    ApplyPrioritiesLocked(record.priorities());
  }
  result.updated = static_cast<int32_t>(by_sequence.size());
  return result;
}

void RunTable::ApplyPrioritiesLocked(const v1::storage::PrioritiesUpdated& priorities) {
  for (const auto& [sequence, priority] : priorities.priorities()) {
    auto it = items_.find(sequence);
    if (it == items_.end()) continue;
    it->second.priority = priority;
    sampler_->Update(sequence, priority);
    max_client_priority_ = std::max(max_client_priority_, priority);
  }
}

}  // namespace sluice::replay_buffer
