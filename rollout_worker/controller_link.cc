#include "rollout_worker/controller_link.h"

#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/logging.h"

namespace sluice::rollout_worker {
namespace {

// The worker's status lists the run and says it is no longer running: it
// ended on its own (finished, or failed).
bool EndedOnItsOwn(const v1::RolloutWorkerStatus& status, const std::string& run_id) {
  if (status.state() != v1::ROLLOUT_WORKER_STATE_IDLE &&
      status.state() != v1::ROLLOUT_WORKER_STATE_FAILED) {
    return false;
  }
  for (const v1::RolloutRunStatus& run : status.runs()) {
    if (run.run_id() == run_id) return true;
  }
  return false;
}

}  // namespace

ControllerLink::ControllerLink(ControllerLinkOptions options, HeartbeatCall heartbeat,
                               LinkedWorker* worker)
    : options_(std::move(options)),
      heartbeat_(std::move(heartbeat)),
      worker_(worker),
      interval_(options_.interval) {}

ControllerLink::~ControllerLink() { Stop(); }

void ControllerLink::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable()) return;
  quit_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void ControllerLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    quit_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ControllerLink::Leave() {
  Stop();
  absl::MutexLock beat(&beat_mu_);
  v1::WorkerHeartbeatRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_incarnation(options_.incarnation);
  request.set_address(options_.address);
  request.set_leaving(true);
  *request.mutable_status() = worker_->Status();
  absl::StatusOr<v1::WorkerHeartbeatResponse> response = heartbeat_(request);
  log::Info("left the controller", {{"worker_id", options_.worker_id},
                                    {"told", response.ok()},
                                    {"error", response.ok() ? "" : response.status().ToString()}});
}

bool ControllerLink::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

int64_t ControllerLink::heartbeats() const {
  absl::MutexLock lock(&mu_);
  return heartbeats_;
}

void ControllerLink::Loop() {
  while (true) {
    BeatOnce().IgnoreError();  // Logged there.
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&quit_), interval_)) return;
  }
}

absl::Status ControllerLink::BeatOnce() {
  absl::MutexLock beat(&beat_mu_);
  v1::WorkerHeartbeatRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_incarnation(options_.incarnation);
  request.set_address(options_.address);
  *request.mutable_status() = worker_->Status();
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& run_id : started_) request.add_serving_run_ids(run_id);
  }
  absl::StatusOr<v1::WorkerHeartbeatResponse> response = heartbeat_(request);
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    if (!response.ok() && absl::IsAlreadyExists(response.status())) {
      // Another live process holds this worker id: said loudly, at once,
      // and again every warn_every while it lasts. Not a connection
      // problem: the controller answered.
      connected_ = false;
      if (now - conflict_logged_at_ >= options_.warn_every) {
        conflict_logged_at_ = now;
        log::Error(
            "the controller refuses this worker: another live process has the same "
            "worker id; this one serves nothing until that one is gone",
            {{"worker_id", options_.worker_id},
             {"incarnation", std::to_string(options_.incarnation)},
             {"error", std::string(response.status().message())}});
      }
      return response.status();
    }
    if (!response.ok()) {
      if (failing_since_ == absl::InfiniteFuture()) failing_since_ = now;
      if (now - last_warning_ >= options_.warn_every) {
        last_warning_ = now;
        // The worker goes on with its runs; their own calls retry.
        log::Warning("cannot reach the controller; serving on and retrying",
                     {{"worker_id", options_.worker_id},
                      {"failing_for_ms", absl::ToInt64Milliseconds(now - failing_since_)},
                      {"error", response.status().ToString()}});
      }
      connected_ = false;
      return response.status();
    }
    if (!connected_) {
      log::Info(failing_since_ == absl::InfiniteFuture() ? "registered with the controller"
                                                         : "reconnected to the controller",
                {{"worker_id", options_.worker_id},
                 {"incarnation", std::to_string(options_.incarnation)},
                 {"address", options_.address}});
    }
    connected_ = true;
    failing_since_ = absl::InfiniteFuture();
    last_warning_ = absl::InfinitePast();
    if (response->heartbeat_interval_ms() > 0) {
      interval_ = absl::Milliseconds(response->heartbeat_interval_ms());
    }
    if (!response->conflict().empty() && now - conflict_logged_at_ >= options_.warn_every) {
      conflict_logged_at_ = now;
      log::Error(
          "another process uses this worker id (two workers started with the same "
          "--worker-id?)",
          {{"worker_id", options_.worker_id},
           {"incarnation", std::to_string(options_.incarnation)},
           {"controller_says", response->conflict()}});
    }
  }

  std::set<std::string> listed;
  if (response->superseded()) {
    absl::MutexLock lock(&mu_);
    if (!superseded_) {
      log::Error("the controller knows a newer incarnation of this worker id; serving nothing",
                 {{"worker_id", options_.worker_id},
                  {"incarnation", std::to_string(options_.incarnation)}});
    }
    superseded_ = true;
  } else {
    for (const v1::RolloutAssignment& assignment : response->assignments()) {
      listed.insert(assignment.run_id());
    }
  }

  // Runs no longer listed are over for this worker.
  std::vector<std::string> to_stop;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = started_.begin(); it != started_.end();) {
      if (listed.count(*it) == 0) {
        to_stop.push_back(*it);
        it = started_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const std::string& run_id : to_stop) {
    log::Info("the controller no longer lists the run; stopping it",
              {{"worker_id", options_.worker_id}, {"run_id", run_id}});
    worker_->StopRun(run_id);
  }

  if (response->superseded()) return absl::OkStatus();
  for (const v1::RolloutAssignment& assignment : response->assignments()) {
    {
      absl::MutexLock lock(&mu_);
      if (started_.count(assignment.run_id()) > 0) continue;
      started_.insert(assignment.run_id());
    }
    // Listed again after it ended here on its own: it stays ended (its
    // status tells the controller how).
    if (EndedOnItsOwn(request.status(), assignment.run_id())) continue;
    if (absl::Status started = worker_->StartRun(assignment); !started.ok()) {
      log::Error("cannot serve the run the controller assigned",
                 {{"worker_id", options_.worker_id},
                  {"run_id", assignment.run_id()},
                  {"error", started.ToString()}});
    }
  }
  return absl::OkStatus();
}

}  // namespace sluice::rollout_worker
