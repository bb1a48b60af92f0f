#include "common/run/run_memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/run/run_weight_sync.h"

namespace sluice::run {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kFloat = 4;  // The model computes in float32.
// The trainer's weight store keeps this many published versions
// (trainer/weight_store.h's default).
constexpr int64_t kRetainedVersions = 4;
// The evaluator generates this many prompts at a time (trainer/evaluator.h).
constexpr int64_t kEvalBatchRows = 256;

// Saturating arithmetic: absurd specs must give absurd (but finite,
// comparable) estimates, not overflow into small or negative ones.
int64_t Mul(int64_t a, int64_t b) {
  if (a <= 0 || b <= 0) return 0;
  if (a > kMax / b) return kMax;
  return a * b;
}
template <typename... Rest>
int64_t Mul(int64_t a, int64_t b, Rest... rest) {
  return Mul(Mul(a, b), rest...);
}
int64_t Add(int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; }


int64_t PerTokenKvBytes(const model::ModelConfig& config) {
  return Mul(config.num_hidden_layers, 2, config.num_key_value_heads, config.resolved_head_dim(),
             kFloat);
}

void AddTerm(ServiceMemoryEstimate& estimate, std::string what, int64_t bytes, std::string how) {
  estimate.bytes = Add(estimate.bytes, bytes);
  estimate.terms.push_back({std::move(what), bytes, std::move(how)});
}

std::string Count(int64_t n) {
  // 1234567 -> "1,234,567".
  std::string digits = absl::StrCat(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace

int64_t ContextTokens(const v1::RunSpec& spec, const model::ModelConfig& config) {
  const int64_t context = spec.model().max_context_tokens() > 0 ? spec.model().max_context_tokens()
                                                                 : config.max_position_embeddings;
  return std::max<int64_t>(1, context);
}

int64_t RunSequenceTokens(const v1::RunSpec& spec, const model::ModelConfig& config,
                          int64_t max_prompt_tokens) {
  const int64_t context = ContextTokens(spec, config);
  const int64_t max_new = spec.rollout().sampling().max_new_tokens() > 0
                              ? spec.rollout().sampling().max_new_tokens()
                              : context;
  if (max_prompt_tokens <= 0) return context;
  return std::clamp<int64_t>(Add(max_prompt_tokens, max_new), 1, context);
}

int64_t GenerationBatchBytes(const model::ModelConfig& config, int64_t sequences,
                             int64_t prompt_tokens, int64_t total_tokens) {
  const int64_t kv = Mul(sequences, total_tokens, PerTokenKvBytes(config));
  // Prefill, one layer at a time: hidden states and MLP activations of every
  // prompt position, attention scores and probabilities, and the logits.
  const int64_t prefill = Add(
      Mul(sequences, prompt_tokens,
          Add(Mul(4, config.hidden_size), Mul(2, config.intermediate_size)), kFloat),
      Add(Mul(sequences, config.num_attention_heads, prompt_tokens, prompt_tokens, 2, kFloat),
          Mul(sequences, prompt_tokens, config.vocab_size, kFloat)));
  // A decoding step: logits, their softmax and the sampling copy.
  const int64_t decode = Mul(sequences, config.vocab_size, 3, kFloat);
  return Add(kv, std::max(prefill, decode));
}

bool KeepsProximalPolicy(const v1::AlgorithmConfig& a) {
  const bool decoupled =
      a.objective() == v1::OBJECTIVE_DECOUPLED_PPO || a.objective() == v1::OBJECTIVE_UNSPECIFIED;
  return decoupled && a.minibatches_per_batch() > 1 && !a.truncated_importance_sampling() &&
         a.proximal_logprobs() != v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR;
}

bool KeepsReferencePolicy(const v1::AlgorithmConfig& a) {
  return a.objective() == v1::OBJECTIVE_TRAJECTORY_BALANCE ? a.tb_use_reference()
                                                           : a.kl_coef() > 0;
}

int64_t TrainingBatchBytes(const model::ModelConfig& config, int64_t sequences, int64_t tokens,
                           bool entropy_gradient) {
  const int64_t d = config.hidden_size;
  const int64_t per_token_per_layer =
      Add(Add(Mul(10, d), Mul(4, config.intermediate_size)),
          Mul(2, config.num_attention_heads, config.resolved_head_dim()));
  const int64_t saved = Mul(sequences, tokens, config.num_hidden_layers, per_token_per_layer, kFloat);
  const int64_t attention =
      Mul(sequences, config.num_hidden_layers, config.num_attention_heads, tokens, tokens, 2, kFloat);
  const int64_t logits =
      Mul(sequences, tokens, config.vocab_size, entropy_gradient ? 5 : 3, kFloat);
  return Add(Add(saved, attention), logits);
}

int64_t StoredGroupBytes(int64_t group_size, int64_t tokens) {
  // Per token: id (4), behaviour log-prob (4), version (8); per trajectory
  // the proto's framing, reward details and ids; per group its key and index.
  return Add(Mul(group_size, Add(Mul(tokens, 16), 512)), 1024);
}

ServiceMemoryEstimate EstimateReplayBufferMemory(int64_t batch_size_groups, int64_t max_staleness,
                                                 int64_t group_size,
                                                 const v1::BufferConfig& buffer,
                                                 int64_t sequence_tokens, std::string length_how,
                                                 int64_t retained_step_batches) {
  // The admission gate holds accepted + running below (eta + v + 1) * B,
  // and a group stays until sampled max_times_sampled times, so about
  // (eta + 1 + max_times_sampled) * B groups at most.
  ServiceMemoryEstimate b;
  const int64_t batch_groups = std::max<int64_t>(1, batch_size_groups);
  const int64_t group = std::max<int64_t>(1, group_size);
  const int64_t tokens = std::max<int64_t>(1, sequence_tokens);
  if (length_how.empty()) length_how = absl::StrCat(Count(tokens), " tokens");
  const int64_t times = std::max(1, buffer.max_times_sampled());
  int64_t held = Mul(Add(Add(std::max<int64_t>(0, max_staleness), 1), times), batch_groups);
  if (buffer.capacity_groups() > 0) held = std::min(held, buffer.capacity_groups());
  AddTerm(b, "groups held", Mul(held, StoredGroupBytes(group, tokens)),
          absl::StrCat(Count(held), " groups ((max_staleness + 1 + max_times_sampled) x "
                                    "batch_size_groups) x ",
                       Count(group), " trajectories x ", length_how));
  b.fields = {"algorithm.batch_size_groups", "algorithm.max_staleness", "algorithm.group_size",
              "buffer.max_times_sampled", "buffer.capacity_groups",
              "rollout.sampling.max_new_tokens"};
  if (retained_step_batches > 0) {
    const int64_t kept = Mul(retained_step_batches, batch_groups);
    AddTerm(b, "trained batches kept until checkpointed", Mul(kept, StoredGroupBytes(group, tokens)),
            absl::StrCat(Count(kept), " groups (", Count(retained_step_batches),
                         " batches since the last checkpoint x batch_size_groups) x ",
                         Count(group), " trajectories x ", length_how));
    b.fields.insert(b.fields.begin() + 1, "checkpoint.every_n_steps");
  }
  return b;
}

int64_t RetainedStepBatches(const v1::RunSpec& spec) {
  const int64_t every = spec.checkpoint().every_n_steps();
  if (spec.checkpoint().dir().empty() || every <= 0) return 0;
  const int64_t minibatches = std::max(1, spec.algorithm().minibatches_per_batch());
  if (minibatches == 1) return every;
  return (every + minibatches - 1) / minibatches + 1;
}

RunMemoryEstimate EstimateRunMemory(const v1::RunSpec& spec, const model::ModelConfig& config,
                                    int64_t max_prompt_tokens) {
  RunMemoryEstimate out;
  const v1::AlgorithmConfig& a = spec.algorithm();
  const int64_t params = config.ParameterCount();
  const int64_t context = ContextTokens(spec, config);
  const int64_t tokens = RunSequenceTokens(spec, config, max_prompt_tokens);
  out.sequence_tokens = tokens;
  out.max_prompt_tokens = std::max<int64_t>(0, max_prompt_tokens);
  const int64_t prompt_tokens = max_prompt_tokens <= 0 ? tokens : std::min(max_prompt_tokens, tokens);
  const int64_t group_size = std::max(1, a.group_size());
  const int64_t batch_groups = std::max(1, a.batch_size_groups());
  const std::string shape = absl::StrCat(config.num_hidden_layers, " layers, ",
                                         config.num_key_value_heads, " KV heads x ",
                                         config.resolved_head_dim());
  const std::string length_how =
      max_prompt_tokens <= 0
          ? absl::StrCat(Count(tokens), " tokens (the context)")
          : absl::StrCat(Count(tokens), " tokens (prompt <= ", Count(prompt_tokens),
                         " + max new tokens, within the context of ", Count(context), ")");

  // How versions travel (weight_sync): the store's and the workers' copies.
  const WeightSync sync = ResolveWeightSync(spec);
  const int64_t sync_bytes = sync.dtype == v1::DTYPE_FLOAT32 ? kFloat : 2;
  const std::string sync_dtype = WeightSyncDTypeName(sync.dtype);

  // Rollout worker.
  {
    ServiceMemoryEstimate& w = out.rollout_worker;
    const int64_t groups = spec.rollout().max_concurrent_groups_per_worker() > 0
                               ? spec.rollout().max_concurrent_groups_per_worker()
                               : batch_groups;
    const int64_t sequences = Mul(groups, group_size);
    AddTerm(w, "weights", Mul(params, 2, kFloat),
            absl::StrCat(Count(params), " parameters, the current and an incoming version"));
    if (sync.delta) {
      AddTerm(w, "held version", Mul(params, sync_bytes),
              absl::StrCat("the version held as it came (", sync_dtype,
                           "), the base of the next delta"));
    }
    w.batch_bytes = GenerationBatchBytes(config, sequences, prompt_tokens, tokens);
    AddTerm(w, "generation batch", w.batch_bytes,
            absl::StrCat(Count(sequences), " sequences (", Count(groups), " groups x ",
                         Count(group_size), ") x ", length_how, ", KV cache of ", shape,
                         ", logits over ", Count(config.vocab_size), " tokens"));
    w.fields = {spec.rollout().max_concurrent_groups_per_worker() > 0
                    ? "rollout.max_concurrent_groups_per_worker"
                    : "algorithm.batch_size_groups (or set "
                      "rollout.max_concurrent_groups_per_worker)",
                "algorithm.group_size", "rollout.sampling.max_new_tokens",
                "model.max_context_tokens"};
  }

  // Trainer.
  {
    ServiceMemoryEstimate& t = out.trainer;
    AddTerm(t, "weights and optimizer", Mul(params, 4, kFloat),
            absl::StrCat(Count(params), " parameters: weights, gradients, AdamW's two moments"));
    // Versions are published in weight_sync.dtype (run_weight_sync.h).
    AddTerm(t, "published versions", Mul(params, kRetainedVersions, sync_bytes),
            absl::StrCat(kRetainedVersions, " versions kept for the workers, in ", sync_dtype));
    if (sync.delta) {
      // A tensor whose delta would pass half its size travels whole.
      AddTerm(t, "version deltas", Mul(params, kRetainedVersions, sync_bytes) / 2,
              "each kept version's sparse delta against the one before, at most half its size");
    }
    if (sync_bytes < kFloat) {
      AddTerm(t, "float32 copy of the last version", Mul(params, kFloat),
              "so that a rolled-back step loses nothing to the published rounding");
    }
    const int minibatches = std::max(1, a.minibatches_per_batch());
    if (KeepsProximalPolicy(a)) {
      AddTerm(t, "proximal policy", Mul(params, kFloat), "a copy of the weights");
    }
    if (KeepsReferencePolicy(a)) {
      AddTerm(t, "reference policy", Mul(params, kFloat), "a copy of the weights");
    }
    const int64_t rl_sequences = Mul((batch_groups + minibatches - 1) / minibatches, group_size);
    int64_t transient = TrainingBatchBytes(config, rl_sequences, tokens, a.entropy_coef() > 0);
    std::string transient_how =
        absl::StrCat("RL minibatch of ", Count(rl_sequences), " sequences (",
                     Count(batch_groups), " groups / ", minibatches, " minibatches x ",
                     Count(group_size), ") x ", length_how, ": activations, attention, logits");
    std::vector<std::string> fields = {"algorithm.batch_size_groups",
                                       "algorithm.minibatches_per_batch", "algorithm.group_size",
                                       "rollout.sampling.max_new_tokens"};
    if (spec.warm_start().sft_steps() > 0) {
      const int64_t sft = TrainingBatchBytes(config, spec.warm_start().batch_size(), tokens);
      if (sft > transient) {
        transient = sft;
        transient_how = absl::StrCat("warm-start batch of ", Count(spec.warm_start().batch_size()),
                                     " sequences x ", length_how);
        fields.insert(fields.begin(), "warm_start.batch_size");
      }
    }
    const int64_t eval_max_new = spec.eval().sampling().max_new_tokens() > 0
                                     ? spec.eval().sampling().max_new_tokens()
                                     : context;
    const int64_t eval_tokens = std::min(context, Add(prompt_tokens, eval_max_new));
    const int64_t eval_rows =
        std::min<int64_t>(kEvalBatchRows, spec.eval().num_prompts() > 0
                                              ? spec.eval().num_prompts()
                                              : std::max(1, spec.task().eval_split_size()));
    const int64_t eval = GenerationBatchBytes(config, eval_rows, prompt_tokens, eval_tokens);
    if (eval > transient) {
      transient = eval;
      transient_how = absl::StrCat("evaluation batch of ", Count(eval_rows), " prompts x ",
                                   Count(eval_tokens), " tokens");
      fields.push_back("eval.sampling.max_new_tokens");
    }
    t.batch_bytes = transient;
    AddTerm(t, "largest batch", transient, std::move(transient_how));
    t.fields = std::move(fields);
  }

  out.replay_buffer =
      EstimateReplayBufferMemory(batch_groups, a.max_staleness(), group_size, spec.buffer(),
                                 tokens, length_how, RetainedStepBatches(spec));
  return out;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes == kMax) return "more than 8 EiB";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string CheckMemoryBudget(absl::string_view service, const ServiceMemoryEstimate& estimate,
                              const MemoryBudget& budget) {
  if (budget.bytes <= 0 || estimate.bytes <= budget.bytes) return "";
  std::vector<const MemoryTerm*> terms;
  for (const MemoryTerm& term : estimate.terms) terms.push_back(&term);
  std::stable_sort(terms.begin(), terms.end(),
                   [](const MemoryTerm* x, const MemoryTerm* y) { return x->bytes > y->bytes; });
  std::vector<std::string> shown;
  for (const MemoryTerm* term : terms) {
    if (term->bytes == 0) continue;
    shown.push_back(absl::StrCat(term->what, " ", FormatBytes(term->bytes), ": ", term->how));
  }
  return absl::StrCat(service, ": the run needs about ", FormatBytes(estimate.bytes), " (",
                      absl::StrJoin(shown, "; "), "), more than the ", FormatBytes(budget.bytes),
                      " budget of ", budget.owner, "; lower ", absl::StrJoin(estimate.fields, ", "),
                      ", or give the service a larger budget");
}

absl::StatusOr<int64_t> ParseMemorySize(absl::string_view text) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory size must be bytes, a size like 16GiB / 512MiB / 64K, or a share of the "
        "machine like 80%; ",
        why, ", got '", text, "'"));
  };
  absl::string_view s = absl::StripAsciiWhitespace(text);
  if (absl::ConsumeSuffix(&s, "%")) {
    double percent = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(s), &percent) || !(percent > 0) ||
        percent > 100) {
      return bad("a share must be in (0, 100]%");
    }
    const std::optional<int64_t> machine = MachineMemoryBytes();
    if (!machine.has_value()) return bad("this machine's memory cannot be read");
    return static_cast<int64_t>(static_cast<double>(*machine) * percent / 100);
  }
  size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) ||
                               s[digits] == '.')) {
    ++digits;
  }
  double number = 0;
  if (digits == 0 || !absl::SimpleAtod(s.substr(0, digits), &number)) {
    return bad("no number");
  }
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(digits)));
  double scale = 1;
  if (!unit.empty() && unit != "b") {
    static constexpr std::pair<char, double> kScales[] = {
        {'k', 1024.0}, {'m', 1024.0 * 1024}, {'g', 1024.0 * 1024 * 1024},
        {'t', 1024.0 * 1024 * 1024 * 1024}};
    bool found = false;
    for (const auto& [letter, factor] : kScales) {
      if (unit[0] != letter) continue;
      const std::string rest = unit.substr(1);
      if (rest.empty() || rest == "b" || rest == "ib") {
        scale = factor;
        found = true;
      }
    }
    if (!found) return bad(absl::StrCat("unknown unit '", unit, "'"));
  }
  const double bytes = number * scale;
  if (!(bytes >= 1)) return bad("must be at least 1 byte");
  if (bytes >= 9.2e18) return bad("too large");
  return static_cast<int64_t>(bytes);
}

std::optional<int64_t> MachineMemoryBytes() {
  std::optional<int64_t> total;
  {
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    int64_t kib = 0;
    std::string unit;
    while (meminfo >> key >> kib) {
      std::getline(meminfo, unit);
      if (key == "MemTotal:") {
        total = Mul(kib, 1024);
        break;
      }
    }
  }
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream file(path);
    std::string value;
    if (!(file >> value)) continue;
    int64_t limit = 0;
    if (value == "max" || !absl::SimpleAtoi(value, &limit) || limit <= 0) continue;
    // cgroup v1 reports "no limit" as a huge page-aligned number.
    if (!total.has_value() || limit < *total) total = limit;
  }
  return total;
}

}  // namespace sluice::run
