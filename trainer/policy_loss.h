#ifndef SLUICE_TRAINER_POLICY_LOSS_H_
#define SLUICE_TRAINER_POLICY_LOSS_H_

#include <torch/torch.h>

#include "trainer/importance_weights.h"

namespace sluice::trainer {

// How the per-token loss terms are reduced to one number
// (algorithm.loss_aggregation). Tokens a correction dropped count as absent.
enum class LossAggregation {
  // sum_t l_t / #tokens.
  kTokenMean,
  // mean over sequences (rows with a kept token) of sum_t l_t / #tokens(row).
  kSequenceMean,
  // sum_t l_t / (#sequences * aggregation_constant): Dr. GRPO's constant
  // normaliser, no length normalisation.
  kConstantNormalizer,
};

struct PolicyLossOptions {
  double clip_eps_low = 0.2;
  double clip_eps_high = 0.2;
  // The behaviour weight's bounds and masks (importance_weights.h).
  double behaviour_weight_cap = 5.0;
  WeightCapMode cap_mode = WeightCapMode::kTruncate;
  double behaviour_weight_floor = 0;
  double second_moment_threshold = 0;
  LossAggregation aggregation = LossAggregation::kTokenMean;
  double aggregation_constant = 1.0;  // kConstantNormalizer's, in tokens (> 0)
  // Weight of the k3 KL term to PolicyLossInputs.logp_reference (0 = none).
  double kl_coef = 0;
  // Weight of the entropy bonus on PolicyLossInputs.entropy (0 = none).
  double entropy_coef = 0;
};

// All tensors share one shape ([rows, completion positions]); logp (and
// entropy) require grad, the others are constants.
struct PolicyLossInputs {
  torch::Tensor logp;        // log pi_theta
  torch::Tensor logp_prox;   // log pi_prox
  torch::Tensor logp_behav;  // log pi_behav
  torch::Tensor advantages;
  torch::Tensor mask;        // 1 on trained tokens
  // log pi_ref; required when kl_coef > 0, else ignored.
  torch::Tensor logp_reference;
  // The policy's entropy per position; required when entropy_coef > 0.
  torch::Tensor entropy;
};

struct PolicyLoss {
  torch::Tensor loss;               // scalar, differentiable
  double clip_fraction = 0;         // tokens whose ratio was clipped (of masked tokens)
  double capped_fraction = 0;       // tokens whose behaviour weight exceeded the cap
  double kl_to_behaviour = 0;       // k3 estimate of KL(behaviour || current)
  double mean_ratio = 0;
  // Tokens (of the mask) each correction dropped (CorrectedWeights).
  double masked_above_cap_fraction = 0;
  double masked_below_floor_fraction = 0;
  double masked_second_moment_fraction = 0;
  // Mean k3 of KL(current || reference) over the mask; 0 without one.
  double kl_to_reference = 0;
};

// AReaL's decoupled PPO objective, per token t with mask m_t:
//
//   u_t = exp(logp_t - logp_prox_t)                       (trust region around pi_prox)
//   w_t = exp(logp_prox_t - logp_behav_t), bounded as the options say
//         (importance weight correcting for the policy that actually
//         sampled the token; CorrectBehaviourWeights: truncated or masked
//         at the cap, masked below the floor and by M2PO's second moment)
//   l_t = -w_t * min(u_t * A_t, clip(u_t, 1 - eps_low, 1 + eps_high) * A_t)
//         + kl_coef * k3_t - entropy_coef * H_t
//   k3_t = exp(d_t) - d_t - 1,  d_t = logp_reference_t - logp_t
//   loss = aggregate of l_t over the kept tokens       (LossAggregation)
//
// GRPO is the special case logp_prox = logp_behav (w = 1); truncated
// importance sampling the case logp_prox = logp.detach() (u = 1 in value,
// so the clip never acts and the gradient is w A grad log pi).
PolicyLoss DecoupledPpoLoss(const PolicyLossInputs& inputs, const PolicyLossOptions& options);

// k3(x) = exp(x) - x - 1, the estimator of a KL from samples of the other
// side: with x = log(p/q) at tokens sampled from q, mean k3 estimates
// KL(q || p) (>= 0, unbiased, low variance).
torch::Tensor K3(const torch::Tensor& log_ratio);

// Mean of `values` over the tokens of `mask` (in double precision, without
// gradient); 0 for an empty mask.
double MaskedMean(const torch::Tensor& values, const torch::Tensor& mask);

// Reduces per-token values `values` over the tokens of `keep` (float 0/1,
// same shape [rows, positions]) as `aggregation` says; 0 when nothing is
// kept. Differentiable in `values`.
torch::Tensor AggregateTokens(const torch::Tensor& values, const torch::Tensor& keep,
                              LossAggregation aggregation, double constant);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_POLICY_LOSS_H_
