#ifndef SLUICE_REWARD_SERVER_REWARD_METRICS_H_
#define SLUICE_REWARD_SERVER_REWARD_METRICS_H_

#include <cstddef>
#include <deque>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "reward_server/sandbox/sandbox_pool.h"
#include "reward_server/scorer.h"

namespace sluice::reward_server {

// The reward server's own metrics, recorded per scored batch:
//
//   sluice_reward_batches_total                     ScoreBatch calls scored
//   sluice_reward_items_total{verifier, error_kind} items, by outcome
//   sluice_reward_item_seconds{verifier}            verification time (histogram)
//   sluice_reward_mean{verifier}                    mean reward of the last
//                                                   `mean_window` items
//   sluice_reward_queued_items                      verifier jobs waiting for a
//                                                   thread (the score queue)
//   sluice_reward_busy_workers                      threads running a verifier
//   sluice_reward_abandoned_workers                 threads left inside a
//                                                   verifier past its deadline
//   sluice_reward_sandbox_slots{state}              the code sandbox pool's
//                                                   slots: busy, idle (started,
//                                                   free), not_started
//   sluice_reward_sandbox_waiting_runs              programs waiting for a slot
//   sluice_reward_sandbox_admitted_programs         programs of the batches
//                                                   being scored (admission)
//   sluice_reward_sandbox_runs_total                programs run in the pool
//   sluice_reward_sandbox_slots_started_total       slots started
//   sluice_reward_sandbox_slots_recycled_total{reason}  replaced between
//                                                   programs: dirty, max_runs
//   sluice_reward_sandbox_slots_killed_total{reason}    killed mid-program:
//                                                   deadline, output_limit,
//                                                   unresponsive, died, protocol
//   sluice_reward_refused_batches_total{reason}     ScoreBatch calls refused
//                                                   with RESOURCE_EXHAUSTED
//                                                   (sandbox_full)
//
// `verifier` is the item's top-level verifier ("math", "composite"); an
// unknown name is labelled "unknown" and an item rejected before any verifier
// "none", so that clients cannot create label values. The mean and the
// histogram leave out items the verifier did not judge (unknown verifier,
// invalid input, retryable errors); a parse failure or timeout counts as
// reward 0. Thread-safe.
class RewardMetrics {
 public:
  // Families are registered on `registry`, which must outlive this object.
  explicit RewardMetrics(prometheus::Registry& registry, size_t mean_window = 1000);

  void RecordBatch(const BatchScores& scores) ABSL_LOCKS_EXCLUDED(mu_);

  // The scorer's state now (Scorer::GetStats), for the queue gauges.
  void RecordScorerStats(const Scorer::Stats& stats);

  // The sandbox pool's state and counters now, and the programs admitted.
  void RecordSandboxPool(const sandbox::SandboxPoolStats& stats, int64_t admitted)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A ScoreBatch refused before scoring (reason: "sandbox_full").
  void RecordRefusedBatch(const std::string& reason);

 private:
  struct PerVerifier {
    prometheus::Histogram* seconds = nullptr;
    prometheus::Gauge* mean = nullptr;
    std::deque<double> recent;  // The last mean_window rewards.
    double recent_sum = 0;
  };

  PerVerifier& ForVerifierLocked(const std::string& verifier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t mean_window_;
  prometheus::Counter& batches_;
  prometheus::Family<prometheus::Counter>& items_;
  prometheus::Family<prometheus::Histogram>& item_seconds_;
  prometheus::Family<prometheus::Gauge>& mean_;
  prometheus::Gauge& queued_items_;
  prometheus::Gauge& busy_workers_;
  prometheus::Gauge& abandoned_workers_;
  prometheus::Family<prometheus::Gauge>& sandbox_slots_;
  prometheus::Gauge& sandbox_waiting_;
  prometheus::Gauge& sandbox_admitted_;
  prometheus::Counter& sandbox_runs_;
  prometheus::Counter& sandbox_started_;
  prometheus::Family<prometheus::Counter>& sandbox_recycled_;
  prometheus::Family<prometheus::Counter>& sandbox_killed_;
  prometheus::Family<prometheus::Counter>& refused_batches_;
  absl::Mutex mu_;
  std::map<std::string, PerVerifier> verifiers_ ABSL_GUARDED_BY(mu_);
  // The pool's counters at the last RecordSandboxPool (Prometheus counters
  // take increments).
  sandbox::SandboxPoolStats last_pool_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_REWARD_METRICS_H_
