#include "trainer/policy_loss.h"

#include <algorithm>

namespace sluice::trainer {

PolicyLoss DecoupledPpoLoss(const torch::Tensor& logp, const torch::Tensor& logp_prox,
                            const torch::Tensor& logp_behav, const torch::Tensor& advantages,
                            const torch::Tensor& mask, const PolicyLossOptions& options) {
  PolicyLoss out;
  torch::Tensor m = mask.to(torch::kFloat32);
  const torch::Tensor prox = logp_prox.detach();
  const torch::Tensor behav = logp_behav.detach();
  const torch::Tensor adv = advantages.detach();

  torch::Tensor ratio = torch::exp(logp - prox);
  torch::Tensor clipped =
      torch::clamp(ratio, 1.0 - options.clip_eps_low, 1.0 + options.clip_eps_high);
  torch::Tensor surrogate = torch::min(ratio * adv, clipped * adv);

  torch::Tensor weight = torch::exp(prox - behav);
  torch::Tensor capped = weight > options.behaviour_weight_cap;
  switch (options.cap_mode) {
    case WeightCapMode::kTruncate:
      weight = torch::clamp_max(weight, options.behaviour_weight_cap);
      break;
    case WeightCapMode::kMask:
      m = m * (~capped).to(torch::kFloat32);
      break;
    case WeightCapMode::kNone:
      break;
  }
  const torch::Tensor tokens = m.sum().clamp_min(1.0);
  out.loss = -(weight * surrogate * m).sum() / tokens;

  torch::NoGradGuard no_grad;
  const torch::Tensor mask_f = mask.to(torch::kFloat32);
  const double all_tokens = std::max(1.0, mask_f.sum().item<double>());
  const torch::Tensor was_clipped =
      ((ratio < 1.0 - options.clip_eps_low) & (adv < 0)) |
      ((ratio > 1.0 + options.clip_eps_high) & (adv > 0));
  out.clip_fraction = (was_clipped.to(torch::kFloat32) * mask_f).sum().item<double>() / all_tokens;
  out.capped_fraction = (capped.to(torch::kFloat32) * mask_f).sum().item<double>() / all_tokens;
  // k3 with samples from the behaviour policy: rho = pi/mu, KL(mu||pi) ~ E[rho - 1 - log rho].
  const torch::Tensor log_rho = logp.detach() - behav;
  out.kl_to_behaviour =
      ((torch::exp(log_rho) - 1 - log_rho) * mask_f).sum().item<double>() / all_tokens;
  out.mean_ratio = (ratio.detach() * mask_f).sum().item<double>() / all_tokens;
  return out;
}

}  // namespace sluice::trainer
