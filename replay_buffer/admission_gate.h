#ifndef SLUICE_REPLAY_BUFFER_ADMISSION_GATE_H_
#define SLUICE_REPLAY_BUFFER_ADMISSION_GATE_H_

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/replay_buffer_storage.pb.h"

namespace sluice::replay_buffer {

// Why a quarantined worker's call or group is refused (PERMISSION_DENIED).
std::string QuarantineMessage(const std::string& run_id, const std::string& worker_id);
// The same for a quarantined connection ("peer:<address>").
std::string ConnectionQuarantineMessage(const std::string& run_id, const std::string& connection);

// The admission gate's numbers at one instant.
struct GateState {
  int64_t policy_version = 0;   // v
  int64_t accepted = 0;         // see AdmissionGate
  int64_t running = 0;          // live slot leases
  int64_t admission_limit = 0;  // (eta + v + 1) * B
};

// What a worker asks of the gate (RunTable::AcquireSlots, ReleaseSlots).
struct AcquireRequest {
  std::string worker_id;
  uint64_t worker_incarnation = 0;
  // Who asks, as the service can tell (runtime::CallerAttribution): a
  // quarantined connection is refused whatever worker it names. Empty =
  // not known (tests, in-process callers).
  std::string caller;
  // New slots wanted (>= 0; 0 = only renew).
  int32_t num_groups = 0;
  // How long to wait for at least one slot; zero = grant what is free now.
  absl::Duration wait_timeout = absl::ZeroDuration();
  // Leases of this worker to extend by a full TTL.
  std::vector<std::string> renew_lease_ids;
};

struct AcquireResult {
  // One id per granted slot (granted = lease_ids.size()).
  std::vector<std::string> lease_ids;
  // Expiry of the granted and renewed leases (table clock).
  absl::Time lease_expires_at;
  absl::Duration lease_ttl;
  // renew_lease_ids that were unknown, expired or another worker's.
  std::vector<std::string> expired_lease_ids;
  // How long the call waited at the gate.
  absl::Duration waited;
  GateState gate;
};

struct ReleaseRequest {
  std::string worker_id;
  uint64_t worker_incarnation = 0;
  // Leases of worker_id to release; others and unknown ids are ignored.
  std::vector<std::string> lease_ids;
  // Release every lease of worker_id (any incarnation), ignoring lease_ids.
  bool release_all = false;
};

struct ReleaseResult {
  int32_t released = 0;
  int64_t running = 0;
};

// One run's admission gate (AReaL's staleness manager): who may generate a
// group now. With v the latest policy version, B = batch_size_groups and
// eta = max_staleness, a generation slot is granted only while
//
//     accepted + running < (eta + v + 1) * B
//
//   running   live slot leases: granted, not yet inserted, released or
//             expired. A lease belongs to (worker_id, incarnation) and lives
//             lease_ttl from its grant or last renewal.
//   accepted  groups stored (held now or already trained), minus groups that
//             left the table untrained-for-good: evicted as stale, for
//             capacity or for uniform rewards. Without that give-back the
//             gate could deadlock: stale groups would hold capacity that no
//             version update ever frees, since the trainer cannot advance
//             without fresh groups. A gate that starts at version k > 0 (a
//             resumed run) starts with accepted = k * B, as if the k batches
//             before had been generated (AReaL#1388: without it a resumed run
//             generates far ahead and then evicts most of it as stale).
//
// Since the trainer consumes B groups per version, generation never runs
// more than eta versions ahead of consumption.
//
// The gate also keeps who may not generate at all: workers the run's trainer
// quarantined (their groups' log-probs, tokens or versions were forged), for
// the run's life, and connections it quarantined (an unauthenticated caller
// that inserted such groups under some worker id).
//
//   RunTable ──owns──> AdmissionGate      (the arithmetic, the leases, the
//      │                                   quarantine: no I/O, no waiting)
//      └─ journals a WalRecord, then applies it here; waits on its mutex
//         for capacity; times the wait to NextExpiryRealTime().
//
// The gate decides and applies; it never journals. Each record the table
// journals about it is applied by the same calls live and on replay (Grant,
// Release, QuarantineWorkers, AdvanceVersion, OnAccepted), so a replayed
// journal rebuilds the same gate. Lease expiry is not journaled: a restored lease
// gets a fresh TTL and expires again if its worker is gone.
//
// Not thread-safe: guarded by the RunTable's mutex (the table owns one and
// uses it only under its lock). Never blocks.
class AdmissionGate {
 public:
  struct Options {
    // For the quarantine messages.
    std::string run_id;
    // B (> 0) and eta (>= 0), as RunConfig::Validate checks them.
    int32_t batch_size_groups = 0;
    int32_t max_staleness = 0;
    // How long a lease lives from its grant or renewal (> 0).
    absl::Duration lease_ttl = absl::Seconds(60);
    // Time for lease expiry; tests pass a fake clock. Required.
    std::function<absl::Time()> clock = [] { return absl::Now(); };
  };

