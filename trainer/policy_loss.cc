#include "trainer/policy_loss.h"

#include <algorithm>

namespace sluice::trainer {

torch::Tensor AggregateTokens(const torch::Tensor& values, const torch::Tensor& keep,
                              LossAggregation aggregation, double constant) {
  const torch::Tensor kept_values = values * keep;
  switch (aggregation) {
    case LossAggregation::kTokenMean:
      break;
    case LossAggregation::kSequenceMean: {
      const torch::Tensor row_tokens = keep.sum(-1);
      const torch::Tensor has_tokens = (row_tokens > 0).to(values.scalar_type());
      const torch::Tensor row_means = kept_values.sum(-1) / row_tokens.clamp_min(1.0);
      return (row_means * has_tokens).sum() / has_tokens.sum().clamp_min(1.0);
    }
    case LossAggregation::kConstantNormalizer: {
      const torch::Tensor rows = (keep.sum(-1) > 0).to(values.scalar_type()).sum();
      return kept_values.sum() / (rows.clamp_min(1.0) * constant);
    }
  }
  return kept_values.sum() / keep.sum().clamp_min(1.0);
}

torch::Tensor K3(const torch::Tensor& log_ratio) { return torch::exp(log_ratio) - log_ratio - 1; }

double MaskedMean(const torch::Tensor& values, const torch::Tensor& mask) {
  const torch::Tensor m = mask.detach().to(torch::kFloat64);
  return (values.detach().to(torch::kFloat64) * m).sum().item<double>() /
         std::max(1.0, m.sum().item<double>());
}

PolicyLoss DecoupledPpoLoss(const PolicyLossInputs& in, const PolicyLossOptions& options) {
  PolicyLoss out;
  const torch::Tensor mask = in.mask.to(torch::kFloat32);
  const torch::Tensor prox = in.logp_prox.detach();
  const torch::Tensor behav = in.logp_behav.detach();
  const torch::Tensor adv = in.advantages.detach();

  const torch::Tensor ratio = torch::exp(in.logp - prox);
  const torch::Tensor clipped =
      torch::clamp(ratio, 1.0 - options.clip_eps_low, 1.0 + options.clip_eps_high);
  const torch::Tensor surrogate = torch::min(ratio * adv, clipped * adv);

  WeightCorrectionOptions correction;
  correction.mode = options.cap_mode;
  correction.cap = options.behaviour_weight_cap;
  correction.floor = options.behaviour_weight_floor;
  correction.second_moment_threshold = options.second_moment_threshold;
  const CorrectedWeights weights = CorrectBehaviourWeights(prox - behav, mask, correction);

  torch::Tensor per_token = -(weights.weight * surrogate);
  torch::Tensor k3;
  if (options.kl_coef > 0) {
    k3 = K3(in.logp_reference.detach() - in.logp);
    per_token = per_token + options.kl_coef * k3;
  }
  if (options.entropy_coef > 0) per_token = per_token - options.entropy_coef * in.entropy;
  out.loss = AggregateTokens(per_token, weights.keep, options.aggregation,
                             options.aggregation_constant);

  torch::NoGradGuard no_grad;
  out.clip_fraction = MaskedMean(((ratio < 1.0 - options.clip_eps_low) & (adv < 0)) |
                                     ((ratio > 1.0 + options.clip_eps_high) & (adv > 0)),
                                 mask);
  out.capped_fraction = weights.above_cap_fraction;
  out.masked_above_cap_fraction = weights.masked_above_cap_fraction;
  out.masked_below_floor_fraction = weights.masked_below_floor_fraction;
  out.masked_second_moment_fraction = weights.masked_second_moment_fraction;
  // k3 with samples from the behaviour policy: rho = pi/mu, KL(mu||pi) ~ E[rho - 1 - log rho].
  out.kl_to_behaviour = MaskedMean(K3(in.logp.detach() - behav), mask);
  out.mean_ratio = MaskedMean(ratio, mask);
  if (k3.defined()) out.kl_to_reference = MaskedMean(k3, mask);
  return out;
}

}  // namespace sluice::trainer
