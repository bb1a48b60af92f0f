#ifndef SLUICE_CONTROLLER_RUN_SPEC_H_
#define SLUICE_CONTROLLER_RUN_SPEC_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/run/run_memory.h"
#include "common/task/arithmetic.h"
#include "sluice/v1/common.pb.h"

namespace sluice::controller {

// A RunSpec as submitted leaves most fields at 0 / unset, meaning "the
// documented default" (see common.proto). The controller resolves every
// default it knows into explicit values before it stores the spec or sends it
// to a service, so that GetRun, spec.json and every component see one and
// the same set of numbers:
//
//   model.max_context_tokens = the builtin model's context length (the model
//   itself is never defaulted: a spec names it); task.eval_split_size 200;
//   arithmetic: max_operand 99, num_operands 2, operators + - *, num_prompts
//   10000; objective DECOUPLED_PPO; G = group_size 8; B = batch_size_groups
//   16; eta = max_staleness 4; clip_eps_low 0.2, clip_eps_high = low;
//   behaviour_weight_cap 5, mode TRUNCATE; learning_rate 1e-6;
//   grad_clip_norm 1.0; normalize_advantage_by_std true; advantage_eps 1e-6;
//   tb_beta 1.0; total_steps 1000; minibatches_per_batch 1;
//   proximal_logprobs RECOMPUTE; loss_aggregation TOKEN_MEAN, and with
//   CONSTANT_NORMALIZER loss_normalizer_tokens = rollout.sampling.max_new_tokens
//   (else the model's context; left 0 for a Hugging Face model, whose
//   context the trainer reads); dynamic_sampling DROP (KEEP for
//   TRAJECTORY_BALANCE); the corrections and regularisers stay off
//   (behaviour_weight_floor, second_moment_threshold, kl_coef, entropy_coef
//   0; truncated_importance_sampling, tb_use_reference false); warm start (only
//   with sft_steps > 0): learning_rate 1e-4, batch_size G * B; rollout
//   sampling temperature 1.0, top_p 1.0; rollout.num_workers 0 (every registered
//   worker), rollout.min_workers 1;
//   reward.verifiers [{math, 1}] for arithmetic, GSM8K and MATH datasets,
//   [{code, 1}] for HumanEval (JSONL has none: the user names them);
//   task.prompt_template for a dataset task = run::DefaultPromptTemplate
//   (the arithmetic task keeps "" = its own prompts); verifier weight 1.0;
//   buffer sampler FIFO, max_times_sampled 1, priority_alpha 0.6,
//   recency_probability 0.5; eval sampling temperature 0 (greedy), top_p 1.0;
//   checkpoint.resume true.
//
// model.device "cpu" when empty; model.dtype FLOAT32 on cpu (unset on a
// GPU); algorithm.rollout_verification's fraction 1 and trusted_fraction
// 1/16 (run_verification.h; the controller adds the trusted workers).
//
// eval.num_prompts stays 0 (= the whole eval split), as do the other fields
// whose 0 means something other than a value (DescribeZeroDefaults). Idempotent:
// ResolveDefaults(ResolveDefaults(s)) == ResolveDefaults(s). Pure (reads no
// file), O(size).
v1::RunSpec ResolveDefaults(v1::RunSpec spec);

// The most a serialized RunSpec may take. A spec goes whole to every service
// of its run and to every user that looks at it (WorkerHeartbeat answers,
// StartTraining, GetRun, WatchRun, ListRuns), and their receivers take 4 MiB
// a message by default: a run that cannot be sent would hold the services,
// and every run queued behind it, for nothing.
inline constexpr size_t kMaxRunSpecBytes = 256 << 10;

// The bounds of the spec's strings and lists, checked before anything else
// (cheap: no file is read, nothing is tokenized): name <= 256 bytes; at most
// 64 labels, keys 1-63 bytes, values <= 256; paths (model.hf_model_dir,
// model.tokenizer_path, task.dataset.path, checkpoint.dir) <= 4096; names
// among known ones (model.builtin, model.device, task.chat_template,
// task.dataset.*_field, task.arithmetic.operators[i], verifier names) <= 128;
// task.prompt_template and task.system_prompt <= 32 KiB; at most 16
// operators, 64 stop token ids, 16 stop strings of <= 256 bytes, 32
// verifiers with at most 32 params each (keys <= 128 bytes, values <= 4096);
// and the whole spec <= kMaxRunSpecBytes serialized. INVALID_ARGUMENT with a
// line per field over its bound, naming it, the bound and the size:
//
//   name: must be at most 256 bytes, got 20971520
//
// O(size of the spec).
absl::Status ValidateRunSpecSizes(const v1::RunSpec& spec);
// What the fields a resolved spec leaves 0 (or UNSPECIFIED) mean, one
// "path: 0 = meaning" line each, e.g.
//   buffer.capacity_groups: 0 = unlimited (the admission gate holds ...)
//   eval.num_prompts: 0 = the whole eval split (task.eval_split_size: 500 prompts)
// For `sluice submit --validate-only`, whose resolved spec would otherwise
// show bare zeros. O(1).
std::vector<std::string> DescribeZeroDefaults(const v1::RunSpec& resolved);

// Checks a (normally resolved) spec and reports every problem at once, one
// per line, each naming the field path and what is wrong with it:
//
//   algorithm.group_size: must be >= 2 (GRPO needs several samples per prompt), got 1
//   model.builtin: unknown model "huge"; known: tiny, micro
//
//   task.dataset.path: cannot read "/x.jsonl": ...
//
// INVALID_ARGUMENT when anything is wrong, OK otherwise. A dataset task's
// file is read here (run::ValidateRunTask), so that an unreadable or
// malformed dataset fails the submission, not the run; O(dataset size).
// Features the contracts describe but this release does not implement (MBPP
// datasets) are rejected here with a message saying so, rather than failing
// mid-run; so are objective settings that the chosen objective would ignore
// (a behaviour-weight floor with GRPO, kl_coef with trajectory balance, ...:
// docs/objectives.md).
//
// A spec over the bounds of ValidateRunSpecSizes gets those problems only
// (it is not read further). Every numeric field also has an upper bound far
// beyond real runs
// (algorithm.group_size <= 1024, batch_size_groups <= 65536, ...), so that an
// absurd value is refused here; what the run needs in memory is judged by
// CheckRunMemory.
absl::Status ValidateRunSpec(const v1::RunSpec& spec);

// Checks reward.verifiers[i].name against the verifiers a reward server
// offers (`known`, e.g. from ListVerifiers; `offered_by` names it in the
// message). INVALID_ARGUMENT, one line per unknown name:
//   reward.verifiers[0].name: unknown verifier "mth"; did you mean "math"?
//   (the reward server at 127.0.0.1:50053 offers code, exact_match, ...)
absl::Status CheckVerifierNames(const v1::RunSpec& spec, const std::vector<std::string>& known,
                                const std::string& offered_by);

// What a valid, resolved spec needs in memory on each service
// (run::EstimateRunMemory), with the longest prompt measured by tokenizing
// the task's training and eval prompts. Errors are the model's or task's.
absl::StatusOr<run::RunMemoryEstimate> EstimateSpecMemory(const v1::RunSpec& spec);

// The budgets the services report (0 = unknown, not checked).
struct ServiceMemoryBudgets {
  run::MemoryBudget rollout_worker;  // The smallest of the run's workers.
  run::MemoryBudget trainer;
  run::MemoryBudget replay_buffer;   // What is left of it.
};

// INVALID_ARGUMENT with one line per service whose estimate exceeds its
// budget (run::CheckMemoryBudget), OK otherwise.
absl::Status CheckRunMemory(const run::RunMemoryEstimate& estimate,
                            const ServiceMemoryBudgets& budgets);

// What `sluice submit --validate-only` does without a controller:
// ResolveDefaults, ValidateRunSpec, the verifier names against the builtin
// ones (run::BuiltinVerifierNames, common/run/verifier_params.h), and the memory estimate
// (shown, not checked: the budgets are the services'). INVALID_ARGUMENT
// with every problem, as SubmitRun would answer.
struct OfflineValidation {
  v1::RunSpec spec;  // Resolved.
  run::RunMemoryEstimate memory;
};
absl::StatusOr<OfflineValidation> ValidateSpecOffline(const v1::RunSpec& spec);

// "rollout worker 1.2 GiB, trainer 3.4 GiB, replay buffer 56.0 MiB (each
// sequence up to 1,024 tokens)".
std::string DescribeRunMemory(const run::RunMemoryEstimate& estimate);

// The arithmetic task options a resolved spec describes (the training pool
// and eval split the controller hands out and the trainer evaluates on);
// run::ArithmeticOptionsFor. Requires spec.task().has_arithmetic().
task::ArithmeticOptions ArithmeticOptionsFor(const v1::RunSpec& spec);

// The run's training prompts in task order (not yet shuffled):
// run::LoadRunTask(spec).train; each Prompt carries its id, final text
// (templates applied), reference answer, verifier and metadata. Errors are
// LoadRunTask's (a missing dataset file, a bad template, ...).
absl::StatusOr<std::vector<v1::Prompt>> BuildTrainingPrompts(const v1::RunSpec& spec);

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_RUN_SPEC_H_
