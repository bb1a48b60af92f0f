#ifndef SLUICE_REPLAY_BUFFER_RUN_TABLE_H_
#define SLUICE_REPLAY_BUFFER_RUN_TABLE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "replay_buffer/admission_gate.h"
#include "replay_buffer/group_validation.h"
#include "replay_buffer/memory_account.h"
#include "replay_buffer/rate_limiter.h"
#include "replay_buffer/run_config.h"
#include "replay_buffer/samplers/sampler.h"
#include "replay_buffer/staleness_histogram.h"
#include "replay_buffer/step_batches.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/replay_buffer.pb.h"
#include "sluice/v1/replay_buffer_storage.pb.h"

namespace sluice::replay_buffer {

// What a call blocked on, or arriving at, a table that is shutting down gets.
inline constexpr char kRunTableShuttingDown[] = "replay buffer is shutting down";

// Where a table's mutations go before they are acknowledged: the replay
// buffer's write-ahead log (durable_buffer.h). A table without one keeps its
// state in memory only.
class Journal {
 public:
  virtual ~Journal() = default;
  // Appends one record, whose bytes are `prefix` followed by the serialized
  // `record` (protobuf merges the two; see GroupStored); `prefix` is taken
  // by value so the record can be appended to it in place. Called under the
  // table's lock, so records are in the order of the mutations they
  // describe; the mutation is applied only when this returns OK. Returns the
  // record's log sequence number.
  virtual absl::StatusOr<uint64_t> Append(std::string prefix,
                                          const v1::storage::WalRecord& record) = 0;
  // Blocks until record `lsn` is as durable as the fsync policy promises.
  // Called without the table's lock, before an insert is acknowledged.
  virtual absl::Status Sync(uint64_t lsn) = 0;
};

// Process-wide settings of every run table.
struct RunTableOptions {
  // How long a generation slot stays "running" without an insert, a release
  // or a renewal.
  absl::Duration lease_ttl = absl::Seconds(60);
  // Time for lease expiry and Group.inserted_at; tests pass a fake clock.
  // Waiting (wait_timeout, Sample timeout) always uses real time.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  // Null: in memory only. Shared by every table of a buffer.
  std::shared_ptr<Journal> journal;
  // The bytes every table of a buffer holds, against its memory budget
  // (memory_account.h): an insert that does not fit is RETRYABLE_ERROR.
  // Null: not counted, no budget. Shared by every table of a buffer.
  std::shared_ptr<MemoryAccount> memory;

