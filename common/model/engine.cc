#include "common/model/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace sluice::model {
namespace {

// SplitMix64's finaliser: a bijective mix of 64 bits.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

int64_t VersionChanges(const std::vector<int64_t>& versions) {
  int64_t changes = 0;
  for (size_t i = 1; i < versions.size(); ++i) changes += versions[i] != versions[i - 1];
  return changes;
}

}  // namespace

double SampleUniform(uint64_t seed, int64_t t) {
  // Two rounds so that neighbouring seeds and neighbouring t give unrelated
  // draws; the top 53 bits make the double.
  const uint64_t z = Mix(Mix(seed) + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(t + 1));
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const ModelConfig& config,
                                                       const EngineOptions& options,
                                                       const SamplingOptions& sampling) {
  RETURN_IF_ERROR(ValidateSamplingOptions(sampling));
  if (options.max_rows < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows: must be >= 1, got ", options.max_rows));
  }
  if (options.capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity: must be >= 0 (0 = the model's context), got ", options.capacity));
  }
  if (!options.stop_strings.empty() && !options.detokenize) {
    return absl::InvalidArgumentError("stop strings need a detokenize function");
  }
  for (const std::string& stop : options.stop_strings) {
    if (stop.empty()) return absl::InvalidArgumentError("a stop string is empty");
  }
  std::unique_ptr<Engine> engine(new Engine(config, options, sampling));
  engine->capacity_ = options.capacity > 0
                          ? std::min<int64_t>(options.capacity, config.max_position_embeddings)
                          : config.max_position_embeddings;
  for (const std::string& stop : options.stop_strings) {
    engine->longest_stop_string_ = std::max(engine->longest_stop_string_, stop.size());
  }
  engine->rows_.reserve(static_cast<size_t>(options.max_rows));
  return engine;
}

absl::StatusOr<int64_t> Engine::AddGroup(const std::vector<int32_t>& prompt,
                                         std::vector<SampleRequest> samples) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (samples.empty()) return absl::InvalidArgumentError("a group needs at least one sample");
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("the prompt has token id ", prompt[i],
                                                     " at index ", i, ", outside [0, ",
                                                     config_.vocab_size, ")"));
    }
  }
  const int64_t room = capacity_ - static_cast<int64_t>(prompt.size());
  if (room < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt.size(), " tokens, which leaves no room in the ", capacity_,
        " positions a sequence may hold"));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const SampleRequest& request = samples[i];
    const Completion& prefix = request.prefix;
    if (request.max_new_tokens < 0) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", i, ": max_new_tokens must be >= 0 (0 = the default), got ",
                                                     request.max_new_tokens));
    }
    if (prefix.logprobs.size() != prefix.tokens.size() ||
        prefix.versions.size() != prefix.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", i, ": the prefix has ", prefix.tokens.size(), " tokens, ",
          prefix.logprobs.size(), " log-probs and ", prefix.versions.size(), " versions"));
    }
    for (int32_t id : prefix.tokens) {
      if (id < 0 || id >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sample ", i, ": the prefix has token id ",
                                                       id, ", outside [0, ", config_.vocab_size,
                                                       ")"));
      }
    }
    if (static_cast<int64_t>(prefix.tokens.size()) >= room) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample ", i, ": prompt and prefix (", prompt.size() + prefix.tokens.size(),
          " tokens) leave no room in the ", capacity_, " positions a sequence may hold"));
    }
  }
  const int64_t handle = next_group_++;
  Group& group = groups_[handle];
  group.prompt = prompt;
  group.samples = static_cast<int32_t>(samples.size());
  group.to_admit = group.samples;
  group.outstanding = group.samples;
  for (size_t i = 0; i < samples.size(); ++i) {
    queue_.push_back({handle, static_cast<int32_t>(i), std::move(samples[i])});
  }
  return handle;
}

Engine::Prefilled Engine::PrefillSequences(const std::vector<std::vector<int32_t>>& sequences) {
  const int64_t batch = static_cast<int64_t>(sequences.size());
  int64_t longest = 0;
  for (const auto& sequence : sequences) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(sequence.size()));
  }
  torch::Tensor ids = torch::zeros({batch, longest}, torch::kInt64);
  torch::Tensor lengths = torch::empty({batch}, torch::kInt64);
  {
    auto id = ids.accessor<int64_t, 2>();
    auto length = lengths.accessor<int64_t, 1>();
    for (int64_t b = 0; b < batch; ++b) {
      const auto& sequence = sequences[static_cast<size_t>(b)];
      for (size_t i = 0; i < sequence.size(); ++i) id[b][static_cast<int64_t>(i)] = sequence[i];
      length[b] = static_cast<int64_t>(sequence.size());
      stats_.prefill_tokens += length[b];
    }
  }
  Prefilled prefilled;
  prefilled.cache = policy_.model->NewCache(batch, longest);
  prefilled.last_logits = policy_.model->Prefill(ids, lengths, prefilled.cache);
  ++stats_.prefills;
  return prefilled;
}

