#ifndef SLUICE_CONTROLLER_WORKER_REGISTRY_H_
#define SLUICE_CONTROLLER_WORKER_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {

struct WorkerRegistryOptions {
  // What WorkerHeartbeatResponse tells workers.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A worker silent this long is lost.
  absl::Duration worker_ttl = absl::Seconds(10);
  // Incarnations are process start times (ns since the epoch): one more than
  // this ahead of the controller's clock is refused, so that nobody can push
  // a worker id's incarnation arbitrarily far ahead (--worker-clock-skew-ms).
  absl::Duration max_clock_skew = absl::Minutes(1);
  // Null = absl::Now. Tests pass a fake.
  std::function<absl::Time()> clock;
};

// Something that happened to one of a run's workers, for the run's driver.
struct WorkerEvent {
  enum class Kind {
    kJoined,     // A worker incarnation was given the run (first or later).
    kRestarted,  // A worker that served the run came back with a new incarnation
                 // (whether or not it had been lost meanwhile).
    kLost,       // A worker serving the run stopped heartbeating (TTL).
    kLeft,       // A worker serving the run said it is leaving (shutdown).
  };
  Kind kind;
  std::string worker_id;
  uint64_t incarnation = 0;  // The incarnation the event is about.
  // kLost: how long it had been silent.
  absl::Duration silent_for;
};

// A worker as a run sees it.
struct RunWorker {
  std::string worker_id;
  uint64_t incarnation = 0;
  std::string address;
  absl::Time last_heartbeat;
  v1::RolloutWorkerStatus status;  // As of its last heartbeat.
};

// The rollout workers the controller knows, and which run each serves.
//
// Pull, not push: workers register themselves with their first heartbeat
// (worker_id + incarnation) and learn their runs from the answers; the
// controller never calls a worker and keeps no list of addresses. A run's
// driver Offers the run (up to rollout.num_workers workers, 0 = all); each
// live worker that heartbeats while the run has room is assigned to it.
//
// Membership:
// - A higher incarnation of a known worker_id replaces the old one (a
//   restart) once the old one has been silent for HandoverAfter() (three
//   heartbeat intervals, at most the TTL): the old incarnation's assignments
//   end (kRestarted for their runs) and the new one is assigned afresh on
//   the same heartbeat. A restarted process is back within a few seconds;
//   the old one is dead and silent.
// - While the old one still heartbeats, the higher incarnation is a second
//   live process with the same worker_id (a copy-pasted --worker-id), not a
//   restart: it is refused (ALREADY_EXISTS naming the holder) and the holder
//   is told (WorkerHeartbeatResponse.conflict, ListWorkers) for a TTL; both
//   are logged as errors. Nothing is handed over, nothing counted.
// - An incarnation more than max_clock_skew ahead of the controller's clock
//   is refused (INVALID_ARGUMENT): a forged one cannot lock the id's real
//   process out beyond that.
// - A lower incarnation than the known one is superseded while the known
//   one is live: a leftover process, assigned nothing (and the holder is
//   told of it). Once the known one is lost or left, the lower one is the
//   id's only live process and holds the id again (no restart counted).
// - A worker silent for worker_ttl is lost: its assignments end (kLost) and
//   it makes room for others. One that says it is leaving (a heartbeat with
//   `leaving`, sent at shutdown) is gone at once (kLeft). If it heartbeats again (a partition
//   healed), it is re-admitted like a new worker.
// Expiry is checked on every call (no thread of its own), so the driver's
// periodic RunWorkers() call bounds how late a loss is noticed. Live workers
// are indexed by their last heartbeat, so the check costs O(log n) per worker
// it expires and nothing for the others: a heartbeat is O(log n + runs) with
// n workers (docs/scaling.md measures it at 10,000).
//
// Every run has an event queue (TakeEvents) so its driver can count
// recovery and give back a lost worker's leases. Thread-safe.
class WorkerRegistry {
 public:
  explicit WorkerRegistry(WorkerRegistryOptions options = {});

