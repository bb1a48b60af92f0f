#ifndef SLUICE_CONTROLLER_PROMPT_FEED_H_
#define SLUICE_CONTROLLER_PROMPT_FEED_H_

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "controller/prompt_feed_journal.h"
#include "sluice/v1/common.pb.h"

namespace sluice::controller {

// Prompts handed to one rollout worker under one lease.
struct PromptLease {
  std::string lease_id;  // Empty when no prompts were handed out.
  std::vector<v1::Prompt> prompts;
  absl::Time expires_at;
};

// Counters of a feed, for progress, RecoveryStats and tests. Cumulative over
// the run: a feed restored from its journal continues them.
struct PromptFeedStats {
  int64_t issued = 0;          // Prompt hand-outs, re-issues included.
  int64_t reissued = 0;        // Hand-outs of abandoned, expired or restored prompts.
  int64_t completed = 0;       // Prompts reported complete (each id once).
  int64_t leases_expired = 0;  // Leases given back unreported: expired, or
                               // their worker came back as a new incarnation.
  // Completion reports of ids that were not outstanding: already completed
  // (a late report of a re-issued prompt, a repeated report) or unknown.
  // Ignored, never counted as completed.
  int64_t completions_ignored = 0;
  int64_t outstanding = 0;  // Leased now, neither completed nor given back.
  int64_t waiting_reissue = 0;  // Given back (or restored) and not yet re-issued.
  int64_t epoch = 0;  // Passes over the pool started so far, minus one.
  int64_t journal_errors = 0;  // Events the journal could not write.
};

// What PromptFeed::Open found in an existing journal.
struct PromptFeedRestore {
  bool restored = false;        // The journal held events: the feed continues them.
  int64_t events = 0;           // Events replayed.
  int64_t reissue_queued = 0;   // Prompts handed out and not completed: re-issued first.
  int64_t torn_tail_bytes = 0;  // A partial last line left by kill -9, dropped.
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
// Durability (Open): every hand-out and every completion is journaled
// before the call returns (PromptFeedJournal: one line, one write(2);
// fdatasync at most every sync_interval), so a controller killed at any
// point restarts with the same feed. A hand-out of fresh prompts is
// recorded as (epoch, position range) of the deterministic order, a
// completion as the ids newly completed:
//
//   {"t":"lease","n":7,"fresh":[[0,24,32]],"reissued":["p3"]}
//   {"t":"done","ids":["p3","p17"]}
//   {"t":"expired","count":1}
//   {"t":"checkpoint","epoch":0,"position":32,"next_lease":8,"issued":..,
//    "reissued":..,"completed":..,"leases_expired":..,"completions_ignored":..,
//    "outstanding":[[0,12],[0,40]]}      (epoch, pool index) pairs
//
// Restoring replays the events: fresh hand-out resumes at the recorded
// epoch and position; every prompt handed out and not completed goes to the
// re-issue queue, in hand-out order, under its id (its old lease is gone; a
// late completion from its first worker still counts, and the buffer
// stores only one group per prompt id); a completed prompt is never handed
// out again. The journal is then rewritten as one checkpoint line (which
// also drops a partial last line), and again every compact_after_events.
//
// The invariants this keeps (docs/run-lifecycle.md, "Prompts"), with
// "prompt" meaning one id, i.e. one pool item in one epoch:
//   - no prompt is trained more than once: the feed never hands out a
//     completed id again, and of the groups of an id handed out more than
//     once (re-issued) the buffer stores the first and refuses the others
//     as DUPLICATE (idempotency key <run_id>/<prompt_id>);
//   - no prompt is silently skipped: every id below the feed's position is
//     completed, leased, or waiting to be re-issued, across restarts; none
//     is dropped without a completion. (A completed prompt whose group the
//     buffer later evicts as stale is not skipped silently: it is counted in
//     groups_evicted_stale. Prompts still out when the run reaches
//     total_steps are never trained: the run ends mid-epoch by design.)
//
// Time is passed in (`now`) so that tests control it. Thread-safe.
class PromptFeed {
 public:
  static constexpr absl::Duration kDefaultLeaseTtl = absl::Seconds(120);

  // `prompts`: the training pool in task order; must not be empty.
  PromptFeed(std::vector<v1::Prompt> prompts, uint64_t seed,
             absl::Duration lease_ttl = kDefaultLeaseTtl);

  // A feed journaled in `journal.path`. When that file already holds
  // events (the controller restarted), continues from them as the class
  // comment says; otherwise starts at the beginning. DATA_LOSS for a journal
  // that contradicts itself or the pool (a complete line that is not an
  // event, a position outside the pool), naming the line; other errors when
  // the file cannot be read or written.
  static absl::StatusOr<std::unique_ptr<PromptFeed>> Open(std::vector<v1::Prompt> prompts,
                                                          uint64_t seed, absl::Duration lease_ttl,
                                                          PromptFeedJournalOptions journal);

