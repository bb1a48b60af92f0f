#ifndef SLUICE_TRAINER_TRAJECTORY_BALANCE_H_
#define SLUICE_TRAINER_TRAJECTORY_BALANCE_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace sluice::trainer {

// One minibatch of sequences for the trajectory balance objective.
struct TrajectoryBalanceInputs {
  // [N], differentiable: log pi_theta(y_i | x_i), the sum of sample i's
  // completion token log-probs.
  torch::Tensor sequence_logp;
  // [N] constants: log pi_ref(y_i | x_i) under the frozen reference policy;
  // undefined = no reference (log pi_ref taken as 0).
  torch::Tensor sequence_logp_reference;
  // r_i, one per sample.
  std::vector<double> rewards;
  // The group (prompt) of each sample: samples with the same value share
  // one log Z. Any integers; groups need not be contiguous.
  std::vector<int64_t> groups;
};

struct TrajectoryBalanceLoss {
  torch::Tensor loss;  // scalar, differentiable through sequence_logp
  // Mean over the groups of their log Z estimate.
  double log_z_mean = 0;
};

// Trajectory balance in the VarGrad form TBA trains with (bbartoldson/TBA,
// tba_trainer_gsm8k.py), with beta = algorithm.tb_beta:
//
//   log Z(x) = stopgrad( mean_{k in group(x)} [ r_k / beta - log pi_theta(y_k) + log pi_ref(y_k) ] )
//   L_i      = ( log Z(x_i) + log pi_theta(y_i) - log pi_ref(y_i) - r_i / beta )^2
//   loss     = mean_i L_i
//
// Minimising it drives pi_theta towards pi* proportional to pi_ref exp(r / beta)
// (the KL-regularised optimum, beta the KL's weight); any sampling policy
// with full support is valid, so stale samples need no importance weight.
// Within a group the residuals sum to zero: a group of one sample has no
// signal. O(N). `beta` > 0.
TrajectoryBalanceLoss TrajectoryBalance(const TrajectoryBalanceInputs& inputs, double beta);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAJECTORY_BALANCE_H_
