#ifndef SLUICE_SERVICES_CONTROLLER_PROMPT_FEED_H_
#define SLUICE_SERVICES_CONTROLLER_PROMPT_FEED_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sluice/v1/common.pb.h"

namespace sluice::controller {

// Prompts handed to one rollout worker under one lease.
struct PromptLease {
  std::string lease_id;  // Empty when no prompts were handed out.
  std::vector<v1::Prompt> prompts;
  absl::Time expires_at;
};

// Counters of a feed, for progress and tests.
struct PromptFeedStats {
  int64_t issued = 0;       // Prompt hand-outs, re-issues included.
  int64_t reissued = 0;     // Hand-outs of abandoned or expired prompts.
  int64_t completed = 0;    // Prompts reported complete.
  int64_t outstanding = 0;  // Leased and neither completed nor given back.
  int64_t waiting_reissue = 0;
  int64_t epoch = 0;  // Passes over the pool started so far, minus one.
};

// The training prompts of one run, handed to rollout workers under leases.
//
// Order: the pool is shuffled with the run seed, handed out front to back,
// then reshuffled (seed and epoch number) for the next pass, for ever; the
// run stops asking when it has trained total_steps. A prompt keeps its task
// id in the first pass and gets "<id>-e<k>" in pass k >= 1, so that prompt
// ids (and the group ids and buffer idempotency keys workers derive from
// them) stay unique within the run. Shuffling uses only the raw output of
// mt19937_64, so the order is the same with every standard library.
//
// Leases: every hand-out is a lease of `lease_ttl`. A worker completes
// prompts (their groups are in the buffer), abandons them (handed out again
// before anything new), or renews the lease. Prompts of a lease that expires
// unreported, or of an older incarnation of the same worker, are handed out
// again first, under their original id (a late completion of the old lease
// still counts, and the buffer dedupes a repeated insert).
//
// Time is passed in (`now`) so that tests control it. Thread-safe.
class PromptFeed {
 public:
  static constexpr absl::Duration kDefaultLeaseTtl = absl::Seconds(120);

  // `prompts`: the training pool in task order; must not be empty.
  PromptFeed(std::vector<v1::Prompt> prompts, uint64_t seed,
             absl::Duration lease_ttl = kDefaultLeaseTtl);

  PromptFeed(const PromptFeed&) = delete;
  PromptFeed& operator=(const PromptFeed&) = delete;

  // Up to `max_prompts` (> 0) prompts for `worker_id`: given-back ones first,
  // then fresh ones. Expires overdue leases first. Empty after MarkDone().
  // O(max_prompts + leases).
  PromptLease Lease(const std::string& worker_id, uint64_t worker_incarnation, int max_prompts,
                    absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Extends a live lease to now + lease_ttl and returns the new expiry;
  // NOT_FOUND when the lease is unknown, expired or has nothing left.
  absl::StatusOr<absl::Time> Renew(const std::string& lease_id, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Prompts whose groups are in the buffer: never handed out again. Unknown
  // or already completed ids are ignored. Returns how many were newly
  // completed.
  int Complete(const std::vector<std::string>& prompt_ids) ABSL_LOCKS_EXCLUDED(mu_);

  // Prompts the worker gave up on: handed out again before anything else.
  // Unknown, completed or already given-back ids are ignored.
  void Abandon(const std::vector<std::string>& prompt_ids) ABSL_LOCKS_EXCLUDED(mu_);

  // Notes the worker's current incarnation; a higher one than seen before
  // gives back every prompt leased to the worker's older incarnations.
  void ObserveWorker(const std::string& worker_id, uint64_t worker_incarnation)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The worker is lost (no heartbeat): every lease it holds, of any
  // incarnation, is given back at once rather than at its expiry. Returns
  // the prompts given back. A late completion still counts.
  int GiveBackWorker(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);

  // The run needs no more prompts: Lease() returns nothing from now on.
  void MarkDone() ABSL_LOCKS_EXCLUDED(mu_);
  bool done() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration lease_ttl() const { return lease_ttl_; }
  PromptFeedStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct LeaseRecord {
    std::string worker_id;
    uint64_t incarnation = 0;
    absl::Time expires_at;
    std::vector<std::string> prompt_ids;  // May include ones since completed.
  };
  struct Outstanding {
    v1::Prompt prompt;
    std::string lease_id;  // Empty while waiting to be re-issued.
  };

  void ExpireLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the lease's unfinished prompts to the re-issue queue and drops it.
  void GiveBack(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartEpoch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Prompt NextFresh() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<v1::Prompt> pool_;
  const uint64_t seed_;
  const absl::Duration lease_ttl_;

  mutable absl::Mutex mu_;
  std::vector<uint32_t> order_ ABSL_GUARDED_BY(mu_);  // Pool indices of this epoch.
  size_t position_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_lease_number_ ABSL_GUARDED_BY(mu_) = 1;
  // Prompt id -> the prompt while it is leased or waiting to be re-issued.
  absl::flat_hash_map<std::string, Outstanding> outstanding_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> reissue_ ABSL_GUARDED_BY(mu_);  // Ids, oldest first.
  std::map<std::string, LeaseRecord> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> incarnations_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  PromptFeedStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::controller

#endif  // SLUICE_SERVICES_CONTROLLER_PROMPT_FEED_H_
