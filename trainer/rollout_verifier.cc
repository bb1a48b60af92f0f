#include "trainer/rollout_verifier.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace sluice::trainer {
namespace {

// Rows per batched forward, and what bounds it: the logits and their
// log-softmax ([rows, length, vocab] float32 each) stay under ~1 GiB.
constexpr size_t kRowsPerForward = 128;
constexpr int64_t kLogitBudgetFloats = int64_t{1} << 27;

// One trajectory to check.
struct Checked {
  size_t group;  // index into the groups (and the accumulators)
  const v1::Trajectory* trajectory;
};

// What a group's comparisons add up to.
struct Accumulator {
  double max_abs_diff = 0;
  double sum_abs_diff = 0;
  int64_t tokens = 0;
  // The reason of the largest failing difference, or the first structural
  // failure / missing version.
  std::string failure;
  double failure_diff = -1;
  std::string unverifiable;
};

void Fail(Accumulator& acc, std::string why) {
  if (acc.failure_diff < std::numeric_limits<double>::infinity()) {
    acc.failure = std::move(why);
    acc.failure_diff = std::numeric_limits<double>::infinity();
  }
}

void Compare(Accumulator& acc, const v1::Trajectory& t, int64_t token, int64_t version,
             double recomputed, double tolerance) {
  const double reported = t.behaviour_logprobs(static_cast<int>(token));
  double diff = std::abs(reported - recomputed);
  if (!std::isfinite(diff)) diff = std::numeric_limits<double>::infinity();
  acc.max_abs_diff = std::max(acc.max_abs_diff, diff);
  if (std::isfinite(diff)) acc.sum_abs_diff += diff;
  ++acc.tokens;
  if (diff > tolerance && diff > acc.failure_diff) {
    acc.failure_diff = diff;
    acc.failure = absl::StrFormat(
        "trajectory %s token %d (id %d, version %d): reported log-prob %.6g, recomputed %.6g "
        "(|delta| %.3g > tolerance %.3g)",
        t.trajectory_id(), token, t.completion_token_ids(static_cast<int>(token)), version,
        reported, recomputed, diff, tolerance);
  }
}

// The structural checks no float noise explains; empty when fine.
std::string StructuralProblem(const v1::Trajectory& t, int64_t vocab, int64_t newest_version) {
  const int n = t.completion_token_ids_size();
  if (t.behaviour_logprobs_size() != n || t.token_policy_versions_size() != n) {
    return absl::StrCat("trajectory ", t.trajectory_id(), ": ", n, " completion tokens but ",
                        t.behaviour_logprobs_size(), " behaviour log-probs and ",
                        t.token_policy_versions_size(), " token versions");
  }
  if (t.prompt_token_ids_size() == 0) {
    return absl::StrCat("trajectory ", t.trajectory_id(), ": no prompt tokens");
  }
  for (int32_t id : t.prompt_token_ids()) {
    if (id < 0 || id >= vocab) {
      return absl::StrCat("trajectory ", t.trajectory_id(), ": prompt token id ", id,
                          " outside the vocabulary of ", vocab);
    }
  }
  for (int j = 0; j < n; ++j) {
    const int32_t id = t.completion_token_ids(j);
    if (id < 0 || id >= vocab) {
      return absl::StrCat("trajectory ", t.trajectory_id(), ": completion token ", j, " id ", id,
                          " outside the vocabulary of ", vocab);
    }
    if (!std::isfinite(t.behaviour_logprobs(j)) || t.behaviour_logprobs(j) > 0) {
      return absl::StrCat("trajectory ", t.trajectory_id(), ": token ", j, " log-prob ",
                          t.behaviour_logprobs(j), " is not a log-probability");
    }
    const int64_t v = t.token_policy_versions(j);
    if (v < 0 || v > newest_version) {
      return absl::StrCat("trajectory ", t.trajectory_id(), ": token ", j, " claims version ", v,
                          ", but the newest published is ", newest_version);
    }
  }
  return "";
}

// Token ids of prompt ++ completion[0, n-1): the inputs whose logits give
// completion tokens 0..n-1 at rows p-1 .. p+n-2.
std::vector<int64_t> Inputs(const v1::Trajectory& t) {
  std::vector<int64_t> ids(t.prompt_token_ids().begin(), t.prompt_token_ids().end());
  ids.insert(ids.end(), t.completion_token_ids().begin(), t.completion_token_ids().end() - 1);
  return ids;
}

// Full forward of `rows` under `model`; compares the tokens of `version` in
// each (all of a single-version trajectory's).
void CompareFullForward(const model::Transformer& model, int64_t version,
                        const std::vector<Checked>& rows, const RolloutVerifierOptions& options,
                        std::vector<Accumulator>& acc) {
  int64_t longest = 1;
  for (const Checked& row : rows) {
    longest = std::max<int64_t>(longest, row.trajectory->prompt_token_ids_size() +
                                             row.trajectory->completion_token_ids_size());
  }
  const size_t per_forward = static_cast<size_t>(std::clamp<int64_t>(
      kLogitBudgetFloats / (longest * model.config().vocab_size), 1, kRowsPerForward));
  for (size_t start = 0; start < rows.size(); start += per_forward) {
    const size_t end = std::min(rows.size(), start + per_forward);
    size_t width = 0;
    std::vector<std::vector<int64_t>> inputs;
    for (size_t r = start; r < end; ++r) {
      inputs.push_back(Inputs(*rows[r].trajectory));
      width = std::max(width, inputs.back().size());
    }
    torch::Tensor ids = torch::zeros({static_cast<int64_t>(inputs.size()), static_cast<int64_t>(width)},
                                     torch::kInt64);
    auto ids_a = ids.accessor<int64_t, 2>();
    for (size_t r = 0; r < inputs.size(); ++r) {
      for (size_t i = 0; i < inputs[r].size(); ++i) ids_a[r][i] = inputs[r][i];
    }
    // Compared on the host, in float32, whatever the model computes in.
    const torch::Tensor logp =
        torch::log_softmax(model.Forward(ids).to(torch::kFloat32) / options.temperature, -1)
            .to(torch::kCPU)
            .contiguous();
    auto logp_a = logp.accessor<float, 3>();
    for (size_t r = start; r < end; ++r) {
      const v1::Trajectory& t = *rows[r].trajectory;
      const int64_t p = t.prompt_token_ids_size();
      for (int j = 0; j < t.completion_token_ids_size(); ++j) {
        if (t.token_policy_versions(j) != version) continue;
        const float recomputed = logp_a[r - start][p - 1 + j][t.completion_token_ids(j)];
        Compare(acc[rows[r].group], t, j, version, recomputed, options.tolerance);
      }
    }
  }
}

// The engine's KEEP_CACHE swaps replayed on one cache, segment by segment.
void CompareKeptCacheReplay(const Checked& row, const PolicyLookup& policies,
                            const RolloutVerifierOptions& options, std::vector<Accumulator>& acc) {
  const v1::Trajectory& t = *row.trajectory;
  const int64_t p = t.prompt_token_ids_size();
  const int64_t n = t.completion_token_ids_size();
  std::shared_ptr<const model::Transformer> first = policies(t.token_policy_versions(0));
  model::KVCache cache = first->NewCache(1, p + n);
  const std::vector<int64_t> inputs = Inputs(t);
  int64_t a = 0;
  while (a < n) {
    const int64_t version = t.token_policy_versions(static_cast<int>(a));
    int64_t b = a;
    while (b < n && t.token_policy_versions(static_cast<int>(b)) == version) ++b;
    std::shared_ptr<const model::Transformer> model = policies(version);
    // Inputs [from, p + b - 1): the prompt too for the first segment.
    const int64_t from = a == 0 ? 0 : p + a - 1;
    const int64_t count = p + b - 1 - from;
    torch::Tensor ids =
        torch::tensor(std::vector<int64_t>(inputs.begin() + from, inputs.begin() + from + count))
            .unsqueeze(0);
    torch::Tensor positions = torch::arange(from, from + count, torch::kInt64).unsqueeze(0);
    torch::Tensor key_mask = torch::ones({1, cache.length + count}, torch::kInt64);
    const torch::Tensor logp =
        torch::log_softmax(model->ForwardCached(ids, positions, key_mask, cache)
                                   .to(torch::kFloat32) /
                               options.temperature,
                           -1)
            .to(torch::kCPU)
            .contiguous();
    auto logp_a = logp.accessor<float, 3>();
    for (int64_t j = a; j < b; ++j) {
      const int64_t position = p - 1 + j - from;
      const float recomputed =
          logp_a[0][position][t.completion_token_ids(static_cast<int>(j))];
      Compare(acc[row.group], t, j, version, recomputed, options.tolerance);
    }
    a = b;
  }
}

}  // namespace

