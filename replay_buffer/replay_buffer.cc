#include "replay_buffer/replay_buffer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/run/run_memory.h"
#include "common/status_macros.h"
#include "replay_buffer/wire.h"
#include "sluice/v1/replay_buffer_storage.pb.h"

namespace sluice::replay_buffer {

namespace storage = v1::storage;

// The tables' journal: one record per mutation in the shared log.
class ReplayBuffer::WalJournal final : public Journal {
 public:
  explicit WalJournal(durability::WalWriter* wal) : wal_(wal) {}

  absl::StatusOr<uint64_t> Append(std::string payload,
                                  const storage::WalRecord& record) override {
    record.AppendToString(&payload);  // after the prefix, in place
    // Under the table's lock: write(2) only; the fsync (kAlways) happens in
    // Sync, after the lock is released, shared by concurrent inserts.
    return wal_->AppendWithoutSync(payload);
  }

  absl::Status Sync(uint64_t lsn) override { return wal_->SyncUpTo(lsn); }

 private:
  durability::WalWriter* const wal_;
};

absl::Status DurabilityOptions::Validate() const {
  if (data_dir.empty()) return absl::OkStatus();
  std::vector<std::string> problems;
  if (fsync_interval <= absl::ZeroDuration()) {
    problems.push_back(absl::StrCat("fsync_interval_ms: must be > 0, got ",
                                    absl::ToInt64Milliseconds(fsync_interval)));
  }
  if (snapshot_interval < absl::ZeroDuration()) {
    problems.push_back(absl::StrCat("snapshot_interval_s: must be >= 0 (0 = by size only), got ",
                                    absl::ToInt64Seconds(snapshot_interval)));
  }
  if (snapshot_wal_bytes == 0) problems.push_back("snapshot_wal_bytes: must be > 0");
  if (data_dir_lock_wait < absl::ZeroDuration()) {
    problems.push_back(absl::StrCat("data_dir_lock_wait_ms: must be >= 0, got ",
                                    absl::ToInt64Milliseconds(data_dir_lock_wait)));
  }
  if (write_retry_interval <= absl::ZeroDuration()) {
    problems.push_back(absl::StrCat("write_retry_interval: must be > 0, got ",
                                    absl::FormatDuration(write_retry_interval)));
  }
  if (write_warning_interval <= absl::ZeroDuration()) {
    problems.push_back(absl::StrCat("write_warning_interval: must be > 0, got ",
                                    absl::FormatDuration(write_warning_interval)));
  }
  if (keep_snapshots < 1) {
    problems.push_back(absl::StrCat("keep_snapshots: must be >= 1, got ", keep_snapshots));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

absl::StatusOr<std::unique_ptr<ReplayBuffer>> ReplayBuffer::Create(RunTableOptions options,
                                                                   DurabilityOptions durability) {
  RETURN_IF_ERROR(options.Validate());
  RETURN_IF_ERROR(durability.Validate());
  if (options.memory == nullptr) options.memory = std::make_shared<MemoryAccount>(0);
  std::unique_ptr<ReplayBuffer> buffer(new ReplayBuffer(std::move(options), std::move(durability)));
  if (!buffer->durability_.data_dir.empty()) {
    RETURN_IF_ERROR(buffer->Restore());
    buffer->snapshot_thread_ = std::thread([raw = buffer.get()] { raw->SnapshotLoop(); });
  }
  return buffer;
}

ReplayBuffer::~ReplayBuffer() { Shutdown(); }

absl::Status ReplayBuffer::Restore() {
  const absl::Time start = absl::Now();
  const std::string& dir = durability_.data_dir;
  durability::WalOptions wal_options;
  wal_options.fsync_policy = durability_.fsync_policy;
  wal_options.fsync_interval = durability_.fsync_interval;
  wal_options.fsync_observer = durability_.on_fsync;
  wal_options.lock_wait = durability_.data_dir_lock_wait;
  wal_options.lock_wait_observer = [dir, wait = durability_.data_dir_lock_wait](
                                       const std::string& holder) {
    log::Warning("another process holds the data directory (a replay buffer still shutting "
                 "down after kill -9, or a second one on the same directory); waiting for it",
                 {{"data_dir", dir},
                  {"holder", holder.empty() ? "unknown" : holder},
                  {"max_wait_ms", absl::ToInt64Milliseconds(wait)}});
  };
  const std::string wal_dir = absl::StrCat(dir, "/wal");
  // The log's lock first: it makes this process the directory's only user
  // before anything in it is touched (SnapshotStore::Open deletes unfinished
  // snapshots, which would be a live buffer's snapshot in progress).
  ASSIGN_OR_RETURN(wal_, durability::WalWriter::Open(wal_dir, wal_options));
  ASSIGN_OR_RETURN(snapshots_, durability::SnapshotStore::Open(absl::StrCat(dir, "/snapshots"),
                                                               durability_.keep_snapshots));
  options_.journal = std::make_shared<WalJournal>(wal_.get());

  RestoreReport& report = restore_report_;
  report.durable = true;
  if (!wal_->recovery().truncation_reason.empty()) {
    report.torn_tail = absl::StrCat(wal_->recovery().truncated_bytes, " bytes cut from ",
                                    wal_->recovery().truncated_segment, " at offset ",
                                    wal_->recovery().truncated_at_offset, ": ",
                                    wal_->recovery().truncation_reason);
  }

  // The snapshot: per table, its header record and then its items.
  absl::flat_hash_map<std::string, std::shared_ptr<RunTable>> tables;
  std::optional<storage::TableSnapshot> pending;
  std::vector<storage::SnapshotItem> pending_items;
  const auto finish_table = [&]() -> absl::Status {
    if (!pending.has_value()) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::unique_ptr<RunTable> table,
                     RunTable::Restore(*pending, std::move(pending_items), options_));
    tables.emplace(table->run_id(), std::move(table));
    pending.reset();
    pending_items.clear();
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(
      const durability::SnapshotLoadResult loaded,
      snapshots_->LoadLatest([&](absl::string_view payload) -> absl::Status {
        storage::SnapshotRecord record;
        if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          return absl::DataLossError("snapshot record does not parse");
        }
        if (record.has_table()) {
          RETURN_IF_ERROR(finish_table());
          pending = std::move(*record.mutable_table());
        } else if (record.has_item() && pending.has_value()) {
          pending_items.push_back(std::move(*record.mutable_item()));
        } else {
          return absl::DataLossError("snapshot record is neither a table nor one of its groups");
        }
        return absl::OkStatus();
      }));
  RETURN_IF_ERROR(finish_table());
  report.warnings = loaded.warnings;
  report.snapshot_lsn = loaded.lsn;
  report.snapshot_path = loaded.path;

  // The log after it.
  const uint64_t from = loaded.lsn.has_value() ? *loaded.lsn + 1 : durability::kFirstLsn;
  ASSIGN_OR_RETURN(
      const durability::WalReadResult read,
      durability::ReadWal(wal_dir, from, [&](uint64_t lsn, absl::string_view payload) -> absl::Status {
        storage::WalRecord record;
        if (!record.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
          return absl::DataLossError(absl::StrCat("write-ahead log record ", lsn,
                                                  " does not parse"));
        }
        ++report.wal_records_replayed;
        auto it = tables.find(record.run_id());
        if (it == tables.end()) {
          if (!record.has_configured()) {
            return absl::DataLossError(absl::StrCat("write-ahead log record ", lsn, " is for run ",
                                                    record.run_id(),
                                                    ", which no earlier record created"));
          }
          ASSIGN_OR_RETURN(std::unique_ptr<RunTable> table,
                           RunTable::Create(RunConfigFromProto(record.configured()), options_,
                                            lsn));
          tables.emplace(record.run_id(), std::move(table));
          return absl::OkStatus();
        }
        return it->second->ApplyRecord(lsn, record);
      }));
  if (read.next_lsn < from) {
    report.warnings.push_back(absl::StrCat("the write-ahead log ends at ", read.next_lsn - 1,
                                           ", before the snapshot's ", from - 1,
                                           " (lost to power loss under a lax fsync policy?)"));
    // New records must not reuse LSNs the snapshot covers: the next restore
    // would skip them.
    RETURN_IF_ERROR(wal_->AdvanceNextLsn(from));
  }
  if (report.torn_tail.empty()) report.torn_tail = read.torn_tail;

  {
    absl::MutexLock lock(&mu_);
    for (auto& [run_id, table] : tables) runs_.emplace(run_id, std::move(table));
    report.runs = static_cast<int64_t>(runs_.size());
    report.groups = 0;
    for (const auto& [run_id, table] : runs_) report.groups += table->Stats().size_groups;
  }
  report.duration = absl::Now() - start;
  restored_ = true;
  absl::MutexLock snapshot_lock(&snapshot_mu_);
  last_snapshot_lsn_ = loaded.lsn.value_or(0);
  wal_bytes_at_snapshot_ = 0;
  last_snapshot_time_ = absl::Now();
  return absl::OkStatus();
}

absl::StatusOr<ReplayBuffer::ConfigureResult> ReplayBuffer::ConfigureRun(const RunConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  std::shared_ptr<RunTable> table;
  ConfigureResult result;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("replay buffer is shutting down");
    if (auto it = runs_.find(config.run_id); it != runs_.end()) {
      table = it->second;
    } else {
      RETURN_IF_ERROR(CheckNewTableMemory(config));
      ASSIGN_OR_RETURN(std::unique_ptr<RunTable> created, RunTable::Create(config, options_));
      table = std::move(created);
      runs_.emplace(config.run_id, table);
      result.created = true;
    }
  }
  if (!result.created) RETURN_IF_ERROR(table->Reconfigure(config));
  result.stats = table->Stats();
  return result;
}

absl::Status ReplayBuffer::CheckNewTableMemory(const RunConfig& config) const {
  const MemoryAccount& memory = *options_.memory;
  if (memory.budget_bytes() <= 0 || config.max_sequence_tokens <= 0) return absl::OkStatus();
  const run::ServiceMemoryEstimate estimate = run::EstimateReplayBufferMemory(
      config.batch_size_groups, config.max_staleness, config.group_size, config.buffer,
      config.max_sequence_tokens, absl::StrCat(config.max_sequence_tokens, " tokens"),
      config.retained_step_batches);
  const int64_t used = memory.used_bytes();
  const run::MemoryBudget left{
      std::max<int64_t>(1, memory.budget_bytes() - used),
      absl::StrCat("this replay buffer (", run::FormatBytes(memory.budget_bytes()), ", of which ",
                   run::FormatBytes(used), " held by other runs)")};
  if (std::string problem = run::CheckMemoryBudget("replay buffer", estimate, left);
      !problem.empty()) {
    return absl::ResourceExhaustedError(problem);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<RunTable>> ReplayBuffer::GetRun(absl::string_view run_id) const {
  absl::MutexLock lock(&mu_);
  if (auto it = runs_.find(run_id); it != runs_.end()) return it->second;
  if (run_id.empty()) return absl::InvalidArgumentError("run_id: required");
  return absl::NotFoundError(absl::StrCat("run_id: run \"", run_id,
                                          "\" is not configured on this replay buffer "
                                          "(ConfigureRun creates it)"));
}

std::vector<std::string> ReplayBuffer::RunIds() const {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [run_id, table] : runs_) ids.push_back(run_id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::vector<InsertResult> ReplayBuffer::Insert(std::vector<v1::Group> groups,
                                               absl::Duration rate_limit_wait) {
  std::vector<InsertResult> results;
  results.reserve(groups.size());
  uint64_t last_lsn = 0;
  for (v1::Group& group : groups) {
    absl::StatusOr<std::shared_ptr<RunTable>> table = GetRun(group.run_id());
    if (!table.ok()) {
      InsertResult& result = results.emplace_back();
      result.idempotency_key = group.idempotency_key();
      result.status = table.status().code() == absl::StatusCode::kNotFound
                          ? InsertStatus::kUnknownRun
                          : InsertStatus::kInvalid;
      result.message = std::string(table.status().message());
      continue;
    }
    results.push_back((*table)->Insert(std::move(group), rate_limit_wait));
    last_lsn = std::max(last_lsn, results.back().lsn);
  }
  if (last_lsn > 0 && options_.journal != nullptr) {
    if (absl::Status synced = options_.journal->Sync(last_lsn); !synced.ok()) {
      for (InsertResult& result : results) {
        if (result.status != InsertStatus::kStored) continue;
        result.status = InsertStatus::kRetryableError;
        result.message = absl::StrCat("write-ahead log sync failed: ", synced.message());
      }
    }
  }
  return results;
}

absl::Status ReplayBuffer::SnapshotNow() {
  if (wal_ == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&snapshot_mu_);
  return SnapshotLocked();
}

absl::Status ReplayBuffer::SnapshotLocked() {
  // Every record below `floor` is applied: a table appends and applies under
  // its own lock, and Snapshot() takes that lock after this read. Records at
  // or after it may be in a table's copy too; its covered_lsn says which.
  const uint64_t floor = wal_->next_lsn();
  const uint64_t lsn = floor - 1;
  if (lsn == last_snapshot_lsn_) return absl::OkStatus();
  std::vector<std::shared_ptr<RunTable>> tables;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [run_id, table] : runs_) tables.push_back(table);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<durability::SnapshotWriter> writer,
                   snapshots_->BeginSnapshot(lsn));
  storage::SnapshotRecord record;
  std::string payload;
  for (const std::shared_ptr<RunTable>& table : tables) {
    RunTable::SnapshotData data = table->Snapshot();
    *record.mutable_table() = std::move(data.table);
    payload.clear();
    record.AppendToString(&payload);
    RETURN_IF_ERROR(writer->Append(payload));
    for (const RunTable::SnapshotData::Item& item : data.items) {
      // SnapshotRecord.item (2) { group (1), times_sampled, priority },
      // serialized without copying the group.
      storage::SnapshotItem counts;
      counts.set_times_sampled(item.times_sampled);
      counts.set_priority(item.priority);
      counts.set_retained_only(item.retained_only);
      payload.clear();
      wire::AppendNested(2, 1, *item.group, counts.SerializeAsString(), &payload);
      RETURN_IF_ERROR(writer->Append(payload));
    }
  }
  ASSIGN_OR_RETURN(durability::SnapshotInfo info, writer->Commit());
  last_snapshot_lsn_ = lsn;
  last_snapshot_time_ = absl::Now();
  wal_bytes_at_snapshot_ = wal_->stats().bytes_appended;
  ++snapshots_taken_;
  if (durability_.on_snapshot) durability_.on_snapshot(info);
  last_snapshot_ = std::move(info);
  // Keep the log from the oldest kept snapshot on, so that falling back to
  // it (the newest damaged) can still replay.
  ASSIGN_OR_RETURN(const std::vector<uint64_t> kept, snapshots_->ListSnapshots());
  if (!kept.empty()) RETURN_IF_ERROR(wal_->RemoveSegmentsBefore(kept.front() + 1));
  return absl::OkStatus();
}

void ReplayBuffer::SnapshotLoop() {
  absl::MutexLock lock(&snapshot_mu_);
  while (!snapshot_stop_) {
    // Wakes at least every second to look at the log's size (and as often
    // as asked to look at its health).
    snapshot_mu_.AwaitWithTimeout(absl::Condition(&snapshot_stop_),
                                  std::min(absl::Seconds(1), durability_.write_retry_interval));
    if (snapshot_stop_) break;
    CheckWritesLocked();
    if (!wal_->error().ok()) continue;  // No snapshot of a log that cannot take records.
    const uint64_t grown = wal_->stats().bytes_appended - wal_bytes_at_snapshot_;
    const bool by_time = durability_.snapshot_interval > absl::ZeroDuration() &&
                         absl::Now() - last_snapshot_time_ >= durability_.snapshot_interval;
    if (grown == 0 || (!by_time && grown < durability_.snapshot_wal_bytes)) continue;
    if (absl::Status status = SnapshotLocked(); !status.ok()) {
      log::Error("replay buffer snapshot failed; the write-ahead log keeps everything",
                 {{"error", std::string(status.message())}});
      last_snapshot_time_ = absl::Now();  // retried at the next interval, not in a tight loop
    }
  }
}

void ReplayBuffer::CheckWritesLocked() {
  const absl::Status error = wal_->error();
  const absl::Time now = absl::Now();
  const std::string& dir = durability_.data_dir;
  if (error.ok()) return;
  WriteHealth health = write_health();
  if (health.error.ok()) {
    // Just found: nothing can be stored until it is mended.
    log::Error(
        "replay buffer cannot write its data directory: inserts and every other change "
        "are refused (RETRYABLE_ERROR) until it can; nothing acknowledged is lost, and the "
        "buffer resumes by itself once the directory takes writes again",
        {{"data_dir", dir}, {"error", std::string(error.message())}});
    {
      absl::MutexLock lock(&health_mu_);
      write_health_ = {error, now};
    }
    last_write_warning_ = now;
    write_retry_backoff_ = durability_.write_retry_interval;
    next_write_retry_ = now + write_retry_backoff_;
    if (durability_.on_write_health) durability_.on_write_health(error);
    return;
  }
  if (now < next_write_retry_) return;
  // A small write first: a full disk is refused cheaply, before a snapshot
  // of everything is tried.
  constexpr uint64_t kProbeBytes = 64 << 10;
  absl::Status retried = durability::ProbeWritable(dir, kProbeBytes);
  // The snapshot covers what the failure kept out of the log (a change
  // applied in memory, records a failed sync may have lost), so that the
  // log may go on from here.
  bool snapshot_failed = false;
  if (retried.ok()) {
    retried = SnapshotLocked();
    snapshot_failed = !retried.ok();
  }
  if (retried.ok()) retried = wal_->Recover();
  if (!retried.ok()) {
    if (snapshot_failed) {
      write_retry_backoff_ =
          std::min(2 * write_retry_backoff_, 32 * durability_.write_retry_interval);
    }
    next_write_retry_ = now + write_retry_backoff_;
    if (now - last_write_warning_ >= durability_.write_warning_interval) {
      last_write_warning_ = now;
      log::Warning("replay buffer still cannot write its data directory; inserts are refused",
                   {{"data_dir", dir},
                    {"for_s", absl::ToInt64Seconds(now - health.since)},
                    {"error", std::string(retried.message())}});
    }
    return;
  }
  log::Info("replay buffer writes its data directory again; inserts are stored",
            {{"data_dir", dir}, {"outage_ms", absl::ToInt64Milliseconds(now - health.since)}});
  {
    absl::MutexLock lock(&health_mu_);
    write_health_ = WriteHealth();
  }
  if (durability_.on_write_health) durability_.on_write_health(absl::OkStatus());
}

WriteHealth ReplayBuffer::write_health() const {
  absl::MutexLock lock(&health_mu_);
  return write_health_;
}

DurabilityStats ReplayBuffer::durability_stats() const {
  DurabilityStats stats;
  if (wal_ != nullptr) stats.wal = wal_->stats();
  absl::MutexLock lock(&snapshot_mu_);
  stats.snapshots_taken = snapshots_taken_;
  stats.last_snapshot_lsn = last_snapshot_lsn_;
  stats.last_snapshot_bytes = last_snapshot_.size_bytes;
  stats.last_snapshot_duration = last_snapshot_.duration;
  return stats;
}

void ReplayBuffer::Shutdown() {
  std::vector<std::shared_ptr<RunTable>> tables;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    for (const auto& [run_id, table] : runs_) tables.push_back(table);
  }
  for (const auto& table : tables) table->Shutdown();
  // A buffer whose restore failed must not snapshot: it would record a
  // partial state as complete and hide the log from the next start.
  if (wal_ == nullptr || !restored_) return;
  {
    absl::MutexLock lock(&snapshot_mu_);
    snapshot_stop_ = true;
  }
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  {
    // A last snapshot makes the next start replay almost nothing.
    absl::MutexLock lock(&snapshot_mu_);
    if (absl::Status status = SnapshotLocked(); !status.ok()) {
      log::Error("replay buffer: final snapshot failed; the write-ahead log keeps everything",
                 {{"error", std::string(status.message())}});
    }
  }
  if (absl::Status closed = wal_->Close(); !closed.ok()) {
    log::Error("replay buffer: closing the write-ahead log failed",
               {{"error", std::string(closed.message())}});
  }
}

}  // namespace sluice::replay_buffer
