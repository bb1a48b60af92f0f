#include "controller/worker_registry.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "google/protobuf/util/time_util.h"

namespace sluice::controller {
namespace {

google::protobuf::Timestamp ToProto(absl::Time time) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(time));
}

}  // namespace

WorkerRegistry::WorkerRegistry(WorkerRegistryOptions options) : options_(std::move(options)) {}

absl::Time WorkerRegistry::Now() const { return options_.clock ? options_.clock() : absl::Now(); }

absl::Duration WorkerRegistry::HandoverAfter() const {
  return std::min(3 * options_.heartbeat_interval, options_.worker_ttl);
}

void WorkerRegistry::NoteConflictLocked(const std::string& worker_id, Worker& holder,
                                        const std::string& what, absl::Time now) {
  holder.conflict = what;
  holder.conflict_at = now;
  if (now - holder.conflict_logged_at < absl::Seconds(30)) return;
  holder.conflict_logged_at = now;
  log::Error(
      "two live processes claim one rollout worker id; the id stays with the one that "
      "holds it, the other is refused (start each worker with its own --worker-id)",
      {{"worker_id", worker_id},
       {"holder_incarnation", std::to_string(holder.incarnation)},
       {"holder_address", holder.address},
       {"other", what}});
}

std::string WorkerRegistry::CurrentConflictLocked(const Worker& worker, absl::Time now) const {
  if (worker.conflict.empty() || now - worker.conflict_at >= options_.worker_ttl) return "";
  return worker.conflict;
}