  // A gate at `initial_policy_version` with accepted = that version * B and
  // no leases. Lease ids get a random prefix, unique across gates and
  // process restarts.
  AdmissionGate(Options options, int64_t initial_policy_version);

  AdmissionGate(const AdmissionGate&) = delete;
  AdmissionGate& operator=(const AdmissionGate&) = delete;

  // ---- The rule -----------------------------------------------------------

  int64_t policy_version() const { return policy_version_; }
  int64_t accepted() const { return accepted_; }
  // Live leases, including expired ones ExpireLeases has not dropped yet.
  int64_t running() const { return static_cast<int64_t>(leases_.size()); }
  // (eta + v + 1) * B.
  int64_t admission_limit() const;
  // Slots free now: admission_limit - accepted - running. Negative when a
  // group was stored without a live lease (an expired one) or capacity was
  // taken back some other way; a grant needs capacity() > 0.
  int64_t capacity() const { return admission_limit() - accepted_ - running(); }
  GateState state() const;

  // Raises v (a lower or equal version is ignored: returns false), which
  // frees B slots per version.
  bool AdvanceVersion(int64_t policy_version);
  // A group was stored: accepted + 1 (its lease, if live, is Released
  // separately).
  void OnAccepted() { ++accepted_; }
  // A stored group left untrained for good (stale, capacity, uniform
  // rewards): accepted - 1, its capacity back to the gate.
  void OnDroppedUntrained() { --accepted_; }

  // ---- Workers and their incarnations -------------------------------------

  // INVALID_ARGUMENT naming the field for a request no gate can serve: no
  // worker_id, num_groups < 0, wait_timeout < 0.
  static absl::Status CheckRequest(const AcquireRequest& request);
  // Whether an AcquireSlots of (worker_id, incarnation) is a new incarnation,
  // to be journaled as a LeasesGranted without ids and applied with Grant:
  // true for a worker never seen or a higher incarnation than seen (a
  // restart). FAILED_PRECONDITION for a lower one (a zombie of an older
  // process). O(1).
  absl::StatusOr<bool> IsNewIncarnation(const std::string& worker_id, uint64_t incarnation) const;

  // ---- Leases -------------------------------------------------------------

