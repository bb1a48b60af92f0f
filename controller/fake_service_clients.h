#ifndef SLUICE_CONTROLLER_FAKE_SERVICE_CLIENTS_H_
#define SLUICE_CONTROLLER_FAKE_SERVICE_CLIENTS_H_

// Test doubles of the services a controller drives (service_clients.h):
// they record the last request of each kind, signal the first call through
// an absl::Notification, and answer OK unless told otherwise. Test-only.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "controller/service_clients.h"
#include "controller/worker_registry.h"

namespace sluice::controller::testing {

class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1767225600);  // 2026-01-01
};

inline v1::TrainerStatus IdleTrainer() {
  v1::TrainerStatus status;
  status.set_state(v1::TRAINER_STATE_IDLE);
  status.set_memory_budget_bytes(int64_t{16} << 30);
  status.set_incarnation(1);
  status.set_resumed_from_step(-1);
  return status;
}

class FakeTrainer : public TrainerClient {
 public:
  const std::string& address() const override { return address_; }
  absl::Status StartTraining(const v1::StartTrainingRequest& request) override {
    absl::MutexLock lock(&mu_);
    start_ = request;
    ++starts_;
    if (start_status_.ok()) {
      status_.set_run_id(request.run_id());
      status_.set_state(v1::TRAINER_STATE_LOADING);
      status_.set_resumed_from_step(resume_step_);
      status_.set_steps_redone(steps_redone_);
    }
    if (!started.HasBeenNotified()) started.Notify();
    return start_status_;
  }
  absl::Status StopTraining(const v1::StopTrainingRequest& request) override {
    absl::MutexLock lock(&mu_);
    stop_ = request;
    ++stops_;
    status_.clear_run_id();
    status_.set_state(v1::TRAINER_STATE_IDLE);
    if (!stopped.HasBeenNotified()) stopped.Notify();
    return absl::OkStatus();
  }
  // As a trainer answers: its current run (from StartTraining until
  // StopTraining) unless SetStatus overrode it; UNAVAILABLE after
  // FailStatus.
  absl::StatusOr<v1::TrainerStatus> GetStatus() override {
    absl::MutexLock lock(&mu_);
    ++status_calls_;
    if (!status_error_.ok()) return status_error_;
    return status_;
  }
  void SetStatus(v1::TrainerStatus status) {
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
  }
  // What a trainer that reports `state` for `run_id` also says of itself.
  void SetRunState(const std::string& run_id, v1::TrainerState state) {
    absl::MutexLock lock(&mu_);
    if (status_.run_id() != run_id) return;
    status_.set_state(state);
  }
  void FailStatus(absl::Status status) {
    absl::MutexLock lock(&mu_);
    status_error_ = std::move(status);
  }
  // As a trainer killed and started again: idle, a new incarnation. The
  // next StartTraining "resumes" from `resume_step` (-1: from scratch) and
  // reports `steps_redone`.
  void Restart(uint64_t incarnation, int64_t resume_step, int64_t steps_redone) {
    absl::MutexLock lock(&mu_);
    status_ = IdleTrainer();
    status_.set_incarnation(incarnation);
    resume_step_ = resume_step;
    steps_redone_ = steps_redone;
  }
  int starts() const {
    absl::MutexLock lock(&mu_);
    return starts_;
  }
  // True once StartTraining was called `n` times, false after `timeout`.
  bool AwaitStarts(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return starts_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  int stops() const {
    absl::MutexLock lock(&mu_);
    return stops_;
  }
  bool AwaitStatusCalls(int calls, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return status_calls_ >= calls;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }
  void FailStart(absl::Status status) {
    absl::MutexLock lock(&mu_);
    start_status_ = std::move(status);
  }
  v1::StartTrainingRequest start_request() const {
    absl::MutexLock lock(&mu_);
    return start_;
  }
  v1::StopTrainingRequest stop_request() const {
    absl::MutexLock lock(&mu_);
    return stop_;
  }

  absl::Notification started;
  absl::Notification stopped;

 private:
  const std::string address_ = "trainer:1";
  mutable absl::Mutex mu_;
  absl::Status start_status_ ABSL_GUARDED_BY(mu_);
  absl::Status status_error_ ABSL_GUARDED_BY(mu_);
  int64_t resume_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t steps_redone_ ABSL_GUARDED_BY(mu_) = 0;
  v1::TrainerStatus status_ ABSL_GUARDED_BY(mu_) = IdleTrainer();
  int starts_ ABSL_GUARDED_BY(mu_) = 0;
  int stops_ ABSL_GUARDED_BY(mu_) = 0;
  int status_calls_ ABSL_GUARDED_BY(mu_) = 0;
  v1::StartTrainingRequest start_ ABSL_GUARDED_BY(mu_);
  v1::StopTrainingRequest stop_ ABSL_GUARDED_BY(mu_);
};

// A WorkerRegistry's clock for tests that lose workers by a short TTL on a
// machine that may run a heartbeat thread late: fake time that moves `step`
// at a time, and only once every FakeWorker attached to it (Attach's `pace`)
// has heartbeated since the last move. A live worker is then never more than
// one step silent as the registry sees it, however late its thread runs,
// while a detached one (killed) is lost after TTL / step moves, as fast as
// the others heartbeat. With no worker attached, each Now() moves a step, so
// that the last worker's loss is seen too. Thread-safe.
class HeartbeatPacedClock {
 public:
  explicit HeartbeatPacedClock(absl::Duration step) : step_(step) {}

  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    if (beaten_.empty()) now_ += step_;
    return now_;
  }
  // A worker starts or stops heartbeating.
  void Join(const void* worker) {
    absl::MutexLock lock(&mu_);
    beaten_[worker] = false;
  }
  void Leave(const void* worker) {
    absl::MutexLock lock(&mu_);
    beaten_.erase(worker);
    MaybeStepLocked();
  }
  // A joined worker's heartbeat was answered.
  void Beat(const void* worker) {
    absl::MutexLock lock(&mu_);
    auto it = beaten_.find(worker);
    if (it == beaten_.end()) return;
    it->second = true;
    MaybeStepLocked();
  }