absl::Status Engine::Swap(const PolicySnapshot& policy) {
  RETURN_IF_ERROR(CheckSwappable(config_, policy.model->config()));
  if (has_policy_) {
    const ModelPlacement& was = policy_.model->placement();
    const ModelPlacement& next = policy.model->placement();
    if (was.device != next.device || was.compute_dtype != next.compute_dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "policy version ", policy.version, " is placed on ", next.DebugString(),
          ", the engine's KV cache on ", was.DebugString(), ": every version must share them"));
    }
  }
  const bool first = !has_policy_;
  policy_ = policy;
  has_policy_ = true;
  if (first) {
    cache_ = policy_.model->NewCache(options_.max_rows, capacity_);
    if (options_.cuda_graphs && policy_.model->device().is_cuda()) {
      ASSIGN_OR_RETURN(graphs_, MakeDecodeGraphs(config_, policy_.model->placement(),
                                                 options_.max_rows, capacity_));
    }
  }
  if (graphs_ != nullptr) graphs_->SetWeights(*policy_.model);
  if (first) return absl::OkStatus();
  ++stats_.swaps;
  // Prompt KV kept for waiting samples was computed by the old weights:
  // a waiting sample has no token yet, so it starts under the new ones.
  for (auto& [handle, group] : groups_) {
    group.keys.clear();
    group.values.clear();
    group.last_logits = torch::Tensor();
  }
  if (options_.swap_mode == SwapMode::kKeepCache || rows_.empty()) return absl::OkStatus();
  // Recompute: every running row's KV again, from its prompt and the tokens
  // it has fed (all but the last, which is fed next).
  std::vector<std::vector<int32_t>> sequences;
  sequences.reserve(rows_.size());
  for (const Row& row : rows_) {
    std::vector<int32_t> sequence = groups_.at(row.group).prompt;
    sequence.insert(sequence.end(), row.completion.tokens.begin(),
                    row.completion.tokens.end() - 1);
    stats_.recomputed_tokens += static_cast<int64_t>(sequence.size());
    sequences.push_back(std::move(sequence));
  }
  Prefilled prefilled = PrefillSequences(sequences);
  for (size_t i = 0; i < rows_.size(); ++i) {
    const int64_t slot = static_cast<int64_t>(i);
    CopyIntoRow(slot, prefilled.cache, slot, rows_[i].cached);
  }
  return absl::OkStatus();
}

