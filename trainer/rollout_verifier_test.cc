#include "trainer/rollout_verifier.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/engine.h"
#include "common/model/test_models.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainer/policy_history.h"

namespace sluice::trainer {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 64;
constexpr int kGroupSize = 4;

// A policy line like an RL run's: version k + 1 is version k moved by one
// Adam-like step (every weight by ~lr, each in its own direction), the
// movement of the quickstart's learning rate (3e-4).
std::vector<std::shared_ptr<const model::Transformer>> PolicyLine(int versions, double lr,
                                                                   uint64_t seed) {
  std::vector<std::shared_ptr<const model::Transformer>> line;
  line.push_back(model::testing::TestModel(seed, kVocab));
  torch::manual_seed(seed + 1);
  for (int v = 1; v < versions; ++v) {
    auto next = model::Transformer::CreateUninitialized(line.back()->config());
    EXPECT_TRUE(next.ok());
    std::vector<model::NamedTensor> weights;
    for (const model::NamedTensor& param : line.back()->parameters()) {
      torch::Tensor step = torch::randn(param.tensor.sizes()).sign() * lr;
      weights.push_back({param.name, param.tensor.detach() + step});
    }
    EXPECT_TRUE((*next)->LoadWeights(weights).ok());
    line.push_back(std::shared_ptr<const model::Transformer>(std::move(*next)));
  }
  return line;
}

struct HonestRun {
  std::vector<std::shared_ptr<const model::Transformer>> line;
  std::vector<v1::Group> groups;
};

// An honest worker's run: `groups` groups of kGroupSize samples decoded by
// the rollout engine (continuous batching, KV cache, `max_rows` rows), the
// policy moving to the next version every `swap_every` engine steps (up to
// `versions` - 1), so that many samples span a swap.
HonestRun Generate(int groups, v1::WeightSwapMode swap_mode, uint64_t seed, int versions = 8,
                   int swap_every = 7, double lr = 3e-4, double temperature = 1.0) {
  HonestRun run;
  // The trainer has published a few versions more by the time it verifies
  // (what a claim of a newer version can point at).
  run.line = PolicyLine(versions + 3, lr, seed);
  model::EngineOptions options;
  options.max_rows = 12;
  options.swap_mode = swap_mode == v1::WEIGHT_SWAP_MODE_RECOMPUTE ? model::SwapMode::kRecompute
                                                                  : model::SwapMode::kKeepCache;
  model::SamplingOptions sampling;
  sampling.temperature = temperature;
  sampling.max_new_tokens = 14;
  sampling.stop_token_ids = {0};
  auto engine = model::Engine::Create(run.line[0]->config(), options, sampling);
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> token(1, kVocab - 1);
  std::uniform_int_distribution<int> length(1, 9);
  std::map<int64_t, int> handle_to_group;
  run.groups.resize(groups);
  for (int g = 0; g < groups; ++g) {
    std::vector<int32_t> prompt(length(rng));
    for (int32_t& id : prompt) id = token(rng);
    std::vector<model::SampleRequest> requests(kGroupSize);
    for (int s = 0; s < kGroupSize; ++s) requests[s].seed = seed * 100000 + g * 10 + s;
    auto handle = (*engine)->AddGroup(prompt, requests);
    EXPECT_TRUE(handle.ok());
    handle_to_group[*handle] = g;
    v1::Group& group = run.groups[g];
    group.set_group_id(absl::StrCat("g", g));
    for (int s = 0; s < kGroupSize; ++s) {
      v1::Trajectory* t = group.add_trajectories();
      t->set_trajectory_id(absl::StrCat("g", g, "/", s));
      t->set_group_id(group.group_id());
      t->set_sample_index(s);
      t->set_rollout_worker_id("honest-worker");
      for (int32_t id : prompt) t->add_prompt_token_ids(id);
    }
  }
  int64_t step = 0;
  while (!(*engine)->idle()) {
    const int version = std::min<int>(versions - 1, static_cast<int>(step / swap_every));
    auto finished = (*engine)->Step({run.line[version], version});
    EXPECT_TRUE(finished.ok()) << finished.status();
    for (const model::FinishedSample& f : *finished) {
      v1::Trajectory* t = run.groups[handle_to_group[f.group]].mutable_trajectories(f.sample);
      for (size_t i = 0; i < f.completion.tokens.size(); ++i) {
        t->add_completion_token_ids(f.completion.tokens[i]);
        t->add_behaviour_logprobs(f.completion.logprobs[i]);
        t->add_token_policy_versions(f.completion.versions[i]);
      }
      t->set_finish_reason(f.completion.finish == model::Finish::kStop ? v1::FINISH_REASON_STOP
                                                                      : v1::FINISH_REASON_LENGTH);
    }
    ++step;
  }
  return run;
}

RolloutVerifierOptions Options(const HonestRun& run, v1::WeightSwapMode mode) {
  RolloutVerifierOptions options;
  options.swap_mode = mode;
  options.newest_version = static_cast<int64_t>(run.line.size()) - 1;
  return options;
}

PolicyLookup Lookup(const HonestRun& run) {
  return [&run](int64_t v) -> std::shared_ptr<const model::Transformer> {
    if (v < 0 || v >= static_cast<int64_t>(run.line.size())) return nullptr;
    return run.line[v];
  };
}

std::vector<GroupVerification> Verify(const std::vector<v1::Group>& groups, const HonestRun& run,
                                      const RolloutVerifierOptions& options) {
  std::vector<const v1::Group*> pointers;
  for (const v1::Group& g : groups) pointers.push_back(&g);
  return VerifyGroups(pointers, Lookup(run), options);
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(q * values.size()))];
}

