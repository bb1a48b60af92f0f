#include "trainer/rl_batch.h"

#include <algorithm>

#include "trainer/advantages.h"
#include "trainer/step_guard.h"

namespace sluice::trainer {

PaddedBatch PadRows(const std::vector<TokenRow>& rows, int32_t pad_id) {
  size_t longest = 0;
  for (const auto& [prefix, trained] : rows) longest = std::max(longest, prefix.size() + trained.size());
  const int64_t r_count = static_cast<int64_t>(rows.size());
  const int64_t width = static_cast<int64_t>(longest) - 1;
  std::vector<int64_t> inputs(r_count * width, pad_id);
  std::vector<int64_t> targets(r_count * width, pad_id);
  std::vector<float> mask(r_count * width, 0.0f);
  PaddedBatch batch;
  for (int64_t r = 0; r < r_count; ++r) {
    std::vector<int32_t> seq = rows[r].first;
    seq.insert(seq.end(), rows[r].second.begin(), rows[r].second.end());
    batch.real_tokens += static_cast<int64_t>(seq.size());
    const int64_t prefix = static_cast<int64_t>(rows[r].first.size());
    for (int64_t t = 0; t + 1 < static_cast<int64_t>(seq.size()); ++t) {
      inputs[r * width + t] = seq[t];
      targets[r * width + t] = seq[t + 1];
      if (t + 1 >= prefix) mask[r * width + t] = 1.0f;
    }
  }
  auto opts = torch::TensorOptions().dtype(torch::kInt64);
  batch.inputs = torch::from_blob(inputs.data(), {r_count, width}, opts).clone();
  batch.targets = torch::from_blob(targets.data(), {r_count, width}, opts).clone();
  batch.mask = torch::from_blob(mask.data(), {r_count, width}, torch::kFloat32).clone();
  return batch;
}

namespace {

template <typename T>
std::vector<T> Scatter(const std::vector<std::vector<T>>& values,
                       const std::vector<int64_t>& prefix_lengths, int64_t width) {
  const int64_t r_count = static_cast<int64_t>(values.size());
  std::vector<T> out(r_count * width, T{0});
  for (int64_t r = 0; r < r_count; ++r) {
    for (size_t j = 0; j < values[r].size(); ++j) {
      const int64_t t = prefix_lengths[r] - 1 + static_cast<int64_t>(j);
      if (t < width) out[r * width + t] = values[r][j];
    }
  }
  return out;
}

}  // namespace

torch::Tensor ScatterCompletionValues(const std::vector<std::vector<float>>& values,
                                      const std::vector<int64_t>& prefix_lengths, int64_t width) {
  std::vector<float> out = Scatter(values, prefix_lengths, width);
  const int64_t r_count = static_cast<int64_t>(values.size());
  return torch::from_blob(out.data(), {r_count, width}, torch::kFloat32).clone();
}

torch::Tensor ScatterCompletionVersions(const std::vector<std::vector<int64_t>>& values,
                                        const std::vector<int64_t>& prefix_lengths, int64_t width) {
  std::vector<int64_t> out = Scatter(values, prefix_lengths, width);
  const int64_t r_count = static_cast<int64_t>(values.size());
  return torch::from_blob(out.data(), {r_count, width}, torch::kInt64).clone();
}

RlRows BuildRlRows(const v1::SampleResponse& batch, int begin, int end,
                   const RlRowOptions& options) {
  RlRows out;
  for (int g = begin; g < end; ++g) {
    const v1::SampledGroup& sampled = batch.groups(g);
    out.group_ids.push_back(sampled.group().group_id());
    if (absl::Status trainable =
            CheckTrainableGroup(sampled.group(), options.vocab_size, options.trainer_version);
        !trainable.ok()) {
      // The buffer refuses such groups; one that got past it is left out
      // rather than failing the run or poisoning the step.
      out.invalid.emplace_back(sampled.group().group_id(), std::string(trainable.message()));
      continue;
    }
    const int64_t staleness = sampled.staleness();
    out.staleness_counts[staleness]++;
    out.staleness_sum += staleness;
    out.staleness_max = std::max(out.staleness_max, staleness);
    std::vector<double> rewards;
    for (const auto& t : sampled.group().trajectories()) {
      rewards.push_back(t.reward());
      out.reward_sum += t.reward();
      out.passed += t.reward() >= 1.0 - 1e-9 ? 1 : 0;
      ++out.trajectories;
      out.completion_tokens += t.completion_token_ids_size();
    }
    if (IsUniform(rewards) && !options.train_uniform_groups) {
      ++out.zero_advantage;
      continue;
    }
    const std::vector<double> adv =
        GroupAdvantages(rewards, options.normalize_advantage_by_std, options.advantage_eps);
    int i = 0;
    for (const auto& t : sampled.group().trajectories()) {
      const double a = adv[i++];
      if (t.finish_reason() == v1::FINISH_REASON_ABORTED || t.completion_token_ids_size() == 0) {
        continue;  // excluded from the loss
      }
      out.rows.emplace_back(
          std::vector<int32_t>(t.prompt_token_ids().begin(), t.prompt_token_ids().end()),
          std::vector<int32_t>(t.completion_token_ids().begin(), t.completion_token_ids().end()));
      out.prefix_lengths.push_back(t.prompt_token_ids_size());
      out.behaviour.emplace_back(t.behaviour_logprobs().begin(), t.behaviour_logprobs().end());
      out.advantages.emplace_back(t.completion_token_ids_size(), static_cast<float>(a));
      out.versions.emplace_back(t.token_policy_versions().begin(), t.token_policy_versions().end());
      out.rewards.push_back(t.reward());
      out.groups.push_back(g);
    }
  }
  return out;
}

}  // namespace sluice::trainer