absl::StatusOr<v1::WorkerHeartbeatResponse> WorkerRegistry::Heartbeat(
    const v1::WorkerHeartbeatRequest& request) {
  if (request.worker_id().empty()) {
    return absl::InvalidArgumentError("worker_id: required");
  }
  if (request.incarnation() == 0) {
    return absl::InvalidArgumentError("incarnation: required (distinct for every start, > 0)");
  }
  v1::WorkerHeartbeatResponse response;
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  response.set_worker_ttl_ms(absl::ToInt64Milliseconds(options_.worker_ttl));

  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  // Incarnations are start times: one far ahead of this clock is forged (or
  // its host's clock is wrong), and would lock the id's real process out
  // for as long as it stays ahead.
  const absl::Time started = absl::FromUnixNanos(static_cast<int64_t>(
      std::min<uint64_t>(request.incarnation(), std::numeric_limits<int64_t>::max())));
  if (started - now > options_.max_clock_skew) {
    return absl::InvalidArgumentError(absl::StrCat(
        "incarnation: ", request.incarnation(), " is ",
        absl::FormatDuration(absl::Trunc(started - now, absl::Seconds(1))),
        " ahead of the controller's clock; an incarnation is the worker's start time in "
        "nanoseconds since the epoch and may lead the controller's clock by at most ",
        absl::FormatDuration(options_.max_clock_skew),
        " (--worker-clock-skew-ms; synchronize the hosts' clocks)"));
  }
  ExpireLocked(now);
  auto it = workers_.find(request.worker_id());
  if (it != workers_.end() && request.incarnation() < it->second.incarnation) {
    if (it->second.live) {
      // A leftover (an old process that was stopped, not killed), or a
      // second process: assigned nothing, and the holder is told.
      NoteConflictLocked(request.worker_id(), it->second,
                         absl::StrCat("an older process (incarnation ", request.incarnation(),
                                      ", address ", request.address(),
                                      ") still heartbeats with this worker id; it serves nothing"),
                         now);
      response.set_superseded(true);
      response.set_conflict(absl::StrCat("this worker id is held by a newer process (incarnation ",
                                         it->second.incarnation, ", address ", it->second.address,
                                         "); this one serves nothing"));
      return response;
    }
    // The newer process is gone (lost or left): this one is the id's only
    // live process and holds it again. Not a restart: nothing new started.
    log::Warning("rollout worker id held again by an older incarnation (the newer one is gone)",
                 {{"worker_id", request.worker_id()},
                  {"incarnation", std::to_string(request.incarnation())},
                  {"gone_incarnation", std::to_string(it->second.incarnation)},
                  {"address", request.address()}});
    it->second.incarnation = request.incarnation();
    it->second.registered_at = now;
  }
  if (it != workers_.end() && request.incarnation() > it->second.incarnation && it->second.live &&
      now - it->second.last_heartbeat < HandoverAfter()) {
    // The id's process still heartbeats: this is a second process with the
    // same --worker-id, not its restart (a restarted process's predecessor
    // is dead and silent).
    Worker& holder = it->second;
    const std::string other =
        absl::StrCat("another process (incarnation ", request.incarnation(), ", address ",
                     request.address(), ") asked for this worker id and was refused");
    NoteConflictLocked(request.worker_id(), holder, other, now);
    return absl::AlreadyExistsError(absl::StrCat(
        "worker_id: \"", request.worker_id(), "\" is held by a live process (incarnation ",
        holder.incarnation, ", address ", holder.address, ", last heartbeat ",
        absl::FormatDuration(absl::Trunc(now - holder.last_heartbeat, absl::Milliseconds(1))),
        " ago); two processes cannot share a worker id: give each its own --worker-id. A "
        "restarted worker takes the id over once its old process has been silent for ",
        absl::FormatDuration(HandoverAfter())));
  }
  if (it == workers_.end()) {
    it = workers_.emplace(request.worker_id(), Worker{}).first;
    it->second.incarnation = request.incarnation();
    it->second.registered_at = now;
    log::Info("rollout worker registered", {{"worker_id", request.worker_id()},
                                            {"incarnation", std::to_string(request.incarnation())},
                                            {"address", request.address()}});
  } else if (request.incarnation() > it->second.incarnation) {
    // Runs it served and was lost to (a restart slower than the TTL) count
    // the restart too; those it still serves end with it.
    for (auto& [run_id, offered] : offers_) {
      if (offered.served.count(request.worker_id()) > 0 &&
          offered.assigned.count(request.worker_id()) == 0) {
        offered.events.push_back({WorkerEvent::Kind::kRestarted, request.worker_id(),
                                  it->second.incarnation, absl::ZeroDuration()});
      }
    }
    UnassignLocked(request.worker_id(), it->second.incarnation, WorkerEvent::Kind::kRestarted,
                   absl::ZeroDuration());
    log::Info("rollout worker restarted", {{"worker_id", request.worker_id()},
                                           {"incarnation", std::to_string(request.incarnation())},
                                           {"address", request.address()}});
    it->second.incarnation = request.incarnation();
    it->second.registered_at = now;
    it->second.conflict.clear();
    ++it->second.restarts;
  } else if (!it->second.live) {
    log::Info("rollout worker is back", {{"worker_id", request.worker_id()},
                                         {"address", request.address()}});
    it->second.registered_at = now;
  }
  if (!given_up_.empty()) given_up_.erase(request.worker_id());
  Worker& worker = it->second;
  UnindexLocked(request.worker_id(), worker);
  if (request.leaving()) {
    if (worker.live) {
      log::Info("rollout worker leaving", {{"worker_id", request.worker_id()}});
      UnassignLocked(request.worker_id(), worker.incarnation, WorkerEvent::Kind::kLeft,
                     absl::ZeroDuration());
    }
    worker.live = false;
    worker.last_heartbeat = now;
    worker.status = request.status();
    return response;
  }
  worker.live = true;
  worker.last_heartbeat = now;
  IndexLocked(request.worker_id(), worker);
  worker.address = request.address();
  worker.status = request.status();
  if (worker.status.state() == v1::ROLLOUT_WORKER_STATE_FAILED) {
    failed_.insert(request.worker_id());
  } else if (!failed_.empty()) {
    failed_.erase(request.worker_id());
  }

  response.set_conflict(CurrentConflictLocked(worker, now));
  for (auto& [run_id, offered] : offers_) {
    auto assigned = offered.assigned.find(request.worker_id());
    if (assigned == offered.assigned.end()) {
      if (offered.max_workers > 0 &&
          static_cast<int>(offered.assigned.size()) >= offered.max_workers) {
        continue;
      }
      offered.assigned[request.worker_id()] = worker.incarnation;
      offered.served.insert(request.worker_id());
      offered.events.push_back({WorkerEvent::Kind::kJoined, request.worker_id(),
                                worker.incarnation, absl::ZeroDuration()});
      log::Info("rollout worker assigned", {{"worker_id", request.worker_id()},
                                            {"run_id", run_id}});
    }
    v1::RolloutAssignment& assignment = *response.add_assignments();
    if (std::find(request.serving_run_ids().begin(), request.serving_run_ids().end(), run_id) !=
        request.serving_run_ids().end()) {
      // The worker has the spec: a run's spec crosses the wire once.
      assignment.set_run_id(run_id);
      *assignment.mutable_endpoints() = offered.assignment.endpoints();
      assignment.set_max_prompt_tokens(offered.assignment.max_prompt_tokens());
    } else {
      assignment = offered.assignment;
    }
  }
  return response;
}

void WorkerRegistry::Offer(const v1::RolloutAssignment& assignment, int max_workers) {
  absl::MutexLock lock(&mu_);
  Offered& offered = offers_[assignment.run_id()];
  offered.assignment = assignment;
  offered.max_workers = std::max(0, max_workers);
}

void WorkerRegistry::Withdraw(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  offers_.erase(run_id);
}

std::vector<RunWorker> WorkerRegistry::RunWorkers(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(Now());
  std::vector<RunWorker> result;
  auto offered = offers_.find(run_id);
  if (offered == offers_.end()) return result;
  for (const auto& [worker_id, incarnation] : offered->second.assigned) {
    auto it = workers_.find(worker_id);
    if (it == workers_.end() || it->second.incarnation != incarnation) continue;
    result.push_back(ViewLocked(worker_id, it->second));
  }
  return result;
}

