#include "common/model/generation.h"

#include <atomic>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/model/test_models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kVocab = 24;

std::shared_ptr<const Transformer> Model(uint64_t seed, const std::string& name = "tiny") {
  return testing::TestModel(seed, kVocab, name);
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 3, 10, 13, 7, 8, 16}, {1, 4, 16}, {1, 11, 3, 13, 12}, {5}};

// Logits of the full (uncached) forward over prompt + completion, one row.
torch::Tensor FullLogits(const Transformer& model, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& completion) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), completion.begin(), completion.end());
  torch::NoGradGuard no_grad;
  return model.Forward(torch::tensor(ids).unsqueeze(0))[0];
}

SamplingOptions Greedy(int64_t max_new_tokens) {
  SamplingOptions options;
  options.temperature = 0;
  options.max_new_tokens = max_new_tokens;
  return options;
}

TEST(GenerateTest, GreedyPicksTheArgmaxOfTheFullForwardAtEveryStep) {
  auto model = Model(1);
  absl::StatusOr<std::vector<Completion>> completions = Generate({model, 0}, kPrompts, Greedy(8));
  ASSERT_TRUE(completions.ok()) << completions.status();
  ASSERT_EQ(completions->size(), kPrompts.size());
  for (size_t row = 0; row < kPrompts.size(); ++row) {
    const Completion& completion = (*completions)[row];
    ASSERT_EQ(completion.tokens.size(), 8u);
    EXPECT_EQ(completion.finish, Finish::kLength);
    EXPECT_THAT(completion.versions, ::testing::Each(0));
    EXPECT_EQ(completion.weight_swaps, 0);
    const torch::Tensor logits = FullLogits(*model, kPrompts[row], completion.tokens);
    const int64_t prompt_length = static_cast<int64_t>(kPrompts[row].size());
    for (size_t i = 0; i < completion.tokens.size(); ++i) {
      const torch::Tensor step = logits[prompt_length - 1 + static_cast<int64_t>(i)];
      // The chosen token is the maximum up to float noise.
      EXPECT_GE(step[completion.tokens[i]].item<float>(), step.max().item<float>() - 1e-5)
          << "row " << row << " token " << i;
      EXPECT_NEAR(completion.logprobs[i],
                  torch::log_softmax(step, -1)[completion.tokens[i]].item<float>(), 1e-4);
    }
  }
}

TEST(GenerateTest, BehaviourLogProbsMatchTheFullForwardAtTemperature) {
  auto model = Model(2);
  SamplingOptions options;
  options.temperature = 0.7;
  options.max_new_tokens = 10;
  options.seed = 3;
  absl::StatusOr<std::vector<Completion>> completions = Generate({model, 0}, kPrompts, options);
  ASSERT_TRUE(completions.ok());
  for (size_t row = 0; row < kPrompts.size(); ++row) {
    const Completion& completion = (*completions)[row];
    const torch::Tensor logits = FullLogits(*model, kPrompts[row], completion.tokens);
    const int64_t prompt_length = static_cast<int64_t>(kPrompts[row].size());
    const int64_t n = static_cast<int64_t>(completion.tokens.size());
    const torch::Tensor expected = TokenLogProbs(
        logits.narrow(0, prompt_length - 1, n),
        torch::tensor(std::vector<int64_t>(completion.tokens.begin(), completion.tokens.end())),
        0.7);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(completion.logprobs[i], expected[i].item<float>(), 1e-4)
          << "row " << row << " token " << i;
    }
  }
}

TEST(GenerateTest, SameSeedSameOutputDifferentSeedDifferentOutput) {
  auto model = Model(3);
  SamplingOptions options;
  options.max_new_tokens = 12;
  options.seed = 42;
  std::vector<std::vector<int32_t>> prompts(8, {1, 3, 10, 13});
  const std::vector<Completion> first = *Generate({model, 0}, prompts, options);
  const std::vector<Completion> second = *Generate({model, 0}, prompts, options);
  options.seed = 43;
  const std::vector<Completion> other = *Generate({model, 0}, prompts, options);
  bool any_difference = false;
  std::set<std::vector<int32_t>> distinct_rows;
  for (size_t row = 0; row < prompts.size(); ++row) {
    EXPECT_EQ(first[row].tokens, second[row].tokens);
    EXPECT_EQ(first[row].logprobs, second[row].logprobs);
    any_difference |= first[row].tokens != other[row].tokens;
    distinct_rows.insert(first[row].tokens);
  }
  EXPECT_TRUE(any_difference);
  // Identical prompts still sample independently.
  EXPECT_GT(distinct_rows.size(), 1u);
}