 private:
  void MaybeStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (beaten_.empty()) return;
    for (const auto& [worker, beaten] : beaten_) {
      if (!beaten) return;
    }
    now_ += step_;
    for (auto& [worker, beaten] : beaten_) beaten = false;
  }

  const absl::Duration step_;
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1767225600);  // 2026-01-01
  absl::flat_hash_map<const void*, bool> beaten_ ABSL_GUARDED_BY(mu_);
};

// A rollout worker that heartbeats to a WorkerRegistry from its own thread
// (every few milliseconds) and serves what it is assigned: it reports the run
// in its status from the first heartbeat that lists it until one no longer
// does (or ForgetRun).
class FakeWorker {
 public:
  explicit FakeWorker(std::string worker_id = "fake-worker", uint64_t incarnation = 1)
      : worker_id_(std::move(worker_id)), incarnation_(incarnation) {}
  ~FakeWorker() { Detach(); }

  // Starts heartbeating to `registry`; with `pace`, the registry's clock,
  // which then moves only as fast as this worker (and the others it paces)
  // heartbeats.
  void Attach(std::shared_ptr<WorkerRegistry> registry, HeartbeatPacedClock* pace = nullptr) {
    Detach();
    {
      absl::MutexLock lock(&mu_);
      registry_ = std::move(registry);
      pace_ = pace;
      quit_ = false;
    }
    if (pace != nullptr) pace->Join(this);
    thread_ = std::thread([this] { Loop(); });
  }
  // Stops heartbeating (as a worker that was killed).
  void Detach() {
    HeartbeatPacedClock* pace = nullptr;
    {
      absl::MutexLock lock(&mu_);
      quit_ = true;
      pace = pace_;
      pace_ = nullptr;
    }
    if (thread_.joinable()) thread_.join();
    if (pace != nullptr) pace->Leave(this);
  }
  // As a restarted worker: a new incarnation that serves nothing yet.
  void Restart(uint64_t incarnation) {
    absl::MutexLock lock(&mu_);
    incarnation_ = incarnation;
    serving_.clear();
  }
  // As a worker whose run thread failed.
  void FailRun(const std::string& error) {
    absl::MutexLock lock(&mu_);
    failed_ = error;
  }
  // It no longer reports its run (stopped by another client).
  void ForgetRun() {
    absl::MutexLock lock(&mu_);
    serving_.clear();
    forgotten_ = true;
  }
  void SetMemoryBudget(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    memory_budget_ = bytes;
  }
  v1::RolloutAssignment start_request() const {
    absl::MutexLock lock(&mu_);
    return start_;
  }
  int heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  // True once `n` more heartbeats were answered, false after `timeout`.
  bool AwaitMoreHeartbeats(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    const int target = heartbeats_ + n;
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return heartbeats_ >= target; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

  absl::Notification started;  // First assignment seen.
  absl::Notification stopped;  // The assignment went away after that.

 private:
  v1::RolloutWorkerStatus StatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::RolloutWorkerStatus status;
    status.set_worker_id(worker_id_);
    status.set_incarnation(incarnation_);
    status.set_memory_budget_bytes(memory_budget_);
    status.set_state(!failed_.empty()    ? v1::ROLLOUT_WORKER_STATE_FAILED
                     : serving_.empty() ? v1::ROLLOUT_WORKER_STATE_IDLE
                                        : v1::ROLLOUT_WORKER_STATE_RUNNING);
    status.set_last_error(failed_);
    if (!serving_.empty()) status.add_runs()->set_run_id(serving_);
    return status;
  }

