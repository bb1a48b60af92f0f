#ifndef SLUICE_TRAINER_IMPORTANCE_WEIGHTS_H_
#define SLUICE_TRAINER_IMPORTANCE_WEIGHTS_H_

#include <torch/torch.h>

#include <cstdint>

// The behaviour importance weight of the decoupled objective and what bounds
// it, per token t of the padded [rows, completion positions] layout:
//
//   w_t = pi_prox(a_t | s_t) / pi_behav(a_t | s_t)
//
// pi_behav is what sampled the token (the rollout's log-probs, possibly of
// several versions along one completion); pi_prox is the trust region's
// centre. The further the data is off-policy, the heavier w's tails: the
// corrections below keep a few tokens with huge (or tiny) weights from
// dominating the gradient, and the statistics predict when they stop
// being enough (docs/objectives.md).
//
// Plain tensor functions, no model, no gRPC; all inputs are constants (no
// gradient flows through a weight).
namespace sluice::trainer {

// How w is bounded above (algorithm.behaviour_weight_mode): kTruncate
// w = min(w, cap) (truncated importance sampling); kMask drops the tokens
// with w > cap from the loss; kNone leaves w unbounded.
enum class WeightCapMode { kTruncate, kMask, kNone };

// AReaL's log-linear approximation of the proximal policy (prox_logp_method:
// loglinear), which saves the forward pass of a second copy of the weights:
//
//   log pi_prox ~ log pi_behav + alpha (log pi_theta - log pi_behav)
//   alpha_t = (v_prox - v_behav_t) / (v_theta - v_behav_t),  1 when v_theta = v_behav_t
//
// with v_behav_t the version that sampled token t (`token_versions`, same
// shape), v_prox the version at the batch's start and v_theta the version
// of the weights that computed `logp_current`. Versions satisfy
// v_behav <= v_prox <= v_theta, so alpha is in [0, 1]: the proximal
// log-prob is interpolated in version time between the behaviour policy's
// and the current one's. With one optimizer step per batch (v_prox =
// v_theta) it is logp_current exactly. `logp_current` is detached here.
torch::Tensor LogLinearProximalLogProbs(const torch::Tensor& logp_current,
                                        const torch::Tensor& logp_behaviour,
                                        const torch::Tensor& token_versions,
                                        int64_t proximal_version, int64_t current_version);

struct WeightCorrectionOptions {
  WeightCapMode mode = WeightCapMode::kTruncate;
  // Upper bound of w (> 0).
  double cap = 5.0;
  // Tokens with w < floor drop out of the loss (IcePop's lower bound; with
  // kMask the kept tokens are those with w in [floor, cap]). 0 = none.
  double floor = 0;
  // M2PO's second-moment trust region: tau > 0 drops the tokens with the
  // largest (log w)^2 until the mean (log w)^2 of the kept tokens is <= tau.
  // Applied after the cap and floor masks, to the tokens they kept. 0 = off.
  double second_moment_threshold = 0;
};

struct CorrectedWeights {
  // w as the loss uses it (truncated at the cap under kTruncate).
  torch::Tensor weight;
  // The input mask minus every token a correction dropped (float 0/1).
  torch::Tensor keep;
  // Fractions of the input mask's tokens: w above the cap (in any mode;
  // truncated under kTruncate, dropped under kMask), dropped by the cap
  // (kMask), dropped by the floor, dropped by the second-moment mask.
  double above_cap_fraction = 0;
  double masked_above_cap_fraction = 0;
  double masked_below_floor_fraction = 0;
  double masked_second_moment_fraction = 0;
};

// Applies `options` to w = exp(log_weight) over `mask`'s tokens.
// O(tokens log tokens) with the second-moment mask (a sort), else O(tokens).
CorrectedWeights CorrectBehaviourWeights(const torch::Tensor& log_weight, const torch::Tensor& mask,
                                         const WeightCorrectionOptions& options);

// M2PO's mask on its own: 1 for the tokens of `mask` that stay, 0 for the
// others. The kept tokens are the k with the smallest (log w)^2 for the
// largest k whose mean (log w)^2 is <= threshold (all of them when their
// mean already is; ties go by position, first kept). threshold <= 0 keeps
// all.
torch::Tensor SecondMomentKeepMask(const torch::Tensor& log_weight, const torch::Tensor& mask,
                                   double threshold);

// How far the batch is off-policy, from its importance weights w over
// `mask`'s tokens (the raw weights, before any correction).
struct ImportanceWeightStats {
  int64_t tokens = 0;
  // Normalised effective sample size (sum w)^2 / (N sum w^2), in (0, 1]:
  // 1 when every weight is equal (on-policy), -> 1/N when one dominates.
  double effective_sample_size = 1;
  double max = 1;
  double min = 1;
  // Quantiles with linear interpolation between order statistics (numpy's
  // default): position q (N - 1) in the sorted weights.
  double p99 = 1;
  double p01 = 1;
  // Fractions of tokens with w > 2 and w < 0.5.
  double fraction_above_2 = 0;
  double fraction_below_half = 0;
};

// All 1s (ESS 1, no tails) for an empty mask. O(tokens log tokens).
ImportanceWeightStats SummarizeImportanceWeights(const torch::Tensor& weight,
                                                 const torch::Tensor& mask);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_IMPORTANCE_WEIGHTS_H_