absl::Status Engine::Admit() {
  std::vector<Waiting> admitted;
  while (static_cast<int64_t>(rows_.size() + admitted.size()) < options_.max_rows &&
         !queue_.empty()) {
    admitted.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  if (admitted.empty()) return absl::OkStatus();

  // One prefill for the prompts that need one and the resumed samples.
  std::vector<std::vector<int32_t>> sequences;
  std::map<int64_t, size_t> prompt_index;   // group -> row of the prefill
  std::vector<int64_t> resume_index(admitted.size(), -1);
  for (size_t i = 0; i < admitted.size(); ++i) {
    const Waiting& waiting = admitted[i];
    Group& group = groups_.at(waiting.group);
    const std::vector<int32_t>& prefix = waiting.request.prefix.tokens;
    if (prefix.empty()) {
      if (group.keys.empty() && prompt_index.count(waiting.group) == 0) {
        prompt_index[waiting.group] = sequences.size();
        sequences.push_back(group.prompt);
      }
    } else {
      resume_index[i] = static_cast<int64_t>(sequences.size());
      std::vector<int32_t> sequence = group.prompt;
      sequence.insert(sequence.end(), prefix.begin(), prefix.end() - 1);
      stats_.recomputed_tokens += static_cast<int64_t>(prefix.size()) - 1;
      sequences.push_back(std::move(sequence));
    }
  }
  Prefilled prefilled;
  if (!sequences.empty()) prefilled = PrefillSequences(sequences);
  for (const auto& [handle, index] : prompt_index) {
    Group& group = groups_.at(handle);
    const int64_t length = static_cast<int64_t>(group.prompt.size());
    group.keys.clear();
    group.values.clear();
    for (size_t l = 0; l < prefilled.cache.keys.size(); ++l) {
      group.keys.push_back(prefilled.cache.keys[l][static_cast<int64_t>(index)].narrow(1, 0, length));
      group.values.push_back(
          prefilled.cache.values[l][static_cast<int64_t>(index)].narrow(1, 0, length));
    }
    group.last_logits = prefilled.last_logits[static_cast<int64_t>(index)];
    ++stats_.prompt_prefills;
  }

  std::vector<Row*> fresh;
  std::vector<torch::Tensor> fresh_logits;
  for (size_t i = 0; i < admitted.size(); ++i) {
    Waiting& waiting = admitted[i];
    Group& group = groups_.at(waiting.group);
    const int64_t prompt_length = static_cast<int64_t>(group.prompt.size());
    const int64_t slot = static_cast<int64_t>(rows_.size());
    rows_.emplace_back();
    Row& row = rows_.back();
    row.group = waiting.group;
    row.sample = waiting.sample;
    row.seed = waiting.request.seed;
    const int64_t asked = waiting.request.max_new_tokens > 0 ? waiting.request.max_new_tokens
                                                             : sampling_.max_new_tokens;
    row.max_new = std::min(asked, capacity_ - prompt_length);
    row.completion = std::move(waiting.request.prefix);
    if (resume_index[i] >= 0) {
      // A partial rollout: its KV recomputed, its last token fed next.
      row.cached = prompt_length + static_cast<int64_t>(row.completion.tokens.size()) - 1;
      CopyIntoRow(slot, prefilled.cache, resume_index[i], row.cached);
      if (static_cast<int64_t>(row.completion.tokens.size()) >= row.max_new) {
        FinishRow(row, Finish::kLength);
      }
    } else {
      // A fresh sample: the group's prompt KV, its first token from the
      // prompt's last logits.
      row.cached = prompt_length;
      for (size_t l = 0; l < cache_.keys.size(); ++l) {
        cache_.keys[l][slot].narrow(1, 0, row.cached).copy_(group.keys[l]);
        cache_.values[l][slot].narrow(1, 0, row.cached).copy_(group.values[l]);
      }
      fresh.push_back(&row);
      fresh_logits.push_back(group.last_logits);
    }
    if (--group.to_admit == 0) {
      // Every sample has its row: the prompt's KV is not needed again (a
      // swap recomputes rows from their tokens).
      group.keys.clear();
      group.values.clear();
    }
  }
  if (fresh.empty()) return absl::OkStatus();
  return SampleInto(torch::stack(fresh_logits), fresh);
}

void Engine::CopyIntoRow(int64_t slot, const KVCache& from, int64_t from_row, int64_t length) {
  for (size_t l = 0; l < cache_.keys.size(); ++l) {
    cache_.keys[l][slot].narrow(1, 0, length).copy_(from.keys[l][from_row].narrow(1, 0, length));
    cache_.values[l][slot].narrow(1, 0, length).copy_(from.values[l][from_row].narrow(1, 0, length));
  }
}

absl::Status Engine::SampleInto(const torch::Tensor& raw_logits, const std::vector<Row*>& rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const auto no_distribution = [&]() {
    const absl::Status why = NoDistribution(raw_logits, sampling_.temperature);
    return absl::Status(why.code(), absl::StrCat("sampling with policy version ", policy_.version,
                                                 ": ", why.message()));
  };
  // Everything up to the sampled tokens stays on the model's device; one
  // copy brings the tokens, their log-probs and a finiteness flag to the
  // host, which needs the tokens for stop checks (the one device-to-host
  // transfer of a decode step).
  const torch::Tensor logits = raw_logits.to(torch::kFloat32);
  torch::Tensor tokens;
  torch::Tensor logprobs;
  torch::Tensor finite;
  if (sampling_.temperature == 0) {
    tokens = logits.argmax(-1);
    logprobs = torch::log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
    finite = torch::isfinite(logprobs).all();
  } else {
    const torch::Tensor scaled = logits / sampling_.temperature;
    const torch::Tensor log_probs = torch::log_softmax(scaled, -1);
    const int64_t vocab = logits.size(-1);
    const torch::Tensor filtered = TruncateLogits(scaled, sampling_.top_k, sampling_.top_p);
    const torch::Tensor probabilities = torch::softmax(filtered, -1);
    // Inverse CDF with the row's own draw: the first token whose cumulative
    // mass exceeds u times the total (never one of zero probability).
    const torch::Tensor cdf = probabilities.to(torch::kFloat64).cumsum(-1);
    torch::Tensor draws = torch::empty({n, 1}, torch::kFloat64);
    {
      auto u = draws.accessor<double, 2>();
      for (int64_t b = 0; b < n; ++b) {
        const Row& row = *rows[static_cast<size_t>(b)];
        u[b][0] = SampleUniform(row.seed, static_cast<int64_t>(row.completion.tokens.size()));
      }
    }
    const torch::Tensor target = draws.to(logits.device()) * cdf.narrow(-1, vocab - 1, 1);
    tokens = (cdf <= target).sum(-1).clamp_max(vocab - 1);
    logprobs = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
    finite = torch::isfinite(probabilities).all() & torch::isfinite(logprobs).all();
  }
  // [2n + 1] doubles: tokens (exact below 2^53), log-probs, the flag.
  const torch::Tensor host =
      torch::cat({tokens.to(torch::kFloat64), logprobs.to(torch::kFloat64),
                  finite.to(torch::kFloat64).reshape({1})})
          .to(torch::kCPU);
  auto values = host.accessor<double, 1>();
  if (values[2 * n] == 0) return no_distribution();
  stats_.sampled_tokens += n;
  for (int64_t b = 0; b < n; ++b) {
    Row& row = *rows[static_cast<size_t>(b)];
    const int64_t token = static_cast<int64_t>(values[b]);
    row.completion.tokens.push_back(static_cast<int32_t>(token));
    row.completion.logprobs.push_back(static_cast<float>(values[n + b]));
    row.completion.versions.push_back(policy_.version);
    if (std::find(sampling_.stop_token_ids.begin(), sampling_.stop_token_ids.end(), token) !=
            sampling_.stop_token_ids.end() ||
        StopStringHit(row)) {
      FinishRow(row, Finish::kStop);
    } else if (static_cast<int64_t>(row.completion.tokens.size()) >= row.max_new) {
      FinishRow(row, Finish::kLength);
    }
  }
  return absl::OkStatus();
}

bool Engine::StopStringHit(const Row& row) const {
  if (options_.stop_strings.empty()) return false;
  // A window of tokens long enough to spell the longest stop string (a
  // token is at least one byte; a few more for multi-token characters);
  // a hit counts only when the newest token completes it.
  const std::vector<int32_t>& tokens = row.completion.tokens;
  const size_t window = std::min(tokens.size(), longest_stop_string_ + 4);
  const std::vector<int32_t> tail(tokens.end() - static_cast<std::ptrdiff_t>(window), tokens.end());
  const std::string text = options_.detokenize(tail);
  const std::string before =
      options_.detokenize(std::vector<int32_t>(tail.begin(), tail.end() - 1));
  for (const std::string& stop : options_.stop_strings) {
    if (text.find(stop) != std::string::npos && before.find(stop) == std::string::npos) {
      return true;
    }
  }
  return false;
}

void Engine::FinishRow(Row& row, Finish finish) {
  row.done = true;
  row.completion.finish = finish;
  row.completion.weight_swaps = static_cast<int32_t>(VersionChanges(row.completion.versions));
}

std::vector<FinishedSample> Engine::Compact() {
  std::vector<FinishedSample> finished;
  // From the highest row down: the last row moved into a gap is never one
  // that has finished (those above have been removed already).
  for (int64_t i = static_cast<int64_t>(rows_.size()) - 1; i >= 0; --i) {
    if (!rows_[static_cast<size_t>(i)].done) continue;
    Row& row = rows_[static_cast<size_t>(i)];
    finished.push_back({row.group, row.sample, std::move(row.completion)});
    ReleaseSample(row.group);
    const int64_t last = static_cast<int64_t>(rows_.size()) - 1;
    if (i != last) {
      Row& moved = rows_[static_cast<size_t>(last)];
      CopyIntoRow(i, cache_, last, moved.cached);
      rows_[static_cast<size_t>(i)] = std::move(moved);
      ++stats_.compactions;
    }
    rows_.pop_back();
  }
  std::reverse(finished.begin(), finished.end());
  return finished;
}

void Engine::ReleaseSample(int64_t group) {
  auto it = groups_.find(group);
  if (it != groups_.end() && --it->second.outstanding == 0) groups_.erase(it);
}

absl::StatusOr<std::vector<FinishedSample>> Engine::Step(const PolicySnapshot& policy) {
  if (policy.model == nullptr) return absl::InvalidArgumentError("the policy has no model");
  if (!has_policy_ || policy.version != policy_.version) RETURN_IF_ERROR(Swap(policy));
  c10::InferenceMode inference;
  RETURN_IF_ERROR(Admit());
  std::vector<FinishedSample> finished = Compact();
  if (rows_.empty()) return finished;

  const int64_t batch = static_cast<int64_t>(rows_.size());
  torch::Tensor ids = torch::empty({batch, 1}, torch::kInt64);
  torch::Tensor lengths = torch::empty({batch}, torch::kInt64);
  int64_t longest = 0;
  {
    auto id = ids.accessor<int64_t, 2>();
    auto length = lengths.accessor<int64_t, 1>();
    for (int64_t b = 0; b < batch; ++b) {
      const Row& row = rows_[static_cast<size_t>(b)];
      id[b][0] = row.completion.tokens.back();
      length[b] = row.cached;
      longest = std::max(longest, row.cached);
    }
  }
  // The step's inputs go to the device in two small copies; the longest row
  // is known here, so nothing is read back before the forward pass.
  torch::Tensor logits;
  if (graphs_ != nullptr) {
    try {
      logits = graphs_->Forward(ids, lengths, longest, cache_);
      stats_.graph_captures = graphs_->captures();
      stats_.graph_replays = graphs_->replays();
    } catch (const c10::Error& e) {
      // A capture the device refused: this engine goes on eagerly (the
      // step is recomputed below; its keys and values are rewritten).
      stats_.graph_error = e.what_without_backtrace();
      graphs_.reset();
    }
  }
  if (!logits.defined()) {
    logits = policy_.model->ForwardRows(ids, lengths, cache_, longest).squeeze(1);
  }
  ++stats_.decode_steps;
  stats_.decoded_rows += batch;
  std::vector<Row*> all;
  all.reserve(rows_.size());
  for (Row& row : rows_) {
    ++row.cached;
    all.push_back(&row);
  }
  RETURN_IF_ERROR(SampleInto(logits, all));
  std::vector<FinishedSample> more = Compact();
  finished.insert(finished.end(), std::make_move_iterator(more.begin()),
                  std::make_move_iterator(more.end()));
  return finished;
}

std::vector<FinishedSample> Engine::Drain(Finish finish) {
  std::vector<FinishedSample> drained;
  for (Row& row : rows_) {
    FinishRow(row, finish);
    drained.push_back({row.group, row.sample, std::move(row.completion)});
  }
  for (Waiting& waiting : queue_) {
    Completion completion = std::move(waiting.request.prefix);
    completion.finish = finish;
    completion.weight_swaps = static_cast<int32_t>(VersionChanges(completion.versions));
    drained.push_back({waiting.group, waiting.sample, std::move(completion)});
  }
  rows_.clear();
  queue_.clear();
  groups_.clear();
  return drained;
}

absl::StatusOr<std::vector<Completion>> GenerateContinuous(
    const PolicySnapshot& initial, const std::vector<std::vector<int32_t>>& prompts,
    std::vector<std::vector<SampleRequest>> samples, const EngineOptions& options,
    const SamplingOptions& sampling, const GenerationHooks& hooks) {
  if (initial.model == nullptr) return absl::InvalidArgumentError("the initial policy has no model");
  if (samples.size() != prompts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(prompts.size(), " prompts but ", samples.size(),
                                                   " sample lists"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   Engine::Create(initial.model->config(), options, sampling));
  std::vector<size_t> offset(prompts.size() + 1, 0);
  for (size_t p = 0; p < prompts.size(); ++p) {
    offset[p + 1] = offset[p] + samples[p].size();
    // Handles count from 0 in order: group p is handle p.
    absl::StatusOr<int64_t> handle = engine->AddGroup(prompts[p], std::move(samples[p]));
    if (!handle.ok()) {
      return absl::Status(handle.status().code(),
                          absl::StrCat("prompt ", p, ": ", handle.status().message()));
    }
  }
  std::vector<Completion> completions(offset.back());
  const auto place = [&](std::vector<FinishedSample>& finished) {
    for (FinishedSample& sample : finished) {
      completions[offset[static_cast<size_t>(sample.group)] + static_cast<size_t>(sample.sample)] =
          std::move(sample.completion);
    }
  };
  while (!engine->idle()) {
    if (hooks.should_abort && hooks.should_abort()) {
      std::vector<FinishedSample> drained = engine->Drain(Finish::kAborted);
      place(drained);
      break;
    }
    PolicySnapshot policy = hooks.current_policy ? hooks.current_policy() : initial;
    if (policy.model == nullptr) {
      return absl::InvalidArgumentError("current_policy returned a policy without a model");
    }
    ASSIGN_OR_RETURN(std::vector<FinishedSample> finished, engine->Step(policy));
    place(finished);
  }
  return completions;
}

}  // namespace sluice::model
