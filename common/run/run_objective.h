#ifndef SLUICE_COMMON_RUN_RUN_OBJECTIVE_H_
#define SLUICE_COMMON_RUN_RUN_OBJECTIVE_H_

// The objective's part of a run spec's algorithm section: its defaults and
// which corrections and variants go with which objective (docs/objectives.md).
// One home for the controller (which resolves and checks a spec at submit)
// and the trainer (which resolves what it is sent the same way, so the two
// agree whatever the spec left unset). A new objective adds its value to
// `enum Objective`, its loss in trainer/, and its rules here.

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/v1/common.pb.h"

namespace sluice::run {

// Defaults of the fields a spec leaves unset (0 or absent).
inline constexpr int kDefaultMaxStaleness = 4;
inline constexpr double kDefaultClipEps = 0.2;
inline constexpr double kDefaultBehaviourWeightCap = 5.0;
inline constexpr double kDefaultTbBeta = 1.0;
inline constexpr double kDefaultAdvantageEps = 1e-6;
// The largest coefficient (kl_coef, entropy_coef, second_moment_threshold,
// ...) and loss normalizer a spec may ask for: far beyond any real run.
inline constexpr double kMaxCoefficient = 1000000;
inline constexpr int64_t kMaxNormalizerTokens = 100000000;

// Applies the objective's defaults to `a`: the objective (decoupled PPO),
// eta (max_staleness, 4), the clip range, the behaviour-weight cap and mode,
// trajectory balance's beta, advantage normalization and its epsilon, the
// staleness bound (per group), proximal log-probs (recomputed), the loss
// aggregation (token mean; a constant normalizer left 0 becomes
// `max_new_tokens`, else `max_context_tokens`, else stays 0 for the trainer to
// choose) and dynamic sampling (KEEP for trajectory balance, else DROP).
// Fields already set are kept. Idempotent.
void ResolveObjectiveDefaults(v1::AlgorithmConfig* a, int64_t max_new_tokens,
                              int64_t max_context_tokens);

// eta as the run uses it: algorithm.max_staleness, or its default when unset.
int64_t ResolvedMaxStaleness(const v1::AlgorithmConfig& a);

// The objective's corrections and variants, each in its range and only with
// an objective it acts on, so that a setting that would be silently ignored
// is refused instead: one "algorithm.<field>: ..." line per problem, appended
// to `problems`. `a` as resolved (ResolveObjectiveDefaults).
void ValidateObjectiveChoices(const v1::AlgorithmConfig& a, std::vector<std::string>* problems);

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_OBJECTIVE_H_
