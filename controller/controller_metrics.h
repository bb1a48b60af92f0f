#ifndef SLUICE_CONTROLLER_CONTROLLER_METRICS_H_
#define SLUICE_CONTROLLER_CONTROLLER_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "controller/run_driver.h"

namespace sluice::controller {

// The controller's Prometheus metrics, kept current from run updates:
//
//   sluice_controller_runs{state}                 runs per state (gauge)
//   sluice_run_step{run_id}                       RL steps done (gauge)
//   sluice_run_policy_version{run_id}             latest policy version (gauge)
//   sluice_run_reward_mean{run_id}                mean reward of the last batch (gauge)
//   sluice_run_eval_accuracy{run_id}              latest evaluation accuracy (gauge)
//   sluice_run_generated_tokens_total{run_id}     completion tokens generated (counter)
//   sluice_run_workers_live{run_id}               workers serving the run (gauge)
//   sluice_run_recovery_restarts_total{run_id,service}
//                                                 restarts the run survived (counter)
//   sluice_run_recovery_events_total{run_id,event}
//                                                 the other RecoveryStats counts: event =
//                                                 workers_lost, workers_joined,
//                                                 prompt_leases_expired, prompts_reissued,
//                                                 late_groups_refused, trainer_steps_redone,
//                                                 trainer_resumes, controller_readoptions
//
// Thread-safe; its lock is a leaf (OnRunUpdated runs under a run's lock).
class ControllerMetrics final : public RunObserver {
 public:
  explicit ControllerMetrics(prometheus::Registry& registry);

  void OnRunUpdated(const v1::Run& run) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  prometheus::Family<prometheus::Gauge>& runs_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Gauge>& policy_version_;
  prometheus::Family<prometheus::Gauge>& reward_mean_;
  prometheus::Family<prometheus::Gauge>& eval_accuracy_;
  prometheus::Family<prometheus::Counter>& generated_tokens_;
  prometheus::Family<prometheus::Gauge>& workers_live_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Counter>& recovery_events_;

  // Adds what `total` grew by since it was last seen under `key`.
  void CountLocked(prometheus::Family<prometheus::Counter>& family,
                   const prometheus::Labels& labels, const std::string& key, int64_t total)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, v1::RunState> states_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> tokens_counted_ ABSL_GUARDED_BY(mu_);
  // "<run_id>/<what>" -> the total already counted.
  absl::flat_hash_map<std::string, int64_t> counted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_CONTROLLER_METRICS_H_
