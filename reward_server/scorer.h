#ifndef SLUICE_REWARD_SERVER_SCORER_H_
#define SLUICE_REWARD_SERVER_SCORER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "reward_server/verifier.h"

namespace sluice::reward_server {

struct ScorerOptions {
  // Threads running verifiers. Items beyond this many wait in a queue.
  int num_workers = 2;
  // Threads abandoned inside a verifier that overran its deadline, beyond
  // num_workers, that the scorer tolerates before it stops replacing them
  // (see Scorer). 0 = never replace a stuck worker.
  int max_abandoned_workers = 16;

  // INVALID_ARGUMENT naming the field: num_workers in [1, 1024],
  // max_abandoned_workers in [0, 1024].
  absl::Status Validate() const;
};

// A verifier and its weight in a composition (sluice.v1.WeightedVerifier).
struct WeightedVerifier {
  std::string name;
  double weight = 0.0;  // > 0; 0 means 1.0.
  // Per-run parameters: defaults for the request's metadata when this
  // verifier runs (a key the item's metadata sets wins).
  std::map<std::string, std::string> params;
};

// Largest composition ScoreBatch accepts.
inline constexpr int kMaxCompositionSize = 32;

// Bytes kept of a result's detail and extracted answer.
inline constexpr size_t kMaxDetailBytes = 4096;
inline constexpr size_t kMaxExtractedAnswerBytes = 1024;

// INVALID_ARGUMENT naming the entry ("composition[1].weight: must be >= 0
// (0 means 1.0), got -2") for an empty name, a negative or non-finite weight,
// or more than kMaxCompositionSize entries. Unknown names are not an error
// here: they yield kUnknownVerifier components.
absl::Status ValidateComposition(const std::vector<WeightedVerifier>& composition);

// The weighted mean of `components` (each with its weight and outcome set),
// named "composite", with the components listed in order:
//   reward = sum(w_i * r_i) / sum(w_i)
// A component that failed through the model's fault (parse, timeout, crash,
// resource limits) counts as reward 0 and the composite stays kNone, unless
// every component failed, when the composite takes the first one's error.
// A component that failed through no fault of the model (unknown verifier,
// invalid input, or a retryable kind) makes the whole composite fail with its
// error, reward 0: a partial reward would train on a broken signal. The
// duration is the longest component's (they run in parallel); the extracted
// answer the first non-empty one.
VerifyOutcome ComposeOutcomes(std::vector<VerifyOutcome> components);

// One response to score (sluice.v1.ScoreItem).
struct ScoreItem {
  std::string item_id;
  // Verifier name; empty = the batch's composition.
  std::string verifier;
  // Inputs; the scorer sets request.deadline.
  VerifyRequest request;
  // Deadline after the batch arrives; 0 = the verifier's default (for a
  // composition, the largest default of its verifiers). Clamped to the
  // verifier's max_timeout; negative is kInvalidInput.
  absl::Duration timeout = absl::ZeroDuration();
};

struct ItemScore {
  std::string item_id;
  VerifyOutcome outcome;
};

struct BatchScores {
  std::vector<ItemScore> items;  // In request order.
  absl::Duration duration;       // Wall time of the whole batch.
};

// Scores batches on a bounded pool of worker threads, with a hard deadline
// per item.
//
// Every (item, verifier) pair is a job in one FIFO queue shared by all
// batches; num_workers threads take jobs from it. ScoreBatch waits until each
// job has finished or passed its item's deadline, whichever is first, so a
// batch returns within its largest item deadline (plus scheduling noise)
// whatever the verifiers do:
//   - a job still queued at its deadline is kUnavailable (retryable: the
//     server was too busy, not the model's fault) and is never run;
//   - a job running at its deadline is kTimeout, reward 0, and its worker is
//     abandoned: in-process code cannot be interrupted, so the thread is
//     detached and left to finish the call on its own (its late result is
//     dropped; it holds references to the verifier and the request, so
//     nothing it touches is freed under it). A fresh worker replaces it at
//     once, so one hung verifier cannot starve the pool, as long as fewer
//     than num_workers + max_abandoned_workers threads exist; past that the
//     pool shrinks (logged) until abandoned threads return. A verifier that
//     can hang forever (user code) belongs in a subprocess it can kill at
//     the request's deadline (issue #5's sandbox), not here.
//
// Shutdown() makes every pending and future item kUnavailable at once.
//
// Thread-safe: any number of concurrent ScoreBatch calls share the pool.
class Scorer {
 public:
  // Starts the workers. INVALID_ARGUMENT for bad options or a null registry;
  // INTERNAL when no thread can be started.
  static absl::StatusOr<std::unique_ptr<Scorer>> Create(
      std::shared_ptr<const VerifierRegistry> registry, ScorerOptions options = {});

  // Shutdown(), then joins idle workers; busy ones are detached (see above).
  // Call only once every ScoreBatch call has returned.
  ~Scorer();

  Scorer(const Scorer&) = delete;
  Scorer& operator=(const Scorer&) = delete;

  // Scores `items` and returns one result per item, in order. Blocks until
  // every item has a result: at most its deadline after the call. Problems
  // of single items (unknown verifier, missing fields, timeouts) are item
  // outcomes. Errors: INVALID_ARGUMENT for a bad composition (see
  // ValidateComposition), UNAVAILABLE after Shutdown(). An empty batch
  // returns an empty result.
  absl::StatusOr<BatchScores> ScoreBatch(std::vector<ScoreItem> items,
                                         const std::vector<WeightedVerifier>& composition);

  // Makes pending batches return now with kUnavailable for every unfinished
  // item, and later ScoreBatch calls fail with UNAVAILABLE. Non-blocking;
  // idempotent.
  void Shutdown();

  const VerifierRegistry& registry() const { return *registry_; }

  struct Stats {
    int workers = 0;            // Live worker threads.
    int busy_workers = 0;       // Of which running a verifier.
    int abandoned_workers = 0;  // Detached threads still inside a verifier.
    size_t queued_jobs = 0;     // Jobs waiting for a worker.
  };
  Stats GetStats() const;

  // Blocks until no abandoned thread is still inside a verifier or `timeout`
  // passes; true when none is. For tests and orderly exits.
  bool AwaitNoAbandonedWorkers(absl::Duration timeout) const;

 private:
  struct State;

  Scorer(std::shared_ptr<const VerifierRegistry> registry, std::shared_ptr<State> state);

  const std::shared_ptr<const VerifierRegistry> registry_;
  // Shared with the worker threads, which may outlive the scorer.
  const std::shared_ptr<State> state_;
};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_SCORER_H_
