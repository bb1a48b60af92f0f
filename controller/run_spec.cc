#include "controller/run_spec.h"

#include "replay_buffer/run_table.h"

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
#include "common/run/run_model.h"
#include "common/run/run_task.h"
#include "common/run/run_verification.h"
#include "common/run/run_weight_sync.h"
#include "common/task/char_tokenizer.h"
#include "common/status_macros.h"
#include "reward_server/verifier_params.h"
#include "controller/spec_yaml.h"

namespace sluice::controller {
namespace {

using v1::RunSpec;

constexpr int kDefaultEvalSplitSize = 200;
constexpr int64_t kDefaultMaxOperand = 99;
constexpr int kDefaultNumOperands = 2;
constexpr int64_t kDefaultNumArithmeticPrompts = 10000;
constexpr int kDefaultGroupSize = 8;
constexpr int kDefaultBatchSizeGroups = 16;
constexpr int kDefaultMaxStaleness = 4;
constexpr double kDefaultClipEps = 0.2;
constexpr double kDefaultBehaviourWeightCap = 5.0;
constexpr double kDefaultLearningRate = 1e-6;
constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr double kDefaultGradClipNorm = 1.0;
constexpr double kDefaultAdvantageEps = 1e-6;
constexpr double kDefaultTbBeta = 1.0;
constexpr int64_t kDefaultTotalSteps = 1000;
constexpr double kDefaultWarmStartLearningRate = 1e-4;
constexpr double kDefaultPriorityAlpha = 0.6;
constexpr double kDefaultRecencyProbability = 0.5;

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
constexpr int kMaxVerifiers = 32;
constexpr int64_t kMaxItemTimeoutMs = 3600000;
constexpr int kMaxTimesSampled = 1000000;
constexpr int64_t kMaxBufferGroups = 1000000000;
constexpr double kMaxSamplesPerInsert = 1000000;
constexpr int64_t kMaxKeepLast = 1000000;
constexpr double kMaxCoefficient = 1000000;
constexpr int64_t kMaxNormalizerTokens = 100000000;

// Upper bounds of the strings and lists. A spec travels whole to every
// service of the run and back to every user (WorkerHeartbeat answers,
// StartTraining, GetRun, WatchRun, ListRuns), whose receivers take at most a
// few MiB a message; each bound is far beyond a real spec's, and
// kMaxRunSpecBytes bounds the whole.
constexpr size_t kMaxNameBytes = 256;
constexpr int kMaxLabels = 64;
// Kubernetes' bound on a label name; values get room for a sentence.
constexpr size_t kMaxLabelKeyBytes = 63;
constexpr size_t kMaxLabelValueBytes = 256;
constexpr size_t kMaxPathBytes = 4096;  // PATH_MAX
// A name among a few known ones (builtin model, device, chat template,
// a dataset's column, a verifier).
constexpr size_t kMaxWordBytes = 128;
// Prompt template and system prompt: text a person writes.
constexpr size_t kMaxTextBytes = 32 << 10;
constexpr int kMaxOperators = 16;
constexpr int kMaxStopTokenIds = 64;
constexpr int kMaxVerifierParams = 32;
constexpr size_t kMaxVerifierParamKeyBytes = 128;
constexpr size_t kMaxVerifierParamValueBytes = 4096;

// Collects "path: problem" lines.
class Problems {
 public:
  template <typename... Args>
  void Add(absl::string_view path, const Args&... args) {
    lines_.push_back(absl::StrCat(path, ": ", args...));
  }
  // A line that already reads "path: problem".
  void AddLine(std::string line) { lines_.push_back(std::move(line)); }
  bool empty() const { return lines_.empty(); }
  absl::Status ToStatus() const {
    if (lines_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(lines_, "\n"));
  }

