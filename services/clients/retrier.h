#ifndef SLUICE_SERVICES_CLIENTS_RETRIER_H_
#define SLUICE_SERVICES_CLIENTS_RETRIER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

// Retries of one client call across a service's restart: exponential backoff
// with jitter, an overall deadline per call, a prompt stop when the caller is
// stopping, and an observer for metrics. retrying_clients.h applies it to the
// four client interfaces, with the per-method table of what is retried.
namespace sluice::clients {

// Ends the retries of every call that shares it: a backoff in progress ends at
// once and no retry starts after (an attempt in flight runs to its own
// timeout). A worker or trainer that is stopping cancels it so that it does not
// sit in a backoff of a service that is away. Cancelling is permanent.
// Thread-safe.
class RetryCancellation {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until Cancel(), or until `also` (when given) is true and Wake() is
  // called, or until `timeout` passes. True when it ended by a stop (Cancel
  // or `also`), false when the timeout passed.
  bool WaitFor(absl::Duration timeout, const std::atomic<bool>* also = nullptr) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Makes every WaitFor re-check its `also` flag (set the flag first).
  void Wake() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// What a retrier tells its observer: a retry about to wait for its backoff, or
// a call given up (after the deadline or the limit on ambiguous failures).
struct RetryEvent {
  enum class Kind { kRetry, kGaveUp };
  Kind kind = Kind::kRetry;
  // "reward_server", "replay_buffer", "controller" or "trainer".
  absl::string_view service;
  // The client method, e.g. "ScoreBatch".
  absl::string_view method;
  // The failure that caused the retry or the give-up.
  absl::Status error;
  // Attempts made so far in this call.
  int attempts = 0;
  // kRetry: the wait before the next attempt.
  absl::Duration backoff;
  // Since the call's first attempt started.
  absl::Duration failing_for;
};

struct RetryOptions {
  // Backoff before retry n (1-based): min(max_backoff, initial_backoff *
  // backoff_multiplier^(n-1)), then shortened by a uniform draw of up to
  // `jitter` of itself so that clients that failed together spread out.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  double backoff_multiplier = 2.0;
  // In [0, 1]; 0 = no jitter. After a failure that carries a retry hint
  // (RetryAfter: the server was full and said when to come back)
  // the backoff is instead the hint lengthened by a uniform draw of up to
  // `jitter` of itself: never shorter than the server asked, and never
  // shorter than initial_backoff (a hint of 0 must not make a busy loop).
  double jitter = 0.2;
  // Bound on one call's retries, from its first attempt: no retry starts
  // after it. Long enough for a supervisor to restart a service (seconds to a
  // minute for a trainer restoring a checkpoint or a buffer replaying its
  // journal); a call still failing then has its service gone for good.
  absl::Duration deadline = absl::Minutes(3);
  // Retries per call after an answer that may mean the server is broken
  // rather than away (DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNKNOWN,
  // CANCELLED; idempotent calls only). UNAVAILABLE, and any failure with a
  // retry hint, are retried until the deadline and do not count here.
  int max_ambiguous_retries = 4;
  // Seed of the jitter: give each process its own (a hash of the worker id
  // and incarnation) so that clients do not retry in lockstep.
  uint64_t seed = 0;
  // Shared with whoever stops the caller. Unset = never cancelled.
  std::shared_ptr<RetryCancellation> cancellation;
  // Told of every retry and give-up (metrics, logs). Called on the calling
  // thread; must be thread-safe when the client is used from several. May be
  // unset.
  std::function<void(const RetryEvent&)> observer;
  // The time the deadline is measured on. Unset = absl::Now. Backoffs are
  // real waits either way; tests pass a clock that their fakes advance.
  std::function<absl::Time()> clock;

