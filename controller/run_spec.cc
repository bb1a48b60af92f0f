#include "controller/run_spec.h"


#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/model/model_config.h"
#include "common/run/run_buffer.h"
#include "common/run/run_model.h"
#include "common/run/run_objective.h"
#include "common/run/run_task.h"
#include "common/run/run_verification.h"
#include "common/run/run_weight_sync.h"
#include "common/run/verifier_params.h"
#include "common/task/char_tokenizer.h"
#include "common/status_macros.h"
#include "controller/spec_problems.h"
#include "controller/spec_yaml.h"

namespace sluice::controller {
namespace {

using v1::RunSpec;
using spec_internal::AtMost;
using spec_internal::DefaultDatasetVerifier;
using spec_internal::kMaxStopStringBytes;
using spec_internal::Problems;

// Upper bounds of the numeric fields. Far beyond any real run, they keep an
// absurd value (group_size 1e9) from reaching a service that would try to
// honour it; the memory estimate (CheckRunMemory) then judges what is left
// against the services' budgets.
constexpr int kMaxGroupSize = 1024;
constexpr int kMaxBatchSizeGroups = 65536;
constexpr int kMaxStaleness = 10000;
constexpr int64_t kMaxSteps = 1000000000;
constexpr int kMaxWorkers = 100000;
constexpr size_t kMaxWorkerIdBytes = 256;
constexpr int64_t kMaxArithmeticPrompts = 10000000;  // The controller holds them all.
constexpr int kMaxEvalSplit = 1000000;
constexpr int64_t kMaxSftSteps = 10000000;
constexpr int kMaxWarmStartBatch = 65536;
constexpr int64_t kMaxItemTimeoutMs = 3600000;
constexpr int kMaxTimesSampled = 1000000;
constexpr int64_t kMaxBufferGroups = 1000000000;
constexpr double kMaxSamplesPerInsert = 1000000;
constexpr int64_t kMaxKeepLast = 1000000;

// Comparisons written so that NaN fails every range check.
bool InOpenUnit(double x) { return x > 0 && x < 1; }
bool InClosedUnit(double x) { return x >= 0 && x <= 1; }
bool NonNegative(double x) { return x >= 0; }

void ValidateSampling(const v1::SamplingParams& sampling, absl::string_view path,
                      Problems& problems) {
  if (!(sampling.temperature() >= 0) || std::isinf(sampling.temperature())) {
    problems.Add(absl::StrCat(path, ".temperature"), "must be >= 0 (0 = greedy), got ",
                 sampling.temperature());
  }
  if (!(sampling.top_p() > 0 && sampling.top_p() <= 1)) {
    problems.Add(absl::StrCat(path, ".top_p"), "must be in (0, 1], got ", sampling.top_p());
  }
  if (sampling.top_k() < 0) {
    problems.Add(absl::StrCat(path, ".top_k"), "must be >= 0 (0 = disabled), got ",
                 sampling.top_k());
  }
  if (sampling.max_new_tokens() < 0) {
    problems.Add(absl::StrCat(path, ".max_new_tokens"),
                 "must be >= 0 (0 = up to the context length), got ", sampling.max_new_tokens());
  }
  for (int i = 0; i < sampling.stop_strings_size(); ++i) {
    // Longer ones are ValidateRunSpecSizes'.
    if (sampling.stop_strings(i).empty()) {
      problems.Add(absl::StrCat(path, ".stop_strings[", i, "]"), "must be 1 to ",
                   kMaxStopStringBytes, " bytes, got 0");
    }
  }
}

// max_new_tokens and top_k against the model, when its config can be read
// (ValidateModel reports it otherwise).
void ValidateSamplingForModel(const v1::SamplingParams& sampling, absl::string_view path,
                              const model::ModelConfig& config, int64_t context,
                              Problems& problems) {
  AtMost(problems, absl::StrCat(path, ".max_new_tokens"), sampling.max_new_tokens(), context,
         "the model's context length");
  AtMost(problems, absl::StrCat(path, ".top_k"), sampling.top_k(), config.vocab_size,
         "the vocabulary size");
}

void ValidateModel(const RunSpec& spec, Problems& problems) {
  if (spec.model().source_case() == v1::ModelConfig::SOURCE_NOT_SET) {
    problems.Add("model",
                 "exactly one of builtin or hf_model_dir must be set (e.g. model: {builtin: "
                 "tiny}, or model: {hf_model_dir: /models/Qwen2.5-0.5B-Instruct})");
    return;
  }
  // The config, tokenizer and their fit with each other and the task, read
  // from the files the spec names (see run::ValidateRunModel).
  std::vector<std::string> model_problems;
  run::ValidateRunModel(spec, &model_problems);
  for (std::string& line : model_problems) problems.AddLine(std::move(line));
  if (spec.model().max_context_tokens() < 0) {
    problems.Add("model.max_context_tokens", "must be >= 0 (0 = the model's context length), got ",
                 spec.model().max_context_tokens());
  }
  switch (spec.model().dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FLOAT32:
    case v1::DTYPE_BFLOAT16:
    case v1::DTYPE_FLOAT16:
      break;
    default:
      problems.Add("model.dtype", "must be DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16, got ",
                   v1::DType_Name(spec.model().dtype()));
  }
  if (!model_problems.empty()) return;
  absl::StatusOr<model::ModelConfig> config = run::LoadRunModelConfig(spec.model());
  if (!config.ok()) return;
  const int64_t context = run::ContextTokens(spec, *config);
  ValidateSamplingForModel(spec.rollout().sampling(), "rollout.sampling", *config, context,
                           problems);
  ValidateSamplingForModel(spec.eval().sampling(), "eval.sampling", *config, context, problems);
}

void ValidateTask(const RunSpec& spec, Problems& problems) {
  const v1::TaskConfig& task = spec.task();
  if (task.eval_split_size() < 0) {
    problems.Add("task.eval_split_size", "must be >= 0 (0 = default 200), got ",
                 task.eval_split_size());
  }
  AtMost(problems, "task.eval_split_size", task.eval_split_size(), kMaxEvalSplit);
  if (task.has_arithmetic()) {
    AtMost(problems, "task.arithmetic.num_prompts", task.arithmetic().num_prompts(),
           kMaxArithmeticPrompts, "the controller holds every prompt in memory");
  }
  if (task.source_case() == v1::TaskConfig::SOURCE_NOT_SET) {
    problems.Add("task", "exactly one of arithmetic or dataset must be set");
    return;
  }
  // Templates, chat template, and for a dataset its file (read here, at
  // submit time, so that a bad file fails the submission and not the run).
  std::vector<std::string> task_problems;
  run::ValidateRunTask(spec, &task_problems);
  for (std::string& line : task_problems) problems.AddLine(std::move(line));
  if (task.has_dataset()) return;
  if (task.eval_split_size() < 0) return;  // Already reported; the task cannot be sized.
  const absl::Status valid = task::ValidateArithmeticOptions(ArithmeticOptionsFor(spec));
  if (valid.ok()) return;
  // "invalid arithmetic task options: a: ...; b: ..." -> one line per field,
  // named by its path in the spec.
  absl::string_view message = valid.message();
  absl::ConsumePrefix(&message, "invalid arithmetic task options: ");
  for (absl::string_view problem : absl::StrSplit(message, "; ")) {
    if (absl::ConsumePrefix(&problem, "eval_size")) {
      problems.Add("task.eval_split_size", absl::StripPrefix(problem, ": "));
    } else {
      const size_t colon = problem.find(": ");
      if (colon == absl::string_view::npos) {
        problems.Add("task.arithmetic", problem);
      } else {
        problems.Add(absl::StrCat("task.arithmetic.", problem.substr(0, colon)),
                     problem.substr(colon + 2));
      }
    }
  }
}

void ValidateAlgorithm(const RunSpec& spec, Problems& problems) {
  const v1::AlgorithmConfig& a = spec.algorithm();
  switch (a.objective()) {
    case v1::OBJECTIVE_GRPO:
    case v1::OBJECTIVE_DECOUPLED_PPO:
    case v1::OBJECTIVE_TRAJECTORY_BALANCE:
      break;
    default:
      problems.Add("algorithm.objective",
                   "must be OBJECTIVE_GRPO, OBJECTIVE_DECOUPLED_PPO or "
                   "OBJECTIVE_TRAJECTORY_BALANCE, got ",
                   v1::Objective_Name(a.objective()).empty()
                       ? std::to_string(static_cast<int>(a.objective()))
                       : v1::Objective_Name(a.objective()));
  }
  if (a.group_size() < 2) {
    problems.Add("algorithm.group_size",
                 "must be >= 2 (GRPO needs several samples per prompt), got ", a.group_size());
  }
  AtMost(problems, "algorithm.group_size", a.group_size(), kMaxGroupSize);
  if (a.batch_size_groups() < 1) {
    problems.Add("algorithm.batch_size_groups", "must be >= 1, got ", a.batch_size_groups());
  }
  AtMost(problems, "algorithm.batch_size_groups", a.batch_size_groups(), kMaxBatchSizeGroups);
  if (a.max_staleness() < 0) {
    problems.Add("algorithm.max_staleness", "must be >= 0 (0 = synchronous on-policy), got ",
                 a.max_staleness());
  }
  AtMost(problems, "algorithm.max_staleness", a.max_staleness(), kMaxStaleness);
  if (!InOpenUnit(a.clip_eps_low())) {
    problems.Add("algorithm.clip_eps_low", "must be in (0, 1), got ", a.clip_eps_low());
  }
  if (!InOpenUnit(a.clip_eps_high())) {
    problems.Add("algorithm.clip_eps_high", "must be in (0, 1), got ", a.clip_eps_high());
  }
  if (!(a.behaviour_weight_cap() > 0) || std::isinf(a.behaviour_weight_cap())) {
    problems.Add("algorithm.behaviour_weight_cap", "must be > 0, got ", a.behaviour_weight_cap());
  }
  if (!v1::BehaviourWeightMode_IsValid(a.behaviour_weight_mode()) ||
      a.behaviour_weight_mode() == v1::BEHAVIOUR_WEIGHT_MODE_UNSPECIFIED) {
    problems.Add("algorithm.behaviour_weight_mode",
                 "must be BEHAVIOUR_WEIGHT_MODE_TRUNCATE, _MASK or _NONE, got ",
                 static_cast<int>(a.behaviour_weight_mode()));
  }
  if (!InOpenUnit(a.learning_rate())) {
    problems.Add("algorithm.learning_rate", "must be > 0 and < 1, got ", a.learning_rate());
  }
  const v1::RolloutVerificationConfig& verification = a.rollout_verification();
  if (!(verification.fraction() >= 0 && verification.fraction() <= 1)) {
    problems.Add("algorithm.rollout_verification.fraction", "must be in [0, 1], got ",
                 verification.fraction());
  }
  if (!(verification.tolerance() >= 0) || std::isinf(verification.tolerance())) {
    problems.Add("algorithm.rollout_verification.tolerance",
                 "must be >= 0 and finite (0 = default 1e-3), got ", verification.tolerance());
  }
  if (!(verification.trusted_fraction() >= 0 && verification.trusted_fraction() <= 1)) {
    problems.Add("algorithm.rollout_verification.trusted_fraction", "must be in [0, 1], got ",
                 verification.trusted_fraction());
  }
  AtMost(problems, "algorithm.rollout_verification.trusted_worker_ids",
         verification.trusted_worker_ids_size(), kMaxWorkers);
  for (int i = 0; i < verification.trusted_worker_ids_size(); ++i) {
    const std::string& id = verification.trusted_worker_ids(i);
    if (id.empty() || id.size() > kMaxWorkerIdBytes) {
      problems.Add(absl::StrCat("algorithm.rollout_verification.trusted_worker_ids[", i, "]"),
                   "must be a worker id of 1 to ", kMaxWorkerIdBytes, " bytes, got ", id.size());
    }
  }
  if (verification.quarantine_after_failed_groups() < 0) {
    problems.Add("algorithm.rollout_verification.quarantine_after_failed_groups",
                 "must be >= 0 (0 = default 3), got ",
                 verification.quarantine_after_failed_groups());
  }
  if (!(a.weight_decay() >= 0 && a.weight_decay() <= 1)) {
    problems.Add("algorithm.weight_decay", "must be in [0, 1], got ", a.weight_decay());
  }
  if (!(a.grad_clip_norm() >= 0 && a.grad_clip_norm() <= run::kMaxCoefficient)) {
    problems.Add("algorithm.grad_clip_norm", "must be in [0, ", run::kMaxCoefficient,
                 "] (0 = no clipping), got ", a.grad_clip_norm());
  }
  if (!(a.kl_coef() >= 0 && a.kl_coef() <= run::kMaxCoefficient)) {
    problems.Add("algorithm.kl_coef", "must be in [0, ", run::kMaxCoefficient, "], got ", a.kl_coef());
  }
  if (!(a.tb_beta() > 0 && a.tb_beta() <= run::kMaxCoefficient)) {
    problems.Add("algorithm.tb_beta", "must be in (0, ", run::kMaxCoefficient, "], got ", a.tb_beta());
  }
  if (!(a.advantage_eps() > 0 && a.advantage_eps() <= 1)) {
    problems.Add("algorithm.advantage_eps", "must be in (0, 1], got ", a.advantage_eps());
  }
  if (a.total_steps() <= 0) {
    problems.Add("algorithm.total_steps", "must be > 0, got ", a.total_steps());
  }
  AtMost(problems, "algorithm.total_steps", a.total_steps(), kMaxSteps);
  if (a.lr_warmup_steps() < 0) {
    problems.Add("algorithm.lr_warmup_steps", "must be >= 0, got ", a.lr_warmup_steps());
  }
  AtMost(problems, "algorithm.lr_warmup_steps", a.lr_warmup_steps(), kMaxSteps);
  if (!v1::LrSchedule_IsValid(a.lr_schedule()) ||
      a.lr_schedule() == v1::LR_SCHEDULE_UNSPECIFIED) {
    problems.Add("algorithm.lr_schedule", "must be LR_SCHEDULE_CONSTANT, _COSINE or _LINEAR, got ",
                 static_cast<int>(a.lr_schedule()));
  }
  if (!(a.min_lr_ratio() >= 0 && a.min_lr_ratio() <= 1)) {
    problems.Add("algorithm.min_lr_ratio", "must be in [0, 1], got ", a.min_lr_ratio());
  } else if (a.lr_schedule() == v1::LR_SCHEDULE_CONSTANT && a.min_lr_ratio() != 0) {
    problems.Add("algorithm.min_lr_ratio",
                 "is where a decaying schedule ends; set algorithm.lr_schedule to cosine or "
                 "linear, or leave it out (got ",
                 a.min_lr_ratio(), " with a constant learning rate)");
  }
  std::vector<std::string> objective_problems;
  run::ValidateObjectiveChoices(a, &objective_problems);
  for (std::string& line : objective_problems) problems.AddLine(std::move(line));
  if (a.minibatches_per_batch() < 1) {
    problems.Add("algorithm.minibatches_per_batch", "must be >= 1, got ",
                 a.minibatches_per_batch());
  } else if (a.batch_size_groups() >= 1 && a.minibatches_per_batch() > a.batch_size_groups()) {
    problems.Add("algorithm.minibatches_per_batch", "must be <= batch_size_groups (",
                 a.batch_size_groups(), "), got ", a.minibatches_per_batch());
  }
}

void ValidateWarmStart(const RunSpec& spec, Problems& problems) {
  const v1::WarmStartConfig& w = spec.warm_start();
  if (w.sft_steps() < 0) {
    problems.Add("warm_start.sft_steps", "must be >= 0 (0 = no warm start), got ", w.sft_steps());
  }
  AtMost(problems, "warm_start.sft_steps", w.sft_steps(), kMaxSftSteps);
  AtMost(problems, "warm_start.batch_size", w.batch_size(), kMaxWarmStartBatch);
  if (!InClosedUnit(w.target_accuracy())) {
    problems.Add("warm_start.target_accuracy", "must be in [0, 1], got ", w.target_accuracy());
  }
  if (w.sft_steps() > 0) {
    if (!InOpenUnit(w.learning_rate())) {
      problems.Add("warm_start.learning_rate", "must be > 0 and < 1, got ", w.learning_rate());
    }
    if (w.batch_size() < 1) {
      problems.Add("warm_start.batch_size", "must be >= 1, got ", w.batch_size());
    }
  } else {
    if (!NonNegative(w.learning_rate()) || w.learning_rate() >= 1) {
      problems.Add("warm_start.learning_rate", "must be >= 0 and < 1, got ", w.learning_rate());
    }
    if (w.batch_size() < 0) {
      problems.Add("warm_start.batch_size", "must be >= 0, got ", w.batch_size());
    }
  }
}

void ValidateRollout(const RunSpec& spec, Problems& problems) {
  const v1::RolloutConfig& r = spec.rollout();
  ValidateSampling(r.sampling(), "rollout.sampling", problems);
  if (r.num_workers() < 0) {
    problems.Add("rollout.num_workers", "must be >= 0 (0 = every registered worker), got ",
                 r.num_workers());
  }
  AtMost(problems, "rollout.num_workers", r.num_workers(), kMaxWorkers);
  if (r.min_workers() < 1) {
    problems.Add("rollout.min_workers", "must be >= 1, got ", r.min_workers());
  }
  AtMost(problems, "rollout.min_workers", r.min_workers(), kMaxWorkers);
  if (r.num_workers() > 0 && r.min_workers() > r.num_workers()) {
    problems.Add("rollout.min_workers", "must be <= rollout.num_workers (", r.num_workers(),
                 "), got ", r.min_workers());
  }
  if (r.max_concurrent_groups_per_worker() < 0) {
    problems.Add("rollout.max_concurrent_groups_per_worker",
                 "must be >= 0 (0 = the worker decides), got ",
                 r.max_concurrent_groups_per_worker());
  }
  AtMost(problems, "rollout.max_concurrent_groups_per_worker",
         r.max_concurrent_groups_per_worker(), kMaxBatchSizeGroups);
  if (!v1::WeightSwapMode_IsValid(r.weight_swap_mode()) ||
      r.weight_swap_mode() == v1::WEIGHT_SWAP_MODE_UNSPECIFIED) {
    problems.Add("rollout.weight_swap_mode", "must be WEIGHT_SWAP_MODE_KEEP_CACHE or _RECOMPUTE, got ",
                 static_cast<int>(r.weight_swap_mode()));
  }
}

void ValidateReward(const RunSpec& spec, Problems& problems) {
  const v1::RewardConfig& r = spec.reward();
  // Without a task, or with a dataset format that has no reader, there is no
  // default verifier; that is reported as the task's problem.
  if (r.verifiers().empty()) {
    const v1::TaskConfig& task = spec.task();
    if (task.has_dataset() && task.dataset().format() == v1::DATASET_FORMAT_JSONL) {
      problems.Add("reward.verifiers",
                   "a JSONL dataset needs reward.verifiers (e.g. {name: math}); only GSM8K, MATH "
                   "and HumanEval datasets get a default verifier");
    } else if (task.has_arithmetic() ||
               (task.has_dataset() && DefaultDatasetVerifier(task.dataset().format()) != nullptr)) {
      problems.Add("reward.verifiers", "must name at least one verifier (e.g. {name: math})");
    }
  }
  for (int i = 0; i < r.verifiers_size(); ++i) {
    const v1::WeightedVerifier& v = r.verifiers(i);
    if (v.name().empty()) {
      problems.Add(absl::StrCat("reward.verifiers[", i, "].name"),
                   "must name a verifier (e.g. \"math\")");
    }
    if (!(v.weight() > 0 && v.weight() <= run::kMaxCoefficient)) {
      problems.Add(absl::StrCat("reward.verifiers[", i, "].weight"), "must be in (0, ",
                   run::kMaxCoefficient, "], got ", v.weight());
    }
    const std::map<std::string, std::string> params(v.params().begin(), v.params().end());
    if (absl::Status valid = run::ValidateVerifierParams(v.name(), params); !valid.ok()) {
      problems.Add(absl::StrCat("reward.verifiers[", i, "].params"), valid.message());
    }
  }
  if (r.item_timeout_ms() < 0) {
    problems.Add("reward.item_timeout_ms", "must be >= 0 (0 = the verifier's default), got ",
                 r.item_timeout_ms());
  }
  AtMost(problems, "reward.item_timeout_ms", r.item_timeout_ms(), kMaxItemTimeoutMs, "an hour");
}

void ValidateBuffer(const RunSpec& spec, Problems& problems) {
  // The buffer section's rules, the ones the replay buffer applies again at
  // ConfigureRun (common/run/run_buffer.h), so that a spec the controller
  // accepts is never refused there.
  const v1::BufferConfig& b = spec.buffer();
  AtMost(problems, "buffer.max_times_sampled", b.max_times_sampled(), kMaxTimesSampled);
  AtMost(problems, "buffer.capacity_groups", b.capacity_groups(), kMaxBufferGroups);
  AtMost(problems, "buffer.min_size_to_sample_groups", b.min_size_to_sample_groups(),
         kMaxBufferGroups);
  if (!(b.samples_per_insert() <= kMaxSamplesPerInsert)) {
    problems.Add("buffer.samples_per_insert", "must be <= ", kMaxSamplesPerInsert, ", got ",
                 b.samples_per_insert());
  }
  if (!(b.samples_per_insert_tolerance() <= kMaxBufferGroups)) {
    problems.Add("buffer.samples_per_insert_tolerance", "must be <= ", kMaxBufferGroups, ", got ",
                 b.samples_per_insert_tolerance());
  }
  std::vector<std::string> buffer_problems;
  run::ValidateBufferConfig(b, std::max(1, spec.algorithm().batch_size_groups()),
                            &buffer_problems);
  for (std::string& line : buffer_problems) problems.AddLine(std::move(line));
}

void ValidateEvalAndCheckpoint(const RunSpec& spec, Problems& problems) {
  const v1::EvalConfig& e = spec.eval();
  if (e.every_n_steps() < 0) {
    problems.Add("eval.every_n_steps", "must be >= 0 (0 = only at the end), got ",
                 e.every_n_steps());
  }
  AtMost(problems, "eval.every_n_steps", e.every_n_steps(), kMaxSteps);
  if (e.num_prompts() < 0) {
    problems.Add("eval.num_prompts", "must be >= 0 (0 = the whole eval split), got ",
                 e.num_prompts());
  } else if (e.num_prompts() > spec.task().eval_split_size() &&
             spec.task().eval_split_size() >= 0) {
    problems.Add("eval.num_prompts", "must be <= task.eval_split_size (",
                 spec.task().eval_split_size(), "), got ", e.num_prompts());
  }
  ValidateSampling(e.sampling(), "eval.sampling", problems);
  const v1::CheckpointConfig& c = spec.checkpoint();
  if (c.every_n_steps() < 0) {
    problems.Add("checkpoint.every_n_steps", "must be >= 0 (0 = only at the end), got ",
                 c.every_n_steps());
  }
  AtMost(problems, "checkpoint.every_n_steps", c.every_n_steps(), kMaxSteps);
  if (c.keep_last() < 0) {
    problems.Add("checkpoint.keep_last", "must be >= 0 (0 = keep all), got ", c.keep_last());
  }
  AtMost(problems, "checkpoint.keep_last", c.keep_last(), kMaxKeepLast);
}
}  // namespace

absl::Status ValidateRunSpec(const RunSpec& spec) {
  // A spec over its bounds is judged on them alone: the checks below read
  // files and tokenize templates the spec names, which an absurd spec must
  // not get to do.
  RETURN_IF_ERROR(ValidateRunSpecSizes(spec));
  Problems problems;
  ValidateModel(spec, problems);
  ValidateTask(spec, problems);
  ValidateAlgorithm(spec, problems);
  ValidateWarmStart(spec, problems);
  ValidateRollout(spec, problems);
  ValidateReward(spec, problems);
  ValidateBuffer(spec, problems);
  ValidateEvalAndCheckpoint(spec, problems);
  std::vector<std::string> weight_sync_problems;
  run::ValidateWeightSync(spec, &weight_sync_problems);
  for (std::string& line : weight_sync_problems) problems.AddLine(std::move(line));
  return problems.ToStatus();
}

absl::Status CheckVerifierNames(const RunSpec& spec, const std::vector<std::string>& known,
                                const std::string& offered_by) {
  Problems problems;
  for (int i = 0; i < spec.reward().verifiers_size(); ++i) {
    const std::string& name = spec.reward().verifiers(i).name();
    if (name.empty() || std::find(known.begin(), known.end(), name) != known.end()) continue;
    const std::optional<std::string> closest = ClosestName(name, known);
    problems.Add(absl::StrCat("reward.verifiers[", i, "].name"), "unknown verifier \"", name, "\"",
                 closest.has_value() ? absl::StrCat("; did you mean \"", *closest, "\"?") : "",
                 " (", offered_by, " offers ",
                 known.empty() ? "no verifiers" : absl::StrJoin(known, ", "), ")");
  }
  return problems.ToStatus();
}

absl::StatusOr<run::RunMemoryEstimate> EstimateSpecMemory(const RunSpec& spec) {
  absl::StatusOr<model::ModelConfig> config = run::LoadRunModelConfig(spec.model());
  if (!config.ok()) return config.status();
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tokenizer =
      run::LoadRunTokenizer(spec.model());
  if (!tokenizer.ok()) return tokenizer.status();
  absl::StatusOr<run::RunTask> task = run::LoadRunTask(spec);
  if (!task.ok()) return task.status();
  int64_t longest = 0;
  for (const std::vector<task::TaskItem>* items : {&task->train, &task->eval}) {
    for (const task::TaskItem& item : *items) {
      longest = std::max<int64_t>(
          longest, static_cast<int64_t>(run::EncodePrompt(**tokenizer, item.prompt).size()));
    }
  }
  return run::EstimateRunMemory(spec, *config, longest);
}

absl::Status CheckRunMemory(const run::RunMemoryEstimate& estimate,
                            const ServiceMemoryBudgets& budgets) {
  Problems problems;
  for (const auto& [name, service, budget] :
       {std::tuple{"rollout worker", &estimate.rollout_worker, &budgets.rollout_worker},
        std::tuple{"trainer", &estimate.trainer, &budgets.trainer},
        std::tuple{"replay buffer", &estimate.replay_buffer, &budgets.replay_buffer}}) {
    std::string line = run::CheckMemoryBudget(name, *service, *budget);
    if (!line.empty()) problems.AddLine(std::move(line));
  }
  return problems.ToStatus();
}

absl::StatusOr<OfflineValidation> ValidateSpecOffline(const RunSpec& submitted) {
  OfflineValidation out;
  out.spec = ResolveDefaults(submitted);
  // Both at once, so that a user fixes everything in one go.
  const absl::Status valid = ValidateRunSpec(out.spec);
  const absl::Status names = CheckVerifierNames(out.spec, run::BuiltinVerifierNames(),
                                                "this build's reward server");
  if (!valid.ok() || !names.ok()) {
    std::vector<absl::string_view> lines;
    if (!valid.ok()) lines.push_back(valid.message());
    if (!names.ok()) lines.push_back(names.message());
    return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
  }
  absl::StatusOr<run::RunMemoryEstimate> memory = EstimateSpecMemory(out.spec);
  if (!memory.ok()) return memory.status();
  out.memory = *std::move(memory);
  return out;
}

std::string DescribeRunMemory(const run::RunMemoryEstimate& estimate) {
  return absl::StrCat("rollout worker ", run::FormatBytes(estimate.rollout_worker.bytes),
                      ", trainer ", run::FormatBytes(estimate.trainer.bytes), ", replay buffer ",
                      run::FormatBytes(estimate.replay_buffer.bytes), " (each sequence up to ",
                      estimate.sequence_tokens, " tokens)");
}

task::ArithmeticOptions ArithmeticOptionsFor(const RunSpec& spec) {
  return run::ArithmeticOptionsFor(spec);
}

absl::StatusOr<std::vector<v1::Prompt>> BuildTrainingPrompts(const RunSpec& spec) {
  absl::StatusOr<run::RunTask> task = run::LoadRunTask(spec);
  if (!task.ok()) return task.status();
  std::vector<v1::Prompt> prompts;
  prompts.reserve(task->train.size());
  for (task::TaskItem& item : task->train) {
    v1::Prompt& prompt = prompts.emplace_back();
    prompt.set_prompt_id(std::move(item.prompt_id));
    prompt.set_text(std::move(item.prompt));
    prompt.set_reference_answer(std::move(item.reference_answer));
    prompt.set_reference_is_solution(item.reference_is_solution);
    prompt.set_verifier(std::move(item.verifier));
    for (auto& [key, value] : item.metadata) (*prompt.mutable_metadata())[key] = std::move(value);
  }
  return prompts;
}

}  // namespace sluice::controller
