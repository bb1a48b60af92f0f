#ifndef SLUICE_TRAINER_ADVANTAGES_H_
#define SLUICE_TRAINER_ADVANTAGES_H_

#include <vector>

namespace sluice::trainer {

// GRPO's group-relative advantage of each of a group's G rewards:
//   A_i = (r_i - mean(r)) / (std(r) + eps)   when normalize_by_std
//   A_i =  r_i - mean(r)                     otherwise (Dr. GRPO)
// with the population standard deviation. A group whose rewards are all equal
// has A = 0 for every sample (no learning signal); IsUniform reports it so
// the trainer can skip the group's compute.
std::vector<double> GroupAdvantages(const std::vector<double>& rewards, bool normalize_by_std,
                                    double eps);

bool IsUniform(const std::vector<double>& rewards);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_ADVANTAGES_H_