  absl::Status Validate() const;
};

// Outcome of inserting one group (sluice.v1.InsertStatus).
enum class InsertStatus {
  kStored,
  kDuplicate,
  kRejectedStale,
  kInvalid,
  kUnknownRun,
  kRetryableError,
  kQuarantined,  // the group's worker is quarantined
};

struct InsertResult {
  std::string idempotency_key;
  InsertStatus status = InsertStatus::kInvalid;
  // Why, for every status but kStored and kDuplicate.
  std::string message;
  // The group's buffer_sequence (kStored and kDuplicate only, else 0).
  int64_t buffer_sequence = 0;
  // The journal record that stored it (0 without a journal); the caller
  // syncs it (Journal::Sync) before acknowledging.
  uint64_t lsn = 0;
};

// Why a group left the table (sluice.v1.EvictionReason).
enum class EvictionReason { kStale, kMaxTimesSampled, kCapacity, kUniformReward };

struct SampleRequest {
  // Groups wanted; 0 = the run's B.
  int32_t batch_size_groups = 0;
  // Staleness bound for this batch; unset = the run's eta. A looser bound
  // than the run's eta is tightened to it.
  std::optional<int32_t> max_staleness;
  // The trainer's version; a newer one than the table's is applied as by
  // UpdatePolicyVersion first. Staleness is measured against it.
  int64_t trainer_policy_version = 0;
  // UNSPECIFIED = the run's sampler; another kind than the run's is
  // INVALID_ARGUMENT in this release.
  v1::SamplerKind sampler_override = v1::SAMPLER_KIND_UNSPECIFIED;
  // How long to wait for enough groups; InfiniteDuration = until shutdown.
  absl::Duration timeout = absl::InfiniteDuration();
  // The trainer step the batch is for (>= 0; 0 = none). See "Trainer
  // steps" in RunTable.
  int64_t step = 0;
  // Dynamic sampling with refill: held groups whose rewards are all equal
  // are evicted first, and the batch is chosen among the others (see
  // "Dynamic sampling" in RunTable).
  bool drop_uniform_reward_groups = false;
};

struct UpdatePrioritiesResult {
  int32_t updated = 0;
  std::vector<std::string> not_found_group_ids;
};

struct SampledGroup {
  // Immutable once stored; shared with the table while it may be sampled
  // again (max_times_sampled > 1), so reading it needs no lock.
  std::shared_ptr<const v1::Group> group;
  // Including this sample (Group.times_sampled of the copy handed out).
  int32_t times_sampled = 0;
  // trainer_policy_version - group.min_policy_version.
  int64_t staleness = 0;
  // This sample was the group's last: it left the table.
  bool removed = false;
};

struct SampleResult {
  // Exactly the requested count.
  std::vector<SampledGroup> groups;
  // Mutation counter of the table when the batch was taken.
  int64_t buffer_version = 0;
  // The version staleness was measured against (the trainer's).
  int64_t policy_version = 0;
  // Groups this call evicted as stale before choosing.
  int64_t evicted_stale_groups = 0;
  // Groups this call evicted for drop_uniform_reward_groups.
  int64_t uniform_reward_groups_dropped = 0;
  // The request's step (0 = none).
  int64_t step = 0;
  // The step had been recorded before: this is its batch again.
  bool replayed = false;
};

struct CommitResult {
  // Highest committed step after the call.
  int64_t committed_step = 0;
  // Groups no recorded step keeps any more (what the call let go of).
  int64_t released_groups = 0;
};

struct UpdateVersionResult {
  int64_t policy_version = 0;
  int64_t evicted_stale_groups = 0;
  int64_t admission_limit = 0;
};

struct EvictionCounts {
  int64_t stale = 0;
  int64_t max_times_sampled = 0;
  int64_t capacity = 0;
  int64_t uniform_reward = 0;
};

// sluice.v1.BufferStats, with the rejected inserts split by cause.
struct RunStats {
  std::string run_id;
  int64_t size_groups = 0;
  int64_t size_trajectories = 0;
  int64_t size_bytes = 0;
  int64_t inserted_groups = 0;
  int64_t duplicate_inserts = 0;
  int64_t rejected_stale_inserts = 0;
  int64_t invalid_inserts = 0;
  int64_t retryable_insert_errors = 0;
  int64_t sampled_groups = 0;
  // Time inserts / samples waited for the rate limiter.
  absl::Duration rate_limiter_insert_blocked;
  absl::Duration rate_limiter_sample_blocked;
  int64_t rate_limiter_inserts = 0;
  int64_t rate_limiter_samples = 0;
  EvictionCounts evictions;
  StalenessHistogram sampled_group_staleness;
  StalenessHistogram sampled_token_staleness;
  GateState gate;
  absl::Duration admission_blocked;
  int64_t buffer_version = 0;
  RunConfig config;
  // Trainer steps (see RunTable, "Trainer steps").
  int64_t retained_groups = 0;
  int64_t retained_bytes = 0;  // of those no longer sampleable (not in size_bytes)
  int64_t committed_step = 0;
  int64_t last_recorded_step = 0;
  int64_t replayed_batches = 0;  // since this process started
};

// One run's table: its scored groups, the staleness gate on generation and
// the staleness filter on consumption. The ReplayBuffer holds one per run.
//
// The admission gate (admission_gate.h, which the table holds as gate_)
// grants a generation slot only while accepted + running < (eta + v + 1) * B,
// so generation never runs more than eta versions ahead of consumption; a
// run that starts at initial_policy_version k > 0 starts with accepted =
// k * B. The gate decides; the table journals each of its mutations before
// applying it, and does the waiting for capacity.
//
// Consumption enforces the bound per group: Sample first evicts every group
// whose staleness (trainer version - min_policy_version) exceeds eta. With
// STALENESS_BOUND_TOKEN the group's newest token counts instead
// (max_policy_version): a long sample that outlived eta versions keeps its
// group, and the trainer drops the tokens more than eta old from the loss.
//
// Inserts. A group is stored (accepted + 1) whether or not its slot lease is
// still live: a slow worker whose lease expired has still produced a valid
// group, and refusing it would waste the generation (the proto's contract).
// If the lease is live it is consumed (running - 1). A group too stale to be
// trained is REJECTED_STALE and not stored; a malformed or poisoned one
// (group_validation.h: non-finite log-probs or rewards, ids outside the
// vocabulary, versions ahead of the table's) INVALID, before any of it is
// journaled. Either
// way a live lease it names is released, since that generation is over.
// Idempotency keys of every group ever stored are kept for the life of the
// table (unbounded: about one key per trained group, ~16k for a 1000-step run
// with B = 16), so a retry is DUPLICATE even after the group was trained.
//
// Thread-safe; every public method may be called from any thread. Blocking
// calls (AcquireSlots with a wait, Sample) wait on the table's mutex with a
// deadline and never sleep; Shutdown wakes them.
//
// Sampling. The run's sampler (samplers/) chooses the batch among the groups
// held; each group's priority comes from buffer.priority_source (mean
// reward, mean |advantage| + priority_epsilon, or the client's value) and can
// be changed with UpdatePriorities. A group leaves at its
// max_times_sampled-th sample.
//
// Rate limiting (rate_limiter.h): a Sample waits until max(batch,
// min_size_to_sample_groups) groups are held and the samples-per-insert
// ratio allows the batch; an Insert waits while the ratio says the trainer
// is behind. Both wait on the table's mutex (woken by the state change that
// may admit them) up to their deadline, then Sample returns
// DEADLINE_EXCEEDED and Insert RETRYABLE_ERROR.
//
// Trainer steps (step_batches.h). A Sample with a step records which groups
// the step's batch took and keeps them (still charged to the memory
// account, never evicted) until CommitTrainedSteps covers the step; a
// Sample for a recorded step gets the same batch again without sampling,
// evicting or counting anything. Steps are recorded in order; a step
// further ahead than the next, or one already committed, is
// FAILED_PRECONDITION. An undelivered step batch is not put back: the
// trainer's retry for the step gets it.
//
// Dynamic sampling (AlgorithmConfig.dynamic_sampling REFILL). A Sample with
// drop_uniform_reward_groups first evicts every held group whose
// trajectories' rewards are all equal (no group-relative advantage),
// journaled with the sequences it evicted, and gives each one's capacity back
// to the gate as a stale eviction does; it then waits for, and chooses
// among, the other groups only. So the trainer consumes B groups per
// version, as the gate assumes, while generation replaces the uniform ones,
// and a step's recorded batch is its B informative groups (a replay returns
// exactly them). Whether a group is uniform is decided once, when it is
// stored (Item.uniform_rewards), and the uniform ones held are indexed, so
// the eviction is O(evicted log n).
//
// Durability. With a Journal (RunTableOptions.journal), every mutation is
// appended to it as a storage::WalRecord, under the lock and before it is
// applied; an insert is acknowledged after Journal::Sync. Records describe
// outcomes (which group got which sequence, which groups a batch took), so
// ApplyRecord replays them without re-deciding anything. Snapshot copies the
// state under the lock and serializes it outside; Restore rebuilds a table
// from a snapshot. Leases survive a restart (they are logged), with a fresh
// TTL from the restore.
class RunTable {
 public:
  // INVALID_ARGUMENT when config or options do not validate. With a
  // journal, the creation is journaled (a `configured` record) unless
  // `replayed_lsn` > 0: the table is being rebuilt from that record.
  static absl::StatusOr<std::unique_ptr<RunTable>> Create(RunConfig config,
                                                          RunTableOptions options = {},
                                                          uint64_t replayed_lsn = 0);

