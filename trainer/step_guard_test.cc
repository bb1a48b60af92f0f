#include "trainer/step_guard.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

using ::testing::HasSubstr;

v1::Group TrainableGroup() {
  v1::Group group;
  group.set_group_id("g");
  group.set_min_policy_version(2);
  for (int i = 0; i < 2; ++i) {
    v1::Trajectory* t = group.add_trajectories();
    t->set_trajectory_id("g/" + std::to_string(i));
    for (int id : {1, 2, 3}) t->add_prompt_token_ids(id);
    for (int id : {4, 5}) {
      t->add_completion_token_ids(id);
      t->add_behaviour_logprobs(-1.0f);
      t->add_token_policy_versions(2 + i);
    }
    t->set_reward(i);
  }
  return group;
}

TEST(StepGuardTest, ATrainableGroupPasses) {
  EXPECT_TRUE(CheckTrainableGroup(TrainableGroup(), 64, 3).ok());
}

TEST(StepGuardTest, WhatWouldPoisonTheStepIsNamed) {
  v1::Group group = TrainableGroup();
  group.mutable_trajectories(1)->set_completion_token_ids(1, 1000000000);
  EXPECT_EQ(CheckTrainableGroup(group, 64, 3).message(),
            "trajectory g/1: completion_token_ids[1] is 1000000000, outside the model's "
            "vocabulary [0, 64)");
  group = TrainableGroup();
  group.mutable_trajectories(0)->set_prompt_token_ids(0, -1);
  EXPECT_THAT(CheckTrainableGroup(group, 64, 3).message(), HasSubstr("prompt_token_ids[0] is -1"));
  group = TrainableGroup();
  group.mutable_trajectories(0)->set_behaviour_logprobs(1, std::nanf(""));
  EXPECT_EQ(CheckTrainableGroup(group, 64, 3).message(),
            "trajectory g/0: behaviour_logprobs[1] is nan");
  group = TrainableGroup();
  group.mutable_trajectories(1)->set_reward(std::numeric_limits<double>::infinity());
  EXPECT_EQ(CheckTrainableGroup(group, 64, 3).message(), "trajectory g/1: reward is inf");
  group = TrainableGroup();
  group.mutable_trajectories(0)->clear_prompt_token_ids();
  EXPECT_EQ(CheckTrainableGroup(group, 64, 3).message(), "trajectory g/0: the prompt is empty");
  // A version the trainer has not published yet.
  EXPECT_EQ(CheckTrainableGroup(TrainableGroup(), 64, 2).message(),
            "trajectory g/1: token 0 has policy version 3 (group min 2, trainer at 2)");
  group = TrainableGroup();
  group.mutable_trajectories(0)->mutable_behaviour_logprobs()->RemoveLast();
  EXPECT_EQ(CheckTrainableGroup(group, 64, 3).message(),
            "trajectory g/0: has 1 behaviour log-probs and 2 token versions for 2 tokens");
}

TEST(StepGuardTest, FindsTheFirstNonFiniteParameter) {
  std::vector<model::NamedTensor> params = {{"a", torch::zeros({3})}, {"b", torch::ones({2, 2})}};
  EXPECT_EQ(FirstNonFiniteParameter(params), std::nullopt);
  params[1].tensor[1][0] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FirstNonFiniteParameter(params), "b");
  params[0].tensor[2] = std::nanf("");
  EXPECT_EQ(FirstNonFiniteParameter(params), "a");
}

// Two weights under plain SGD, whose update p -= lr * g overflows for a
// large enough (finite) learning rate.
class GuardedStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    params_ = {{"w", torch::full({2}, 0.5f).requires_grad_()},
               {"v", torch::full({3}, -0.25f).requires_grad_()}};
    published_ = {params_[0].tensor.detach().clone(), params_[1].tensor.detach().clone()};
  }
  std::vector<torch::Tensor> Tensors() const { return {params_[0].tensor, params_[1].tensor}; }
  void SetGradients(float value) {
    for (auto& param : params_) param.tensor.mutable_grad() = torch::full_like(param.tensor, value);
  }
  absl::Status Restore() {
    ++restores_;
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) params_[i].tensor.copy_(published_[i]);
    return absl::OkStatus();
  }
  std::function<absl::Status()> RestoreFn() {
    return [this] { return Restore(); };
  }

  std::vector<model::NamedTensor> params_;
  std::vector<torch::Tensor> published_;
  int restores_ = 0;
};

TEST_F(GuardedStepTest, AFiniteStepUpdates) {
  torch::optim::SGD sgd(Tensors(), torch::optim::SGDOptions(0.1));
  SetGradients(1.0f);
  absl::StatusOr<std::string> skipped = GuardedStep(sgd, params_, 0.3, 1.0, RestoreFn());
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "");
  EXPECT_FLOAT_EQ(params_[0].tensor[0].item<float>(), 0.4f);
  EXPECT_EQ(restores_, 0);
}

TEST_F(GuardedStepTest, ANonFiniteLossOrGradientNormMakesNoUpdate) {
  torch::optim::SGD sgd(Tensors(), torch::optim::SGDOptions(0.1));
  for (const auto& [loss, norm] : std::vector<std::pair<double, double>>{
           {std::nan(""), 1.0}, {1.0, std::numeric_limits<double>::infinity()}}) {
    SetGradients(std::nanf(""));
    absl::StatusOr<std::string> skipped = GuardedStep(sgd, params_, loss, norm, RestoreFn());
    ASSERT_TRUE(skipped.ok());
    EXPECT_THAT(*skipped, HasSubstr("is not finite"));
    EXPECT_FLOAT_EQ(params_[0].tensor[0].item<float>(), 0.5f);
    EXPECT_FALSE(params_[0].tensor.grad().defined() &&
                 torch::isnan(params_[0].tensor.grad()).any().item<bool>());
  }
  EXPECT_EQ(restores_, 0);
}

TEST_F(GuardedStepTest, AnUpdateThatOverflowsAWeightIsRolledBack) {
  torch::optim::SGD sgd(Tensors(), torch::optim::SGDOptions(1e38));
  SetGradients(10.0f);  // 0.5 - 1e39: infinite in float
  absl::StatusOr<std::string> skipped = GuardedStep(sgd, params_, 0.3, 1.0, RestoreFn());
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "the update made w non-finite; the previous weights were restored");
  EXPECT_EQ(restores_, 1);
  EXPECT_EQ(FirstNonFiniteParameter(params_), std::nullopt);
  EXPECT_FLOAT_EQ(params_[1].tensor[2].item<float>(), -0.25f);
}

TEST_F(GuardedStepTest, ARestoreErrorIsReturned) {
  torch::optim::SGD sgd(Tensors(), torch::optim::SGDOptions(1e38));
  SetGradients(10.0f);
  absl::StatusOr<std::string> skipped = GuardedStep(
      sgd, params_, 0.3, 1.0, [] { return absl::InternalError("no published version"); });
  EXPECT_EQ(skipped.status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace sluice::trainer