 private:
  std::vector<std::string> lines_;
};

// "must be <= N (a sane bound ...)" for an integer over its bound.
template <typename T, typename Bound>
void AtMost(Problems& problems, absl::string_view path, T value, Bound bound,
            absl::string_view why = "") {
  if (value <= static_cast<T>(bound)) return;
  problems.Add(path, "must be <= ", bound, why.empty() ? "" : " (", why, why.empty() ? "" : ")",
               ", got ", value);
}

// Comparisons written so that NaN fails every range check.
bool InOpenUnit(double x) { return x > 0 && x < 1; }
bool InClosedUnit(double x) { return x >= 0 && x <= 1; }
bool NonNegative(double x) { return x >= 0; }

void ResolveSampling(v1::SamplingParams* sampling, float default_temperature) {
  if (!sampling->has_temperature()) sampling->set_temperature(default_temperature);
  if (!sampling->has_top_p()) sampling->set_top_p(1.0f);
}

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

// The verifier a dataset format's rows are scored with when reward.verifiers
// is empty; nullptr for JSONL (the user says) and formats without a reader.
const char* DefaultDatasetVerifier(v1::DatasetFormat format) {
  switch (format) {
    case v1::DATASET_FORMAT_GSM8K:
    case v1::DATASET_FORMAT_MATH:
      return "math";
    case v1::DATASET_FORMAT_HUMANEVAL:
      return "code";
    default:
      return nullptr;
  }
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

// The objective's corrections and variants (docs/objectives.md): each in
// its range, and only with an objective it acts on, so that a setting that
// would be silently ignored is refused instead.
void ValidateObjectiveChoices(const v1::AlgorithmConfig& a, Problems& problems) {
  const bool decoupled = a.objective() == v1::OBJECTIVE_DECOUPLED_PPO;
  const bool trajectory_balance = a.objective() == v1::OBJECTIVE_TRAJECTORY_BALANCE;
  const std::string objective = v1::Objective_Name(a.objective());
  if (!v1::ProximalLogprobsMethod_IsValid(a.proximal_logprobs()) ||
      a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_UNSPECIFIED) {
    problems.Add("algorithm.proximal_logprobs",
                 "must be PROXIMAL_LOGPROBS_METHOD_RECOMPUTE or _LOGLINEAR, got ",
                 static_cast<int>(a.proximal_logprobs()));
  } else if (a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR && !decoupled) {
    problems.Add("algorithm.proximal_logprobs",
                 "PROXIMAL_LOGPROBS_METHOD_LOGLINEAR approximates decoupled PPO's proximal policy; ",
                 objective, " has none (use OBJECTIVE_DECOUPLED_PPO)");
  }
  if (a.truncated_importance_sampling()) {
    if (!decoupled) {
      problems.Add("algorithm.truncated_importance_sampling",
                   "replaces decoupled PPO's proximal policy; only with OBJECTIVE_DECOUPLED_PPO, "
                   "got ", objective);
    } else if (a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_LOGLINEAR) {
      problems.Add("algorithm.truncated_importance_sampling",
                   "takes the current weights as the proximal policy, so proximal_logprobs "
                   "LOGLINEAR would be ignored; choose one");
    }
  }
  const double cap = a.behaviour_weight_cap();
  if (!(a.behaviour_weight_floor() >= 0) || std::isinf(a.behaviour_weight_floor())) {
    problems.Add("algorithm.behaviour_weight_floor", "must be >= 0 (0 = none), got ",
                 a.behaviour_weight_floor());
  } else if (a.behaviour_weight_floor() > 0) {
    if (cap > 0 && a.behaviour_weight_floor() >= cap) {
      problems.Add("algorithm.behaviour_weight_floor", "must be < behaviour_weight_cap (", cap,
                   "), got ", a.behaviour_weight_floor());
    } else if (a.behaviour_weight_mode() == v1::BEHAVIOUR_WEIGHT_MODE_NONE) {
      problems.Add("algorithm.behaviour_weight_floor",
                   "bounds the behaviour weight, which BEHAVIOUR_WEIGHT_MODE_NONE leaves "
                   "unbounded; use _MASK (IcePop) or _TRUNCATE, or a floor of 0");
    } else if (!decoupled) {
      problems.Add("algorithm.behaviour_weight_floor",
                   "bounds decoupled PPO's behaviour weight; ", objective,
                   " has none (w = 1), use OBJECTIVE_DECOUPLED_PPO");
    }
  }
  if (!(a.second_moment_threshold() >= 0 && a.second_moment_threshold() <= kMaxCoefficient)) {
    problems.Add("algorithm.second_moment_threshold", "must be in [0, ", kMaxCoefficient,
                 "] (0 = off; M2PO uses 0.04), got ", a.second_moment_threshold());
  } else if (a.second_moment_threshold() > 0 && !decoupled) {
    problems.Add("algorithm.second_moment_threshold",
                 "masks by decoupled PPO's behaviour weight; ", objective,
                 " has none (w = 1), use OBJECTIVE_DECOUPLED_PPO");
  }
  if (!v1::LossAggregation_IsValid(a.loss_aggregation()) ||
      a.loss_aggregation() == v1::LOSS_AGGREGATION_UNSPECIFIED) {
    problems.Add("algorithm.loss_aggregation",
                 "must be LOSS_AGGREGATION_TOKEN_MEAN, _SEQUENCE_MEAN or _CONSTANT_NORMALIZER, got ",
                 static_cast<int>(a.loss_aggregation()));
  } else if (trajectory_balance && a.loss_aggregation() != v1::LOSS_AGGREGATION_TOKEN_MEAN) {
    problems.Add("algorithm.loss_aggregation",
                 "trajectory balance's loss is a mean over sequences already; only the default "
                 "LOSS_AGGREGATION_TOKEN_MEAN, got ",
                 v1::LossAggregation_Name(a.loss_aggregation()));
  }
  if (a.loss_normalizer_tokens() < 0) {
    problems.Add("algorithm.loss_normalizer_tokens",
                 "must be >= 0 (0 = rollout.sampling.max_new_tokens), got ",
                 a.loss_normalizer_tokens());
  }
  AtMost(problems, "algorithm.loss_normalizer_tokens", a.loss_normalizer_tokens(),
         kMaxNormalizerTokens);
  if (!v1::DynamicSampling_IsValid(a.dynamic_sampling()) ||
      a.dynamic_sampling() == v1::DYNAMIC_SAMPLING_UNSPECIFIED) {
    problems.Add("algorithm.dynamic_sampling",
                 "must be DYNAMIC_SAMPLING_KEEP, _DROP or _REFILL, got ",
                 static_cast<int>(a.dynamic_sampling()));
  }
  if (!(a.entropy_coef() >= 0 && a.entropy_coef() <= kMaxCoefficient)) {
    problems.Add("algorithm.entropy_coef", "must be in [0, ", kMaxCoefficient, "], got ",
                 a.entropy_coef());
  } else if (trajectory_balance && a.entropy_coef() > 0) {
    problems.Add("algorithm.entropy_coef",
                 "is a term of the GRPO and decoupled-PPO losses, not of trajectory balance");
  }
  if (trajectory_balance && a.kl_coef() > 0) {
    problems.Add("algorithm.kl_coef",
                 "is a term of the GRPO and decoupled-PPO losses; trajectory balance takes its "
                 "reference inside the residual: set tb_use_reference (and tb_beta) instead");
  }
  if (a.tb_use_reference() && !trajectory_balance) {
    problems.Add("algorithm.tb_use_reference",
                 "is trajectory balance's (OBJECTIVE_TRAJECTORY_BALANCE); for a KL to the "
                 "reference with ", objective, " set kl_coef");
  }
  if (!v1::StalenessBound_IsValid(a.staleness_bound()) ||
      a.staleness_bound() == v1::STALENESS_BOUND_UNSPECIFIED) {
    problems.Add("algorithm.staleness_bound", "must be STALENESS_BOUND_GROUP or _TOKEN, got ",
                 static_cast<int>(a.staleness_bound()));
  } else if (a.staleness_bound() == v1::STALENESS_BOUND_TOKEN && trajectory_balance) {
    problems.Add("algorithm.staleness_bound",
                 "STALENESS_BOUND_TOKEN drops single tokens from the loss; trajectory balance's "
                 "loss is over whole sequences (use STALENESS_BOUND_GROUP)");
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
  if (!(a.grad_clip_norm() >= 0 && a.grad_clip_norm() <= kMaxCoefficient)) {
    problems.Add("algorithm.grad_clip_norm", "must be in [0, ", kMaxCoefficient,
                 "] (0 = no clipping), got ", a.grad_clip_norm());
  }
  if (!(a.kl_coef() >= 0 && a.kl_coef() <= kMaxCoefficient)) {
    problems.Add("algorithm.kl_coef", "must be in [0, ", kMaxCoefficient, "], got ", a.kl_coef());
  }
  if (!(a.tb_beta() > 0 && a.tb_beta() <= kMaxCoefficient)) {
    problems.Add("algorithm.tb_beta", "must be in (0, ", kMaxCoefficient, "], got ", a.tb_beta());
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
  ValidateObjectiveChoices(a, problems);
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
    if (!(v.weight() > 0 && v.weight() <= kMaxCoefficient)) {
      problems.Add(absl::StrCat("reward.verifiers[", i, "].weight"), "must be in (0, ",
                   kMaxCoefficient, "], got ", v.weight());
    }
    const std::map<std::string, std::string> params(v.params().begin(), v.params().end());
    if (absl::Status valid = reward_server::ValidateVerifierParams(v.name(), params); !valid.ok()) {
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
  // The replay buffer's own validation, so that a spec the controller
  // accepts is never refused at ConfigureRun. Its lines about B, eta and G
  // repeat algorithm.* problems reported above; only buffer.* ones are kept.
  replay_buffer::RunConfig config;
  config.run_id = "spec";
  config.batch_size_groups = std::max(1, spec.algorithm().batch_size_groups());
  config.max_staleness = std::max(0, spec.algorithm().max_staleness());
  config.group_size = std::max(1, spec.algorithm().group_size());
  config.buffer = spec.buffer();
  config.seed = spec.seed();
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
  const absl::Status status = config.Validate();
  for (absl::string_view line : absl::StrSplit(status.message(), '\n', absl::SkipEmpty())) {
    if (!absl::StartsWith(line, "buffer.")) continue;
    const size_t colon = line.find(": ");
    problems.Add(line.substr(0, colon), line.substr(colon == absl::string_view::npos ? line.size()
                                                                                      : colon + 2));
  }
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

// "must be at most N bytes, got M" for a string over its bound.
void AtMostBytes(Problems& problems, absl::string_view path, absl::string_view value,
                 size_t bound) {
  if (value.size() <= bound) return;
  problems.Add(path, "must be at most ", bound, " bytes, got ", value.size());
}

void ValidateSamplingSizes(const v1::SamplingParams& sampling, absl::string_view path,
                           Problems& problems) {
  AtMost(problems, absl::StrCat(path, ".stop_token_ids"), sampling.stop_token_ids_size(),
         kMaxStopTokenIds, "entries");
  AtMost(problems, absl::StrCat(path, ".stop_strings"), sampling.stop_strings_size(),
         kMaxStopStrings, "entries");
  for (int i = 0; i < std::min(sampling.stop_strings_size(), kMaxStopStrings); ++i) {
    const size_t size = sampling.stop_strings(i).size();
    if (size > kMaxStopStringBytes) {
      problems.Add(absl::StrCat(path, ".stop_strings[", i, "]"), "must be 1 to ",
                   kMaxStopStringBytes, " bytes, got ", size);
    }
  }
}

}  // namespace

absl::Status ValidateRunSpecSizes(const RunSpec& spec) {
  Problems problems;
  AtMostBytes(problems, "name", spec.name(), kMaxNameBytes);
  AtMost(problems, "labels", spec.labels_size(), kMaxLabels, "entries");
  if (spec.labels_size() <= kMaxLabels) {
    // Sorted, so that the lines come in the same order every time.
    const std::map<std::string, std::string> labels(spec.labels().begin(), spec.labels().end());
    for (const auto& [key, value] : labels) {
      if (key.empty() || key.size() > kMaxLabelKeyBytes) {
        problems.Add("labels", "a key must be 1 to ", kMaxLabelKeyBytes, " bytes, got ", key.size(),
                     key.size() > kMaxLabelKeyBytes ? "" : " (an empty key)");
        continue;
      }
      AtMostBytes(problems, absl::StrCat("labels[\"", key, "\"]"), value, kMaxLabelValueBytes);
    }
  }
  const v1::ModelConfig& model = spec.model();
  AtMostBytes(problems, "model.builtin", model.builtin(), kMaxWordBytes);
  AtMostBytes(problems, "model.hf_model_dir", model.hf_model_dir(), kMaxPathBytes);
  AtMostBytes(problems, "model.tokenizer_path", model.tokenizer_path(), kMaxPathBytes);
  AtMostBytes(problems, "model.device", model.device(), kMaxWordBytes);
  const v1::TaskConfig& task = spec.task();
  AtMostBytes(problems, "task.prompt_template", task.prompt_template(), kMaxTextBytes);
  AtMostBytes(problems, "task.chat_template", task.chat_template(), kMaxWordBytes);
  AtMostBytes(problems, "task.system_prompt", task.system_prompt(), kMaxTextBytes);
  AtMost(problems, "task.arithmetic.operators", task.arithmetic().operators_size(), kMaxOperators,
         "entries");
  for (int i = 0; i < std::min(task.arithmetic().operators_size(), kMaxOperators); ++i) {
    AtMostBytes(problems, absl::StrCat("task.arithmetic.operators[", i, "]"),
                task.arithmetic().operators(i), kMaxWordBytes);
  }
  AtMostBytes(problems, "task.dataset.path", task.dataset().path(), kMaxPathBytes);
  AtMostBytes(problems, "task.dataset.prompt_field", task.dataset().prompt_field(), kMaxWordBytes);
  AtMostBytes(problems, "task.dataset.answer_field", task.dataset().answer_field(), kMaxWordBytes);
  ValidateSamplingSizes(spec.rollout().sampling(), "rollout.sampling", problems);
  ValidateSamplingSizes(spec.eval().sampling(), "eval.sampling", problems);
  const v1::RewardConfig& reward = spec.reward();
  AtMost(problems, "reward.verifiers", reward.verifiers_size(), kMaxVerifiers, "entries");
  for (int i = 0; i < std::min(reward.verifiers_size(), kMaxVerifiers); ++i) {
    const v1::WeightedVerifier& verifier = reward.verifiers(i);
    const std::string path = absl::StrCat("reward.verifiers[", i, "]");
    AtMostBytes(problems, path + ".name", verifier.name(), kMaxWordBytes);
    AtMost(problems, path + ".params", verifier.params_size(), kMaxVerifierParams, "entries");
    if (verifier.params_size() > kMaxVerifierParams) continue;
    const std::map<std::string, std::string> params(verifier.params().begin(),
                                                    verifier.params().end());
    for (const auto& [key, value] : params) {
      if (key.size() > kMaxVerifierParamKeyBytes) {
        problems.Add(path + ".params", "a key must be at most ", kMaxVerifierParamKeyBytes,
                     " bytes, got ", key.size());
        continue;
      }
      AtMostBytes(problems, absl::StrCat(path, ".params[\"", key, "\"]"), value,
                  kMaxVerifierParamValueBytes);
    }
  }
  AtMostBytes(problems, "checkpoint.dir", spec.checkpoint().dir(), kMaxPathBytes);
  // The whole, as every service receives it (the bounds above allow more
  // in sum: many verifiers with long parameters).
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxRunSpecBytes) {
    problems.Add("the run spec", "must be at most ", kMaxRunSpecBytes,
                 " bytes serialized (it goes whole to every service and user), got ", bytes);
  }
  return problems.ToStatus();
}

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
  if (a.objective() == v1::OBJECTIVE_UNSPECIFIED) a.set_objective(v1::OBJECTIVE_DECOUPLED_PPO);
  if (a.group_size() == 0) a.set_group_size(kDefaultGroupSize);
  if (a.batch_size_groups() == 0) a.set_batch_size_groups(kDefaultBatchSizeGroups);
  if (!a.has_max_staleness()) a.set_max_staleness(kDefaultMaxStaleness);
  if (a.clip_eps_low() == 0) a.set_clip_eps_low(kDefaultClipEps);
  if (a.clip_eps_high() == 0) a.set_clip_eps_high(a.clip_eps_low());
  if (a.behaviour_weight_cap() == 0) a.set_behaviour_weight_cap(kDefaultBehaviourWeightCap);
  if (a.behaviour_weight_mode() == v1::BEHAVIOUR_WEIGHT_MODE_UNSPECIFIED) {
    a.set_behaviour_weight_mode(v1::BEHAVIOUR_WEIGHT_MODE_TRUNCATE);
  }
  if (a.learning_rate() == 0) a.set_learning_rate(kDefaultLearningRate);
  if (!a.has_grad_clip_norm()) a.set_grad_clip_norm(kDefaultGradClipNorm);
  if (a.tb_beta() == 0) a.set_tb_beta(kDefaultTbBeta);
  if (!a.has_normalize_advantage_by_std()) a.set_normalize_advantage_by_std(true);
  if (a.advantage_eps() == 0) a.set_advantage_eps(kDefaultAdvantageEps);
  if (a.total_steps() == 0) a.set_total_steps(kDefaultTotalSteps);
  if (a.minibatches_per_batch() == 0) a.set_minibatches_per_batch(1);
  if (a.lr_schedule() == v1::LR_SCHEDULE_UNSPECIFIED) a.set_lr_schedule(v1::LR_SCHEDULE_CONSTANT);
  if (a.staleness_bound() == v1::STALENESS_BOUND_UNSPECIFIED) {
    a.set_staleness_bound(v1::STALENESS_BOUND_GROUP);
  }
  if (a.proximal_logprobs() == v1::PROXIMAL_LOGPROBS_METHOD_UNSPECIFIED) {
    a.set_proximal_logprobs(v1::PROXIMAL_LOGPROBS_METHOD_RECOMPUTE);
  }
  if (a.loss_aggregation() == v1::LOSS_AGGREGATION_UNSPECIFIED) {
    a.set_loss_aggregation(v1::LOSS_AGGREGATION_TOKEN_MEAN);
  }
  if (a.loss_aggregation() == v1::LOSS_AGGREGATION_CONSTANT_NORMALIZER &&
      a.loss_normalizer_tokens() == 0) {
    // Dr. GRPO's constant: the longest completion. A Hugging Face model's
    // context stays unknown here (0): the trainer then takes its own.
    const int64_t max_new = spec.rollout().sampling().max_new_tokens();
    a.set_loss_normalizer_tokens(max_new > 0 ? max_new : model.max_context_tokens());
  }
  if (a.dynamic_sampling() == v1::DYNAMIC_SAMPLING_UNSPECIFIED) {
    // Groups with equal rewards carry no advantage, but trajectory balance
    // learns from them.
    a.set_dynamic_sampling(a.objective() == v1::OBJECTIVE_TRAJECTORY_BALANCE
                               ? v1::DYNAMIC_SAMPLING_KEEP
                               : v1::DYNAMIC_SAMPLING_DROP);
  }

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
  if (!buffer.has_priority_alpha()) buffer.set_priority_alpha(kDefaultPriorityAlpha);
  if (buffer.recency_probability() == 0) {
    buffer.set_recency_probability(kDefaultRecencyProbability);
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
  const absl::Status names = CheckVerifierNames(out.spec, reward_server::BuiltinVerifierNames(),
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