  void Loop() {
    while (true) {
      v1::WorkerHeartbeatRequest request;
      std::shared_ptr<WorkerRegistry> registry;
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&quit_), absl::Milliseconds(5))) return;
        registry = registry_;
        request.set_worker_id(worker_id_);
        request.set_incarnation(incarnation_);
        request.set_address(address_);
        *request.mutable_status() = StatusLocked();
      }
      absl::StatusOr<v1::WorkerHeartbeatResponse> response = registry->Heartbeat(request);
      HeartbeatPacedClock* pace = nullptr;
      {
        absl::MutexLock lock(&mu_);
        pace = pace_;
      }
      if (pace != nullptr) pace->Beat(this);
      absl::MutexLock lock(&mu_);
      ++heartbeats_;
      if (!response.ok()) continue;
      if (response->assignments_size() > 0) {
        if (!forgotten_) serving_ = response->assignments(0).run_id();
        if (!started.HasBeenNotified()) {
          start_ = response->assignments(0);
          started.Notify();
        }
      } else if (started.HasBeenNotified()) {
        serving_.clear();
        if (!stopped.HasBeenNotified()) stopped.Notify();
      }
    }
  }

  const std::string worker_id_;
  const std::string address_ = "worker:1";
  mutable absl::Mutex mu_;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<WorkerRegistry> registry_ ABSL_GUARDED_BY(mu_);
  HeartbeatPacedClock* pace_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool quit_ ABSL_GUARDED_BY(mu_) = false;
  std::string serving_ ABSL_GUARDED_BY(mu_);
  bool forgotten_ ABSL_GUARDED_BY(mu_) = false;
  std::string failed_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t memory_budget_ ABSL_GUARDED_BY(mu_) = int64_t{16} << 30;
  v1::RolloutAssignment start_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

