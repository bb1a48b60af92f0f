#include "common/model/engine.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "common/model/test_models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::model {
namespace {

using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kVocab = 24;

std::shared_ptr<const Transformer> Model(uint64_t seed, const std::string& name = "tiny") {
  return testing::TestModel(seed, kVocab, name);
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {1, 3, 10, 13, 7, 8, 16}, {1, 4, 16}, {1, 11, 3, 13, 12}, {5}};

// Log-softmax of the full (uncached) forward over prompt + tokens[0, n):
// row i is the distribution of completion token i.
torch::Tensor FullLogProbs(const Transformer& model, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& tokens, double temperature = 1.0) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  ids.insert(ids.end(), tokens.begin(), tokens.end());
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = model.Forward(torch::tensor(ids).unsqueeze(0))[0];
  return torch::log_softmax(
      logits.narrow(0, static_cast<int64_t>(prompt.size()) - 1, static_cast<int64_t>(tokens.size())) /
          temperature,
      -1);
}

SamplingOptions Sampling(double temperature, int64_t max_new_tokens) {
  SamplingOptions options;
  options.temperature = temperature;
  options.max_new_tokens = max_new_tokens;
  return options;
}

// G samples per prompt, each with its own seed and length limit.
std::vector<std::vector<SampleRequest>> Requests(size_t prompts, int group, uint64_t seed,
                                                 bool varied_lengths) {
  std::vector<std::vector<SampleRequest>> requests(prompts);
  for (size_t p = 0; p < prompts; ++p) {
    for (int g = 0; g < group; ++g) {
      SampleRequest request;
      request.seed = seed * 1000 + p * 10 + g;
      if (varied_lengths) request.max_new_tokens = 2 + static_cast<int64_t>((p * 7 + g * 5) % 11);
      requests[p].push_back(request);
    }
  }
  return requests;
}

TEST(SampleUniformTest, InUnitIntervalAndDistinctPerSeedAndToken) {
  std::set<double> seen;
  double sum = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    for (int64_t t = 0; t < 40; ++t) {
      const double u = SampleUniform(seed, t);
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      seen.insert(u);
      sum += u;
    }
  }
  EXPECT_EQ(seen.size(), 2000u);
  EXPECT_NEAR(sum / 2000, 0.5, 0.02);
  EXPECT_EQ(SampleUniform(7, 3), SampleUniform(7, 3));
}

// The engine's central promise: a sample decoded among others, joining and
// leaving a running batch that is smaller than the work, gets the tokens of
// a batch of one with the same seed (and log-probs equal to rounding).
TEST(EngineTest, ASampleInAContinuousBatchEqualsABatchOfOne) {
  auto model = Model(1);
  EngineOptions options;
  options.max_rows = 5;  // 12 samples of varied lengths through 5 rows
  const auto requests = Requests(kPrompts.size(), 3, 4, /*varied_lengths=*/true);
  absl::StatusOr<std::vector<Completion>> batched =
      GenerateContinuous({model, 3}, kPrompts, requests, options, Sampling(1.0, 16));
  ASSERT_TRUE(batched.ok()) << batched.status();
  ASSERT_EQ(batched->size(), 12u);
  std::set<std::vector<int32_t>> distinct;
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    for (size_t g = 0; g < 3; ++g) {
      const Completion& in_batch = (*batched)[p * 3 + g];
      EngineOptions alone_options;
      alone_options.max_rows = 1;
      absl::StatusOr<std::vector<Completion>> alone = GenerateContinuous(
          {model, 3}, {kPrompts[p]}, {{requests[p][g]}}, alone_options, Sampling(1.0, 16));
      ASSERT_TRUE(alone.ok()) << alone.status();
      const Completion& single = alone->front();
      EXPECT_EQ(in_batch.tokens, single.tokens) << "prompt " << p << " sample " << g;
      ASSERT_EQ(in_batch.logprobs.size(), single.logprobs.size());
      for (size_t i = 0; i < single.logprobs.size(); ++i) {
        EXPECT_NEAR(in_batch.logprobs[i], single.logprobs[i], 1e-4);
      }
      EXPECT_THAT(in_batch.versions, Each(3));
      EXPECT_EQ(in_batch.finish, Finish::kLength);
      EXPECT_EQ(static_cast<int64_t>(in_batch.tokens.size()), requests[p][g].max_new_tokens);
      // And each log-prob is the full forward's: the cache rows (moved
      // about as samples leave) hold the right keys.
      const torch::Tensor full = FullLogProbs(*model, kPrompts[p], in_batch.tokens);
      for (size_t i = 0; i < in_batch.tokens.size(); ++i) {
        EXPECT_NEAR(in_batch.logprobs[i], full[i][in_batch.tokens[i]].item<float>(), 1e-4)
            << "prompt " << p << " sample " << g << " token " << i;
      }
      distinct.insert(in_batch.tokens);
    }
  }
  EXPECT_GT(distinct.size(), 6u);  // seeds differ, so samples do
}