WorkerRegistry::RunWorkerSummary WorkerRegistry::SummarizeRunWorkers(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(Now());
  RunWorkerSummary summary;
  auto offered = offers_.find(run_id);
  if (offered == offers_.end()) return summary;
  // Assignments end when a worker is lost, leaves or restarts, so every one
  // left is a live worker's current incarnation.
  summary.live = static_cast<int>(offered->second.assigned.size());
  for (const std::string& worker_id : failed_) {
    auto assigned = offered->second.assigned.find(worker_id);
    auto it = workers_.find(worker_id);
    if (assigned == offered->second.assigned.end() || it == workers_.end() ||
        it->second.incarnation != assigned->second) {
      continue;
    }
    summary.failed.push_back(ViewLocked(worker_id, it->second));
  }
  return summary;
}

std::vector<WorkerEvent> WorkerRegistry::TakeEvents(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  ExpireLocked(Now());
  auto offered = offers_.find(run_id);
  if (offered == offers_.end()) return {};
  return std::exchange(offered->second.events, {});
}

std::vector<RunWorker> WorkerRegistry::LiveWorkers() {
  absl::MutexLock lock(&mu_);
  ExpireLocked(Now());
  std::vector<RunWorker> result;
  for (const auto& [worker_id, worker] : workers_) {
    if (worker.live) result.push_back(ViewLocked(worker_id, worker));
  }
  return result;
}

void WorkerRegistry::GiveUp(const std::string& worker_id, const std::string& description) {
  absl::MutexLock lock(&mu_);
  given_up_[worker_id] = description;
}

std::map<std::string, std::string> WorkerRegistry::GivenUp() const {
  absl::MutexLock lock(&mu_);
  return given_up_;
}

v1::ListWorkersResponse WorkerRegistry::List() {
  absl::MutexLock lock(&mu_);
  ExpireLocked(Now());
  std::vector<std::pair<bool, std::string>> order;
  for (const auto& [worker_id, worker] : workers_) order.emplace_back(!worker.live, worker_id);
  std::sort(order.begin(), order.end());
  v1::ListWorkersResponse response;
  for (const auto& [not_live, worker_id] : order) {
    const Worker& worker = workers_.at(worker_id);
    v1::WorkerInfo* info = response.add_workers();
    info->set_worker_id(worker_id);
    info->set_incarnation(worker.incarnation);
    info->set_address(worker.address);
    info->set_live(worker.live);
    *info->mutable_status() = worker.status;
    *info->mutable_registered_at() = ToProto(worker.registered_at);
    *info->mutable_last_heartbeat_at() = ToProto(worker.last_heartbeat);
    info->set_restarts(worker.restarts);
    info->set_conflict(CurrentConflictLocked(worker, Now()));
    for (const auto& [run_id, offered] : offers_) {
      auto assigned = offered.assigned.find(worker_id);
      if (assigned != offered.assigned.end() && assigned->second == worker.incarnation) {
        info->set_run_id(run_id);
        break;
      }
    }
  }
  return response;
}

void WorkerRegistry::IndexLocked(const std::string& worker_id, const Worker& worker) {
  if (worker.live) live_by_heartbeat_.emplace(worker.last_heartbeat, worker_id);
}

void WorkerRegistry::UnindexLocked(const std::string& worker_id, const Worker& worker) {
  if (worker.live) live_by_heartbeat_.erase({worker.last_heartbeat, worker_id});
}

void WorkerRegistry::ExpireLocked(absl::Time now) {
  while (!live_by_heartbeat_.empty() &&
         now - live_by_heartbeat_.begin()->first >= options_.worker_ttl) {
    const std::string worker_id = live_by_heartbeat_.begin()->second;
    live_by_heartbeat_.erase(live_by_heartbeat_.begin());
    Worker& worker = workers_.at(worker_id);
    const absl::Duration silent = now - worker.last_heartbeat;
    worker.live = false;
    log::Warning("rollout worker lost: no heartbeat",
                 {{"worker_id", worker_id},
                  {"incarnation", std::to_string(worker.incarnation)},
                  {"silent_ms", absl::ToInt64Milliseconds(silent)}});
    UnassignLocked(worker_id, worker.incarnation, WorkerEvent::Kind::kLost, silent);
  }
}

void WorkerRegistry::UnassignLocked(const std::string& worker_id, uint64_t incarnation,
                                    WorkerEvent::Kind kind, absl::Duration silent_for) {
  for (auto& [run_id, offered] : offers_) {
    auto assigned = offered.assigned.find(worker_id);
    if (assigned == offered.assigned.end() || assigned->second != incarnation) continue;
    offered.assigned.erase(assigned);
    offered.events.push_back({kind, worker_id, incarnation, silent_for});
  }
}

RunWorker WorkerRegistry::ViewLocked(const std::string& worker_id, const Worker& worker) const {
  return RunWorker{.worker_id = worker_id,
                   .incarnation = worker.incarnation,
                   .address = worker.address,
                   .last_heartbeat = worker.last_heartbeat,
                   .status = worker.status};
}

}  // namespace sluice::controller
