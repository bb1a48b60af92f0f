// RunTable's durability half: its state as snapshot records, a table rebuilt
// from a snapshot, and journal records applied on restore (the live
// mutations are in run_table.cc and run_table_sampling.cc).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/time_util.h"
#include "replay_buffer/run_table.h"

namespace sluice::replay_buffer {

namespace {

void HistogramToProto(const StalenessHistogram& histogram, v1::StalenessHistogram* proto) {
  proto->mutable_bucket_upper_bounds()->Add(histogram.bucket_upper_bounds().begin(),
                                            histogram.bucket_upper_bounds().end());
  proto->mutable_counts()->Add(histogram.counts().begin(), histogram.counts().end());
  proto->set_sum(histogram.sum());
}

bool HistogramFromProto(const v1::StalenessHistogram& proto, StalenessHistogram* histogram) {
  if (proto.counts_size() == 0) return true;  // nothing recorded
  return histogram->Restore({proto.bucket_upper_bounds().begin(), proto.bucket_upper_bounds().end()},
                            {proto.counts().begin(), proto.counts().end()}, proto.sum());
}

}  // namespace

RunTable::SnapshotData RunTable::Snapshot() {
  SnapshotData data;
  absl::MutexLock lock(&mu_);
  gate_.ExpireLeases();
  v1::storage::TableSnapshot& table = data.table;
  *table.mutable_config() = RunConfigToProto(config_);
  table.set_covered_lsn(last_lsn_);
  gate_.ToSnapshot(&table);
  table.set_next_sequence(next_sequence_);
  table.set_buffer_version(buffer_version_);
  table.set_items(static_cast<int64_t>(items_.size()));
  table.set_inserted_groups(inserted_groups_);
  table.set_duplicate_inserts(duplicate_inserts_);
  table.set_rejected_stale_inserts(rejected_stale_inserts_);
  table.set_invalid_inserts(invalid_inserts_);
  table.set_retryable_insert_errors(retryable_insert_errors_);
  table.set_sampled_groups(sampled_groups_);
  table.set_evicted_stale(evictions_.stale);
  table.set_evicted_max_times_sampled(evictions_.max_times_sampled);
  table.set_evicted_capacity(evictions_.capacity);
  table.set_evicted_uniform_reward(evictions_.uniform_reward);
  HistogramToProto(sampled_group_staleness_, table.mutable_sampled_group_staleness());
  HistogramToProto(sampled_token_staleness_, table.mutable_sampled_token_staleness());
  table.set_rate_limiter_inserts(rate_limiter_.inserts());
  table.set_rate_limiter_samples(rate_limiter_.samples());
  table.set_max_client_priority(max_client_priority_);
  for (const auto& [key, sequence] : stored_keys_) (*table.mutable_stored_keys())[key] = sequence;
  data.items.reserve(items_.size());
  for (const auto& [sequence, item] : items_) {
    data.items.push_back({item.group, item.times_sampled, item.priority});
  }
  steps_.ToSnapshot(&table);
  std::vector<int64_t> retained_only;
  for (const auto& [sequence, kept] : steps_.retained()) {
    if (!items_.contains(sequence)) retained_only.push_back(sequence);
  }
  std::sort(retained_only.begin(), retained_only.end());
  for (const int64_t sequence : retained_only) {
    data.items.push_back({.group = steps_.Retained(sequence)->group, .retained_only = true});
  }
  table.set_retained_items(static_cast<int64_t>(retained_only.size()));
  return data;
}

absl::StatusOr<std::unique_ptr<RunTable>> RunTable::Restore(
    const v1::storage::TableSnapshot& snapshot, std::vector<v1::storage::SnapshotItem> items,
    RunTableOptions options) {
  const RunConfig config = RunConfigFromProto(snapshot.config());
  const std::string where = absl::StrCat("snapshot of run ", config.run_id, ": ");
  if (static_cast<int64_t>(items.size()) != snapshot.items() + snapshot.retained_items()) {
    return absl::DataLossError(absl::StrCat(where, "expected ", snapshot.items(), " + ",
                                            snapshot.retained_items(), " groups, found ",
                                            items.size()));
  }
  absl::StatusOr<std::unique_ptr<RunTable>> created =
      Create(config, options, std::max<uint64_t>(1, snapshot.covered_lsn()));
  if (!created.ok()) {
    return absl::DataLossError(absl::StrCat(where, created.status().message()));
  }
  std::unique_ptr<RunTable> table = std::move(created).value();
  RunTable& t = *table;
  absl::MutexLock lock(&t.mu_);
  t.last_lsn_ = snapshot.covered_lsn();
  t.gate_.RestoreFromSnapshot(snapshot);
  t.inserted_groups_ = snapshot.inserted_groups();
  t.duplicate_inserts_ = snapshot.duplicate_inserts();
  t.rejected_stale_inserts_ = snapshot.rejected_stale_inserts();
  t.invalid_inserts_ = snapshot.invalid_inserts();
  t.retryable_insert_errors_ = snapshot.retryable_insert_errors();
  t.sampled_groups_ = snapshot.sampled_groups();
  t.evictions_ = EvictionCounts{.stale = snapshot.evicted_stale(),
                                .max_times_sampled = snapshot.evicted_max_times_sampled(),
                                .capacity = snapshot.evicted_capacity(),
                                .uniform_reward = snapshot.evicted_uniform_reward()};
  if (!HistogramFromProto(snapshot.sampled_group_staleness(), &t.sampled_group_staleness_) ||
      !HistogramFromProto(snapshot.sampled_token_staleness(), &t.sampled_token_staleness_)) {
    return absl::DataLossError(absl::StrCat(where, "staleness histograms have other buckets"));
  }
  t.rate_limiter_.Restore(snapshot.rate_limiter_inserts(), snapshot.rate_limiter_samples());
  t.max_client_priority_ = snapshot.max_client_priority();
  for (const auto& [key, sequence] : snapshot.stored_keys()) t.stored_keys_[key] = sequence;
  // Each kind ascending: the held groups, then those kept only for
  // recorded steps (by sequence).
  int64_t previous_held = 0;
  int64_t previous_retained = 0;
  absl::flat_hash_map<int64_t, Item> retained_only;
  for (v1::storage::SnapshotItem& entry : items) {
    auto group = std::make_shared<v1::Group>(std::move(*entry.mutable_group()));
    const int64_t sequence = group->buffer_sequence();
    int64_t& previous = entry.retained_only() ? previous_retained : previous_held;
    if (sequence <= previous || sequence >= snapshot.next_sequence()) {
      return absl::DataLossError(absl::StrCat(where, "group ", group->group_id(),
                                              " has buffer_sequence ", sequence,
                                              " out of order or past next_sequence"));
    }
    previous = sequence;
    Item item = MakeItem(group);
    if (entry.retained_only()) {
      retained_only.emplace(sequence, std::move(item));
      continue;
    }
    item.times_sampled = entry.times_sampled();
    item.priority = entry.priority();
    t.AddItemLocked(sequence, std::move(item));
  }
  t.next_sequence_ = snapshot.next_sequence();
  t.buffer_version_ = snapshot.buffer_version();
  // The recorded steps, after the held items (whose bytes those already
  // charged), then the bytes of the groups only they keep.
  t.steps_.RestorePosition(snapshot.committed_step(), snapshot.last_recorded_step());
  for (const v1::storage::RecordedStep& step : snapshot.recorded_steps()) {
    StepBatches::Batch batch;
    batch.trainer_policy_version = step.trainer_policy_version();
    batch.buffer_version = step.buffer_version();
    for (const v1::storage::RecordedStep::Entry& entry : step.entries()) {
      const Item* item = nullptr;
      if (auto held = t.items_.find(entry.sequence()); held != t.items_.end()) {
        item = &held->second;
      } else if (auto kept = retained_only.find(entry.sequence()); kept != retained_only.end()) {
        item = &kept->second;
      } else {
        return absl::DataLossError(absl::StrCat(where, "recorded step ", step.step(),
                                                " took group ", entry.sequence(),
                                                ", which the snapshot does not hold"));
      }
      t.steps_.Keep(entry.sequence(), item->group, item->size_bytes);
      batch.entries.push_back({.sequence = entry.sequence(),
                               .times_sampled = entry.times_sampled(),
                               .removed = entry.removed()});
    }
    t.steps_.Add(step.step(), std::move(batch));
  }
  for (const auto& [sequence, item] : retained_only) {
    if (!t.steps_.Retains(sequence)) {
      return absl::DataLossError(absl::StrCat(where, "group ", item.group->group_id(),
                                              " is kept for no recorded step"));
    }
    t.retained_only_bytes_ += item.size_bytes;
    if (t.options_.memory != nullptr) t.options_.memory->Charge(item.size_bytes);
  }
  return table;
}

absl::Status RunTable::ApplyRecord(uint64_t lsn, const v1::storage::WalRecord& record) {
  absl::MutexLock lock(&mu_);
  if (lsn <= last_lsn_) return absl::OkStatus();  // already in the snapshot
  const auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("write-ahead log record ", lsn, " (run ", run_id_,
                                            "): ", what));
  };
  switch (record.kind_case()) {
    case v1::storage::WalRecord::kConfigured: {
      const RunConfig config = RunConfigFromProto(record.configured());
      if (config.batch_size_groups != batch_size_groups_ ||
          config.max_staleness != max_staleness_ || config.group_size != group_size_ ||
          config.resolved_staleness_bound() != staleness_bound_) {
        return corrupt("reconfigures B, eta, G or the staleness bound");
      }
      absl::StatusOr<SamplerOptions> options = SamplerOptions::FromConfig(config.buffer, config.seed);
      if (!options.ok()) return corrupt(options.status().message());
      absl::StatusOr<std::unique_ptr<Sampler>> sampler = CreateSampler(*options);
      if (!sampler.ok()) return corrupt(sampler.status().message());
      ApplyConfigLocked(config, std::move(sampler).value());
      break;
    }
    case v1::storage::WalRecord::kStored: {
      const v1::storage::GroupStored& stored = record.stored();
      auto group = std::make_shared<v1::Group>(stored.group());
      group->set_buffer_sequence(stored.sequence());
      *group->mutable_inserted_at() =
          google::protobuf::util::TimeUtil::MicrosecondsToTimestamp(stored.inserted_at_micros());
      if (items_.contains(stored.sequence()) || stored_keys_.contains(group->idempotency_key())) {
        return corrupt(absl::StrCat("stores sequence ", stored.sequence(), " twice"));
      }
      Item item = MakeItem(group);
      item.priority = stored.priority();
      ApplyStoredLocked(group, std::move(item), stored.sequence(), stored.consumed_lease_id());
      break;
    }
    case v1::storage::WalRecord::kRefused:
      ApplyRefusedLocked(record.refused().status(), record.refused().released_lease_id());
      break;
    case v1::storage::WalRecord::kVersion:
      ApplyVersionLocked(record.version().policy_version());
      break;
    case v1::storage::WalRecord::kStaleEvicted:
      EvictStaleLocked(record.stale_evicted().reference_version(),
                       record.stale_evicted().max_staleness());
      break;
    case v1::storage::WalRecord::kUniformEvicted: {
      const std::vector<int64_t> sequences(record.uniform_evicted().sequences().begin(),
                                           record.uniform_evicted().sequences().end());
      for (const int64_t sequence : sequences) {
        if (!items_.contains(sequence)) {
          return corrupt(absl::StrCat("evicts group ", sequence, ", which is not held"));
        }
      }
      ApplyUniformEvictedLocked(sequences);
      break;
    }
    case v1::storage::WalRecord::kSampled: {
      const std::vector<int64_t> sequences(record.sampled().sequences().begin(),
                                           record.sampled().sequences().end());
      for (const int64_t sequence : sequences) {
        if (!items_.contains(sequence)) {
          return corrupt(absl::StrCat("samples group ", sequence, ", which is not held"));
        }
      }
      const int64_t step = record.sampled().step();
      if (step > 0 && steps_.Locate(step) != StepBatches::Position::kNext) {
        return corrupt(absl::StrCat("records step ", step, " out of order (next is ",
                                    steps_.next_step(), ")"));
      }
      SampleResult ignored;
      ApplySampledLocked(record.sampled().trainer_policy_version(), sequences, step, &ignored);
      break;
    }
    case v1::storage::WalRecord::kCommitted:
      ApplyCommittedLocked(record.committed().step());
      break;
    case v1::storage::WalRecord::kReturned: {
      std::vector<Item> items;
      for (const auto& entry : record.returned().groups()) {
        auto group = std::make_shared<v1::Group>(entry.group());
        items.push_back(MakeItem(std::move(group)));
      }
      ApplyReturnedLocked(record.returned(), &items);
      break;
    }
    case v1::storage::WalRecord::kLeasesGranted:
      gate_.Grant(record.leases_granted(), gate_.FreshExpiry());
      break;
    case v1::storage::WalRecord::kLeasesReleased:
      for (const std::string& id : record.leases_released().lease_ids()) gate_.Release(id);
      break;
    case v1::storage::WalRecord::kPriorities:
      ApplyPrioritiesLocked(record.priorities());
      break;
    case v1::storage::WalRecord::kQuarantined:
      gate_.QuarantineWorkers(record.quarantined());
      break;
    case v1::storage::WalRecord::KIND_NOT_SET:
      return corrupt("has no kind (written by a newer Sluice?)");
  }
  last_lsn_ = lsn;
  return absl::OkStatus();
}

}  // namespace sluice::replay_buffer
