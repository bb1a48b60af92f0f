#ifndef SLUICE_CLI_STACK_OPTIONS_H_
#define SLUICE_CLI_STACK_OPTIONS_H_

// What `sluice up` is asked for (LocalStackOptions) and what it tells about
// each service it runs (ServiceEndpoint, endpoints.json): the vocabulary
// shared by the stack's supervisor (local_stack.h), the command lines it
// gives its services (stack_layout.h) and its TLS material
// (stack_security.h).

#include <sys/types.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cli/supervisor.h"

namespace sluice::cli {

// The kinds of service of a local stack, in start order (rollout_worker: as
// many as asked).
const std::vector<std::string>& StackServiceKinds();

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

  // Errors name the option and what to do (a missing service binary: build
  // it or pass --bin-dir).
  absl::Status Validate() const;
};

// Where one service of the stack can be reached, and how it is doing.
struct ServiceEndpoint {
  std::string name;     // "replay_buffer", "rollout_worker-1"
  std::string kind;     // "replay_buffer", "rollout_worker"
  std::string grpc;     // "127.0.0.1:P"
  std::string metrics;  // "http://127.0.0.1:Q/metrics"
  std::string log_path;
  pid_t pid = 0;  // The live process; 0 while it is not running.
  // "running", "restarting" (waiting out its backoff), "gave_up" (crash
  // loop, or a failure under --restart never) or "exited" (it exited 0 by
  // itself and is not restarted).
  std::string state;
  int restarts = 0;       // Successful restarts.
  std::string last_exit;  // How the previous process ended; empty if none did.
  std::string worker_id;  // Rollout workers: their --worker-id.
};

// What `sluice up --tls` wrote into <state_dir>/tls/ (stack_security.h).
struct StackSecurity {
  std::string dir;
  std::string ca_cert;              // ca.pem
  std::string tokens_file;          // tokens.yaml: the services' --auth-tokens
  std::string operator_token_file;  // operator.token (0600)
  std::string viewer_token_file;    // viewer.token (0600)
};

}  // namespace sluice::cli

#endif  // SLUICE_CLI_STACK_OPTIONS_H_