  // Registers or refreshes the worker and answers with its assignments: a
  // run the request names in serving_run_ids is listed without its spec
  // (the worker has it). INVALID_ARGUMENT without worker_id or incarnation,
  // or with an incarnation too far ahead; ALREADY_EXISTS while another live
  // process holds the worker_id (class comment). O(log n + runs).
  absl::StatusOr<v1::WorkerHeartbeatResponse> Heartbeat(const v1::WorkerHeartbeatRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Makes the run available to workers: at most `max_workers` (0 = no
  // limit) live workers serve it at once. Replaces an earlier offer of the
  // same run (its assignments stay).
  void Offer(const v1::RolloutAssignment& assignment, int max_workers) ABSL_LOCKS_EXCLUDED(mu_);
  // The run is over for workers: their next heartbeat no longer lists it.
  // Its events are dropped.
  void Withdraw(const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);

  // The live workers assigned to the run (expires lost workers first).
  // O(workers of the run), copies included: for a look at every worker.
  std::vector<RunWorker> RunWorkers(const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);

  // What a run's driver checks every second: how many live workers serve
  // the run, and those of them whose last heartbeat said FAILED. O(log n +
  // failed), so that a fleet of thousands costs its driver nothing per check
  // (RunWorkers would copy every worker's status under the lock).
  struct RunWorkerSummary {
    int live = 0;
    std::vector<RunWorker> failed;
  };
  RunWorkerSummary SummarizeRunWorkers(const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Events of the run since the last call, oldest first.
  std::vector<WorkerEvent> TakeEvents(const std::string& run_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The last status of every live worker (any run or none).
  std::vector<RunWorker> LiveWorkers() ABSL_LOCKS_EXCLUDED(mu_);

  // A supervisor gave up on the worker; kept for messages until the
  // worker_id heartbeats again.
  void GiveUp(const std::string& worker_id, const std::string& description)
      ABSL_LOCKS_EXCLUDED(mu_);
  // worker_id -> why its supervisor gave up on it.
  std::map<std::string, std::string> GivenUp() const ABSL_LOCKS_EXCLUDED(mu_);

  // Every worker seen: live first, then by id.
  v1::ListWorkersResponse List() ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerRegistryOptions& options() const { return options_; }

  // How long a worker_id's live process must have been silent before a
  // higher incarnation takes the id over as its restart: three heartbeat
  // intervals, at most the TTL.
  absl::Duration HandoverAfter() const;

 private:
  struct Worker {
    uint64_t incarnation = 0;
    std::string address;
    bool live = false;
    absl::Time registered_at;
    absl::Time last_heartbeat;
    v1::RolloutWorkerStatus status;
    int64_t restarts = 0;
    // Another live process that claimed the id, as said to this one, and
    // when it last did (told for a TTL after); when it was last logged.
    std::string conflict;
    absl::Time conflict_at = absl::InfinitePast();
    absl::Time conflict_logged_at = absl::InfinitePast();
  };
  struct Offered {
    v1::RolloutAssignment assignment;
    int max_workers = 0;
    // worker_id -> the incarnation assigned.
    std::map<std::string, uint64_t> assigned;
    // Every worker_id that served the run: one lost (or gone) before its
    // new incarnation registered restarted all the same.
    std::set<std::string> served;
    std::vector<WorkerEvent> events;
  };

  absl::Time Now() const;
  // Marks the workers silent for worker_ttl lost: O(log n) for each.
  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps live_by_heartbeat_ in step with a worker's live flag and last
  // heartbeat: call before changing either (Unindex) and after (Index).
  void IndexLocked(const std::string& worker_id, const Worker& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnindexLocked(const std::string& worker_id, const Worker& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the worker's assignments with an event of `kind`.
  void UnassignLocked(const std::string& worker_id, uint64_t incarnation, WorkerEvent::Kind kind,
                      absl::Duration silent_for) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RunWorker ViewLocked(const std::string& worker_id, const Worker& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that another process claims the held id (`what` says which and
  // how) and logs it at most every 30 s per id.
  void NoteConflictLocked(const std::string& worker_id, Worker& holder, const std::string& what,
                          absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The holder's conflict while it is recent (a TTL), else empty.
  std::string CurrentConflictLocked(const Worker& worker, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerRegistryOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
  // (last heartbeat, worker_id) of every live worker, oldest first: the
  // ones to expire are at the front.
  std::set<std::pair<absl::Time, std::string>> live_by_heartbeat_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Offered> offers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> given_up_ ABSL_GUARDED_BY(mu_);
  // Workers whose last heartbeat's status was ROLLOUT_WORKER_STATE_FAILED.
  std::set<std::string> failed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_WORKER_REGISTRY_H_
