#include "trainer/objective.h"

#include <algorithm>

#include "common/model/transformer.h"
#include "common/run/run_objective.h"
#include "trainer/importance_weights.h"
#include "trainer/trajectory_balance.h"

namespace sluice::trainer {
namespace {

WeightCapMode ToCapMode(v1::BehaviourWeightMode mode) {
  switch (mode) {
    case v1::BEHAVIOUR_WEIGHT_MODE_MASK:
      return WeightCapMode::kMask;
    case v1::BEHAVIOUR_WEIGHT_MODE_NONE:
      return WeightCapMode::kNone;
    default:
      return WeightCapMode::kTruncate;
  }
}

LossAggregation ToAggregation(v1::LossAggregation aggregation) {
  switch (aggregation) {
    case v1::LOSS_AGGREGATION_SEQUENCE_MEAN:
      return LossAggregation::kSequenceMean;
    case v1::LOSS_AGGREGATION_CONSTANT_NORMALIZER:
      return LossAggregation::kConstantNormalizer;
    default:
      return LossAggregation::kTokenMean;
  }
}

}  // namespace

ObjectiveConfig ObjectiveConfig::FromAlgorithm(const v1::AlgorithmConfig& algorithm,
                                               int64_t max_new_tokens) {
  // The spec's defaults, resolved as the controller resolved them at submit
  // (a spec sent resolved is unchanged by this).
  v1::AlgorithmConfig a = algorithm;
  run::ResolveObjectiveDefaults(&a, max_new_tokens, /*max_context_tokens=*/0);
  ObjectiveConfig c;
  c.objective = a.objective();
  if (a.truncated_importance_sampling()) {
    c.proximal = ProximalSource::kCurrent;
  } else if (a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR) {
    c.proximal = ProximalSource::kLogLinear;
  }
  PolicyLossOptions& loss = c.loss;
  loss.clip_eps_low = a.clip_eps_low();
  loss.clip_eps_high = a.clip_eps_high();
  loss.behaviour_weight_cap = a.behaviour_weight_cap();
  loss.cap_mode = ToCapMode(a.behaviour_weight_mode());
  loss.behaviour_weight_floor = a.behaviour_weight_floor();
  loss.second_moment_threshold = a.second_moment_threshold();
  loss.aggregation = ToAggregation(a.loss_aggregation());
  loss.aggregation_constant = static_cast<double>(
      a.loss_normalizer_tokens() > 0 ? a.loss_normalizer_tokens()
                                     : std::max<int64_t>(1, max_new_tokens));
  loss.kl_coef = a.kl_coef();
  loss.entropy_coef = a.entropy_coef();
  c.tb_beta = a.tb_beta();
  c.tb_use_reference = a.tb_use_reference();
  c.dynamic_sampling = a.dynamic_sampling();
  c.normalize_advantage_by_std = a.normalize_advantage_by_std();
  c.advantage_eps = a.advantage_eps();
  if (a.staleness_bound() == v1::STALENESS_BOUND_TOKEN) {
    c.max_token_staleness = a.max_staleness();
  }
  return c;
}

bool ObjectiveConfig::UsesReference() const {
  return objective == v1::OBJECTIVE_TRAJECTORY_BALANCE ? tb_use_reference : loss.kl_coef > 0;
}

bool ObjectiveConfig::EntropyInLoss() const {
  return objective != v1::OBJECTIVE_TRAJECTORY_BALANCE && loss.entropy_coef > 0;
}

double EntropyFigure(const torch::Tensor& logits, const torch::Tensor& mask, double temperature) {
  torch::NoGradGuard no_grad;
  return MaskedMean(model::Entropy(logits.detach(), temperature), mask);
}

torch::Tensor ComputeObjective(const ObjectiveBatch& batch, const ObjectiveConfig& config,
                               v1::TrainingStepMetrics* metrics) {
  // Token staleness: the current weights' version minus the one that
  // sampled each token. Under a per-token bound the tokens past it leave
  // the loss (and every figure below, which is over the tokens trained).
  const torch::Tensor staleness =
      (static_cast<double>(batch.current_version) - batch.versions.to(torch::kFloat64));
  torch::Tensor mask = batch.mask;
  if (config.max_token_staleness >= 0) {
    torch::NoGradGuard no_grad;
    mask = batch.mask * (staleness <= static_cast<double>(config.max_token_staleness))
                            .to(batch.mask.scalar_type());
    const double completion = batch.mask.sum().item<double>();
    metrics->set_tokens_masked_stale_fraction(
        completion > 0 ? 1.0 - mask.sum().item<double>() / completion : 0.0);
  }
  const torch::Tensor current = batch.logp.detach();
  const bool trajectory_balance = config.objective == v1::OBJECTIVE_TRAJECTORY_BALANCE;

  // The proximal policy, and the one the telemetry's weights are taken
  // against: GRPO's trust region is the behaviour policy itself and
  // trajectory balance has none, so theirs is the current policy before the
  // update (how far the data is from what is trained).
  torch::Tensor proximal;
  if (config.objective == v1::OBJECTIVE_GRPO) {
    proximal = batch.behaviour;
  } else if (!trajectory_balance) {
    switch (config.proximal) {
      case ProximalSource::kRecompute:
        proximal = batch.proximal.defined() ? batch.proximal : current;
        break;
      case ProximalSource::kLogLinear:
        proximal = LogLinearProximalLogProbs(current, batch.behaviour, batch.versions,
                                             batch.batch_start_version, batch.current_version);
        break;
      case ProximalSource::kCurrent:
        proximal = current;
        break;
    }
  }
  const torch::Tensor observed =
      config.objective == v1::OBJECTIVE_DECOUPLED_PPO ? proximal : current;

  // The entropy as a loss term (differentiable); otherwise the caller
  // measures it after the backward pass (EntropyFigure), when the graph's
  // memory is free again.
  torch::Tensor entropy;
  if (config.EntropyInLoss()) entropy = model::Entropy(batch.logits, batch.temperature);

  torch::Tensor loss;
  if (trajectory_balance) {
    TrajectoryBalanceInputs inputs;
    inputs.sequence_logp = (batch.logp * mask).sum(-1);
    if (config.tb_use_reference) {
      inputs.sequence_logp_reference = (batch.reference.detach() * mask).sum(-1);
    }
    inputs.rewards = batch.rewards;
    inputs.groups = batch.groups;
    const TrajectoryBalanceLoss tb = TrajectoryBalance(inputs, config.tb_beta);
    loss = tb.loss;
    metrics->set_tb_log_z_mean(tb.log_z_mean);
    torch::NoGradGuard no_grad;
    metrics->set_kl_to_behaviour(MaskedMean(K3(current - batch.behaviour), mask));
    if (config.tb_use_reference) {
      metrics->set_kl_to_reference(MaskedMean(K3(batch.reference - current), mask));
    }
  } else {
    PolicyLossInputs inputs;
    inputs.logp = batch.logp;
    inputs.logp_prox = proximal;
    inputs.logp_behav = batch.behaviour;
    inputs.advantages = batch.advantages;
    inputs.mask = mask;
    inputs.logp_reference = batch.reference;
    inputs.entropy = entropy;
    const PolicyLoss policy = DecoupledPpoLoss(inputs, config.loss);
    loss = policy.loss;
    metrics->set_clip_fraction(policy.clip_fraction);
    metrics->set_behaviour_weight_capped_fraction(policy.capped_fraction);
    metrics->set_kl_to_behaviour(policy.kl_to_behaviour);
    metrics->set_tokens_masked_cap_fraction(policy.masked_above_cap_fraction);
    metrics->set_tokens_masked_floor_fraction(policy.masked_below_floor_fraction);
    metrics->set_tokens_masked_second_moment_fraction(policy.masked_second_moment_fraction);
    metrics->set_kl_to_reference(policy.kl_to_reference);
  }

  torch::NoGradGuard no_grad;
  if (entropy.defined()) metrics->set_entropy(MaskedMean(entropy, mask));
  const ImportanceWeightStats weights =
      SummarizeImportanceWeights(torch::exp(observed.detach() - batch.behaviour), mask);
  metrics->set_importance_weight_ess(weights.effective_sample_size);
  metrics->set_importance_weight_max(weights.max);
  metrics->set_importance_weight_min(weights.min);
  metrics->set_importance_weight_p99(weights.p99);
  metrics->set_importance_weight_p01(weights.p01);
  metrics->set_importance_weight_above_2_fraction(weights.fraction_above_2);
  metrics->set_importance_weight_below_half_fraction(weights.fraction_below_half);
  metrics->set_token_staleness_mean(MaskedMean(staleness, mask));
  metrics->set_token_staleness_max(
      mask.sum().item<double>() > 0
          ? static_cast<int64_t>((staleness * mask.to(torch::kFloat64)).max().item<double>())
          : 0);
  return loss;
}

}  // namespace sluice::trainer