  PromptFeed(const PromptFeed&) = delete;
  PromptFeed& operator=(const PromptFeed&) = delete;

  // Up to `max_prompts` (> 0) prompts for `worker_id`: given-back ones first,
  // then fresh ones. Expires overdue leases first. Empty after MarkDone().
  // Journaled before it returns. O(max_prompts + log leases), plus
  // O(log leases) per lease it expires.
  PromptLease Lease(const std::string& worker_id, uint64_t worker_incarnation, int max_prompts,
                    absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Extends a live lease to now + lease_ttl and returns the new expiry;
  // NOT_FOUND when the lease is unknown, expired or has nothing left.
  absl::StatusOr<absl::Time> Renew(const std::string& lease_id, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Prompts whose groups are in the buffer: never handed out again. Unknown
  // or already completed ids are ignored (counted in completions_ignored).
  // A lease left with no prompt out closes (Renew then answers NOT_FOUND).
  // Journaled before it returns. Returns how many were newly completed.
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
  // What Open() restored; all zero for a new feed.
  const PromptFeedRestore& restore() const { return restore_; }

  // fdatasyncs the journal (a graceful controller stop); OK without one.
  absl::Status SyncJournal() ABSL_LOCKS_EXCLUDED(mu_);

  // Why the journal stopped being written (PromptFeedJournal::error: a full
  // disk), OK while it is written (or there is none). Meanwhile the feed
  // goes on in memory and its events are not journaled.
  absl::Status journal_error() const ABSL_LOCKS_EXCLUDED(mu_);
  // When the journal stopped: rewrites it as one checkpoint of the feed as
  // it is now (covering the events it missed), after which events are
  // journaled again. OK when nothing needed repair; else the write's error.
  // O(prompts outstanding).
  absl::Status RepairJournal() ABSL_LOCKS_EXCLUDED(mu_);

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
    // Where it comes from, for the journal's checkpoint: the pass and the
    // pool index, and the order of hand-out (re-issue order on restore).
    int64_t epoch = 0;
    uint32_t pool_index = 0;
    int64_t sequence = 0;
  };

  // fdatasyncs the journal when a sync is due (PromptFeedJournal::BeginSync),
  // outside the lock. Every public call that journals ends with it (through
  // a SyncAfter declared before its lock).
  void SyncIfDue() ABSL_LOCKS_EXCLUDED(mu_);
  struct SyncAfter {
    PromptFeed* feed;
    ~SyncAfter() { feed->SyncIfDue(); }
  };
  void ExpireLeases(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the lease (and its expiry entry) once none of its prompts is out
  // under it any more: completed, or re-issued under another lease.
  void CloseIfDoneLocked(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves the lease's unfinished prompts to the re-issue queue and drops it.
  // Returns how many prompts went back.
  int GiveBack(const std::string& lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the leases back and counts (and journals) those that returned
  // prompts as expired.
  void CountExpiredLocked(const std::vector<std::string>& lease_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartEpoch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next prompt of the order (starting the next epoch when this one is
  // through), its pool index in `pool_index`.
  v1::Prompt NextFresh(uint32_t* pool_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The prompt of `pool_index` as handed out in `epoch` (id suffixed).
  v1::Prompt PromptFor(int64_t epoch, uint32_t pool_index) const;

  // Journal plumbing (no-ops without a journal). A failed write is counted
  // and logged, not returned: the feed goes on, and a prompt whose event was
  // lost is at worst handed out again after a restart, which the buffer's
  // idempotency keys absorb.
  void JournalLocked(const nlohmann::json& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  nlohmann::json CheckpointLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replays Read()'s events into the empty feed, then queues every prompt
  // still out for re-issue.
  absl::Status ReplayLocked(const std::vector<nlohmann::json>& events, const std::string& path)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<v1::Prompt> pool_;
  const uint64_t seed_;
  const absl::Duration lease_ttl_;

  mutable absl::Mutex mu_;
  std::vector<uint32_t> order_ ABSL_GUARDED_BY(mu_);  // Pool indices of this epoch.
  size_t position_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_lease_number_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  // Prompt id -> the prompt while it is leased or waiting to be re-issued.
  absl::flat_hash_map<std::string, Outstanding> outstanding_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> reissue_ ABSL_GUARDED_BY(mu_);  // Ids, oldest first.
  std::map<std::string, LeaseRecord> leases_ ABSL_GUARDED_BY(mu_);
  // (expires_at, lease_id) of every lease in leases_, soonest first: expiry
  // looks at the front only, not at every lease.
  std::set<std::pair<absl::Time, std::string>> lease_expiry_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> incarnations_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  PromptFeedStats stats_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PromptFeedJournal> journal_ ABSL_GUARDED_BY(mu_);
  PromptFeedRestore restore_;  // Set by Open before the feed is shared.
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_PROMPT_FEED_H_
