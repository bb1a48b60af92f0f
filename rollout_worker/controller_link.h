#ifndef SLUICE_ROLLOUT_WORKER_CONTROLLER_LINK_H_
#define SLUICE_ROLLOUT_WORKER_CONTROLLER_LINK_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sluice/v1/controller.pb.h"

namespace sluice::rollout_worker {

// What the link needs of the worker it speaks for.
class LinkedWorker {
 public:
  virtual ~LinkedWorker() = default;
  // The worker's status, sent with every heartbeat.
  virtual v1::RolloutWorkerStatus Status() = 0;
  // Starts serving the run (returns once it was started or refused; a
  // refusal must show in Status() as FAILED with last_error, for the
  // controller to see).
  virtual absl::Status StartRun(const v1::RolloutAssignment& assignment) = 0;
  // Aborts the run and returns once it has stopped.
  virtual void StopRun(const std::string& run_id) = 0;
};

struct ControllerLinkOptions {
  std::string worker_id;
  uint64_t incarnation = 0;
  // Where this worker's gRPC server answers (informational).
  std::string address;
  // Between heartbeats until the controller says otherwise.
  absl::Duration interval = absl::Seconds(1);
  // After this many seconds of failing heartbeats a warning is repeated.
  absl::Duration warn_every = absl::Seconds(30);
};

// One heartbeat RPC to the controller.
using HeartbeatCall =
    std::function<absl::StatusOr<v1::WorkerHeartbeatResponse>(const v1::WorkerHeartbeatRequest&)>;

// A rollout worker's side of membership: registers with the controller and
// heartbeats on its own thread, starting the runs the answers list and
// aborting those they no longer list (pull: nobody needs the worker's
// address). While the controller cannot be reached the worker goes on with
// what it serves (its runs' own calls retry); it re-registers by itself when
// the controller is back, at any address the HeartbeatCall reaches.
//
// A run that ended on its own in this incarnation (finished, or failed: its
// status says FAILED) is not started again when still listed; one stopped
// because the controller no longer listed it is, if listed again (a
// controller that restarted and re-adopted it). Each heartbeat names the
// runs this process serves (serving_run_ids), so that the controller sends
// a run's spec once, in the answer that assigns it.
//
// Two processes with one worker id: the controller refuses the second
// (ALREADY_EXISTS) and tells the first (WorkerHeartbeatResponse.conflict);
// either logs it as an error at once and every warn_every while it lasts.
//
// Thread-safe.
class ControllerLink {
 public:
  ControllerLink(ControllerLinkOptions options, HeartbeatCall heartbeat, LinkedWorker* worker);
  // Stop().
  ~ControllerLink();

  ControllerLink(const ControllerLink&) = delete;
  ControllerLink& operator=(const ControllerLink&) = delete;

  // Starts the heartbeat thread.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops it (no more heartbeats); the worker's runs are left to the caller.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Stop(), then one last heartbeat saying the worker leaves (shutdown), so
  // that the controller hands its prompts to others at once instead of after
  // the worker TTL. Best effort: an unreachable controller finds out by the
  // TTL.
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);

  // One heartbeat and what it says; the thread calls this. Returns the
  // heartbeat's status. Exposed for tests.
  absl::Status BeatOnce() ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the last heartbeat reached the controller; the number sent.
  bool connected() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t heartbeats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop();

  const ControllerLinkOptions options_;
  const HeartbeatCall heartbeat_;
  LinkedWorker* const worker_;

  mutable absl::Mutex mu_;
  bool quit_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  int64_t heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time failing_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time last_warning_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool superseded_ ABSL_GUARDED_BY(mu_) = false;
  // Another live process with this worker id (the controller said so, or
  // refused this one for it): when that was last logged, so that it is
  // said at once and then every warn_every, loudly, not every second.
  absl::Time conflict_logged_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Runs this incarnation started (and has not stopped for the controller).
  std::set<std::string> started_ ABSL_GUARDED_BY(mu_);
  // Serializes BeatOnce (the thread, or a test).
  absl::Mutex beat_mu_;
  std::thread thread_;
};

}  // namespace sluice::rollout_worker

#endif  // SLUICE_ROLLOUT_WORKER_CONTROLLER_LINK_H_