// The noise an honest worker's log-probs show against the recomputation
// (engine: KV cache, continuous batching, swaps; verifier: full forward or
// a cached replay), float32 on CPU: no honest group may fail. Prints the
// figures the default tolerance comes from (docs/rollout-verification.md).
class HonestRunTest : public ::testing::TestWithParam<v1::WeightSwapMode> {};

TEST_P(HonestRunTest, NoHonestGroupFailsOverALongRun) {
  std::vector<double> group_max;
  int64_t groups = 0, tokens = 0, swapped = 0, flagged = 0;
  for (uint64_t seed : {11u, 12u, 13u}) {
    HonestRun run = Generate(/*groups=*/120, GetParam(), seed);
    for (const v1::Group& g : run.groups) {
      for (const v1::Trajectory& t : g.trajectories()) {
        swapped += t.token_policy_versions(0) !=
                   t.token_policy_versions(t.token_policy_versions_size() - 1);
      }
    }
    for (const GroupVerification& v : Verify(run.groups, run, Options(run, GetParam()))) {
      ++groups;
      tokens += v.tokens_compared;
      group_max.push_back(v.max_abs_diff);
      if (v.verdict != VerifyVerdict::kVerified) {
        ++flagged;
        ADD_FAILURE() << "honest group " << v.group_id << " " << VerifyVerdictName(v.verdict)
                      << ": " << v.why;
      }
    }
  }
  EXPECT_EQ(flagged, 0);
  EXPECT_GT(swapped, 100);  // many samples span a swap
  std::printf("honest %s: groups=%lld tokens=%lld trajectories_spanning_a_swap=%lld flagged=%lld "
              "group max|delta|: p50=%.3g p99=%.3g max=%.3g (tolerance %.3g)\n",
              v1::WeightSwapMode_Name(GetParam()).c_str(), static_cast<long long>(groups),
              static_cast<long long>(tokens), static_cast<long long>(swapped),
              static_cast<long long>(flagged), Percentile(group_max, 0.5),
              Percentile(group_max, 0.99), Percentile(group_max, 1.0), kDefaultVerifyTolerance);
  // The margin: honest noise is far below the tolerance.
  EXPECT_LT(Percentile(group_max, 1.0), kDefaultVerifyTolerance / 20);
}