TEST(EngineTest, NoRowStepIsWastedAndAGroupIsPrefilledOnce) {
  auto model = Model(2);
  EngineOptions options;
  options.max_rows = 4;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(model->config(), options, Sampling(1.0, 16));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const auto requests = Requests(kPrompts.size(), 4, 9, /*varied_lengths=*/true);
  int64_t tokens_asked = 0;
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    for (const SampleRequest& r : requests[p]) tokens_asked += r.max_new_tokens;
    ASSERT_TRUE((*engine)->AddGroup(kPrompts[p], requests[p]).ok());
  }
  int64_t tokens = 0;
  int64_t steps = 0;
  while (!(*engine)->idle()) {
    EXPECT_LE((*engine)->running(), 4);
    absl::StatusOr<std::vector<FinishedSample>> finished = (*engine)->Step({model, 0});
    ASSERT_TRUE(finished.ok()) << finished.status();
    for (const FinishedSample& s : *finished) tokens += static_cast<int64_t>(s.completion.tokens.size());
    ++steps;
  }
  EXPECT_EQ(tokens, tokens_asked);
  const EngineStats& stats = (*engine)->stats();
  // Every decoded row produced a token (the first token of each sample
  // comes from its prompt's prefill): nothing decoded was thrown away.
  EXPECT_EQ(stats.decoded_rows, tokens_asked - 16);
  EXPECT_EQ(stats.prompt_prefills, 4);  // one per group, not per sample
  EXPECT_GT(stats.compactions, 0);
  EXPECT_LT(steps, tokens_asked / 2);
}

TEST(EngineTest, GreedyFollowsTheFullForwardAndStopTokensEndSamples) {
  auto model = Model(3);
  SamplingOptions sampling = Sampling(0.0, 10);
  // The argmax after prompt 0 and greedy continuation: make its third token a stop id.
  absl::StatusOr<std::vector<Completion>> free =
      GenerateContinuous({model, 0}, kPrompts, Requests(kPrompts.size(), 1, 1, false), {},
                         sampling);
  ASSERT_TRUE(free.ok()) << free.status();
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    const Completion& c = (*free)[p];
    const torch::Tensor full = FullLogProbs(*model, kPrompts[p], c.tokens);
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      EXPECT_EQ(full[i].argmax().item<int64_t>(), c.tokens[i]);
      EXPECT_NEAR(c.logprobs[i], full[i][c.tokens[i]].item<float>(), 1e-4);
    }
  }
  sampling.stop_token_ids = {(*free)[0].tokens[2]};
  absl::StatusOr<std::vector<Completion>> stopped = GenerateContinuous(
      {model, 0}, {kPrompts[0]}, Requests(1, 1, 1, false), {}, sampling);
  ASSERT_TRUE(stopped.ok());
  const Completion& c = stopped->front();
  EXPECT_EQ(c.finish, Finish::kStop);
  // Ends at the first occurrence of the stop id, which is kept.
  const auto first = std::find((*free)[0].tokens.begin(), (*free)[0].tokens.end(),
                               (*free)[0].tokens[2]);
  EXPECT_EQ(c.tokens, std::vector<int32_t>((*free)[0].tokens.begin(), first + 1));
}

