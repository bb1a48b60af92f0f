#ifndef SLUICE_SERVICES_CLIENTS_GROUP_INSERTER_H_
#define SLUICE_SERVICES_CLIENTS_GROUP_INSERTER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/clients/clients.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace sluice::clients {

// True for the RPC codes after which InsertGroups is retried. A retry resends
// every group not yet confirmed under the same idempotency key, so it is safe
// whatever happened to the lost call (the buffer answers DUPLICATE for a group
// it already stored):
//
//   UNAVAILABLE         the buffer is down, restarting or unreachable.
//   CANCELLED           the stream was cut (the buffer shutting down cancels
//                       open streams).
//   DEADLINE_EXCEEDED   one call ran out of time; the Insert as a whole still
//                       has its own deadline.
//   RESOURCE_EXHAUSTED  the buffer is overloaded. (gRPC also says this for a
//                       request over the message size limit, which no retry
//                       cures; the deadline ends that case.)
//   ABORTED             a conflict the caller is expected to retry.
//   INTERNAL, UNKNOWN   what gRPC reports when the transport breaks mid-call
//                       (RST_STREAM, "Stream removed") or the server dies
//                       inside the handler; an ack may have been lost, which
//                       the idempotency keys make harmless. A real server
//                       bug keeps failing and the attempt limit ends it.
//
// Every other code is fatal: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
// FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED, UNIMPLEMENTED,
// OUT_OF_RANGE, DATA_LOSS. They say the client and the buffer disagree about
// the protocol, the deployment or identity, which the next attempt (or the
// next batch) would meet again.
bool IsRetryableInsertError(absl::StatusCode code);

struct GroupInserterOptions {
  // Bound on one Insert as a whole: no attempt starts, and no backoff sleeps,
  // past it. (A call already in flight ends by the client's own per-call
  // timeout, which ReplayBufferClient::InsertGroups does not take.)
  absl::Duration deadline = absl::Seconds(60);
  // InsertGroups calls per Insert, the first included (>= 1).
  int max_attempts = 10;
  // Backoff before the n-th retry: min(max_backoff, initial_backoff *
  // backoff_multiplier^(n-1)), then shortened by up to `jitter` of itself
  // (a uniform draw), so clients that failed together spread out.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  double backoff_multiplier = 2.0;
  // In [0, 1]; 0 = no jitter.
  double jitter = 0.2;
  // Seed of the jitter. Give each client its own (a hash of the worker id
  // and incarnation, say): with one seed, clients retry in lockstep.
  uint64_t seed = 0;
  // Waits `duration` before a retry; returns false to abandon the Insert
  // (the caller is stopping). Unset = absl::SleepFor, then true. Tests pass
  // one that advances a fake clock.
  std::function<bool(absl::Duration)> sleep;
  // The time the deadline is measured on. Unset = absl::Now.
  std::function<absl::Time()> clock;
  // Told before each retry why it happens, how many calls were made so far
  // and how long the backoff is (for logs). May be unset.
  std::function<void(const absl::Status& why, int attempts, absl::Duration backoff)> on_retry;

  // INVALID_ARGUMENT naming every bad field.
  absl::Status Validate() const;
};

// What became of one group.
struct GroupInsertResult {
  // The group's idempotency_key and group_id.
  std::string idempotency_key;
  std::string group_id;
  // The buffer's last answer for the group:
  //   STORED, DUPLICATE                     stored (DUPLICATE: by an earlier
  //                                         call whose ack was lost, or an
  //                                         earlier Insert);
  //   REJECTED_STALE, INVALID, UNKNOWN_RUN  refused for good, never resent;
  //   RETRYABLE_ERROR                       not stored when last answered, and
  //                                         the Insert gave up before a retry
  //                                         succeeded;
  //   UNSPECIFIED                           no answer to the last call that
  //                                         carried it: it may or may not be
  //                                         stored. Resending it with the same
  //                                         key is safe.
  v1::InsertStatus status = v1::INSERT_STATUS_UNSPECIFIED;
  // The buffer's message for the group, or why there is no answer.
  std::string message;
  // Set for STORED and DUPLICATE; -1 otherwise.
  int64_t buffer_sequence = -1;
  // InsertGroups calls that carried the group.
  int sends = 0;

