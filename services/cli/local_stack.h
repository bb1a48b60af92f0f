#ifndef SLUICE_SERVICES_CLI_LOCAL_STACK_H_
#define SLUICE_SERVICES_CLI_LOCAL_STACK_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

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
  // Where endpoints.json and logs/<service>.log go; created if missing.
  std::string state_dir;
  // The controller's --runs-dir: each run's spec.json, metrics.jsonl,
  // evals.jsonl and summary.json go to <runs_dir>/<run-id>/. Empty =
  // <state_dir>/../runs. Made absolute before it is passed on.
  std::string runs_dir;
  // How long each service may take to report ready and healthy.
  absl::Duration start_timeout = absl::Seconds(60);
  // After SIGTERM, how long a service may drain before it is killed.
  absl::Duration stop_grace = absl::Seconds(15);
  // LibTorch intra-op threads for the trainer and the rollout worker.
  int torch_threads = 1;
  // Passed to every service: "text" or "json".
  std::string log_format = "text";
  // Each service's --memory-budget, as a share of this machine's memory.
  MemoryShares memory_shares;

  absl::Status Validate() const;
};

// Where one running service can be reached.
struct ServiceEndpoint {
  std::string name;     // "replay_buffer"
  std::string grpc;     // "127.0.0.1:P"
  std::string metrics;  // "http://127.0.0.1:Q/metrics"
  std::string log_path;
  pid_t pid = 0;
};

// The embedded default deployment: all five services as child processes on
// loopback, each on a free port it picked itself (no port race), reported
// back on a pipe once it serves.
//
// Services start one at a time in dependency order (reward server, replay
// buffer, trainer, rollout worker, controller), each only after the previous
// one answered its health check, and stop in reverse order. The controller
// starts last and is given the others' addresses (--trainer-address,
// --replay-buffer-address, --reward-server-address,
// --rollout-worker-addresses) and --runs-dir. Children get
// SIGTERM if this process dies, so a crashed supervisor leaves nothing behind.
//
// Thread-compatible; one thread drives it.
class LocalStack {
 public:
  // Service names in start order; also the keys of endpoints.json.
  static const std::vector<std::string>& ServiceNames();

  explicit LocalStack(LocalStackOptions options);
  // Stops whatever is still running.
  ~LocalStack();

  // Starts every service and waits until each is SERVING, then writes
  // <state_dir>/endpoints.json. On failure stops what it started and returns
  // an error naming the service, why it failed and the end of its log.
  absl::Status Start();

  const std::vector<ServiceEndpoint>& endpoints() const { return endpoints_; }
  std::string endpoints_path() const;
  // The runs directory the controller was given (absolute).
  std::string runs_dir() const;

  // Blocks until SIGTERM/SIGINT arrives (returns OK and the signal's name in
  // `*reason`) or a service exits (returns an error naming it, its exit status
  // and the end of its log). Both signals must be blocked in every thread
  // (runtime::BlockTerminationSignals) so that they are read here.
  //
  // `wake_fd` (optional, e.g. an eventfd): when it becomes readable Supervise
  // returns OK with `*reason` = "woken", so another thread that finished its
  // work (a watched run ended) can end the supervision.
  absl::Status Supervise(std::string* reason, int wake_fd = -1);

  // Stops every service, last started first: SIGTERM, then SIGKILL after
  // stop_grace. Removes endpoints.json. Returns an error listing services
  // that did not exit cleanly. Idempotent.
  absl::Status Stop();

 private:
  struct Child {
    ServiceEndpoint endpoint;
    std::unique_ptr<Subprocess> process;
  };

  absl::Status StartOne(const std::string& name);
  // The flags telling the controller where the services started before it are.
  std::vector<std::string> ControllerFlags() const;
  // "--memory-budget=40%" for a service that holds a run's memory; empty
  // for the others.
  std::string MemoryBudgetFlag(const std::string& name) const;
  absl::Status WriteEndpoints() const;

  LocalStackOptions options_;
  std::vector<Child> children_;
  std::vector<ServiceEndpoint> endpoints_;
};

// The last `max_lines` lines of a text file, for error messages.
std::string TailOfFile(const std::string& path, int max_lines);

}  // namespace sluice::cli

#endif  // SLUICE_SERVICES_CLI_LOCAL_STACK_H_