TEST(GenerateTest, StopTokenEndsARowAndIsKept) {
  auto model = Model(4);
  const std::vector<Completion> free_run = *Generate({model, 0}, kPrompts, Greedy(10));
  // Stop on row 0's third greedy token: row 0 must stop there, or earlier
  // if that token came before.
  const int32_t stop = free_run[0].tokens[2];
  SamplingOptions options = Greedy(10);
  options.stop_token_ids = {stop};
  const std::vector<Completion> stopped = *Generate({model, 0}, kPrompts, options);
  for (size_t row = 0; row < kPrompts.size(); ++row) {
    const std::vector<int32_t>& tokens = stopped[row].tokens;
    const std::vector<int32_t>& free_tokens = free_run[row].tokens;
    auto first_stop = std::find(free_tokens.begin(), free_tokens.end(), stop);
    if (first_stop == free_tokens.end()) {
      EXPECT_EQ(stopped[row].finish, Finish::kLength);
      EXPECT_EQ(tokens, free_tokens);
    } else {
      EXPECT_EQ(stopped[row].finish, Finish::kStop) << "row " << row;
      // Greedy is unaffected by other rows, so the row is the free run's
      // prefix up to and including the stop token.
      EXPECT_EQ(tokens, std::vector<int32_t>(free_tokens.begin(), first_stop + 1));
      EXPECT_EQ(stopped[row].logprobs.size(), tokens.size());
      EXPECT_EQ(stopped[row].versions.size(), tokens.size());
    }
  }
  EXPECT_EQ(stopped[0].finish, Finish::kStop);
  EXPECT_EQ(stopped[0].tokens.back(), stop);
  EXPECT_LE(stopped[0].tokens.size(), 3u);
}

TEST(GenerateTest, MaxNewTokensIsRespectedAndCappedByTheContext) {
  auto model = Model(5);
  SamplingOptions options;
  options.max_new_tokens = 3;
  const std::vector<Completion> short_run = *Generate({model, 0}, kPrompts, options);
  for (const Completion& completion : short_run) {
    EXPECT_EQ(completion.tokens.size(), 3u);
    EXPECT_EQ(completion.finish, Finish::kLength);
  }
  // 32 positions: a 30-token prompt leaves room for 2.
  const std::vector<std::vector<int32_t>> long_prompts = {std::vector<int32_t>(30, 5), {1, 2}};
  options.max_new_tokens = 16;
  const std::vector<Completion> capped = *Generate({model, 0}, long_prompts, options);
  EXPECT_EQ(capped[0].tokens.size(), 2u);
  EXPECT_EQ(capped[1].tokens.size(), 2u);

  absl::StatusOr<std::vector<Completion>> full =
      Generate({model, 0}, {std::vector<int32_t>(32, 5)}, options);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(full.status().message()), HasSubstr("no room"));
}

TEST(GenerateTest, TinyTopPAndTopKOneSampleGreedily) {
  auto model = Model(6);
  const std::vector<Completion> greedy = *Generate({model, 0}, kPrompts, Greedy(8));
  SamplingOptions nucleus;
  nucleus.top_p = 1e-6;
  nucleus.max_new_tokens = 8;
  nucleus.seed = 9;
  SamplingOptions top_one = nucleus;
  top_one.top_p = 1.0;
  top_one.top_k = 1;
  for (const SamplingOptions& options : {nucleus, top_one}) {
    const std::vector<Completion> sampled = *Generate({model, 0}, kPrompts, options);
    for (size_t row = 0; row < kPrompts.size(); ++row) {
      EXPECT_EQ(sampled[row].tokens, greedy[row].tokens);
      // At temperature 1 the behaviour log-prob is the untruncated one, as
      // the greedy run's.
      for (size_t i = 0; i < greedy[row].logprobs.size(); ++i) {
        EXPECT_NEAR(sampled[row].logprobs[i], greedy[row].logprobs[i], 1e-5);
      }
    }
  }
}

