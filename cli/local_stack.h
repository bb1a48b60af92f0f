#ifndef SLUICE_CLI_LOCAL_STACK_H_
#define SLUICE_CLI_LOCAL_STACK_H_

#include <sys/types.h>

#include <future>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cli/stack_layout.h"
#include "cli/stack_options.h"
#include "cli/stack_security.h"
#include "cli/state_dir.h"
#include "cli/supervisor.h"
#include "common/subprocess.h"

namespace sluice::cli {

// The embedded default deployment: the services as child processes on
// loopback, supervised as Kubernetes would supervise pods.
//
// Start order, each only after the previous one answered its health check:
// reward server, replay buffer, trainer, controller (given the others'
// addresses, --runs-dir, and the ids of the workers it will start as
// --trusted-worker-ids: their rollouts are verified at a sampled fraction,
// common/run/run_verification.h), then the rollout workers (given the
// controller's address and a stable --worker-id; they register with the
// controller themselves). Stop order is the reverse.
//
// Addresses: every service first binds port 0 and reports its port on a
// pipe once it serves, so there is no port race. A restarted singleton
// (reward server, replay buffer, trainer, controller) binds the same port
// again, because the others and the clients hold channels to it (it plays
// the part of a Kubernetes Service name); if the port cannot be bound yet,
// that start fails and is retried with the backoff. A restarted rollout
// worker takes a fresh port: workers are elastic and re-register.
//
// Restarts (Supervise): RestartPolicy decides; each death and restart is one
// line on the console; endpoints.json is rewritten atomically on every
// change; a restarted service's log is appended to after a marker line. A
// service given up on is reported to the controller (ReportServiceFailure)
// so that the runs' records name it; the stack goes on without a rollout
// worker, but not without a singleton.
//
// Children get SIGTERM if this process dies, so a crashed supervisor leaves
// nothing behind for long; the next stack on the same state directory stops
// what is left and replaces its endpoints.json (state_dir.h).
//
// Thread-compatible; one thread drives it (endpoints() changes during
// Supervise).
class LocalStack {
 public:
  // The kinds of service, in start order (rollout_worker: as many as asked).
  static const std::vector<std::string>& ServiceKinds() { return StackServiceKinds(); }

  explicit LocalStack(LocalStackOptions options);
  // Its layout reads its options where they are.
  LocalStack(const LocalStack&) = delete;
  LocalStack& operator=(const LocalStack&) = delete;
  // Stops whatever is still running.
  ~LocalStack();

  // Service names in start order; also the keys of endpoints.json.
  std::vector<std::string> ServiceNames() const;

  // Claims the state directory (FAILED_PRECONDITION naming the pid of
  // another live `sluice up` on it), replaces a stale endpoints.json, starts
  // every service, waits until each is SERVING, then writes endpoints.json.
  // On failure stops what it started and returns an error naming the
  // service, why it failed and the end of its log.
  absl::Status Start();

  const std::vector<ServiceEndpoint>& endpoints() const { return endpoints_; }
  // The endpoint of `name` ("trainer", "rollout_worker-0"); nullptr if none.
  const ServiceEndpoint* endpoint(const std::string& name) const;
  std::string endpoints_path() const { return layout_.endpoints_path(); }
  // The runs directory the controller was given (absolute).
  std::string runs_dir() const { return layout_.runs_dir(); }
  // The replay buffer's data directory (absolute); empty when in memory.
  std::string buffer_data_dir() const { return layout_.buffer_data_dir(); }
  // The --allowed-path-roots the services get (absolute): the options' (or
  // the working directory), then the state and runs directories.
  std::vector<std::string> allowed_path_roots() const { return layout_.allowed_path_roots(); }

  // Supervises until SIGTERM/SIGINT arrives (returns OK and the signal's
  // name in `*reason`) or the stack cannot go on: a singleton given up on,
  // or one that exited 0 by itself (returns an error naming it, how it died
  // each time and the end of its log). Services that die meanwhile are
  // restarted as the policy says; restarts happen on this thread and block
  // it for at most start_timeout each. Both signals must be blocked in every
  // thread (runtime::BlockTerminationSignals) so that they are read here.
  //
  // `wake_fd` (optional, e.g. an eventfd): when it becomes readable Supervise
  // returns OK with `*reason` = "woken", so another thread that finished its
  // work (a watched run ended) can end the supervision.
  absl::Status Supervise(std::string* reason, int wake_fd = -1);

  // Stops every service, last started first: SIGTERM, then SIGKILL after
  // stop_grace. Removes endpoints.json and lets go of the state directory.
  // Returns an error listing services that did not exit cleanly. Idempotent.
  absl::Status Stop();

 private:
  enum class State { kRunning, kRestarting, kGaveUp, kExited };
  struct Child {
    ServiceEndpoint endpoint;
    std::unique_ptr<Subprocess> process;  // Null while not running.
    State state = State::kRunning;
    absl::Time restart_at;  // kRestarting: when to start it again.
    // Liveness: the next probe, the one in flight (its answer, or an error
    // saying why none came), and the process it asked.
    absl::Time probe_at = absl::InfinitePast();
    std::shared_ptr<std::future<absl::Status>> probe;
    pid_t probed_pid = 0;
    std::shared_ptr<LivenessCount> liveness;
    // Set when the stack killed the process for its liveness: why, said
    // with its death.
    std::string killed_because;
    bool singleton() const { return endpoint.kind != "rollout_worker"; }
  };

  // Starts `child`'s process and waits until it serves. `restart`: on the
  // same port for a singleton, log appended to rather than truncated.
  absl::Status StartProcess(Child& child, bool restart);
  // Every child's endpoint as known now, in start order.
  std::vector<ServiceEndpoint> StackEndpoints() const;

  // A running child's process exited. Error: the stack cannot go on.
  absl::Status OnExit(Child& child);
  // `child` failed (died, or did not come back up): schedule its restart or
  // give up on it. Error: the stack cannot go on.
  absl::Status OnFailure(Child& child, const std::string& description);
  // Starts the children whose backoff is over. Error: the stack cannot go on.
  absl::Status RestartDue();
  // Liveness: starts the probes that are due (each on its own thread, so
  // that the supervision never waits on a hung service), reads those that
  // have answered, and kills a process that failed too many in a row (its
  // death then goes through OnExit). Returns when the next probe is due or
  // an answer should be looked for.
  absl::Time ProbeLiveness();
  // Tells the controller that `child` is gone for good; says how that went.
  void ReportToController(const Child& child, const std::string& description);

  // Rebuilds endpoints_ from children_ and rewrites endpoints.json.
  absl::Status Publish();
  // Publish(), saying on the console why endpoints.json could not be written.
  void Republish();
  absl::Status WriteEndpoints() const;
  void Say(const std::string& line) const;

  LocalStackOptions options_;
  StackLayout layout_{options_};  // Reads options_, declared before it.
  std::unique_ptr<StateDirLock> lock_;
  std::unique_ptr<RestartPolicy> policy_;
  std::vector<Child> children_;  // In start order.
  std::vector<ServiceEndpoint> endpoints_;
  std::optional<StackSecurity> security_;  // options_.tls
};

// The last `max_lines` lines of a text file, for error messages.
std::string TailOfFile(const std::string& path, int max_lines);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_LOCAL_STACK_H_