  bool stored() const {
    return status == v1::INSERT_STATUS_STORED || status == v1::INSERT_STATUS_DUPLICATE;
  }
  // Stored or refused for good: nothing more will be learned by resending.
  bool resolved() const {
    return status != v1::INSERT_STATUS_UNSPECIFIED && status != v1::INSERT_STATUS_RETRYABLE_ERROR;
  }
};

struct InsertOutcome {
  // One per group given to Insert, in the same order.
  std::vector<GroupInsertResult> groups;
  // OK when every group is resolved(). Otherwise why the Insert stopped with
  // groups unresolved:
  //   - a fatal RPC code (see IsRetryableInsertError), returned at once; it
  //     also sticks to the inserter;
  //   - DEADLINE_EXCEEDED: the deadline passed; marked IsRetriesExhausted
  //     (retrier.h) when the last call failed as a whole (the buffer was
  //     unreachable), not when the buffer kept answering RETRYABLE_ERROR;
  //   - a client's own IsRetriesExhausted error, at once (kept marked);
  //   - the last retryable code (UNAVAILABLE for per-group RETRYABLE_ERROR):
  //     max_attempts calls were made;
  //   - CANCELLED: the sleep function said to stop.
  absl::Status status;
  // InsertGroups calls made.
  int attempts = 0;

  // Groups with each kind of fate.
  int64_t stored() const;
  int64_t duplicates() const;
  int64_t refused() const;
  int64_t unresolved() const;
};

// Inserts groups into the replay buffer with the retries that make delivery
// exactly-once as far as the buffer's table is concerned:
//
//   - a call that fails with a retryable code (IsRetryableInsertError) is
//     repeated with every group not yet confirmed, under the same
//     idempotency keys: a group whose ack was lost comes back DUPLICATE,
//     which counts as stored, and is stored once;
//   - groups answered RETRYABLE_ERROR are resent; groups answered STORED,
//     DUPLICATE, REJECTED_STALE, INVALID or UNKNOWN_RUN are never resent;
//   - a fatal code ends the Insert at once, without a retry, and is sticky:
//     every later Insert on this inserter returns it without calling the
//     buffer. A fatal code means a mismatch of protocol, deployment or
//     credentials, so every later batch would meet it too; sticking turns a
//     stream of per-batch failures into one error the caller can act on
//     (the rollout worker fails its run). Make a new inserter to try again.
//   - retries back off exponentially with seeded jitter, and the deadline
//     bounds the whole Insert.
//
// Thread-safe: Insert may run on several threads at once (on a thread-safe
// client; every ReplayBufferClient's InsertGroups is).
class GroupInserter {
 public:
  // `client` must outlive the inserter. INVALID_ARGUMENT when `options` do
  // not validate.
  static absl::StatusOr<std::unique_ptr<GroupInserter>> Create(ReplayBufferClient& client,
                                                               GroupInserterOptions options);

  // Inserts `groups`; blocks for the calls and backoffs, at most about
  // options.deadline (see there). The outcome says what became of each
  // group, including when the Insert gave up (outcome.status).
  //
  // An error, rather than an outcome, means nothing was sent by this call:
  // INVALID_ARGUMENT when a group has no idempotency_key, or two share one
  // (a retry could not tell them apart, and the second would be dropped as
  // a DUPLICATE of the first); or the sticky fatal error of an earlier
  // Insert. No groups: an empty OK outcome, without a call.
  absl::StatusOr<InsertOutcome> Insert(std::vector<v1::Group> groups) ABSL_LOCKS_EXCLUDED(mu_);

  // The sticky fatal error, OK while there is none.
  absl::Status fatal_error() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  GroupInserter(ReplayBufferClient& client, GroupInserterOptions options);

  // The jittered backoff before retry number `retry` (1-based).
  absl::Duration Backoff(int retry) ABSL_LOCKS_EXCLUDED(mu_);

  ReplayBufferClient& client_;
  const GroupInserterOptions options_;

  mutable absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  absl::Status fatal_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::clients

#endif  // SLUICE_SERVICES_CLIENTS_GROUP_INSERTER_H_