TEST(EngineTest, StopStringsEndASampleAtTheTokenThatCompletesThem) {
  auto model = Model(4);
  // Token i spells one letter: 'a' + i % 26.
  const auto detokenize = [](const std::vector<int32_t>& ids) {
    std::string text;
    for (int32_t id : ids) text.push_back(static_cast<char>('a' + id % 26));
    return text;
  };
  SamplingOptions sampling = Sampling(1.0, 30);
  const auto requests = Requests(1, 1, 5, false);
  absl::StatusOr<std::vector<Completion>> free =
      GenerateContinuous({model, 0}, {kPrompts[2]}, requests, {}, sampling);
  ASSERT_TRUE(free.ok());
  const std::string text = detokenize(free->front().tokens);
  ASSERT_GE(text.size(), 8u);
  const std::string stop = text.substr(4, 3);
  EngineOptions options;
  options.stop_strings = {stop};
  options.detokenize = detokenize;
  absl::StatusOr<std::vector<Completion>> stopped =
      GenerateContinuous({model, 0}, {kPrompts[2]}, requests, options, sampling);
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  const Completion& c = stopped->front();
  EXPECT_EQ(c.finish, Finish::kStop);
  const size_t end = text.find(stop) + stop.size();
  EXPECT_EQ(c.tokens, std::vector<int32_t>(free->front().tokens.begin(),
                                           free->front().tokens.begin() + end));

  options.detokenize = nullptr;
  EXPECT_EQ(Engine::Create(model->config(), options, sampling).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A hook that swaps to `next` after `after` calls.
GenerationHooks SwapAfter(int after, PolicySnapshot before, PolicySnapshot next, int* calls) {
  GenerationHooks hooks;
  hooks.current_policy = [=] { return ++*calls > after ? next : before; };
  return hooks;
}

TEST(EngineTest, SwapKeepingTheCacheVersionsTokensAndReadsTheOldKeys) {
  auto old_model = Model(8);
  auto new_model = Model(9);
  int calls = 0;
  EngineOptions options;
  options.swap_mode = SwapMode::kKeepCache;
  // Step 1 prefills and decodes (tokens 0 and 1 under v0), steps 2.. under v1.
  absl::StatusOr<std::vector<Completion>> out = GenerateContinuous(
      {old_model, 0}, {kPrompts[0], kPrompts[2]}, Requests(2, 2, 3, false), options,
      Sampling(1.0, 6), SwapAfter(1, {old_model, 0}, {new_model, 1}, &calls));
  ASSERT_TRUE(out.ok()) << out.status();
  bool differs_from_recompute = false;
  for (size_t i = 0; i < out->size(); ++i) {
    const Completion& c = (*out)[i];
    EXPECT_THAT(c.versions, ElementsAre(0, 0, 1, 1, 1, 1));
    EXPECT_EQ(c.weight_swaps, 1);
    const std::vector<int32_t>& prompt = i < 2 ? kPrompts[0] : kPrompts[2];
    const torch::Tensor old_full = FullLogProbs(*old_model, prompt, c.tokens);
    const torch::Tensor new_full = FullLogProbs(*new_model, prompt, c.tokens);
    for (size_t t = 0; t < 2; ++t) {
      EXPECT_NEAR(c.logprobs[t], old_full[t][c.tokens[t]].item<float>(), 1e-4);
    }
    // After the swap the new weights read keys the old ones wrote: not the
    // new model's own view of the sequence.
    for (size_t t = 2; t < 6; ++t) {
      if (std::abs(c.logprobs[t] - new_full[t][c.tokens[t]].item<float>()) > 1e-3) {
        differs_from_recompute = true;
      }
    }
  }
  EXPECT_TRUE(differs_from_recompute);
}

TEST(EngineTest, SwapRecomputingTheCacheDecodesAsTheNewModelSeesTheSequence) {
  auto old_model = Model(8);
  auto new_model = Model(9);
  int calls = 0;
  EngineOptions options;
  options.swap_mode = SwapMode::kRecompute;
  options.max_rows = 3;  // some samples wait, and start under the new version
  absl::StatusOr<std::vector<Completion>> out = GenerateContinuous(
      {old_model, 0}, {kPrompts[0], kPrompts[2]}, Requests(2, 2, 3, false), options,
      Sampling(1.0, 6), SwapAfter(1, {old_model, 0}, {new_model, 1}, &calls));
  ASSERT_TRUE(out.ok()) << out.status();
  int started_late = 0;
  for (size_t i = 0; i < out->size(); ++i) {
    const Completion& c = (*out)[i];
    ASSERT_EQ(c.tokens.size(), 6u);
    const std::vector<int32_t>& prompt = i < 2 ? kPrompts[0] : kPrompts[2];
    const torch::Tensor old_full = FullLogProbs(*old_model, prompt, c.tokens);
    const torch::Tensor new_full = FullLogProbs(*new_model, prompt, c.tokens);
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      // Every token's log-prob is the full forward of the version it carries.
      const torch::Tensor& full = c.versions[t] == 0 ? old_full : new_full;
      EXPECT_NEAR(c.logprobs[t], full[t][c.tokens[t]].item<float>(), 1e-4)
          << "sample " << i << " token " << t << " version " << c.versions[t];
    }
    if (c.versions.front() == 1) {
      ++started_late;
      EXPECT_EQ(c.weight_swaps, 0);
    } else {
      EXPECT_THAT(c.versions, ElementsAre(0, 0, 1, 1, 1, 1));
      EXPECT_EQ(c.weight_swaps, 1);
    }
  }
  EXPECT_EQ(started_late, 1);  // the fourth sample waited for a row
}

TEST(EngineTest, PartialRolloutsResumeWhereTheyStoppedKeepingTheirVersions) {
  auto model = Model(5);
  auto newer = Model(6);
  const auto requests = Requests(kPrompts.size(), 2, 11, /*varied_lengths=*/true);
  EngineOptions options;
  options.max_rows = 3;
  absl::StatusOr<std::vector<Completion>> whole =
      GenerateContinuous({model, 4}, kPrompts, requests, options, Sampling(1.0, 16));
  ASSERT_TRUE(whole.ok());

  // The same work cut after 3 steps, then resumed on a new engine with the
  // same weights: the same tokens, as if never cut.
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(model->config(), options, Sampling(1.0, 16));
  ASSERT_TRUE(engine.ok());
  for (size_t p = 0; p < kPrompts.size(); ++p) ASSERT_TRUE((*engine)->AddGroup(kPrompts[p], requests[p]).ok());
  std::vector<Completion> done(8);
  for (int step = 0; step < 3; ++step) {
    auto finished = (*engine)->Step({model, 4});
    ASSERT_TRUE(finished.ok());
    for (auto& s : *finished) done[s.group * 2 + s.sample] = s.completion;
  }
  std::vector<FinishedSample> cut = (*engine)->Drain(Finish::kPartial);
  ASSERT_FALSE(cut.empty());
  EXPECT_TRUE((*engine)->idle());
  int resumed_with_tokens = 0;
  std::vector<std::vector<SampleRequest>> resumed(kPrompts.size());
  std::vector<std::pair<int64_t, int32_t>> where;
  for (FinishedSample& s : cut) {
    EXPECT_EQ(s.completion.finish, Finish::kPartial);
    if (!s.completion.tokens.empty()) ++resumed_with_tokens;
    SampleRequest r = requests[s.group][s.sample];
    r.prefix = s.completion;
    resumed[s.group].push_back(r);
    where.push_back({s.group, s.sample});
  }
  EXPECT_GT(resumed_with_tokens, 0);
  absl::StatusOr<std::unique_ptr<Engine>> second =
      Engine::Create(model->config(), options, Sampling(1.0, 16));
  std::map<int64_t, std::pair<int64_t, std::vector<int32_t>>> handle_to_group;
  for (size_t p = 0; p < kPrompts.size(); ++p) {
    if (resumed[p].empty()) continue;
    std::vector<int32_t> samples;
    for (const auto& [g, s] : where) if (g == static_cast<int64_t>(p)) samples.push_back(s);
    auto handle = (*second)->AddGroup(kPrompts[p], resumed[p]);
    ASSERT_TRUE(handle.ok()) << handle.status();
    handle_to_group[*handle] = {static_cast<int64_t>(p), samples};
  }
  while (!(*second)->idle()) {
    auto finished = (*second)->Step({model, 4});
    ASSERT_TRUE(finished.ok()) << finished.status();
    for (auto& s : *finished) {
      const auto& [group, samples] = handle_to_group.at(s.group);
      done[group * 2 + samples[s.sample]] = s.completion;
    }
  }
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(done[i].tokens, (*whole)[i].tokens) << i;
    EXPECT_EQ(done[i].finish, Finish::kLength);
    ASSERT_EQ(done[i].logprobs.size(), (*whole)[i].logprobs.size());
    for (size_t t = 0; t < done[i].logprobs.size(); ++t) {
      EXPECT_NEAR(done[i].logprobs[t], (*whole)[i].logprobs[t], 1e-4);
    }
  }

  // Resumed under another version: the prefix keeps its version and
  // log-probs; the rest is sampled (and versioned) by the new policy, and
  // its log-probs are the new policy's full forward.
  absl::StatusOr<std::unique_ptr<Engine>> third =
      Engine::Create(model->config(), options, Sampling(1.0, 16));
  const FinishedSample& partial = cut.front();
  const size_t kept = partial.completion.tokens.size();
  ASSERT_GT(kept, 0u);
  SampleRequest r = requests[partial.group][partial.sample];
  r.prefix = partial.completion;
  ASSERT_TRUE((*third)->AddGroup(kPrompts[partial.group], {r}).ok());
  std::vector<FinishedSample> last;
  while (!(*third)->idle()) {
    auto finished = (*third)->Step({newer, 5});
    ASSERT_TRUE(finished.ok());
    for (auto& s : *finished) last.push_back(s);
  }
  ASSERT_EQ(last.size(), 1u);
  const Completion& c = last.front().completion;
  ASSERT_EQ(static_cast<int64_t>(c.tokens.size()), r.max_new_tokens);
  for (size_t t = 0; t < c.tokens.size(); ++t) {
    EXPECT_EQ(c.versions[t], t < kept ? 4 : 5);
    if (t < kept) {
      EXPECT_EQ(c.logprobs[t], partial.completion.logprobs[t]);
    }
  }
  EXPECT_EQ(c.weight_swaps, c.tokens.size() > kept ? 1 : 0);
  const torch::Tensor full = FullLogProbs(*newer, kPrompts[partial.group], c.tokens);
  for (size_t t = kept; t < c.tokens.size(); ++t) {
    EXPECT_NEAR(c.logprobs[t], full[t][c.tokens[t]].item<float>(), 1e-4);
  }
}

