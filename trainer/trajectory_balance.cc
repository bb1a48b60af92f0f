#include "trainer/trajectory_balance.h"

#include <map>

namespace sluice::trainer {

TrajectoryBalanceLoss TrajectoryBalance(const TrajectoryBalanceInputs& inputs, double beta) {
  TrajectoryBalanceLoss out;
  const int64_t n = inputs.sequence_logp.numel();
  if (n == 0) {
    out.loss = inputs.sequence_logp.sum();  // 0, still in the graph
    return out;
  }
  // Dense group ids 0..G-1 in order of appearance.
  std::map<int64_t, int64_t> dense;
  std::vector<int64_t> group_of(n);
  for (int64_t i = 0; i < n; ++i) {
    group_of[i] = dense.emplace(inputs.groups[i], static_cast<int64_t>(dense.size())).first->second;
  }
  const int64_t group_count = static_cast<int64_t>(dense.size());
  const torch::Device device = inputs.sequence_logp.device();
  const auto doubles = torch::TensorOptions().dtype(torch::kFloat64).device(device);
  const torch::Tensor index = torch::tensor(group_of, torch::kInt64).to(device);
  const torch::Tensor reward_term =
      torch::tensor(inputs.rewards, torch::kFloat64).to(device) / beta;
  const torch::Tensor reference = inputs.sequence_logp_reference.defined()
                                      ? inputs.sequence_logp_reference.detach().to(torch::kFloat64)
                                      : torch::zeros({n}, doubles);
  const torch::Tensor logp = inputs.sequence_logp.reshape({n}).to(torch::kFloat64);

  // The VarGrad estimate, per group, without gradient.
  const torch::Tensor estimate = reward_term - logp.detach() + reference;
  const torch::Tensor sums = torch::zeros({group_count}, doubles).index_add(0, index, estimate);
  const torch::Tensor counts =
      torch::zeros({group_count}, doubles).index_add(0, index, torch::ones({n}, doubles));
  const torch::Tensor log_z = sums / counts;

  const torch::Tensor residual = log_z.index_select(0, index) + logp - reference - reward_term;
  out.loss = residual.pow(2).mean().to(inputs.sequence_logp.scalar_type());
  out.log_z_mean = log_z.mean().item<double>();
  return out;
}

}  // namespace sluice::trainer
