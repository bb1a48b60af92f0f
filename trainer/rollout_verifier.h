#ifndef SLUICE_TRAINER_ROLLOUT_VERIFIER_H_
#define SLUICE_TRAINER_ROLLOUT_VERIFIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/transformer.h"
#include "sluice/v1/common.pb.h"

// Verifying untrusted rollout workers (issue 19), TOPLOC-style but exact:
// the trainer holds the weights of every version a trainable group can carry
// (policy_history.h), so it recomputes the behaviour log-probability of every
// completion token under the version the token claims and compares it with
// what the worker reported. No gRPC: the trainer feeds it sampled groups.
//
// The recomputation replays what the rollout engine (common/model/engine.h)
// did, not merely a full forward per version:
//
//   WEIGHT_SWAP_MODE_KEEP_CACHE  a swap keeps the KV cache the old weights
//     wrote, so token j (version v_j) was sampled by v_j reading keys and
//     values that earlier versions computed. Replayed with one cache per
//     trajectory, fed segment by segment (a segment = a run of tokens of one
//     version): the prompt and the first segment's inputs under v_0, then
//     each later segment's inputs under its version, appending to the cache.
//     The input at position p-1+j (the token before j) is fed under v_j,
//     which is what the engine does: the step that samples token j runs the
//     model that samples it over the previous token.
//   WEIGHT_SWAP_MODE_RECOMPUTE   a swap recomputes the cache, so every token
//     of version v is the full forward of the sequence under v: one forward
//     per version over the trajectories that hold it.
//
// A trajectory of one version (no swap, the common case) is one forward in
// either mode; trajectories of one version are batched (right padded: the
// causal mask hides the padding from every real position).
//
// The statistic is the largest |reported - recomputed| over every token of
// the group: a forgery has to move only one token to be seen, and honest
// float noise is bounded per token (docs/rollout-verification.md has the
// figures the default tolerance comes from). Tokens also fail for what no
// float noise explains: a version newer than the newest published, a token id
// outside the vocabulary, a non-finite log-prob, lengths that disagree.
namespace sluice::trainer {

// The default tolerance on max |reported - recomputed| per token for float32
// weights on CPU. Measured on honest runs (docs/rollout-verification.md):
// the largest |delta| seen was about 5e-6; the tolerance leaves a margin of
// ~200x and is still far below what any forgery that matters moves.
inline constexpr double kDefaultVerifyTolerance = 1e-3;

struct RolloutVerifierOptions {
  // Largest |reported - recomputed| a token may show (nats).
  double tolerance = kDefaultVerifyTolerance;
  // The sampling temperature (T = 1 for greedy): log_softmax(logits / T).
  double temperature = 1.0;
  // How the workers' engines took new weights mid-generation.
  v1::WeightSwapMode swap_mode = v1::WEIGHT_SWAP_MODE_KEEP_CACHE;
  // The newest version published: a token claiming a newer one fails.
  int64_t newest_version = 0;

  absl::Status Validate() const;
};

// A version's weights, or null when they are not held (not retained, e.g.
// older than the window, or from before a resume).
using PolicyLookup = std::function<std::shared_ptr<const model::Transformer>(int64_t version)>;

enum class VerifyVerdict {
  kVerified,      // every token within the tolerance
  kFailed,        // some token is not what its claimed version gives
  kUnverifiable,  // a claimed version's weights are not held; nothing judged
};

const char* VerifyVerdictName(VerifyVerdict verdict);

struct GroupVerification {
  std::string group_id;
  // The worker that generated the group: the first trajectory's
  // rollout_worker_id (a group is one worker's).
  std::string worker_id;
  // Who inserted it, as the buffer saw (Group.inserted_by): what a
  // quarantine may act on. Empty from a buffer that does not say.
  std::string inserted_by;
  VerifyVerdict verdict = VerifyVerdict::kVerified;
  // Over the tokens compared (0 when none).
  double max_abs_diff = 0;
  double mean_abs_diff = 0;
  int64_t tokens_compared = 0;
  // kFailed / kUnverifiable: the first reason, naming the trajectory, the
  // token and both values.
  std::string why;
};

// Verifies each group. Aborted trajectories and those without completion
// tokens are skipped (the trainer does not train them). Does not block
// beyond the forward passes (O(tokens x versions) of model compute; no
// gradient). Thread-compatible: the models are only read.
std::vector<GroupVerification> VerifyGroups(const std::vector<const v1::Group*>& groups,
                                             const PolicyLookup& policies,
                                             const RolloutVerifierOptions& options);

// Which groups of a batch to verify, given each group's fraction in [0, 1]
// (run::RolloutVerificationPolicy::FractionFor): a group at 1 always, at 0
// never, else chosen independently with that probability from a generator
// seeded by (seed, step) so that a replayed step chooses the same groups.
std::vector<bool> ChooseGroupsToVerify(const std::vector<double>& fractions, uint64_t seed,
                                       int64_t step);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_ROLLOUT_VERIFIER_H_
