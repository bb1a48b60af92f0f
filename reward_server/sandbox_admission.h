#ifndef SLUICE_REWARD_SERVER_SANDBOX_ADMISSION_H_
#define SLUICE_REWARD_SERVER_SANDBOX_ADMISSION_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "reward_server/scorer.h"

namespace sluice::reward_server {

struct SandboxAdmissionOptions {
  // Programs the sandbox pool runs at once.
  int slots = 2;
  // Programs admitted beyond the slots, waiting for one. A batch arriving
  // when slots + max_queued programs are already admitted is refused; an
  // idle server admits any batch, however large.
  int max_queued = 64;
  // The retry hint: the admitted programs' expected wait (admitted / slots
  // x the pool's mean run time), within [min_retry_after, max_retry_after].
  absl::Duration min_retry_after = absl::Milliseconds(100);
  absl::Duration max_retry_after = absl::Seconds(30);

  // INVALID_ARGUMENT naming the field.
  absl::Status Validate() const;
};

// Backpressure for the code sandbox: counts the sandboxed programs of the
// batches being scored, and refuses a batch (RESOURCE_EXHAUSTED with a
// retry hint) when that backlog is full, rather than letting its items wait
// in the score queue until their deadline. Thread-safe.
class SandboxAdmission {
 public:
  // `mean_run_time` (may be null) gives the pool's recent mean program time
  // for the hint; without it, or before any run, 100 ms per program.
  SandboxAdmission(SandboxAdmissionOptions options,
                   std::function<absl::Duration()> mean_run_time = nullptr);

  // Admits `programs` more (0 always passes). RESOURCE_EXHAUSTED, carrying
  // WithRetryAfter's hint and saying "retry after N ms", when
  // admitted + programs > slots + max_queued and something is admitted.
  absl::Status TryAdmit(int64_t programs) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns what TryAdmit admitted.
  void Release(int64_t programs) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t admitted() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t refused() const ABSL_LOCKS_EXCLUDED(mu_);
  const SandboxAdmissionOptions& options() const { return options_; }

 private:
  const SandboxAdmissionOptions options_;
  const std::function<absl::Duration()> mean_run_time_;
  mutable absl::Mutex mu_;
  int64_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

// The sandboxed programs scoring `items` runs: one per item whose verifier
// is `sandboxed_verifier`, or whose verifier is empty while `composition`
// names it.
int64_t CountSandboxedPrograms(const std::vector<ScoreItem>& items,
                               const std::vector<WeightedVerifier>& composition,
                               const std::string& sandboxed_verifier = "code");

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_SANDBOX_ADMISSION_H_