INSTANTIATE_TEST_SUITE_P(SwapModes, HonestRunTest,
                         ::testing::Values(v1::WEIGHT_SWAP_MODE_KEEP_CACHE,
                                           v1::WEIGHT_SWAP_MODE_RECOMPUTE));

// A full forward of each version, without replaying the kept cache, is not
// what the engine computed: a swap that keeps the cache moves the later
// tokens' log-probs by more than the tolerance, so the replay is needed for
// honest groups to pass (this is why it exists).
TEST(RolloutVerifierTest, KeptCacheSwapsNeedTheReplay) {
  HonestRun run = Generate(40, v1::WEIGHT_SWAP_MODE_KEEP_CACHE, 21, 8, 7, /*lr=*/3e-3);
  RolloutVerifierOptions wrong = Options(run, v1::WEIGHT_SWAP_MODE_RECOMPUTE);
  int failed_as_recompute = 0;
  for (const GroupVerification& v : Verify(run.groups, run, wrong)) {
    failed_as_recompute += v.verdict == VerifyVerdict::kFailed;
  }
  EXPECT_GT(failed_as_recompute, 0);
  for (const GroupVerification& v :
       Verify(run.groups, run, Options(run, v1::WEIGHT_SWAP_MODE_KEEP_CACHE))) {
    EXPECT_EQ(v.verdict, VerifyVerdict::kVerified) << v.why;
  }
}

// ---- the rogue worker ------------------------------------------------------

enum class Forgery {
  kScaledLogprobs,
  kShiftedLogprobs,
  kRandomLogprobs,
  kCopiedLogprobs,
  kReplacedTokens,
  kReplacedOneToken,
  kClaimsOlderVersion,
  kClaimsNewerVersion,
  kClaimsUnpublishedVersion,
};

const char* ForgeryName(Forgery f) {
  switch (f) {
    case Forgery::kScaledLogprobs: return "log-probs scaled x0.9";
    case Forgery::kShiftedLogprobs: return "log-probs shifted +0.05";
    case Forgery::kRandomLogprobs: return "log-probs random in [-5, 0]";
    case Forgery::kCopiedLogprobs: return "log-probs copied from another trajectory";
    case Forgery::kReplacedTokens: return "tokens replaced (every 3rd), log-probs kept";
    case Forgery::kReplacedOneToken: return "one token replaced, log-probs kept";
    case Forgery::kClaimsOlderVersion: return "versions claimed one older";
    case Forgery::kClaimsNewerVersion: return "versions claimed one newer";
    case Forgery::kClaimsUnpublishedVersion: return "versions claimed unpublished";
  }
  return "?";
}