TEST(GenerateTest, TopKSamplesOnlyAmongTheKMostLikely) {
  auto model = Model(7);
  SamplingOptions options;
  options.top_k = 3;
  options.temperature = 2.0;  // flat enough that truncation matters
  options.max_new_tokens = 1;
  std::vector<std::vector<int32_t>> prompts(64, {1, 3, 10, 13});
  const torch::Tensor logits = FullLogits(*model, prompts[0], {})[3];
  const torch::Tensor top3 = std::get<1>(logits.topk(3));
  std::set<int64_t> allowed;
  for (int64_t i = 0; i < 3; ++i) allowed.insert(top3[i].item<int64_t>());
  std::set<int64_t> seen;
  const std::vector<Completion> sampled = *Generate({model, 0}, prompts, options);
  for (const Completion& completion : sampled) {
    EXPECT_EQ(allowed.count(completion.tokens[0]), 1u) << completion.tokens[0];
    seen.insert(completion.tokens[0]);
  }
  EXPECT_GT(seen.size(), 1u);
}

TEST(GenerateTest, PolicySwapKeepsTheCacheAndVersionsTheTokens) {
  auto old_model = Model(8);
  auto new_model = Model(9);
  const std::vector<std::vector<int32_t>> prompts = {{1, 3, 10, 13, 7}, {1, 4, 16, 5, 5}};
  int calls = 0;
  GenerationHooks hooks;
  hooks.current_policy = [&] {
    ++calls;
    return calls >= 3 ? PolicySnapshot{new_model, 1} : PolicySnapshot{old_model, 0};
  };
  const std::vector<Completion> swapped = *Generate({old_model, 0}, prompts, Greedy(4), hooks);
  EXPECT_EQ(calls, 4);  // once per step, prefill included
  for (const Completion& completion : swapped) {
    EXPECT_THAT(completion.versions, ElementsAre(0, 0, 1, 1));
    EXPECT_EQ(completion.weight_swaps, 1);
  }

  // The same decode by hand: prefill and step 1 on the old model, then the
  // new model reading the old model's cache.
  torch::NoGradGuard no_grad;
  torch::Tensor ids = torch::tensor({1, 3, 10, 13, 7, 1, 4, 16, 5, 5}).view({2, 5});
  torch::Tensor positions = torch::arange(5, torch::kInt64).unsqueeze(0).expand({2, 5});
  KVCache cache = old_model->NewCache(2, 8);
  std::vector<torch::Tensor> step_logits;
  step_logits.push_back(old_model->ForwardCached(ids, positions, torch::ones({2, 5}), cache).select(1, 4));
  for (int step = 1; step < 4; ++step) {
    const Transformer& model = step >= 2 ? *new_model : *old_model;
    torch::Tensor token = torch::tensor({int64_t{swapped[0].tokens[step - 1]},
                                         int64_t{swapped[1].tokens[step - 1]}})
                              .view({2, 1});
    torch::Tensor position = torch::full({2, 1}, 4 + step, torch::kInt64);
    step_logits.push_back(
        model.ForwardCached(token, position, torch::ones({2, 5 + step}), cache).select(1, 0));
  }
  for (int row = 0; row < 2; ++row) {
    for (int step = 0; step < 4; ++step) {
      const torch::Tensor logprobs = torch::log_softmax(step_logits[step][row], -1);
      EXPECT_EQ(logprobs.argmax().item<int64_t>(), swapped[row].tokens[step]);
      EXPECT_NEAR(swapped[row].logprobs[step], logprobs[swapped[row].tokens[step]].item<float>(),
                  1e-5);
    }
  }
  // And the swap changed something: the old model alone decodes otherwise.
  const std::vector<Completion> unswapped = *Generate({old_model, 0}, prompts, Greedy(4));
  EXPECT_NE(unswapped[0].logprobs[2], swapped[0].logprobs[2]);
}

TEST(GenerateTest, SwapsAreCountedOnlyForRowsStillDecoding) {
  auto old_model = Model(10);
  auto new_model = Model(11);
  // Row 0 stops at its first token (its greedy first token is the stop).
  const std::vector<Completion> free_run = *Generate({old_model, 0}, kPrompts, Greedy(1));
  SamplingOptions options = Greedy(4);
  options.stop_token_ids = {free_run[0].tokens[0]};
  int calls = 0;
  GenerationHooks hooks;
  hooks.current_policy = [&] {
    ++calls;
    return calls >= 2 ? PolicySnapshot{new_model, 7} : PolicySnapshot{old_model, 0};
  };
  const std::vector<Completion> completions = *Generate({old_model, 0}, kPrompts, options, hooks);
  EXPECT_EQ(completions[0].finish, Finish::kStop);
  EXPECT_EQ(completions[0].weight_swaps, 0);
  EXPECT_THAT(completions[0].versions, ElementsAre(0));
  for (size_t row = 1; row < kPrompts.size(); ++row) {
    if (completions[row].tokens.size() > 1) {
      EXPECT_EQ(completions[row].weight_swaps, 1);
      EXPECT_EQ(completions[row].versions[1], 7);
    }
  }
}

