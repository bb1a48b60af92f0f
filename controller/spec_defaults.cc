// ResolveDefaults and DescribeZeroDefaults (run_spec.h): what every field a
// spec leaves unset becomes, and what a 0 that stays means.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/model_config.h"
#include "common/run/run_buffer.h"
#include "common/run/run_objective.h"
#include "common/run/run_task.h"
#include "common/run/run_verification.h"
#include "common/run/run_weight_sync.h"
#include "common/task/char_tokenizer.h"
#include "controller/run_spec.h"
#include "controller/spec_problems.h"

namespace sluice::controller {
namespace {

using spec_internal::DefaultDatasetVerifier;
using v1::RunSpec;

constexpr int kDefaultEvalSplitSize = 200;
constexpr int64_t kDefaultMaxOperand = 99;
constexpr int kDefaultNumOperands = 2;
constexpr int64_t kDefaultNumArithmeticPrompts = 10000;
constexpr int kDefaultGroupSize = 8;
constexpr int kDefaultBatchSizeGroups = 16;
constexpr double kDefaultLearningRate = 1e-6;
constexpr double kDefaultGradClipNorm = 1.0;
constexpr int64_t kDefaultTotalSteps = 1000;
constexpr double kDefaultWarmStartLearningRate = 1e-4;

void ResolveSampling(v1::SamplingParams* sampling, float default_temperature) {
  if (!sampling->has_temperature()) sampling->set_temperature(default_temperature);
  if (!sampling->has_top_p()) sampling->set_top_p(1.0f);
}

}  // namespace

RunSpec ResolveDefaults(RunSpec spec) {
  v1::ModelConfig& model = *spec.mutable_model();
  if (model.device().empty()) model.set_device("cpu");
  // On CPU the model computes in float32 and checkpoints are written in it.
  // On a GPU an unset dtype means two things (bfloat16 compute, float32
  // checkpoints): it stays unset there, and DescribeZeroDefaults says so.
  if (model.dtype() == v1::DTYPE_UNSPECIFIED && !run::IsCudaDevice(model.device())) {
    model.set_dtype(v1::DTYPE_FLOAT32);
  }
  if (model.has_builtin() && model.max_context_tokens() == 0) {
    absl::StatusOr<model::ModelConfig> config =
        model::BuiltinModelConfig(model.builtin(), task::CharTokenizer().vocab_size());
    // An unknown name is left for ValidateRunSpec to report.
    if (config.ok())
      model.set_max_context_tokens(static_cast<int32_t>(config->max_position_embeddings));
  }

  v1::TaskConfig& task = *spec.mutable_task();
  if (task.eval_split_size() == 0) task.set_eval_split_size(kDefaultEvalSplitSize);
  if (task.has_arithmetic()) {
    v1::ArithmeticTaskConfig& arithmetic = *task.mutable_arithmetic();
    if (arithmetic.max_operand() == 0) arithmetic.set_max_operand(kDefaultMaxOperand);
    if (arithmetic.num_operands() == 0) arithmetic.set_num_operands(kDefaultNumOperands);
    if (arithmetic.operators().empty()) {
      for (const char* op : {"+", "-", "*"}) arithmetic.add_operators(op);
    }
    if (arithmetic.num_prompts() == 0) arithmetic.set_num_prompts(kDefaultNumArithmeticPrompts);
  }
  // Datasets show the template they use; the arithmetic task keeps an empty
  // one (its prompts are the task's own "07+45=").
  if (task.has_dataset() && task.prompt_template().empty()) {
    task.set_prompt_template(std::string(run::DefaultPromptTemplate(task)));
  }

  v1::AlgorithmConfig& a = *spec.mutable_algorithm();
  // The objective's defaults, as the trainer resolves them (common/run/run_objective.h).
  run::ResolveObjectiveDefaults(&a, spec.rollout().sampling().max_new_tokens(),
                                model.max_context_tokens());
  if (a.group_size() == 0) a.set_group_size(kDefaultGroupSize);
  if (a.batch_size_groups() == 0) a.set_batch_size_groups(kDefaultBatchSizeGroups);
  if (a.learning_rate() == 0) a.set_learning_rate(kDefaultLearningRate);
  if (!a.has_grad_clip_norm()) a.set_grad_clip_norm(kDefaultGradClipNorm);
  if (a.total_steps() == 0) a.set_total_steps(kDefaultTotalSteps);
  if (a.minibatches_per_batch() == 0) a.set_minibatches_per_batch(1);
  if (a.lr_schedule() == v1::LR_SCHEDULE_UNSPECIFIED) a.set_lr_schedule(v1::LR_SCHEDULE_CONSTANT);

  // The fractions (trusted workers: those the controller adds at submit).
  run::ResolveRolloutVerificationDefaults({}, a.mutable_rollout_verification());

  v1::WarmStartConfig& w = *spec.mutable_warm_start();
  if (w.sft_steps() > 0) {
    if (w.learning_rate() == 0) w.set_learning_rate(kDefaultWarmStartLearningRate);
    if (w.batch_size() == 0) w.set_batch_size(a.group_size() * a.batch_size_groups());
  }

  v1::RolloutConfig& rollout = *spec.mutable_rollout();
  ResolveSampling(rollout.mutable_sampling(), 1.0f);
  if (rollout.min_workers() == 0) rollout.set_min_workers(1);
  if (rollout.weight_swap_mode() == v1::WEIGHT_SWAP_MODE_UNSPECIFIED) {
    rollout.set_weight_swap_mode(v1::WEIGHT_SWAP_MODE_KEEP_CACHE);
  }

  v1::RewardConfig& reward = *spec.mutable_reward();
  if (reward.verifiers().empty()) {
    const char* name = task.has_arithmetic() ? "math"
                       : task.has_dataset()  ? DefaultDatasetVerifier(task.dataset().format())
                                             : nullptr;
    if (name != nullptr) {
      v1::WeightedVerifier* verifier = reward.add_verifiers();
      verifier->set_name(name);
      verifier->set_weight(1.0);
    }
  }
  for (v1::WeightedVerifier& verifier : *reward.mutable_verifiers()) {
    if (verifier.weight() == 0) verifier.set_weight(1.0);
  }

  v1::BufferConfig& buffer = *spec.mutable_buffer();
  if (buffer.sampler() == v1::SAMPLER_KIND_UNSPECIFIED) buffer.set_sampler(v1::SAMPLER_KIND_FIFO);
  if (buffer.max_times_sampled() == 0) buffer.set_max_times_sampled(1);
  if (!buffer.has_priority_alpha()) buffer.set_priority_alpha(run::kDefaultPriorityAlpha);
  if (buffer.recency_probability() == 0) {
    buffer.set_recency_probability(run::kDefaultRecencyProbability);
  }

  // Eval sampling: unset temperature means greedy, unlike training rollouts.
  ResolveSampling(spec.mutable_eval()->mutable_sampling(), 0.0f);

  v1::CheckpointConfig& checkpoint = *spec.mutable_checkpoint();
  if (!checkpoint.has_resume()) checkpoint.set_resume(true);

  // What the trainer and workers will do, spelled out in the resolved spec.
  // A weight_sync the validation refuses is left as written, for it to name.
  std::vector<std::string> weight_sync_problems;
  run::ValidateWeightSync(spec, &weight_sync_problems);
  if (weight_sync_problems.empty()) {
    const run::WeightSync sync = run::ResolveWeightSync(spec);
    v1::WeightSyncConfig& weight_sync = *spec.mutable_weight_sync();
    weight_sync.set_transport(sync.transport);
    weight_sync.set_dtype(sync.dtype);
    weight_sync.set_delta(sync.delta);
  }
  return spec;
}

std::vector<std::string> DescribeZeroDefaults(const RunSpec& spec) {
  std::vector<std::string> lines;
  const auto zero = [&lines](absl::string_view path, absl::string_view meaning) {
    lines.push_back(absl::StrCat(path, ": ", meaning));
  };
  if (spec.model().dtype() == v1::DTYPE_UNSPECIFIED) {
    zero("model.dtype",
         run::IsCudaDevice(spec.model().device())
             ? "UNSPECIFIED = bfloat16 compute on the GPU, float32 master weights and checkpoints"
             : "UNSPECIFIED = float32");
  }
  if (spec.model().max_context_tokens() == 0) {
    zero("model.max_context_tokens", "0 = the model's configured context length");
  }
  if (spec.task().has_arithmetic() && spec.task().arithmetic().max_operands() == 0) {
    zero("task.arithmetic.max_operands", "0 = num_operands (every expression has as many)");
  }
  const v1::AlgorithmConfig& a = spec.algorithm();
  if (a.behaviour_weight_floor() == 0) zero("algorithm.behaviour_weight_floor", "0 = none");
  if (a.second_moment_threshold() == 0) zero("algorithm.second_moment_threshold", "0 = off");
  if (a.rollout_verification().tolerance() == 0) {
    zero("algorithm.rollout_verification.tolerance", "0 = 1e-3 nats per token");
  }
  if (a.rollout_verification().quarantine_after_failed_groups() == 0) {
    zero("algorithm.rollout_verification.quarantine_after_failed_groups", "0 = 3 failed groups");
  }
  const v1::RolloutConfig& r = spec.rollout();
  if (r.num_workers() == 0) {
    zero("rollout.num_workers", "0 = every registered worker (they join and leave while it runs)");
  }
  if (r.max_concurrent_groups_per_worker() == 0) {
    zero("rollout.max_concurrent_groups_per_worker",
         "0 = auto (each worker sizes it to its memory)");
  }
  for (const auto& [path, sampling] :
       {std::pair<const char*, const v1::SamplingParams*>{"rollout.sampling", &r.sampling()},
        {"eval.sampling", &spec.eval().sampling()}}) {
    if (sampling->top_k() == 0) zero(absl::StrCat(path, ".top_k"), "0 = off (no top-k cut)");
    if (sampling->max_new_tokens() == 0) {
      zero(absl::StrCat(path, ".max_new_tokens"), "0 = up to the context length");
    }
  }
  if (spec.reward().item_timeout_ms() == 0) {
    zero("reward.item_timeout_ms",
         "0 = each verifier's default deadline on the reward server (as built: math 5 s, code "
         "10 s, the others 1 s)");
  }
  const v1::BufferConfig& b = spec.buffer();
  if (b.capacity_groups() == 0) {
    zero("buffer.capacity_groups",
         absl::StrCat("0 = unlimited (the admission gate holds the buffer to about (eta + 1) * "
                      "B = ",
                      (int64_t{a.max_staleness()} + 1) * a.batch_size_groups(), " groups)"));
  }
  if (b.min_size_to_sample_groups() == 0) {
    zero("buffer.min_size_to_sample_groups",
         absl::StrCat("0 = the batch asked for (B = ", a.batch_size_groups(), " groups)"));
  }
  if (b.samples_per_insert() == 0) zero("buffer.samples_per_insert", "0 = no rate limiting");
  if (b.priority_source() == v1::PRIORITY_SOURCE_UNSPECIFIED &&
      (b.sampler() == v1::SAMPLER_KIND_PRIORITIZED || b.sampler() == v1::SAMPLER_KIND_RECENCY)) {
    zero("buffer.priority_source", "UNSPECIFIED = the group's mean reward");
  }
  const v1::EvalConfig& e = spec.eval();
  if (e.every_n_steps() == 0) zero("eval.every_n_steps", "0 = only before RL and at the end");
  if (e.num_prompts() == 0) {
    zero("eval.num_prompts", absl::StrCat("0 = the whole eval split (task.eval_split_size: ",
                                          spec.task().eval_split_size(), " prompts)"));
  }
  const v1::CheckpointConfig& c = spec.checkpoint();
  if (c.dir().empty()) {
    zero("checkpoint.dir", "empty = no checkpoints");
  } else {
    if (c.every_n_steps() == 0) zero("checkpoint.every_n_steps", "0 = only at the end");
    if (c.keep_last() == 0) zero("checkpoint.keep_last", "0 = keep all");
  }
  return lines;
}

}  // namespace sluice::controller