// Forges trajectory `victim` of `group` (a rogue worker's lie); false when
// this group offers no such forgery (e.g. no newer version to claim).
bool Forge(Forgery kind, v1::Group& group, int victim, int64_t newest, std::mt19937_64& rng) {
  v1::Trajectory& t = *group.mutable_trajectories(victim);
  const int n = t.completion_token_ids_size();
  if (n == 0) return false;
  switch (kind) {
    case Forgery::kScaledLogprobs:
      for (int j = 0; j < n; ++j) t.set_behaviour_logprobs(j, t.behaviour_logprobs(j) * 0.9f);
      return true;
    case Forgery::kShiftedLogprobs:
      for (int j = 0; j < n; ++j) t.set_behaviour_logprobs(j, t.behaviour_logprobs(j) + 0.05f);
      return true;
    case Forgery::kRandomLogprobs: {
      std::uniform_real_distribution<float> lp(-5.0f, 0.0f);
      for (int j = 0; j < n; ++j) t.set_behaviour_logprobs(j, lp(rng));
      return true;
    }
    case Forgery::kCopiedLogprobs: {
      // From another sample of the group whose tokens differ (identical
      // tokens have identical log-probs: copying those forges nothing).
      for (int other = 0; other < group.trajectories_size(); ++other) {
        const v1::Trajectory& donor = group.trajectories(other);
        if (other == victim || donor.completion_token_ids_size() == 0) continue;
        if (std::equal(donor.completion_token_ids().begin(), donor.completion_token_ids().end(),
                       t.completion_token_ids().begin(), t.completion_token_ids().end())) {
          continue;
        }
        for (int j = 0; j < n; ++j) {
          t.set_behaviour_logprobs(
              j, donor.behaviour_logprobs(std::min(j, donor.completion_token_ids_size() - 1)));
        }
        return true;
      }
      return false;
    }
    case Forgery::kReplacedTokens:
    case Forgery::kReplacedOneToken: {
      std::uniform_int_distribution<int32_t> id(1, kVocab - 1);
      const int first = std::uniform_int_distribution<int>(0, n - 1)(rng);
      for (int j = first; j < n; j += 3) {
        int32_t replacement = id(rng);
        while (replacement == t.completion_token_ids(j)) replacement = id(rng);
        t.set_completion_token_ids(j, replacement);
        if (kind == Forgery::kReplacedOneToken) break;
      }
      return true;
    }
    case Forgery::kClaimsOlderVersion:
      if (*std::min_element(t.token_policy_versions().begin(), t.token_policy_versions().end()) == 0) {
        return false;
      }
      for (int j = 0; j < n; ++j) t.set_token_policy_versions(j, t.token_policy_versions(j) - 1);
      return true;
    case Forgery::kClaimsNewerVersion:
      if (*std::max_element(t.token_policy_versions().begin(), t.token_policy_versions().end()) ==
          newest) {
        return false;
      }
      for (int j = 0; j < n; ++j) t.set_token_policy_versions(j, t.token_policy_versions(j) + 1);
      return true;
    case Forgery::kClaimsUnpublishedVersion:
      t.set_token_policy_versions(n - 1, newest + 1);
      return true;
  }
  return false;
}

// Every forged group is flagged, whichever way it was forged, in either
// swap mode; the honest groups of the same run are not. Prints the
// forgery x forged x flagged table.
class RogueWorkerTest : public ::testing::TestWithParam<v1::WeightSwapMode> {};

TEST_P(RogueWorkerTest, EveryForgedGroupIsFlaggedAndNoHonestOne) {
  HonestRun run = Generate(/*groups=*/120, GetParam(), /*seed=*/31);
  const RolloutVerifierOptions options = Options(run, GetParam());
  const int64_t newest = options.newest_version;
  std::mt19937_64 rng(7);
  const std::vector<Forgery> kinds = {
      Forgery::kScaledLogprobs,     Forgery::kShiftedLogprobs,    Forgery::kRandomLogprobs,
      Forgery::kCopiedLogprobs,     Forgery::kReplacedTokens,     Forgery::kReplacedOneToken,
      Forgery::kClaimsOlderVersion, Forgery::kClaimsNewerVersion, Forgery::kClaimsUnpublishedVersion};
  std::printf("rogue worker, %s:\n", v1::WeightSwapMode_Name(GetParam()).c_str());
  for (Forgery kind : kinds) {
    std::vector<v1::Group> forged;
    for (const v1::Group& honest : run.groups) {
      v1::Group g = honest;
      const int victim = std::uniform_int_distribution<int>(0, kGroupSize - 1)(rng);
      if (!Forge(kind, g, victim, newest, rng)) continue;
      for (v1::Trajectory& t : *g.mutable_trajectories()) t.set_rollout_worker_id("rogue");
      forged.push_back(std::move(g));
    }
    int flagged = 0;
    double smallest = std::numeric_limits<double>::infinity();
    for (const GroupVerification& v : Verify(forged, run, options)) {
      EXPECT_EQ(v.worker_id, "rogue");
      if (v.verdict == VerifyVerdict::kFailed) {
        ++flagged;
        smallest = std::min(smallest, v.max_abs_diff);
      } else {
        ADD_FAILURE() << ForgeryName(kind) << ": group " << v.group_id << " passed as "
                      << VerifyVerdictName(v.verdict) << " (max |delta| " << v.max_abs_diff << ")";
      }
    }
    EXPECT_GT(forged.size(), 30u) << ForgeryName(kind);
    std::printf("  %-46s forged=%3zu flagged=%3d smallest flagged max|delta|=%.3g\n",
                ForgeryName(kind), forged.size(), flagged, smallest);
  }
  int honest_flagged = 0;
  for (const GroupVerification& v : Verify(run.groups, run, options)) {
    honest_flagged += v.verdict != VerifyVerdict::kVerified;
  }
  std::printf("  %-46s groups=%3zu flagged=%3d\n", "honest", run.groups.size(), honest_flagged);
  EXPECT_EQ(honest_flagged, 0);
}