absl::Status RolloutVerifierOptions::Validate() const {
  if (!(tolerance > 0) || !std::isfinite(tolerance)) {
    return absl::InvalidArgumentError(
        absl::StrCat("verify tolerance must be finite and > 0, got ", tolerance));
  }
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("verify temperature must be finite and > 0, got ", temperature));
  }
  if (swap_mode != v1::WEIGHT_SWAP_MODE_KEEP_CACHE && swap_mode != v1::WEIGHT_SWAP_MODE_RECOMPUTE) {
    return absl::InvalidArgumentError(
        absl::StrCat("verify swap_mode must be KEEP_CACHE or RECOMPUTE, got ", swap_mode));
  }
  return absl::OkStatus();
}

const char* VerifyVerdictName(VerifyVerdict verdict) {
  switch (verdict) {
    case VerifyVerdict::kVerified:
      return "verified";
    case VerifyVerdict::kFailed:
      return "failed";
    case VerifyVerdict::kUnverifiable:
      return "unverifiable";
  }
  return "unknown";
}

std::vector<GroupVerification> VerifyGroups(const std::vector<const v1::Group*>& groups,
                                            const PolicyLookup& policies,
                                            const RolloutVerifierOptions& options) {
  torch::NoGradGuard no_grad;
  std::vector<Accumulator> acc(groups.size());
  // Version -> rows to run a full forward of under it.
  std::map<int64_t, std::vector<Checked>> full_forward;
  std::vector<Checked> replays;
  std::map<int64_t, std::shared_ptr<const model::Transformer>> models;
  int64_t vocab = -1;
  for (size_t g = 0; g < groups.size(); ++g) {
    // Every version the group needs must be held before anything is judged.
    std::vector<Checked> group_full;
    std::vector<std::pair<int64_t, Checked>> group_versions;
    std::vector<Checked> group_replays;
    for (const v1::Trajectory& t : groups[g]->trajectories()) {
      if (t.finish_reason() == v1::FINISH_REASON_ABORTED || t.completion_token_ids_size() == 0) {
        continue;
      }
      bool missing = false;
      std::vector<int64_t> versions;
      for (int64_t v : t.token_policy_versions()) {
        if (versions.empty() || versions.back() != v) versions.push_back(v);
      }
      for (int64_t v : versions) {
        if (v < 0 || v > options.newest_version) continue;  // a structural failure below
        auto [it, inserted] = models.try_emplace(v);
        if (inserted) it->second = policies(v);
        if (it->second == nullptr) {
          if (acc[g].unverifiable.empty()) {
            acc[g].unverifiable = absl::StrCat("trajectory ", t.trajectory_id(), " claims version ",
                                               v, ", whose weights are not held");
          }
          missing = true;
        } else if (vocab < 0) {
          vocab = it->second->config().vocab_size;
        }
      }
      if (missing) continue;
      const std::string problem =
          StructuralProblem(t, vocab < 0 ? std::numeric_limits<int64_t>::max() : vocab,
                            options.newest_version);
      if (!problem.empty()) {
        Fail(acc[g], problem);
        continue;
      }
      std::sort(versions.begin(), versions.end());
      versions.erase(std::unique(versions.begin(), versions.end()), versions.end());
      const Checked checked{g, &t};
      if (versions.size() == 1) {
        full_forward[versions[0]].push_back(checked);
      } else if (options.swap_mode == v1::WEIGHT_SWAP_MODE_RECOMPUTE) {
        for (int64_t v : versions) full_forward[v].push_back(checked);
      } else {
        replays.push_back(checked);
      }
    }
  }
  // A group with a version not held is not judged at all (its other
  // trajectories are skipped below); one already failed structurally is.
  auto judged = [&](size_t g) { return acc[g].unverifiable.empty(); };
  for (auto& [version, rows] : full_forward) {
    rows.erase(std::remove_if(rows.begin(), rows.end(),
                              [&](const Checked& c) { return !judged(c.group); }),
               rows.end());
    if (!rows.empty()) CompareFullForward(*models[version], version, rows, options, acc);
  }
  const PolicyLookup held = [&models](int64_t v) { return models[v]; };
  for (const Checked& row : replays) {
    if (judged(row.group)) CompareKeptCacheReplay(row, held, options, acc);
  }

  std::vector<GroupVerification> out(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    GroupVerification& result = out[g];
    result.group_id = groups[g]->group_id();
    result.inserted_by = groups[g]->inserted_by();
    if (groups[g]->trajectories_size() > 0) {
      result.worker_id = groups[g]->trajectories(0).rollout_worker_id();
    }
    result.max_abs_diff = acc[g].max_abs_diff;
    result.tokens_compared = acc[g].tokens;
    result.mean_abs_diff = acc[g].tokens > 0 ? acc[g].sum_abs_diff / acc[g].tokens : 0.0;
    if (!acc[g].unverifiable.empty() && acc[g].failure.empty()) {
      result.verdict = VerifyVerdict::kUnverifiable;
      result.why = acc[g].unverifiable;
    } else if (!acc[g].failure.empty()) {
      result.verdict = VerifyVerdict::kFailed;
      result.why = acc[g].failure;
    }
  }
  return out;
}

std::vector<bool> ChooseGroupsToVerify(const std::vector<double>& fractions, uint64_t seed,
                                       int64_t step) {
  std::vector<bool> chosen(fractions.size(), false);
  std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(step + 1)));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (size_t g = 0; g < chosen.size(); ++g) {
    // One draw per group whatever its fraction, so that a group's chance
    // does not depend on its neighbours'.
    const double draw = uniform(rng);
    chosen[g] = fractions[g] >= 1 || (fractions[g] > 0 && draw < fractions[g]);
  }
  return chosen;
}

}  // namespace sluice::trainer