  // The expiry a lease granted or renewed now gets: clock() + lease_ttl.
  absl::Time FreshExpiry() const { return options_.clock() + options_.lease_ttl; }
  // The ids the next `count` granted leases get, for the table to journal
  // in a LeasesGranted. Does not reserve them: Grant does.
  std::vector<std::string> NextLeaseIds(int64_t count) const;
  // Applies a LeasesGranted (live or replayed): records the worker's
  // incarnation; a higher one than seen drops the older incarnations'
  // leases; then adds each lease of granted.lease_ids() (or moves its
  // expiry, for an id already live) expiring at `expires_at`, and moves the
  // lease-id counter past them. O(running) when the incarnation rises, else
  // O(ids log running).
  void Grant(const v1::storage::LeasesGranted& granted, absl::Time expires_at);
  // Extends each of `lease_ids` that is live and `worker_id`'s to
  // FreshExpiry(); appends the others (unknown, expired, another worker's)
  // to `not_renewed` when it is not null. O(ids log running).
  void Renew(const std::string& worker_id, const std::vector<std::string>& lease_ids,
             std::vector<std::string>* not_renewed);
  // Drops the leases whose expiry is at or before clock(). O(expired log
  // running).
  void ExpireLeases();
  // True when `lease_id` was live (and is now dropped); an empty or unknown
  // id changes nothing. O(log running).
  bool Release(const std::string& lease_id);
  bool HasLease(const std::string& lease_id) const { return leases_.contains(lease_id); }
  // The live leases `request` releases, for the table to journal: with
  // release_all every lease of request.worker_id (any incarnation), in no
  // particular order, else those of request.lease_ids that are live and
  // request.worker_id's, in request order. O(running) for release_all, else
  // O(ids).
  std::vector<std::string> LeasesToRelease(const ReleaseRequest& request) const;
  // Real time at which the earliest lease expires (absl::Now() plus its
  // remaining time on the gate's clock), for a waiter's deadline: expiry
  // frees capacity but signals nothing. InfiniteFuture without leases.
  absl::Time NextExpiryRealTime() const;

  // ---- Quarantine ---------------------------------------------------------

  // PERMISSION_DENIED (QuarantineMessage / ConnectionQuarantineMessage) when
  // `worker_id` or `caller` (empty = unknown) is quarantined. O(log n).
  absl::Status CheckNotQuarantined(const std::string& worker_id, const std::string& caller) const;
  // The same for a group: PERMISSION_DENIED when any of its trajectories'
  // rollout workers (the first found) or the connection that inserted it
  // (Group.inserted_by) is quarantined. O(trajectories log n) with
  // quarantined workers, else O(log n).
  absl::Status CheckGroupNotQuarantined(const v1::Group& group) const;
  // The ids of `worker_ids` that QuarantineWorkers would add: not empty, not
  // quarantined already, each once, in order. For the table to journal.
  std::vector<std::string> NotQuarantined(const std::vector<std::string>& worker_ids) const;
  // Applies a WorkersQuarantined (live or replayed): the workers are
  // quarantined for good, and every lease of a quarantined worker is dropped
  // at once, as a release would (not journaled one by one: replaying the
  // record drops them again). O(running).
  void QuarantineWorkers(const v1::storage::WorkersQuarantined& quarantined);
  // Quarantines a connection (in memory only: a connection ends with the
  // process); its leases, if it holds any, are left to expire. False for an
  // empty one or one already quarantined.
  bool QuarantineConnection(const std::string& connection);
  const std::set<std::string>& quarantined_workers() const { return quarantined_workers_; }

  // ---- Snapshots ----------------------------------------------------------

  // v, accepted, the leases (without expiry), the incarnations, the lease-id
  // counter and the quarantined workers, into a snapshot's table record.
  void ToSnapshot(v1::storage::TableSnapshot* table) const;
  // Sets them back from a snapshot; each lease expires at FreshExpiry().
  // Connections are not in snapshots.
  void RestoreFromSnapshot(const v1::storage::TableSnapshot& table);

 private:
  struct Lease {
    std::string worker_id;
    uint64_t incarnation = 0;
    absl::Time expires_at;
  };

  void Erase(absl::flat_hash_map<std::string, Lease>::iterator it);
  // Adds the lease, or moves the expiry of a live one.
  void Add(const std::string& id, const std::string& worker_id, uint64_t incarnation,
           absl::Time expires_at);

  const Options options_;
  // Makes lease ids unique across gates and process restarts.
  const std::string lease_id_prefix_;

  int64_t policy_version_ = 0;
  int64_t accepted_ = 0;
  absl::flat_hash_map<std::string, Lease> leases_;
  // (expires_at, lease id): the next expiry in O(1).
  std::set<std::pair<absl::Time, std::string>> lease_expiry_;
  // Newest incarnation seen per worker_id.
  absl::flat_hash_map<std::string, uint64_t> worker_incarnations_;
  int64_t next_lease_number_ = 1;
  std::set<std::string> quarantined_workers_;
  std::set<std::string> quarantined_connections_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_ADMISSION_GATE_H_