INSTANTIATE_TEST_SUITE_P(SwapModes, RogueWorkerTest,
                         ::testing::Values(v1::WEIGHT_SWAP_MODE_KEEP_CACHE,
                                           v1::WEIGHT_SWAP_MODE_RECOMPUTE));

TEST(RolloutVerifierTest, AGroupWithAVersionNotHeldIsUnverifiableNotFailed) {
  HonestRun run = Generate(6, v1::WEIGHT_SWAP_MODE_KEEP_CACHE, 41);
  RolloutVerifierOptions options = Options(run, v1::WEIGHT_SWAP_MODE_KEEP_CACHE);
  std::vector<const v1::Group*> groups;
  for (const v1::Group& g : run.groups) groups.push_back(&g);
  // Only the newest version is held (a trainer that just resumed).
  const PolicyLookup newest_only = [&run](int64_t v) -> std::shared_ptr<const model::Transformer> {
    return v == static_cast<int64_t>(run.line.size()) - 1 ? run.line.back() : nullptr;
  };
  for (const GroupVerification& v : VerifyGroups(groups, newest_only, options)) {
    EXPECT_EQ(v.verdict, VerifyVerdict::kUnverifiable);
    EXPECT_THAT(v.why, HasSubstr("whose weights are not held"));
  }
}

TEST(RolloutVerifierTest, StructuralLiesFailNamingTheField) {
  HonestRun run = Generate(2, v1::WEIGHT_SWAP_MODE_KEEP_CACHE, 51);
  const RolloutVerifierOptions options = Options(run, v1::WEIGHT_SWAP_MODE_KEEP_CACHE);
  v1::Group short_logprobs = run.groups[0];
  short_logprobs.mutable_trajectories(0)->mutable_behaviour_logprobs()->RemoveLast();
  v1::Group bad_id = run.groups[0];
  bad_id.mutable_trajectories(1)->set_completion_token_ids(0, kVocab + 5);
  v1::Group positive = run.groups[0];
  positive.mutable_trajectories(2)->set_behaviour_logprobs(0, 0.5f);
  const std::vector<GroupVerification> out =
      Verify({short_logprobs, bad_id, positive, run.groups[1]}, run, options);
  EXPECT_EQ(out[0].verdict, VerifyVerdict::kFailed);
  EXPECT_THAT(out[0].why, HasSubstr("behaviour log-probs"));
  EXPECT_EQ(out[1].verdict, VerifyVerdict::kFailed);
  EXPECT_THAT(out[1].why, HasSubstr("outside the vocabulary"));
  EXPECT_EQ(out[2].verdict, VerifyVerdict::kFailed);
  EXPECT_THAT(out[2].why, HasSubstr("is not a log-probability"));
  EXPECT_EQ(out[3].verdict, VerifyVerdict::kVerified) << out[3].why;
}

TEST(RolloutVerifierTest, AbortedTrajectoriesAreNotJudged) {
  HonestRun run = Generate(1, v1::WEIGHT_SWAP_MODE_KEEP_CACHE, 61);
  v1::Group g = run.groups[0];
  g.mutable_trajectories(0)->set_finish_reason(v1::FINISH_REASON_ABORTED);
  g.mutable_trajectories(0)->set_behaviour_logprobs(0, -99.0f);
  const auto out = Verify({g}, run, Options(run, v1::WEIGHT_SWAP_MODE_KEEP_CACHE));
  EXPECT_EQ(out[0].verdict, VerifyVerdict::kVerified) << out[0].why;
}

