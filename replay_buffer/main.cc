// sluice-replay-buffer: see replay_buffer_service.h and README.md.
#include <cstdint>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "replay_buffer/replay_buffer.h"
#include "replay_buffer/replay_buffer_metrics.h"
#include "replay_buffer/replay_buffer_service.h"
#include "replay_buffer/start_count.h"
#include "services/runtime/memory_budget.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  namespace rb = sluice::replay_buffer;
  sluice::runtime::ServiceMain main({
      .component = "replay_buffer",
      .binary = "sluice-replay-buffer",
      .description = "Sluice replay buffer: holds scored groups, gates generation by the staleness bound, samples batches for the trainer, and never loses an acknowledged insert.",
      .default_port = 50054,
      .default_metrics_port = 9094,
  });
  int64_t lease_ttl_ms = 60000;
  std::string data_dir;
  std::string fsync = "interval";
  int64_t fsync_interval_ms = 100;
  int64_t snapshot_interval_s = 300;
  int64_t snapshot_wal_mb = 256;
  int keep_snapshots = 2;
  int64_t data_dir_lock_wait_ms = 10000;
  CLI::App& app = main.app();
  app.add_option("--lease-ttl-ms", lease_ttl_ms,
                 "how long a generation slot counts as running without an insert, release "
                 "or renewal")
      ->capture_default_str();
  app.add_option("--data-dir", data_dir,
                 "directory for the write-ahead log and snapshots; restored at start. Empty: "
                 "in memory only, nothing survives a restart");
  app.add_option("--fsync", fsync,
                 "when the log is fsynced: always (an acknowledged insert survives power loss), "
                 "interval (survives kill -9; power loss loses at most --fsync-interval-ms), "
                 "never (survives kill -9)")
      ->check(CLI::IsMember({"always", "interval", "never"}))
      ->capture_default_str();
  app.add_option("--fsync-interval-ms", fsync_interval_ms, "fsync period under --fsync interval")
      ->capture_default_str();
  app.add_option("--snapshot-interval-s", snapshot_interval_s,
                 "snapshot at least this often while the log grows (0: by size only)")
      ->capture_default_str();
  app.add_option("--snapshot-wal-mb", snapshot_wal_mb,
                 "snapshot whenever the log has grown by this much")
      ->capture_default_str();
  app.add_option("--keep-snapshots", keep_snapshots, "snapshots kept (the older ones are a "
                                                     "fallback if the newest is damaged)")
      ->capture_default_str();
  app.add_option("--data-dir-lock-wait-ms", data_dir_lock_wait_ms,
                 "how long to wait at start for another process to let go of --data-dir (a "
                 "buffer restarted at once after kill -9 finds it still held by the dying one "
                 "for a moment); a second live buffer on the directory is refused after it")
      ->capture_default_str();
  sluice::runtime::MemoryBudgetFlag memory_budget(app);
  return main.Run(argc, argv, [&](ServiceContext& context) -> absl::Status {
    using namespace sluice;
    rb::RunTableOptions options;
    options.lease_ttl = absl::Milliseconds(lease_ttl_ms);
    options.memory = std::make_shared<rb::MemoryAccount>(memory_budget.Apply(context));
    auto durability_metrics =
        std::make_shared<rb::DurabilityMetrics>(context.metrics_registry());
    rb::DurabilityOptions durability;
    durability.data_dir = data_dir;
    durability.fsync_policy = fsync == "always"   ? rb::durability::FsyncPolicy::kAlways
                              : fsync == "never" ? rb::durability::FsyncPolicy::kNever
                                                 : rb::durability::FsyncPolicy::kInterval;
    durability.fsync_interval = absl::Milliseconds(fsync_interval_ms);
    durability.snapshot_interval = absl::Seconds(snapshot_interval_s);
    durability.snapshot_wal_bytes = static_cast<uint64_t>(std::max<int64_t>(1, snapshot_wal_mb)) << 20;
    durability.keep_snapshots = keep_snapshots;
    durability.data_dir_lock_wait = absl::Milliseconds(data_dir_lock_wait_ms);
    durability.on_fsync = [durability_metrics](absl::Duration d) { durability_metrics->ObserveFsync(d); };
    durability.on_snapshot = [durability_metrics](const rb::durability::SnapshotInfo& info) {
      durability_metrics->ObserveSnapshot(info);
    };
    // NOT_SERVING while the data directory cannot be written (WriteHealth);
    // the whole server stays SERVING: a restart would not mend a full disk.
    durability.on_write_health = [health = context.health()](const absl::Status& status) {
      health->SetServing(sluice::v1::ReplayBufferService::service_full_name(), status.ok());
    };
    absl::StatusOr<std::unique_ptr<rb::ReplayBuffer>> created =
        rb::ReplayBuffer::Create(options, durability);
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrCat(data_dir.empty() ? "" : "--data-dir " + data_dir + ": ",
                                       created.status().message()));
    }
    std::shared_ptr<rb::ReplayBuffer> buffer = std::move(created).value();
    const rb::RestoreReport& report = buffer->restore_report();
    if (report.durable) {
      log::Info("replay buffer restored",
                {{"data_dir", data_dir},
                 {"snapshot_lsn", report.snapshot_lsn ? std::to_string(*report.snapshot_lsn) : "none"},
                 {"wal_records_replayed", std::to_string(report.wal_records_replayed)},
                 {"runs", std::to_string(report.runs)},
                 {"groups", std::to_string(report.groups)},
                 {"ms", std::to_string(absl::ToInt64Milliseconds(report.duration))}});
      if (!report.torn_tail.empty()) {
        log::Warning("write-ahead log ended in a torn record (a write interrupted by a crash, "
                     "never acknowledged); dropped",
                     {{"detail", report.torn_tail}});
      }
      for (const std::string& warning : report.warnings) {
        log::Warning("replay buffer restore", {{"detail", warning}});
      }
      if (options.memory->budget_bytes() > 0 &&
          options.memory->used_bytes() > options.memory->budget_bytes()) {
        log::Warning("the restored groups take more than --memory-budget; inserts are refused "
                     "(RETRYABLE_ERROR) until the trainer has sampled enough of them",
                     {{"used_bytes", options.memory->used_bytes()},
                      {"memory_budget_bytes", options.memory->budget_bytes()}});
      }
    }
    // Counted once the directory is ours (Create locked it).
    rb::ReplayBufferServiceImpl::Options service_options;
    if (!data_dir.empty()) {
      absl::StatusOr<int64_t> starts = rb::CountStart(data_dir);
      if (!starts.ok()) {
        return absl::Status(starts.status().code(),
                            absl::StrCat("--data-dir ", data_dir, ": ", starts.status().message()));
      }
      service_options.starts = *starts;
    }
    auto service = std::make_shared<rb::ReplayBufferServiceImpl>(buffer, context.metrics_registry(),
                                                                 service_options);
    context.OnShutdown([service] { service->Shutdown(); });
    context.AddService(service, sluice::v1::ReplayBufferService::service_full_name());
    return absl::OkStatus();
  });
}