TEST(GenerateTest, AbortEndsUnfinishedRows) {
  auto model = Model(12);
  int polls = 0;
  GenerationHooks hooks;
  hooks.should_abort = [&] { return ++polls > 2; };
  const std::vector<Completion> aborted = *Generate({model, 0}, kPrompts, Greedy(8), hooks);
  for (const Completion& completion : aborted) {
    EXPECT_EQ(completion.finish, Finish::kAborted);
    EXPECT_EQ(completion.tokens.size(), 2u);
    EXPECT_EQ(completion.logprobs.size(), 2u);
  }
  hooks.should_abort = [] { return true; };
  const std::vector<Completion> at_once = *Generate({model, 0}, kPrompts, Greedy(8), hooks);
  for (const Completion& completion : at_once) {
    EXPECT_EQ(completion.finish, Finish::kAborted);
    EXPECT_TRUE(completion.tokens.empty());
  }
}

TEST(GenerateTest, RejectsBadPromptsAndOptions) {
  auto model = Model(13, "micro");
  EXPECT_EQ(Generate({model, 0}, {{1, 2}, {}}, Greedy(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<Completion>> out_of_range = Generate({model, 0}, {{1, 24}}, Greedy(2));
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out_of_range.status().message()), HasSubstr("24"));
  SamplingOptions options;
  options.top_p = 0;
  EXPECT_THAT(std::string(Generate({model, 0}, {{1}}, options).status().message()),
              HasSubstr("top_p"));
  options = SamplingOptions();
  options.temperature = -1;
  EXPECT_FALSE(Generate({model, 0}, {{1}}, options).ok());
  options = SamplingOptions();
  options.max_new_tokens = 0;
  EXPECT_FALSE(Generate({model, 0}, {{1}}, options).ok());
  EXPECT_FALSE(Generate({nullptr, 0}, {{1}}, SamplingOptions()).ok());
  EXPECT_TRUE(Generate({model, 0}, {}, SamplingOptions())->empty());

  // A swap to a model of another shape would corrupt the cache.
  auto tiny = Model(14, "tiny");
  GenerationHooks hooks;
  hooks.current_policy = [&] { return PolicySnapshot{tiny, 1}; };
  EXPECT_EQ(Generate({model, 0}, {{1}}, SamplingOptions(), hooks).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Defence in depth behind the worker's check of received weights: a policy
// whose logits are NaN is an error naming the step and version, never a
// LibTorch exception out of torch::multinomial ("probability tensor
// contains either inf, nan or element < 0"), which would end the process.
TEST(GenerateTest, NonFiniteLogitsAreAnErrorNotACrash) {
  auto good = Model(15, "micro");
  absl::StatusOr<std::unique_ptr<Transformer>> broken =
      Transformer::Create(*BuiltinModelConfig("micro", kVocab), 16);
  ASSERT_TRUE(broken.ok());
  std::vector<NamedTensor> weights;
  for (const NamedTensor& param : (*broken)->parameters()) {
    weights.push_back({param.name, torch::full(param.tensor.sizes(), std::nanf(""))});
  }
  ASSERT_TRUE((*broken)->LoadWeights(weights).ok());
  std::shared_ptr<const Transformer> nan_model(std::move(*broken));

  for (double temperature : {1.0, 0.0}) {
    SamplingOptions options;
    options.temperature = temperature;
    options.max_new_tokens = 3;
    absl::StatusOr<std::vector<Completion>> out = Generate({nan_model, 7}, kPrompts, options);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << temperature;
    EXPECT_THAT(std::string(out.status().message()),
                HasSubstr("decoding step 0 with policy version 7: the policy produced NaN"));
  }
  // The same after a swap to it mid-generation.
  GenerationHooks hooks;
  int calls = 0;
  hooks.current_policy = [&] {
    return ++calls <= 2 ? PolicySnapshot{good, 0} : PolicySnapshot{nan_model, 1};
  };
  SamplingOptions options;
  options.max_new_tokens = 5;
  absl::StatusOr<std::vector<Completion>> swapped =
      Generate({good, 0}, kPrompts, options, hooks);
  EXPECT_EQ(swapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(swapped.status().message()), HasSubstr("step 2 with policy version 1"));
}

}  // namespace
}  // namespace sluice::model