TEST(RolloutVerifierTest, OptionsValidate) {
  RolloutVerifierOptions options;
  EXPECT_TRUE(options.Validate().ok());
  options.tolerance = 0;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("tolerance"));
  options.tolerance = 1e-3;
  options.temperature = -1;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("temperature"));
}

TEST(RolloutVerifierTest, ChoosingAFractionIsDeterministicPerStep) {
  const auto all = [](size_t n, double fraction) { return std::vector<double>(n, fraction); };
  EXPECT_THAT(ChooseGroupsToVerify(all(5, 1.0), 3, 9), ::testing::Each(true));
  EXPECT_THAT(ChooseGroupsToVerify(all(5, 0.0), 3, 9), ::testing::Each(false));
  const std::vector<bool> a = ChooseGroupsToVerify(all(2000, 0.25), 3, 9);
  EXPECT_EQ(a, ChooseGroupsToVerify(all(2000, 0.25), 3, 9));
  EXPECT_NE(a, ChooseGroupsToVerify(all(2000, 0.25), 3, 10));
  const double chosen = std::count(a.begin(), a.end(), true);
  // Binomial(2000, 0.25): sd ~19.4; 5 sd.
  EXPECT_NEAR(chosen, 500, 100);
}

// Trusted workers' groups are sampled at their own fraction in the same
// batch as untrusted ones, which are all verified.
TEST(RolloutVerifierTest, EachGroupIsChosenAtItsOwnFraction) {
  std::vector<double> fractions;
  for (int g = 0; g < 4000; ++g) fractions.push_back(g % 2 == 0 ? 1.0 : 1.0 / 16);
  const std::vector<bool> chosen = ChooseGroupsToVerify(fractions, 7, 1);
  int untrusted = 0;
  int trusted = 0;
  for (int g = 0; g < 4000; ++g) (g % 2 == 0 ? untrusted : trusted) += chosen[g] ? 1 : 0;
  EXPECT_EQ(untrusted, 2000);
  // Binomial(2000, 1/16): mean 125, sd ~10.8; 5 sd.
  EXPECT_NEAR(trusted, 125, 54);
}

// ---- PolicyHistory ---------------------------------------------------------

std::shared_ptr<const PublishedVersion> Publish(const model::Transformer& model, int64_t version) {
  auto published = std::make_shared<PublishedVersion>();
  published->info.set_version(version);
  for (const auto& [name, tensor] : model.parameters()) {
    v1::TensorSpec spec;
    spec.set_name(name);
    for (int64_t d : tensor.sizes()) spec.add_shape(d);
    published->tensors.push_back(spec);
    published->bytes.push_back(model::TensorBytes(tensor.detach()));
  }
  return published;
}

TEST(PolicyHistoryTest, HoldsTheLastRetainedVersionsAndBuildsTheirModels) {
  const auto line = PolicyLine(4, 1e-2, 71);
  PolicyHistory history(line[0]->config(), /*retain=*/2);
  for (int v = 0; v < 4; ++v) history.Add(Publish(*line[v], v));
  EXPECT_EQ(history.newest(), 3);
  EXPECT_EQ(history.Get(1), nullptr);
  auto v2 = history.Get(2);
  ASSERT_NE(v2, nullptr);
  EXPECT_EQ(history.Get(2), v2);  // built once
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::tensor({{1, 2, 3}});
  EXPECT_TRUE(torch::equal(v2->Forward(ids), line[2]->Forward(ids)));
  // A republished version (a resume) replaces what followed it.
  history.Add(Publish(*line[1], 2));
  EXPECT_EQ(history.newest(), 2);
  EXPECT_EQ(history.Get(3), nullptr);
  EXPECT_TRUE(torch::equal(history.Get(2)->Forward(ids), line[1]->Forward(ids)));
}

}  // namespace
}  // namespace sluice::trainer
