#ifndef SLUICE_TRAINER_STEP_GUARD_H_
#define SLUICE_TRAINER_STEP_GUARD_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/transformer.h"
#include "sluice/v1/common.pb.h"

// What keeps a bad group from reaching an optimizer step, and a bad step
// from reaching the rollout workers. The replay buffer refuses poisoned
// groups at insert (replay_buffer/group_validation.h); these are the
// trainer's own guards behind it, for whatever gets past (a buffer of an
// older release, a bug, a finite value that still overflows):
//
//   1. CheckTrainableGroup before a group enters the batch: a group the
//      model cannot take (a token id outside its embedding, which LibTorch
//      reports as "index out of range in self") or whose numbers would make
//      the loss NaN is left out of the batch, counted and logged.
//   2. The loss and the gradient norm must be finite for the optimizer to
//      step; otherwise the step makes no update (TrainerRun).
//   3. FirstNonFiniteParameter after the step: a finite but huge update can
//      still overflow a weight; the trainer then puts back the last
//      published weights. Publish checks it once more, so a non-finite
//      weight is never published.
namespace sluice::trainer {

// OK when every trajectory of `group` can be trained on: prompt and
// completion token ids in [0, vocab_size), a non-empty prompt, one finite
// behaviour log-prob and one policy version per completion token, versions
// non-decreasing, none below the group's min_policy_version nor above
// `trainer_version`, and a finite reward. Otherwise INVALID_ARGUMENT naming
// the trajectory and field, e.g. "trajectory g7/2: completion_token_ids[4]
// is 1000000000, outside the model's vocabulary [0, 64)". O(tokens).
absl::Status CheckTrainableGroup(const v1::Group& group, int64_t vocab_size,
                                 int64_t trainer_version);

// The name of the first parameter holding a NaN or an infinity, or nullopt
// when all are finite. One pass over the weights.
std::optional<std::string> FirstNonFiniteParameter(const std::vector<model::NamedTensor>& params);

// Guards 2 and 3 around optimizer.step(), after backward and clipping: when
// `loss` or `grad_norm` is not finite, zeroes the gradients and does not
// step (a NaN gradient would make every weight NaN, and the optimizer's
// moments with them); otherwise steps, and when that leaves a non-finite
// value in `params`, calls `restore` (which puts the last published weights
// back) and clears the optimizer's state (its moments carry the overflow).
// Returns why no update was made, or "" when one was; an error only from
// `restore`.
absl::StatusOr<std::string> GuardedStep(torch::optim::Optimizer& optimizer,
                                        const std::vector<model::NamedTensor>& params, double loss,
                                        double grad_norm,
                                        const std::function<absl::Status()>& restore);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_STEP_GUARD_H_