  // INVALID_ARGUMENT naming every bad field.
  absl::Status Validate() const;
};

// Which failures of a call are retried, by code. Besides these, a failure
// that carries a retry hint (RetryAfter, from the server's
// grpc-retry-pushback-ms trailing metadata; the reward server's
// RESOURCE_EXHAUSTED when its sandbox pool is full) is retried under either
// value until the deadline, after waiting for the hint: the server said it
// did not process the request, and when to come back. Without a hint,
// RESOURCE_EXHAUSTED is final (other services use it for quotas no retry
// cures).
enum class RetryOn {
  // UNAVAILABLE only: the service is down, restarting or unreachable, and
  // the request was most likely not processed (or its answer was lost).
  // For calls that must not run twice.
  kUnavailable,
  // UNAVAILABLE until the deadline; DEADLINE_EXCEEDED, ABORTED, INTERNAL,
  // UNKNOWN and CANCELLED (what gRPC reports when a server dies or shuts
  // down mid-call) up to max_ambiguous_retries. For idempotent calls.
  kTransient,
};

// True when `code` is retried under `on`. A failure with a retry hint is
// retried whatever its code (see RetryOn); this answers for the code alone.
bool IsRetryable(absl::StatusCode code, RetryOn on);

// Limits of one call that differ from the options.
struct CallLimits {
  // Replaces RetryOptions::deadline (e.g. a call that takes its own timeout).
  std::optional<absl::Duration> deadline;
  // Whether giving up marks the error as RetriesExhausted (the service was
  // away for the whole deadline). False for a call whose deadline is its
  // caller's short timeout.
  bool exhausted_is_final = true;
  // A per-call stop besides the options' cancellation (see
  // RetryCancellation::WaitFor); the flag's owner calls Wake() on the
  // options' cancellation after setting it.
  const std::atomic<bool>* stop = nullptr;
};

// True for an error of a call whose retries ran out (the deadline, or the
// limit on ambiguous failures): its service has been away for the whole
// retry deadline, which should end the caller's work with that error rather
// than be retried again. Survives PrefixMessage.
bool IsRetriesExhausted(const absl::Status& status);
// `status` (not OK) marked as IsRetriesExhausted.
absl::Status MarkRetriesExhausted(absl::Status status);

// Appends to `problems` what is wrong with a backoff schedule (RetryOptions,
// GroupInserterOptions): one line per field.
void CheckBackoff(absl::Duration initial_backoff, absl::Duration max_backoff,
                  double backoff_multiplier, double jitter, std::vector<std::string>& problems);

// `status` with "<prefix>: " before its message, payloads kept.
absl::Status PrefixMessage(const absl::Status& status, absl::string_view prefix);

// Runs calls of one service with RetryOptions. Thread-safe.
class Retrier {
 public:
  // `service` names the service in errors and events. Invalid options make
  // every call return the INVALID_ARGUMENT of Validate() without calling.
  Retrier(std::string service, RetryOptions options);

  // Calls `attempt` until it succeeds, fails with a code not retried under
  // `on` and without a retry hint, the caller stops, or the deadline passes.
  // A hinted failure waits for its hint (plus jitter; at most until the
  // deadline) before the next attempt. Blocks for the attempts and the
  // backoffs: at most about the deadline plus one attempt's own timeout.
  // Returns:
  //   - the attempt's result when it succeeds or its error is not retried;
  //   - CANCELLED naming the last error when the cancellation (or
  //     limits.stop) ended the retries;
  //   - the last error, marked IsRetriesExhausted (unless
  //     limits.exhausted_is_final is false) and saying for how long and over
  //     how many attempts the service failed, when the retries ran out; its
  //     retry hint, if any, is removed (the retries are over: a caller that
  //     retries too must not take it as an invitation).
  template <typename T>
  absl::StatusOr<T> Call(absl::string_view method, RetryOn on,
                         absl::FunctionRef<absl::StatusOr<T>()> attempt,
                         const CallLimits& limits = {}) {
    std::optional<absl::StatusOr<T>> result;
    absl::Status status = Run(
        method, on,
        [&] {
          result.emplace(attempt());
          return result->status();
        },
        limits);
    if (status.ok()) return *std::move(result);
    return status;
  }

  // Same for a call without a value.
  absl::Status Run(absl::string_view method, RetryOn on, absl::FunctionRef<absl::Status()> attempt,
                   const CallLimits& limits = {}) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& service() const { return service_; }
  // The options' cancellation (never null).
  RetryCancellation& cancellation() const { return *cancellation_; }
  // The per-call retry deadline (RetryOptions::deadline).
  absl::Duration deadline() const { return options_.deadline; }
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }

 private:
  absl::Duration Backoff(int retry) ABSL_LOCKS_EXCLUDED(mu_);
  // The wait a server's retry hint asks for: at least `hint` (and
  // initial_backoff), plus up to `jitter` of it.
  absl::Duration HintedBackoff(absl::Duration hint) ABSL_LOCKS_EXCLUDED(mu_);
  double Jitter() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string service_;
  const RetryOptions options_;
  const absl::Status valid_;
  const std::shared_ptr<RetryCancellation> cancellation_;
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::clients

#endif  // SLUICE_SERVICES_CLIENTS_RETRIER_H_