  // A table in the state a snapshot describes: `table` and its items, oldest
  // first. INVALID_ARGUMENT / DATA_LOSS for a snapshot that does not add up.
  static absl::StatusOr<std::unique_ptr<RunTable>> Restore(
      const v1::storage::TableSnapshot& table, std::vector<v1::storage::SnapshotItem> items,
      RunTableOptions options);

  RunTable(const RunTable&) = delete;
  RunTable& operator=(const RunTable&) = delete;
  // Gives the bytes it holds back to the memory account.
  ~RunTable();

  const std::string& run_id() const { return run_id_; }

  // Applies a ConfigureRun for an existing run: B, eta and G cannot change
  // (FAILED_PRECONDITION naming the field: the gate's arithmetic and the
  // stored groups depend on them); the buffer config is replaced and a higher
  // initial_policy_version is applied as by UpdatePolicyVersion.
  absl::Status Reconfigure(const RunConfig& config) ABSL_LOCKS_EXCLUDED(mu_);

  // The admission gate. First drops expired leases; a higher incarnation of
  // the worker than seen before drops the older incarnations' leases, a lower
  // one is FAILED_PRECONDITION (a zombie). Renews renew_lease_ids. Then grants
  // min(num_groups, capacity) slots; when none is free and wait_timeout > 0,
  // blocks until capacity appears (a version update, an eviction, a release
  // or expiry, a rejected insert) and grants what is free then, or grants 0
  // when wait_timeout passes. UNAVAILABLE after Shutdown (also when it
  // happens during the wait). INVALID_ARGUMENT for a bad request.
  // O(running) per call when an incarnation changes, else O(log running).
  absl::StatusOr<AcquireResult> AcquireSlots(const AcquireRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops leases of request.worker_id without inserting (aborted generation)
  // and wakes waiting acquirers. Never blocks. O(running) for release_all.
  ReleaseResult ReleaseSlots(const ReleaseRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Validates and stores one group (see "Inserts" above): recomputes min/max
  // policy version from the trajectories, sets buffer_sequence, inserted_at
  // and times_sampled = 0. Blocks only for the rate limiter, up to
  // `rate_limit_wait` (then RETRYABLE_ERROR). RETRYABLE_ERROR, without
  // waiting, when storing it would take the buffer past its memory budget
  // (RunTableOptions.memory). O(tokens) outside the lock, O(log n) under it.
  // After Shutdown: RETRYABLE_ERROR.
  InsertResult Insert(v1::Group group, absl::Duration rate_limit_wait = absl::Seconds(30))
      ABSL_LOCKS_EXCLUDED(mu_);

  // Evicts every group staler than the request's bound, then, once at least
  // max(batch, min_size_to_sample_groups) groups are held and the rate
  // limiter allows it, has the sampler choose the batch and records their
  // staleness. Blocks until then; DEADLINE_EXCEEDED (saying what it waited
  // for) when request.timeout passes first. INVALID_ARGUMENT for a bad
  // request, UNAVAILABLE after Shutdown.
  //
  // With request.step > 0 (see "Trainer steps"): a recorded step returns its
  // batch at once (replayed); the next step is sampled as above and
  // recorded; a committed step or one beyond the next is
  // FAILED_PRECONDITION naming the run and the steps.
  absl::StatusOr<SampleResult> Sample(const SampleRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Puts back a batch that could not be delivered (the trainer went away
  // between Sample and the write), as if it had not been sampled: times
  // sampled, counters and histograms are restored and removed groups return
  // to their place in the order. Groups evicted in the meantime stay evicted.
  // A step's batch (batch.step > 0) stays recorded instead: nothing changes.
  void ReturnUndelivered(const SampleResult& batch) ABSL_LOCKS_EXCLUDED(mu_);

  // The trainer's checkpoint covers every step up to `step`: lets go of
  // their batches (journaled). A step at or below the committed one changes
  // nothing; one beyond the last recorded moves the next step to step + 1.
  // INVALID_ARGUMENT for a negative step. Never blocks; O(groups let go).
  absl::StatusOr<CommitResult> CommitTrainedSteps(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // Raises the policy version (a lower or equal one is ignored and the
  // current one returned), evicts the groups that became stale, which gives
  // their capacity back, and wakes waiting acquirers. INVALID_ARGUMENT for a
  // negative version.
  absl::StatusOr<UpdateVersionResult> UpdatePolicyVersion(int64_t policy_version)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Quarantines rollout workers (the trainer's rollout verification found
  // their groups forged): journaled, never lifted for the run. Drops their
  // generation slots (waking acquirers); later AcquireSlots of theirs are
  // PERMISSION_DENIED and their groups' inserts kQuarantined. Returns the
  // ids that were not quarantined before. Never blocks; O(running).
  absl::StatusOr<std::vector<std::string>> QuarantineWorkers(
      const std::vector<std::string>& worker_ids) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> QuarantinedWorkers() const ABSL_LOCKS_EXCLUDED(mu_);
  // Quarantines connections (Group.inserted_by "peer:<address>"): the
  // verification failed groups that a caller nobody authenticated inserted
  // under some worker id, which proves nothing of that worker. Later
  // inserts of groups that connection inserts are kQuarantined, and its
  // AcquireSlots (AcquireRequest.caller) PERMISSION_DENIED; the worker it
  // named is left alone. In memory only (a connection ends with the
  // process). Returns those not quarantined before. O(connections).
  std::vector<std::string> QuarantineConnections(const std::vector<std::string>& connections)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sets the priority of held groups, by group_id (finite and >= 0);
  // group ids not held are reported. INVALID_ARGUMENT naming the group for
  // a bad value (nothing is changed then).
  absl::StatusOr<UpdatePrioritiesResult> UpdatePriorities(
      const std::vector<std::pair<std::string, double>>& priorities) ABSL_LOCKS_EXCLUDED(mu_);

  // A consistent snapshot (one lock). Drops expired leases first.
  RunStats Stats() ABSL_LOCKS_EXCLUDED(mu_);

  // The table's state as snapshot records: the TableSnapshot (with
  // covered_lsn = the last record this table appended) and its items, oldest
  // first. Copies pointers under the lock; the caller serializes.
  struct SnapshotData {
    v1::storage::TableSnapshot table;
    struct Item {
      std::shared_ptr<const v1::Group> group;
      int32_t times_sampled = 0;
      double priority = 0;
      // Kept only for recorded steps (after the held items).
      bool retained_only = false;
    };
    std::vector<Item> items;
  };
  SnapshotData Snapshot() ABSL_LOCKS_EXCLUDED(mu_);

  // Applies one journal record of this run during restore (never journals).
  // Records with lsn <= the restored snapshot's covered_lsn are skipped.
  // DATA_LOSS naming the lsn for a record that contradicts the state.
  absl::Status ApplyRecord(uint64_t lsn, const v1::storage::WalRecord& record)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every blocked call (they return UNAVAILABLE) and makes later
  // AcquireSlots/Sample return UNAVAILABLE and inserts RETRYABLE_ERROR.
  // Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A stored group and the table's bookkeeping about it.
  struct Item {
    std::shared_ptr<const v1::Group> group;
    int64_t min_policy_version = 0;
    int64_t max_policy_version = 0;
    int32_t times_sampled = 0;
    double priority = 0;
    int64_t size_bytes = 0;
    int64_t trajectories = 0;
    // (policy version, completion tokens generated with it), ascending:
    // the token staleness histogram in O(versions) rather than O(tokens).
    std::vector<std::pair<int64_t, int64_t>> tokens_per_version;
    // Every trajectory has the same reward (see "Dynamic sampling").
    bool uniform_rewards = false;
  };

  RunTable(RunConfig config, RunTableOptions options, std::unique_ptr<Sampler> sampler);

  // What Insert checks a group against (group_validation.h). Reads the
  // atomic copies below, so Insert validates without taking mu_ (a lock per
  // insert more was measurable next to validation itself).
  GroupLimits CurrentGroupLimits() const;
  // Sets those copies from `config`; called wherever config_ changes.
  void SetGroupLimitsLocked(const RunConfig& config) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Item for a validated group (everything but times_sampled, priority).
  static Item MakeItem(std::shared_ptr<const v1::Group> group);
  // The sampler's priority for a group under the current config.
  double PriorityForLocked(const v1::Group& group) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the sampler is given for `item`: its priority, or for
  // SAMPLER_KIND_OLDEST_POLICY its min_policy_version.
  static double SamplerPriority(v1::SamplerKind kind, const Item& item);

  // Appends a record to the journal (no-op without one); the mutation it
  // describes must only be applied on OK.
  absl::StatusOr<uint64_t> JournalLocked(v1::storage::WalRecord& record,
                                         std::string prefix = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Await conditions.
  bool CanGrantOrShutdown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanInsertOrShutdown() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct SampleWait {
    const RunTable* table;
    int64_t needed;
    // Only groups with a reward signal count (drop_uniform_reward_groups).
    bool informative_only = false;
  };
  static bool CanSampleOrShutdown(SampleWait* wait) ABSL_NO_THREAD_SAFETY_ANALYSIS;

  // Journals and drops the leases (not consumed by an insert).
  absl::Status ReleaseLeasesLocked(const std::vector<std::string>& lease_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Journals and applies a version (monotonic), evicting what it made stale;
  // returns the number evicted.
  absl::StatusOr<int64_t> AdvanceVersionLocked(int64_t policy_version)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t ApplyVersionLocked(int64_t policy_version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The version a group's staleness is measured from: its oldest token's
  // (STALENESS_BOUND_GROUP) or its newest token's (STALENESS_BOUND_TOKEN).
  int64_t StalenessVersion(const Item& item) const {
    return staleness_bound_ == v1::STALENESS_BOUND_TOKEN ? item.max_policy_version
                                                         : item.min_policy_version;
  }
  // Evicts groups with reference_version - StalenessVersion > max_staleness.
  int64_t EvictStaleLocked(int64_t reference_version, int64_t max_staleness)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether EvictStaleLocked would evict anything.
  bool HasStaleLocked(int64_t reference_version, int64_t max_staleness) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the oldest groups beyond buffer.capacity_groups (0 = unbounded).
  void EnforceCapacityLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A group left untrained: capacity back to the gate and the limiter.
  void DropUntrainedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Journals and evicts the held groups whose rewards are all equal;
  // returns how many.
  absl::StatusOr<int64_t> EvictUniformLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyUniformEvictedLocked(const std::vector<int64_t>& sequences)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `charged`: the group's bytes are already in the memory account (an
  // insert's TryCharge); else they are charged here (a replay).
  void ApplyStoredLocked(std::shared_ptr<const v1::Group> group, Item item, int64_t sequence,
                         const std::string& consumed_lease_id, bool charged = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRefusedLocked(v1::InsertStatus status, const std::string& lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands out `sequences` (held) as one batch; fills result->groups. With
  // step > 0 the batch is recorded for that step.
  void ApplySampledLocked(int64_t trainer_version, const std::vector<int64_t>& sequences,
                          int64_t step, SampleResult* result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a Sample of `step` (> 0): its recorded batch, nullopt when it is the
  // next step to sample, FAILED_PRECONDITION when it is gone or ahead.
  absl::StatusOr<std::optional<SampleResult>> RecordedStepLocked(int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Lets go of the batches up to `step`; returns the groups released.
  int64_t ApplyCommittedLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyReturnedLocked(const v1::storage::BatchReturned& returned,
                           std::vector<Item>* items) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyConfigLocked(const RunConfig& config, std::unique_ptr<Sampler> sampler)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyPrioritiesLocked(const v1::storage::PrioritiesUpdated& priorities)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Holds `item`; charges its bytes to the memory account unless `charged`.
  void AddItemLocked(int64_t sequence, Item item, bool charged = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveItemLocked(int64_t sequence, EvictionReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordSampleLocked(const Item& item, int64_t staleness, int64_t sign)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Fixed at creation (Reconfigure refuses to change them).
  const std::string run_id_;
  const int32_t batch_size_groups_;
  const int32_t max_staleness_;
  const v1::StalenessBound staleness_bound_;  // resolved: GROUP or TOKEN
  const int32_t group_size_;
  const RunTableOptions options_;

  // config_'s vocab_size and reward range (unset: -inf / +inf), written
  // under mu_, read by Insert without it. A reconfigure racing an insert
  // may check it against either configuration.
  std::atomic<int64_t> vocab_size_{0};
  std::atomic<double> min_reward_{-std::numeric_limits<double>::infinity()};
  std::atomic<double> max_reward_{std::numeric_limits<double>::infinity()};

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  RunConfig config_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Sampler> sampler_ ABSL_GUARDED_BY(mu_);
  RateLimiter rate_limiter_ ABSL_GUARDED_BY(mu_);
  // Largest client-set priority seen (the default for groups without one).
  double max_client_priority_ ABSL_GUARDED_BY(mu_) = 0;
  // LSN of the last record this table journaled or replayed.
  uint64_t last_lsn_ ABSL_GUARDED_BY(mu_) = 0;

  // v, accepted, the leases and the quarantine; the table journals what
  // changes them and waits for its capacity (admission_blocked_).
  AdmissionGate gate_ ABSL_GUARDED_BY(mu_);
  absl::Duration admission_blocked_ ABSL_GUARDED_BY(mu_);
  absl::Duration insert_blocked_ ABSL_GUARDED_BY(mu_);
  absl::Duration sample_blocked_ ABSL_GUARDED_BY(mu_);

  // The groups, by buffer_sequence (ascending = insertion order).
  absl::btree_map<int64_t, Item> items_ ABSL_GUARDED_BY(mu_);
  // (StalenessVersion, buffer_sequence): stale eviction in O(evicted log n).
  std::set<std::pair<int64_t, int64_t>> by_staleness_version_ ABSL_GUARDED_BY(mu_);
  // Sequences of the held groups whose rewards are all equal.
  std::set<int64_t> uniform_items_ ABSL_GUARDED_BY(mu_);
  // group_id -> buffer_sequence of the groups held (UpdatePriorities).
  absl::flat_hash_map<std::string, int64_t> held_group_ids_ ABSL_GUARDED_BY(mu_);
  // Idempotency key -> buffer_sequence of every group ever stored.
  absl::flat_hash_map<std::string, int64_t> stored_keys_ ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t buffer_version_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t size_trajectories_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t size_bytes_ ABSL_GUARDED_BY(mu_) = 0;

  // The trainer steps' batches, and the bytes of their groups that are no
  // longer in items_ (still charged to the memory account).
  StepBatches steps_ ABSL_GUARDED_BY(mu_);
  int64_t retained_only_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t replayed_batches_ ABSL_GUARDED_BY(mu_) = 0;

  // Counters.
  int64_t inserted_groups_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t duplicate_inserts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rejected_stale_inserts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t invalid_inserts_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retryable_insert_errors_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sampled_groups_ ABSL_GUARDED_BY(mu_) = 0;
  EvictionCounts evictions_ ABSL_GUARDED_BY(mu_);
  StalenessHistogram sampled_group_staleness_ ABSL_GUARDED_BY(mu_);
  StalenessHistogram sampled_token_staleness_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_RUN_TABLE_H_
