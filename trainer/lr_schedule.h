#ifndef SLUICE_TRAINER_LR_SCHEDULE_H_
#define SLUICE_TRAINER_LR_SCHEDULE_H_

#include <cstdint>

#include "sluice/v1/common.pb.h"

namespace sluice::trainer {

// The RL learning rate of optimizer step `step` (1 = the first of the run,
// algorithm.total_steps = the last), from a validated, defaulted
// AlgorithmConfig: a linear warm-up over lr_warmup_steps (step k of W at
// k / W of learning_rate), then lr_schedule from learning_rate down to
// min_lr_ratio * learning_rate at total_steps:
//   CONSTANT  learning_rate
//   COSINE    lr * (m + (1 - m) * (1 + cos(pi * p)) / 2)
//   LINEAR    lr * (m + (1 - m) * (1 - p))
// with p = (step - 1 - W) / (total_steps - W) the fraction of the decay
// done before the step (the last step learns at a little above the floor).
// A resumed run gets the rate of its own step: the schedule depends on the
// step alone.
double LearningRateAt(const v1::AlgorithmConfig& algorithm, int64_t step);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_LR_SCHEDULE_H_
