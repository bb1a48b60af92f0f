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
#include "common/subprocess.h"
#include "cli/state_dir.h"
#include "cli/supervisor.h"

namespace sluice::cli {

// The shares of one machine's memory (percent of it, or of its cgroup) that
// `sluice up` gives the services as their --memory-budget. The trainer and
// the rollout workers hold the big allocations: the trainer the weights,
// gradients, AdamW's two moments, the published versions and a training
// batch's activations with their gradients; a worker two copies of the
// weights and a generation batch's KV cache and logits. They get equal
// shares, as an RL step's training and generation batches are of the same
// sequences. The replay buffer holds only token ids, log-probs and versions
// (about 16 bytes a token), so a smaller share holds many batches. What is
// left (5%) is the controller's, the reward server's (its sandboxed
// programs have their own rlimits) and the system's.
struct MemoryShares {
  double trainer = 40;
  double rollout_workers = 40;  // Split evenly among them.
  double replay_buffer = 15;
};

struct LocalStackOptions {
  // Directory holding the sluice-* service binaries (normally the one `sluice`
  // itself is in).
  std::string bin_dir;
  // Where endpoints.json, sluice-up.lock, logs/<service>.log and (by
  // default) the replay buffer's data go; created if missing. One stack per
  // state directory.
  std::string state_dir;
  // The controller's --runs-dir: each run's spec.json, metrics.jsonl,
  // evals.jsonl and summary.json go to <runs_dir>/<run-id>/. Empty =
  // <state_dir>/../runs. Made absolute before it is passed on.
  std::string runs_dir;
  // Rollout workers to start: rollout_worker-0 .. rollout_worker-<N-1>, with
  // worker ids worker-0 .. worker-<N-1> that they keep across restarts. 0
  // starts none (workers started elsewhere can still register with the
  // controller).
  int rollout_workers = 1;
  // The replay buffer's --data-dir. Unset: <state_dir>/replay_buffer, so
  // every acknowledged insert survives a restart of the buffer. Empty or
  // "none": in memory only.
  std::optional<std::string> buffer_data_dir;
  // The controller's, the trainer's and the rollout workers'
  // --allowed-path-roots: where the paths a run spec names may lie. Empty =
  // the working directory (the services run in this process's, and a
  // relative path in a spec resolves against the first root). The state and
  // runs directories are always added. Made absolute before they are passed on.
  std::vector<std::string> allowed_path_roots;
  // When a service dies: restarted with backoff, or given up on (see
  // supervisor.h).
  RestartPolicyOptions restart;
  // When a running service stops answering its health check: killed and
  // restarted (supervisor.h, LivenessOptions).
  LivenessOptions liveness;
  // How long each service may take to report ready and healthy.
  absl::Duration start_timeout = absl::Seconds(60);
  // After SIGTERM, how long a service may drain before it is killed.
  absl::Duration stop_grace = absl::Seconds(15);
  // LibTorch intra-op threads for the trainer and the rollout workers.
  int torch_threads = 1;
  // Passed to every service: "text" or "json".
  std::string log_format = "text";
  // Each service's --memory-budget, as a share of this machine's memory.
  MemoryShares memory_shares;
  // Where deaths, restarts, give-ups and a replaced stale endpoints.json are
  // said, one line each starting with `console_prefix` and ": ". nullptr:
  // nowhere.
  std::ostream* console = &std::cerr;
  std::string console_prefix = "sluice up";
  // Secure the stack (`sluice up --tls`): a local CA and a certificate per
  // service in <state_dir>/tls/ (mutual TLS between the services, each
  // identified by its certificate: worker:<worker-id>, trainer:trainer,
  // controller:controller), and bearer tokens for the users: an operator
  // token (submit, cancel, read) and a viewer token (read only), hashed in
  // <state_dir>/tls/tokens.yaml. endpoints.json names the CA and the
  // operator token, where the CLI finds them; this process dials with them.
  bool tls = false;

  absl::Status Validate() const;
};

// Where one service of the stack can be reached, and how it is doing.
struct ServiceEndpoint {
  std::string name;     // "replay_buffer", "rollout_worker-1"
  std::string kind;     // "replay_buffer", "rollout_worker"
  std::string grpc;     // "127.0.0.1:P"
  std::string metrics;  // "http://127.0.0.1:Q/metrics"
  std::string log_path;
  pid_t pid = 0;        // The live process; 0 while it is not running.
  // "running", "restarting" (waiting out its backoff), "gave_up" (crash
  // loop, or a failure under --restart never) or "exited" (it exited 0 by
  // itself and is not restarted).
  std::string state;
  int restarts = 0;        // Successful restarts.
  std::string last_exit;   // How the previous process ended; empty if none did.
  std::string worker_id;   // Rollout workers: their --worker-id.
};

// What `sluice up --tls` wrote into <state_dir>/tls/.
struct StackSecurity {
  std::string dir;
  std::string ca_cert;              // ca.pem
  std::string tokens_file;          // tokens.yaml: the services' --auth-tokens
  std::string operator_token_file;  // operator.token (0600)
  std::string viewer_token_file;    // viewer.token (0600)
};

// Writes the CA (kept across restarts of the stack), one certificate per
// service name in `names` (rollout workers as worker:<worker id>), and fresh
// operator and viewer tokens.
absl::StatusOr<StackSecurity> WriteStackSecurity(
    const std::string& state_dir, const std::vector<ServiceEndpoint>& services);

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
  static const std::vector<std::string>& ServiceKinds();

  explicit LocalStack(LocalStackOptions options);
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
  std::string endpoints_path() const;
  // The runs directory the controller was given (absolute).
  std::string runs_dir() const;
  // The replay buffer's data directory (absolute); empty when in memory.
  std::string buffer_data_dir() const;
  // The --allowed-path-roots the services get (absolute): the options' (or
  // the working directory), then the state and runs directories.
  std::vector<std::string> allowed_path_roots() const;

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
  std::vector<std::string> FlagsFor(const Child& child) const;
  // The flags telling the controller where the services started before it are.
  std::vector<std::string> ControllerFlags() const;
  // "--memory-budget=40%" for a service that holds a run's memory; empty
  // for the others.
  std::string MemoryBudgetFlag(const std::string& kind) const;

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