TEST(EngineTest, AbortEndsEverySampleRunningOrWaiting) {
  auto model = Model(7);
  GenerationHooks hooks;
  int polls = 0;
  hooks.should_abort = [&] { return ++polls > 2; };
  EngineOptions options;
  options.max_rows = 2;
  absl::StatusOr<std::vector<Completion>> out = GenerateContinuous(
      {model, 0}, kPrompts, Requests(kPrompts.size(), 2, 1, false), options, Sampling(1.0, 20),
      hooks);
  ASSERT_TRUE(out.ok());
  int aborted = 0;
  for (const Completion& c : *out) aborted += c.finish == Finish::kAborted;
  EXPECT_EQ(aborted, 8);
}

TEST(EngineTest, RejectsBadInput) {
  auto model = Model(1, "micro");
  EngineOptions options;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(model->config(), options, Sampling(1.0, 4));
  ASSERT_TRUE(engine.ok());
  EXPECT_THAT(std::string((*engine)->AddGroup({}, {SampleRequest{}}).status().message()),
              HasSubstr("empty"));
  EXPECT_THAT(std::string((*engine)->AddGroup({1, 99}, {SampleRequest{}}).status().message()),
              HasSubstr("token id 99 at index 1"));
  EXPECT_EQ((*engine)->AddGroup({1}, {}).status().code(), absl::StatusCode::kInvalidArgument);
  SampleRequest bad_prefix;
  bad_prefix.prefix.tokens = {1, 2};
  bad_prefix.prefix.logprobs = {-1};
  bad_prefix.prefix.versions = {0, 0};
  EXPECT_THAT(std::string((*engine)->AddGroup({1}, {bad_prefix}).status().message()),
              HasSubstr("2 tokens, 1 log-probs"));
  const std::vector<int32_t> too_long(model->config().max_position_embeddings, 1);
  EXPECT_THAT(std::string((*engine)->AddGroup(too_long, {SampleRequest{}}).status().message()),
              HasSubstr("no room"));
  options.max_rows = 0;
  EXPECT_EQ(Engine::Create(model->config(), options, Sampling(1.0, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Engine::Create(model->config(), {}, Sampling(-1.0, 4)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A policy of another shape cannot read the cache.
  auto other = Model(2, "tiny");
  ASSERT_TRUE((*engine)->AddGroup({1, 2}, {SampleRequest{}}).ok());
  EXPECT_EQ((*engine)->Step({other, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EngineTest, NonFiniteLogitsAreAnErrorNotACrash) {
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
    absl::StatusOr<std::vector<Completion>> out = GenerateContinuous(
        {nan_model, 7}, kPrompts, Requests(kPrompts.size(), 2, 1, false), {},
        Sampling(temperature, 3));
    EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << temperature;
    EXPECT_THAT(std::string(out.status().message()),
                HasSubstr("policy version 7: the policy produced NaN"));
  }
}

}  // namespace
}  // namespace sluice::model
