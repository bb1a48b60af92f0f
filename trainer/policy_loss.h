#ifndef SLUICE_TRAINER_POLICY_LOSS_H_
#define SLUICE_TRAINER_POLICY_LOSS_H_

#include <torch/torch.h>

namespace sluice::trainer {

enum class WeightCapMode { kTruncate, kMask, kNone };

struct PolicyLossOptions {
  double clip_eps_low = 0.2;
  double clip_eps_high = 0.2;
  double behaviour_weight_cap = 5.0;
  WeightCapMode cap_mode = WeightCapMode::kTruncate;
};

struct PolicyLoss {
  torch::Tensor loss;               // scalar, differentiable
  double clip_fraction = 0;         // tokens whose ratio was clipped (of masked tokens)
  double capped_fraction = 0;       // tokens whose behaviour weight hit the cap
  double kl_to_behaviour = 0;       // k3 estimate of KL(behaviour || current)
  double mean_ratio = 0;
};

// AReaL's decoupled PPO objective, per token t with mask m_t:
//
//   r_t = exp(logp_t - logp_prox_t)                       (trust region around pi_prox)
//   w_t = exp(logp_prox_t - logp_behav_t), bounded by the cap (importance
//         weight correcting for the policy that actually sampled the token)
//   l_t = -w_t * min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)
//   loss = sum_t m_t l_t / sum_t m_t                      (token-level mean)
//
// GRPO is the special case logp_prox = logp_behav (w = 1). All tensors share
// one shape ([rows, completion positions]); logp requires grad, the others
// are constants. The cap modes: kTruncate w = min(w, cap); kMask drops tokens
// with w > cap from the loss; kNone leaves w unbounded.
PolicyLoss DecoupledPpoLoss(const torch::Tensor& logp, const torch::Tensor& logp_prox,
                            const torch::Tensor& logp_behav, const torch::Tensor& advantages,
                            const torch::Tensor& mask, const PolicyLossOptions& options);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_POLICY_LOSS_H_
