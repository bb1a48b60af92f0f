#ifndef SLUICE_TRAINER_OBJECTIVE_H_
#define SLUICE_TRAINER_OBJECTIVE_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "sluice/v1/common.pb.h"
#include "sluice/v1/controller.pb.h"
#include "trainer/policy_loss.h"

// The run's objective with its corrections (docs/objectives.md), as one
// function of a minibatch's tensors: which proximal policy, which weight
// bounds and masks, which aggregation, which regularisers, and the
// telemetry that goes with them. The trainer (trainer.cc) runs the forward
// passes and the optimizer around it; the pieces are policy_loss.h,
// importance_weights.h and trajectory_balance.h.
namespace sluice::trainer {

// Where decoupled PPO's log pi_prox comes from.
enum class ProximalSource {
  // The weights at the batch's start (ObjectiveBatch.proximal, from a copy
  // of them, or the current forward's when the weights have not moved).
  kRecompute,
  // AReaL's log-linear approximation in version time.
  kLogLinear,
  // The current weights, detached: truncated importance sampling.
  kCurrent,
};

// An AlgorithmConfig turned into what the step computes. Fields left at 0 /
// unspecified take the defaults the controller resolves them to (run_spec.h),
// so that a spec that did not go through the controller (tests, a client
// of the trainer's own API) trains the same.
struct ObjectiveConfig {
  v1::Objective objective = v1::OBJECTIVE_DECOUPLED_PPO;
  ProximalSource proximal = ProximalSource::kRecompute;
  // Clip, weight bounds and masks, aggregation, KL and entropy.
  PolicyLossOptions loss;
  double tb_beta = 1.0;
  bool tb_use_reference = false;
  v1::DynamicSampling dynamic_sampling = v1::DYNAMIC_SAMPLING_DROP;
  bool normalize_advantage_by_std = true;
  double advantage_eps = 1e-6;
  // STALENESS_BOUND_TOKEN: tokens more than this many versions older than
  // the current weights drop out of the loss (eta). -1 = none (GROUP: the
  // buffer evicts whole groups instead).
  int64_t max_token_staleness = -1;

  // `max_new_tokens`: the run's (what the constant normaliser defaults to).
  static ObjectiveConfig FromAlgorithm(const v1::AlgorithmConfig& algorithm,
                                       int64_t max_new_tokens);

  // The frozen reference policy's log-probs are needed (and its weights
  // kept): kl_coef > 0, or trajectory balance with tb_use_reference (as
  // run::KeepsReferencePolicy, which the memory estimate counts).
  bool UsesReference() const;
  // The entropy bonus is part of the loss (entropy_coef > 0, not trajectory
  // balance): ComputeObjective then reports the entropy figure itself.
  bool EntropyInLoss() const;
  // Groups with all-equal rewards enter the loss.
  bool TrainsUniformGroups() const {
    return dynamic_sampling == v1::DYNAMIC_SAMPLING_KEEP;
  }
};

// One minibatch in the padded [R, W] layout of rl_batch.h.
struct ObjectiveBatch {
  // The current policy: logits [R, W, V] and the targets' log-probs [R, W],
  // both differentiable (the logits only for the entropy bonus and its
  // figure).
  torch::Tensor logits;
  torch::Tensor logp;
  // 1 on trained (completion) tokens.
  torch::Tensor mask;
  torch::Tensor behaviour;   // log pi_behav
  torch::Tensor versions;    // int64: the version that sampled each token
  torch::Tensor advantages;  // GRPO advantages, per token
  // log pi_prox from a copy of the batch start's weights; undefined when
  // the current forward's are the batch start's (or not needed).
  torch::Tensor proximal;
  // log pi_ref; defined exactly when ObjectiveConfig::UsesReference().
  torch::Tensor reference;
  // Per row (trajectory balance): reward and group.
  std::vector<double> rewards;
  std::vector<int64_t> groups;
  // The version at the batch's start (v_prox) and of the current weights
  // (v_theta, the trainer's version).
  int64_t batch_start_version = 0;
  int64_t current_version = 0;
  double temperature = 1.0;
};

// The scalar loss to backpropagate, and the step's figures in `metrics`:
// clip_fraction, behaviour_weight_capped_fraction, kl_to_behaviour, the
// importance-weight statistics, the masked fractions (the stale tokens'
// among them), token staleness (of the tokens trained),
// kl_to_reference, tb_log_z_mean, and entropy when EntropyInLoss().
torch::Tensor ComputeObjective(const ObjectiveBatch& batch, const ObjectiveConfig& config,
                               v1::TrainingStepMetrics* metrics);

// Mean entropy (nats) of softmax(logits / temperature) over `mask`'s
// positions, without gradient: the step's entropy figure when the loss has
// no entropy term (measured after the backward pass, so that its
// vocabulary-sized temporaries do not add to the step's peak memory).
double EntropyFigure(const torch::Tensor& logits, const torch::Tensor& mask, double temperature);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_OBJECTIVE_H_