class FakeBuffer : public ReplayBufferClient {
 public:
  const std::string& address() const override { return address_; }
  absl::Status ConfigureRun(const v1::ConfigureRunRequest& request) override {
    absl::MutexLock lock(&mu_);
    configure_ = request;
    return absl::OkStatus();
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& run_id) override {
    absl::MutexLock lock(&mu_);
    if (!stats_error_.ok()) return stats_error_;
    v1::GetStatsResponse response;
    response.set_incarnation(incarnation_);
    response.set_write_error(write_error_);
    response.set_starts(starts_);
    v1::BufferStats& stats = *response.mutable_stats();
    stats.set_run_id(run_id);
    v1::EvictionCount* stale = stats.add_evictions();
    stale->set_reason(v1::EVICTION_REASON_STALE);
    stale->set_groups(3);
    v1::EvictionCount* sampled = stats.add_evictions();
    sampled->set_reason(v1::EVICTION_REASON_MAX_TIMES_SAMPLED);
    sampled->set_groups(6);
    return response;
  }
  absl::Status ReleaseWorkerSlots(const std::string& run_id,
                                  const std::string& worker_id) override {
    absl::MutexLock lock(&mu_);
    released_.push_back(run_id + "/" + worker_id);
    return absl::OkStatus();
  }
  // As a restarted buffer.
  void SetIncarnation(uint64_t incarnation) {
    absl::MutexLock lock(&mu_);
    incarnation_ = incarnation;
  }
  // As a buffer that has started `starts` times on its data directory
  // (GetStatsResponse.starts; 0 = it has none).
  void SetStarts(int64_t starts) {
    absl::MutexLock lock(&mu_);
    starts_ = starts;
  }
  // GetStats answers this error (e.g. NOT_FOUND: a buffer that lost the run).
  void FailStats(absl::Status status) {
    absl::MutexLock lock(&mu_);
    stats_error_ = std::move(status);
  }
  // GetStatsResponse.write_error from now on ("" = it can write).
  void SetWriteError(std::string error) {
    absl::MutexLock lock(&mu_);
    write_error_ = std::move(error);
  }
  // "<run_id>/<worker_id>" of every ReleaseWorkerSlots call.
  std::vector<std::string> released() const {
    absl::MutexLock lock(&mu_);
    return released_;
  }
  absl::StatusOr<v1::GetStatsResponse> GetServerStats() override {
    absl::MutexLock lock(&mu_);
    v1::GetStatsResponse response;
    response.set_memory_budget_bytes(memory_budget_);
    return response;
  }
  void SetMemoryBudget(int64_t bytes) {
    absl::MutexLock lock(&mu_);
    memory_budget_ = bytes;
  }
  v1::ConfigureRunRequest configure_request() const {
    absl::MutexLock lock(&mu_);
    return configure_;
  }

 private:
  const std::string address_ = "buffer:1";
  mutable absl::Mutex mu_;
  int64_t memory_budget_ ABSL_GUARDED_BY(mu_) = int64_t{8} << 30;
  v1::ConfigureRunRequest configure_ ABSL_GUARDED_BY(mu_);
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t starts_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status stats_error_ ABSL_GUARDED_BY(mu_);
  std::string write_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> released_ ABSL_GUARDED_BY(mu_);
};

// Offers the builtin verifiers unless told otherwise.
class FakeRewardServer : public RewardServerClient {
 public:
  const std::string& address() const override { return address_; }
  absl::StatusOr<std::vector<std::string>> ListVerifiers() override {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    return names_;
  }
  absl::StatusOr<uint64_t> Incarnation() override {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    return incarnation_;
  }
  void SetIncarnation(uint64_t incarnation) {
    absl::MutexLock lock(&mu_);
    incarnation_ = incarnation;
  }
  void SetVerifiers(std::vector<std::string> names) {
    absl::MutexLock lock(&mu_);
    names_ = std::move(names);
  }
  void Fail(absl::Status status) {
    absl::MutexLock lock(&mu_);
    error_ = std::move(status);
  }

 private:
  const std::string address_ = "reward:1";
  absl::Mutex mu_;
  std::vector<std::string> names_ ABSL_GUARDED_BY(mu_) = {"code", "exact_match", "format",
                                                          "length", "math"};
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 1;
};

// Healthy unless told otherwise; counts checks per address.
class FakeHealth : public HealthChecker {
 public:
  absl::Status Check(const std::string& address) override {
    absl::MutexLock lock(&mu_);
    const int call = ++calls_[address];
    auto it = failures_.find(address);
    if (it == failures_.end()) return absl::OkStatus();
    if (it->second.first < 0 || call <= it->second.first) return it->second.second;
    return absl::OkStatus();
  }
  // The first `times` checks of `address` fail (-1: all of them).
  void Fail(const std::string& address, int times, absl::Status status) {
    absl::MutexLock lock(&mu_);
    failures_[address] = {times, std::move(status)};
  }
  bool AwaitCalls(const std::string& address, int calls, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    const auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return calls_[address] >= calls;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::pair<int, absl::Status>> failures_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::controller::testing

#endif  // SLUICE_CONTROLLER_FAKE_SERVICE_CLIENTS_H_
