#ifndef SLUICE_CLI_SUPERVISOR_H_
#define SLUICE_CLI_SUPERVISOR_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/subprocess.h"

namespace sluice::cli {

// What `sluice up` does when one of its services stops, as Kubernetes does
// for a pod's containers (restartPolicy OnFailure, CrashLoopBackOff):
//
//   - A failure (a nonzero exit, a signal, a start that did not come up) is
//     restarted after a backoff that doubles with each failure within
//     `window`: initial_backoff, 2x, 4x, ... up to max_backoff. Failures older
//     than `window` are forgotten, so a service that ran fine for a while
//     starts again from initial_backoff.
//   - More than `max_restarts` failures within `window` is a crash loop: the
//     service is given up on. So is any failure under --restart never.
//   - A clean exit (code 0) is no failure and is not restarted: the service
//     chose to stop (a worker being scaled down, a SIGTERM sent to it
//     directly). Exits during the stack's own stop never reach the policy.
//
// This class only decides; LocalStack starts and stops the processes and
// says what happens on the console.
struct RestartPolicyOptions {
  // --restart on-failure (true) or never (false).
  bool restart_on_failure = true;
  // Restarts allowed within `window`; the next failure gives up.
  int max_restarts = 5;
  absl::Duration window = absl::Minutes(2);
  // Wait before the first restart; doubles with each failure in `window`.
  absl::Duration initial_backoff = absl::Seconds(1);
  absl::Duration max_backoff = absl::Seconds(30);

  // Messages name the option and the value refused.
  absl::Status Validate() const;
};

// One death (or failed start) of a service, as the console and the give-up
// report show it.
struct ServiceFailure {
  absl::Time at;
  // "pid 1234 was killed by signal 9 (SIGKILL)", "failed to start: ...".
  std::string description;
};

struct RestartDecision {
  enum class Action { kRestart, kGiveUp };
  Action action = Action::kRestart;
  // kRestart: how long to wait before starting it again.
  absl::Duration delay;
  // kRestart: which restart this is within the window, 1..max_restarts.
  int restart_in_window = 0;
  // kGiveUp: why, e.g. "it failed 6 times within 2m, more than the 5
  // restarts allowed" or "--restart never".
  std::string give_up_reason;
  // The failures within the window (under --restart never: this one), oldest
  // first; for the give-up report.
  std::vector<ServiceFailure> recent_failures;
};

// The restart policy above, per service name. The clock is injected so that
// tests step time by hand.
//
// Thread-compatible: LocalStack drives it from its supervising thread.
class RestartPolicy {
 public:
  using Clock = std::function<absl::Time()>;

  // `options` must be valid (Validate()).
  explicit RestartPolicy(RestartPolicyOptions options, Clock clock = [] { return absl::Now(); });

  // Records that `service` failed now (`description` says how) and decides.
  // After kGiveUp the caller should not ask again about that service.
  // O(failures within the window).
  RestartDecision OnFailure(const std::string& service, std::string description);

  // Records a successful restart of `service` (it is SERVING again).
  void OnRestarted(const std::string& service);

  // Successful restarts of `service` since the stack started.
  int restarts(const std::string& service) const;

  const RestartPolicyOptions& options() const { return options_; }

  // "restart 2 of 5 allowed in 2m".
  std::string DescribeRestart(const RestartDecision& decision) const;

 private:
  struct History {
    std::vector<ServiceFailure> failures;  // Within the window, oldest first.
    int restarts = 0;
  };

  RestartPolicyOptions options_;
  Clock clock_;
  std::map<std::string, History> histories_;
};

// What `sluice up` does about a service that is alive but does not answer (a
// process stopped with SIGSTOP, a deadlock): as Kubernetes' livenessProbe
// with a gRPC health check, every `period` each running service is asked for
// its health; no answer within `timeout` (or a refused connection) is one
// failure, and `failures` of them in a row get the process killed (SIGKILL)
// and handed to the restart policy like any other death. An answer of any
// kind resets the count: NOT_SERVING is the service saying it cannot work
// now (a buffer that cannot write), which a restart does not mend; liveness
// asks only whether the process answers at all. A period of zero turns the
// check off.
struct LivenessOptions {
  absl::Duration period = absl::Seconds(5);
  absl::Duration timeout = absl::Seconds(2);
  int failures = 3;

  // Messages name the flag (--liveness-period, ...) and the value refused.
  absl::Status Validate() const;
  bool enabled() const { return period > absl::ZeroDuration(); }
};

// Counts one service's consecutive liveness failures. Thread-compatible.
class LivenessCount {
 public:
  explicit LivenessCount(const LivenessOptions& options) : options_(options) {}

  // One probe's outcome. Returns true when the service has now failed
  // options.failures probes in a row and should be killed; the count then
  // starts again. `error` (for a failure) is kept for Describe.
  bool OnProbe(bool answered, const std::string& error);
  int consecutive_failures() const { return failures_; }
  // "did not answer its health check within 2s, 3 times in a row (last:
  // deadline exceeded)", for the console and the restart's description.
  std::string Describe() const;

 private:
  LivenessOptions options_;
  int failures_ = 0;
  int last_run_ = 0;  // The length of the run of failures that fired.
  std::string last_error_;
};

// Whether a service's exit, outside the stack's own stop, is a failure:
// anything but exit code 0.
bool IsFailure(const ExitStatus& exit);

// "exited with code 3", "was killed by signal 9 (SIGKILL)".
std::string DescribeExit(const ExitStatus& exit);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_SUPERVISOR_H_
