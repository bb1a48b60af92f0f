#include "trainer/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/model/generation.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "common/run/run_task.h"
#include "common/status_macros.h"
#include "common/task/arithmetic.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "google/protobuf/util/time_util.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint.h"
#include "trainer/evaluator.h"
#include "trainer/objective.h"
#include "trainer/rl_batch.h"
#include "trainer/step_guard.h"

namespace sluice::trainer {
namespace {

using google::protobuf::util::TimeUtil;

// The warm start checks its dev accuracy this often (and after its last step);
// accuracy jumps sharply during SFT, so checks are frequent (each costs ~0.1 s).
constexpr int64_t kWarmStartCheckEvery = 10;
// Size of the dev split (taken from the head of the training pool; the
// held-out eval split is never touched before "before").
constexpr size_t kDevSplitSize = 200;
constexpr int64_t kSampleTimeoutMs = 1000;
// How long the trainer keeps retrying a replay buffer that is unreachable
// (restarting) before it fails the run.
constexpr double kSampleRetrySeconds = 120;

double Now() { return absl::ToUnixMicros(absl::Now()) / 1e6; }

void SetLearningRate(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

}  // namespace

class TrainerRun::Impl {
 public:
  Impl(std::string run_id, v1::RunSpec spec, TrainerRunDeps deps)
      : run_id_(std::move(run_id)), spec_(std::move(spec)), deps_(std::move(deps)) {
    status_.set_run_id(run_id_);
    status_.set_state(v1::TRAINER_STATE_LOADING);
    status_.set_policy_version(-1);
    status_.set_resumed_from_step(-1);
  }

  absl::Status Run() {
    start_time_ = Now();
    absl::Status status;
    // LibTorch reports errors (bad shapes, out-of-range ids from a corrupt
    // trajectory) as exceptions: they fail the run, never the process.
    try {
      status = RunInner();
    } catch (const std::exception& e) {
      std::string what = e.what();
      status = absl::InternalError(absl::StrCat("LibTorch error: ", what.substr(0, what.find('\n'))));
    }
    if (status.ok()) {
      SetState(v1::TRAINER_STATE_FINISHED);
      Report(v1::TRAINER_STATE_FINISHED);
      log::Info("run finished", {{"run_id", run_id_}, {"steps", step_}});
    } else if (stop_.load()) {
      // Nothing trained yet (stopped while loading or waiting for the first
      // batch): nothing worth a checkpoint.
      if (checkpoint_on_stop_.load() && (step_ > 0 || Status().warm_start_step() > 0)) {
        // Stopped between steps: the weights are those of step_, whole.
        absl::Status written;
        try {
          written = WriteCheckpoint("stopped");
        } catch (const std::exception& e) {
          written = absl::InternalError(e.what());
        }
        if (!written.ok()) {
          log::Error("checkpoint on stop failed",
                     {{"run_id", run_id_}, {"error", std::string(written.message())}});
        }
      }
      status = absl::CancelledError(absl::StrCat("run ", run_id_, " was stopped"));
      SetState(v1::TRAINER_STATE_IDLE);
    } else {
      {
        absl::MutexLock lock(&mu_);
        status_.set_last_error(std::string(status.message()));
      }
      SetState(v1::TRAINER_STATE_FAILED);
      v1::ReportTrainerProgressRequest report = NewReport(v1::TRAINER_STATE_FAILED);
      report.set_error(std::string(status.message()));
      Send(report);
      log::Error("run failed", {{"run_id", run_id_}, {"error", std::string(status.message())}});
    }
    return status;
  }

  void Stop(bool checkpoint) {
    if (checkpoint) checkpoint_on_stop_.store(true);
    if (!stop_.exchange(true)) stopped_.Notify();  // The first Stop notifies.
    if (deps_.buffer != nullptr) deps_.buffer->CancelSample();
  }

  v1::TrainerStatus Status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  absl::Status RunInner() {
    // Model, tokenizer, task: all deterministic in the run's spec and seed.
    const double load_start = Now();
    ASSIGN_OR_RETURN(tokenizer_, run::LoadRunTokenizer(spec_.model()));
    std::string model_name;
    if (spec_.model().has_hf_model_dir()) {
      model_name = spec_.model().hf_model_dir();
      absl::StatusOr<model::HfModel> loaded = model::LoadHfModel(model_name);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(),
                            absl::StrCat("model.hf_model_dir: ", loaded.status().message()));
      }
      model_ = std::move(loaded->model);
    } else {
      model_name = spec_.model().builtin();
      ASSIGN_OR_RETURN(model::ModelConfig config, run::LoadRunModelConfig(spec_.model()));
      ASSIGN_OR_RETURN(model_, model::Transformer::Create(config, spec_.seed()));
    }
    const model::ModelConfig& config = model_->config();
    stop_token_ids_ = run::StopTokenIds(config, *tokenizer_);
    if (stop_token_ids_.empty()) {
      return absl::InvalidArgumentError("model: the tokenizer and config.json name no end-of-sequence token");
    }
    pad_id_ = run::PadTokenId(config, *tokenizer_);
    // What the run holds throughout (weights, optimizer state, published
    // versions, copies): the rest of the budget is the batches'.
    const run::ServiceMemoryEstimate resident = run::EstimateRunMemory(spec_, config, -1).trainer;
    resident_bytes_ = resident.bytes - resident.batch_bytes;
    ASSIGN_OR_RETURN(checkpoint_side_files_, run::CheckpointSideFiles(spec_.model()));
    log::Info("model ready", {{"run_id", run_id_},
                              {"model", model_name},
                              {"architecture", config.architecture},
                              {"parameters", config.ParameterCount()},
                              {"seconds", Now() - load_start}});
    ASSIGN_OR_RETURN(run::RunTask task, run::LoadRunTask(spec_));
    train_items_ = std::move(task.train);
    eval_items_ = std::move(task.eval);
    if (spec_.eval().num_prompts() > 0 &&
        static_cast<size_t>(spec_.eval().num_prompts()) < eval_items_.size()) {
      eval_items_.resize(spec_.eval().num_prompts());
    }
    dev_items_.assign(train_items_.begin(),
                      train_items_.begin() + std::min(kDevSplitSize, train_items_.size()));
    if (spec_.warm_start().sft_steps() > 0) {
      // SFT targets: the reference answer, then the stop token. Items
      // verified by execution only (code) have none and are left out.
      for (const auto& item : train_items_) {
        if (item.reference_answer.empty()) continue;
        std::vector<int32_t> prompt = run::EncodePrompt(*tokenizer_, item.prompt);
        std::vector<int32_t> answer = tokenizer_->Encode(item.reference_answer, /*allow_special=*/false);
        answer.push_back(stop_token_ids_.front());
        sft_rows_.emplace_back(std::move(prompt), std::move(answer));
      }
      if (sft_rows_.empty()) {
        return absl::InvalidArgumentError(
            "warm_start: the task has no reference answers to fine-tune on; set "
            "warm_start.sft_steps to 0");
      }
    }
    if (train_items_.empty()) return absl::InvalidArgumentError("task: the training pool is empty");
    temperature_ = spec_.rollout().sampling().has_temperature()
                       ? spec_.rollout().sampling().temperature()
                       : 1.0;
    if (temperature_ <= 0) temperature_ = 1.0;  // greedy rollouts record T = 1 log-probs
    max_new_tokens_ = spec_.rollout().sampling().max_new_tokens() > 0
                          ? spec_.rollout().sampling().max_new_tokens()
                      : spec_.model().max_context_tokens() > 0
                          ? spec_.model().max_context_tokens()
                          : config.max_position_embeddings;
    objective_ = ObjectiveConfig::FromAlgorithm(spec_.algorithm(), max_new_tokens_);

    // Each batch is kept by the buffer until it is trained for good: until
    // a checkpoint covers it, or at once when no periodic checkpoint will.
    commit_after_checkpoint_ =
        !spec_.checkpoint().dir().empty() && spec_.checkpoint().every_n_steps() > 0;
    ASSIGN_OR_RETURN(const bool resumed, Resume());
    if (!resumed) {
      if (spec_.warm_start().sft_steps() > 0) RETURN_IF_ERROR(WarmStart());
      warm_start_done_ = true;
      if (objective_.UsesReference()) {
        // The reference is the policy RL starts from, frozen (a resumed run
        // brought it with its checkpoint).
        ASSIGN_OR_RETURN(reference_model_, model::Transformer::CreateUninitialized(config));
        RETURN_IF_ERROR(reference_model_->LoadWeights(model_->parameters()));
      }
    }
    if (!before_eval_done_) {
      RETURN_IF_ERROR(RunEval("before", 0));
      before_eval_done_ = true;
    }
    // A resumed run publishes its checkpoint's version (workers fetch it; the
    // buffer, already further, ignores the lower number) and commits it: the
    // incarnation that wrote it may have died before it could.
    RETURN_IF_ERROR(Publish(step_));
    if (resumed) CommitBatches(step_ / Minibatches());
    if (after_eval_done_) {  // resumed from the final checkpoint: the run was done
      CommitBatches((spec_.algorithm().total_steps() + Minibatches() - 1) / Minibatches());
      return absl::OkStatus();
    }
    return TrainRl();
  }

  // ---- warm start --------------------------------------------------------

  absl::Status WarmStart() {
    SetState(v1::TRAINER_STATE_WARM_START);
    Report(v1::TRAINER_STATE_WARM_START);
    const auto& ws = spec_.warm_start();
    const int64_t max_steps = ws.sft_steps();
    const int64_t batch_size = ws.batch_size() > 0
                                   ? ws.batch_size()
                                   : int64_t{spec_.algorithm().group_size()} *
                                         spec_.algorithm().batch_size_groups();
    const int64_t warmup = std::min<int64_t>(50, std::max<int64_t>(1, max_steps / 10));
    torch::optim::AdamW optimizer(
        model_->parameter_tensors(),
        torch::optim::AdamWOptions(ws.learning_rate()).betas({0.9, 0.99}).weight_decay(0.0));
    std::mt19937_64 rng(spec_.seed() ^ 0x5f7a11ULL);
    std::uniform_int_distribution<size_t> pick(0, sft_rows_.size() - 1);
    const double start = Now();
    double accuracy = 0;
    int64_t step = 0;
    while (step < max_steps) {
      if (stop_.load()) return absl::CancelledError("stopped");
      std::vector<TokenRow> rows;
      rows.reserve(batch_size);
      for (int64_t i = 0; i < batch_size; ++i) rows.push_back(sft_rows_[pick(rng)]);
      RETURN_IF_ERROR(CheckBatchMemory(absl::StrCat("warm-start step ", step + 1), rows,
                                       {"warm_start.batch_size"}));
      PaddedBatch batch = PadRows(rows, pad_id_);
      SetLearningRate(optimizer, ws.learning_rate() * std::min(1.0, double(step + 1) / warmup));
      optimizer.zero_grad();
      torch::Tensor logits = model_->Forward(batch.inputs);
      torch::Tensor logp = model::TokenLogProbs(logits, batch.targets);
      torch::Tensor loss = -(logp * batch.mask).sum() / batch.mask.sum().clamp_min(1.0);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model_->parameter_tensors(), 1.0);
      optimizer.step();
      ++step;
      {
        absl::MutexLock lock(&mu_);
        status_.set_warm_start_step(step);
        status_.set_loss(loss.item<double>());
      }
      if (step % kWarmStartCheckEvery == 0 || step == max_steps) {
        ASSIGN_OR_RETURN(v1::EvalResult dev, EvaluateOn(dev_items_, "warm_start", step));
        accuracy = dev.accuracy();
        log::Info("warm start", {{"run_id", run_id_},
                                 {"step", step},
                                 {"loss", loss.item<double>()},
                                 {"dev_accuracy", accuracy}});
        v1::ReportTrainerProgressRequest report = NewReport(v1::TRAINER_STATE_WARM_START);
        *report.mutable_eval() = dev;
        Send(report);
        if (ws.target_accuracy() > 0 && accuracy >= ws.target_accuracy()) break;
      }
    }
    warm_start_done_ = true;
    log::Info("warm start done", {{"run_id", run_id_},
                                  {"steps", step},
                                  {"seconds", Now() - start},
                                  {"dev_accuracy", accuracy}});
    return absl::OkStatus();
  }

  // ---- evaluation --------------------------------------------------------

  absl::StatusOr<v1::EvalResult> EvaluateOn(const std::vector<task::TaskItem>& items,
                                            const std::string& phase, int64_t step) {
    torch::NoGradGuard no_grad;
    EvalOptions options;
    options.phase = phase;
    options.step = step;
    const auto& sampling = spec_.eval().sampling();
    options.temperature = sampling.has_temperature() ? sampling.temperature() : 0.0;
    options.top_p = sampling.has_top_p() ? sampling.top_p() : 1.0;
    options.max_new_tokens = sampling.max_new_tokens() > 0 ? sampling.max_new_tokens() : max_new_tokens_;
    options.seed = spec_.seed() + static_cast<uint64_t>(step);
    options.composition.assign(spec_.reward().verifiers().begin(), spec_.reward().verifiers().end());
    options.item_timeout_ms = spec_.reward().item_timeout_ms();
    options.stop_token_ids = stop_token_ids_;
    options.should_stop = [this] { return stop_.load(); };
    auto result = Evaluate(*model_, *tokenizer_, items, *deps_.reward, options);
    if (!result.ok()) {
      return absl::Status(result.status().code(),
                          absl::StrCat(phase, " evaluation: ", result.status().message()));
    }
    if (deps_.on_eval) deps_.on_eval(*result);
    return result;
  }

  absl::Status RunEval(const std::string& phase, int64_t step) {
    SetState(v1::TRAINER_STATE_EVALUATING);
    ASSIGN_OR_RETURN(v1::EvalResult result, EvaluateOn(eval_items_, phase, step));
    log::Info("evaluation", {{"run_id", run_id_},
                             {"phase", phase},
                             {"step", step},
                             {"accuracy", result.accuracy()},
                             {"prompts", result.num_prompts()}});
    v1::ReportTrainerProgressRequest report = NewReport(v1::TRAINER_STATE_EVALUATING);
    *report.mutable_eval() = result;
    Send(report);
    return absl::OkStatus();
  }

  // ---- publishing --------------------------------------------------------

  absl::Status Publish(int64_t version) {
    // The last line of defence (see step_guard.h): a worker sampling from a
    // non-finite weight would fail every generation.
    if (std::optional<std::string> bad = FirstNonFiniteParameter(model_->parameters())) {
      return absl::InternalError(absl::StrCat("refusing to publish version ", version, ": ",
                                              *bad, " holds a non-finite value"));
    }
    auto published = std::make_shared<PublishedVersion>();
    uint32_t checksum = 0;
    int64_t total = 0;
    for (const auto& [name, tensor] : model_->parameters()) {
      std::string bytes = model::TensorBytes(tensor.detach());
      v1::TensorSpec spec;
      spec.set_name(name);
      spec.set_dtype(v1::DTYPE_FLOAT32);
      for (int64_t d : tensor.sizes()) spec.add_shape(d);
      spec.set_size_bytes(static_cast<int64_t>(bytes.size()));
      spec.set_crc32c(Crc32c(bytes));
      checksum = Crc32c(bytes, checksum);
      total += static_cast<int64_t>(bytes.size());
      published->tensors.push_back(std::move(spec));
      published->bytes.push_back(std::move(bytes));
    }
    auto& info = published->info;
    info.set_run_id(run_id_);
    info.set_version(version);
    info.set_step(version);
    *info.mutable_published_at() = TimeUtil::GetCurrentTime();
    info.set_total_size_bytes(total);
    info.set_tensor_count(static_cast<int32_t>(published->tensors.size()));
    info.set_checksum(absl::StrFormat("crc32c:%08x", checksum));
    last_published_ = published;
    deps_.weights->Publish(std::move(published));
    {
      absl::MutexLock lock(&mu_);
      status_.set_policy_version(version);
      *status_.mutable_last_published_at() = info.published_at();
    }
    // Weights first, then the buffer: a worker admitted at version v can
    // always download v.
    v1::UpdatePolicyVersionRequest update;
    update.set_run_id(run_id_);
    update.set_policy_version(version);
    auto updated = deps_.buffer->UpdatePolicyVersion(update);
    if (!updated.ok()) return updated.status();
    return absl::OkStatus();
  }

  // Puts the weights of the last published version back into the model.
  absl::Status RestorePublishedWeights() {
    if (last_published_ == nullptr) {
      return absl::InternalError("no published version to restore the weights from");
    }
    std::vector<model::NamedTensor> weights;
    for (size_t i = 0; i < last_published_->tensors.size(); ++i) {
      const v1::TensorSpec& spec = last_published_->tensors[i];
      ASSIGN_OR_RETURN(torch::Tensor tensor,
                       model::Float32TensorView(
                           std::vector<int64_t>(spec.shape().begin(), spec.shape().end()),
                           last_published_->bytes[i]));
      weights.push_back({spec.name(), std::move(tensor)});
    }
    return model_->LoadWeights(weights);
  }

  // ---- RL ----------------------------------------------------------------

  absl::Status TrainRl() {
    const auto& alg = spec_.algorithm();
    if (optimizer_ == nullptr) optimizer_ = NewRlOptimizer(*model_);
    const int minibatches = Minibatches();
    if (NeedsProximalModel() && prox_model_ == nullptr) {
      // Later minibatches of a batch need the log-probs of the weights as
      // they were before its first update: keep a copy of those weights.
      ASSIGN_OR_RETURN(prox_model_, model::Transformer::CreateUninitialized(model_->config()));
    }
    SetState(v1::TRAINER_STATE_WAITING_FOR_DATA);
    Report(v1::TRAINER_STATE_WAITING_FOR_DATA);
    const int64_t eval_every = spec_.eval().every_n_steps();
    if (eval_every > 0 && step_ > 0 && step_ % eval_every == 0 && step_ < alg.total_steps() &&
        last_periodic_eval_step_ < step_) {
      // Resumed from a checkpoint whose periodic evaluation a stop cut short.
      RETURN_IF_ERROR(RunEval("periodic", step_));
      last_periodic_eval_step_ = step_;
    }
    while (step_ < alg.total_steps()) {
      if (stop_.load()) return absl::CancelledError("stopped");
      // The buffer's step is the batch: with several minibatches a resume
      // may start inside one, at minibatch step_ % minibatches.
      const int64_t batch_step = step_ / minibatches + 1;
      const int first_minibatch = static_cast<int>(step_ % minibatches);
      // 1. A batch of B groups, none staler than eta (the same batch again
      // when an earlier incarnation of this trainer took it).
      SetState(v1::TRAINER_STATE_WAITING_FOR_DATA);
      const double wait_start = Now();
      v1::SampleResponse batch;
      double failing_since = -1;
      bool reanchored = false;
      while (true) {
        if (stop_.load()) return absl::CancelledError("stopped");
        v1::SampleRequest request;
        request.set_run_id(run_id_);
        request.set_batch_size_groups(alg.batch_size_groups());
        request.set_max_staleness(alg.max_staleness());
        request.set_trainer_policy_version(step_);
        request.set_timeout_ms(kSampleTimeoutMs);
        request.set_step(batch_step);
        // Dynamic sampling with refill: the buffer leaves out (and lets
        // generation replace) groups whose rewards are all equal.
        request.set_drop_uniform_reward_groups(objective_.dynamic_sampling ==
                                               v1::DYNAMIC_SAMPLING_REFILL);
        absl::StatusOr<v1::SampleResponse> sampled = deps_.buffer->Sample(request);
        if (absl::IsFailedPrecondition(sampled.status()) && first_minibatch == 0 &&
            !reanchored) {
          // A buffer that forgot the run's steps (restarted without its data
          // directory) refuses a step ahead of its position: move it here.
          reanchored = true;
          ASSIGN_OR_RETURN(const bool moved, ReanchorSteps(batch_step));
          if (moved) continue;
        }
        if (!sampled.ok()) {
          // A buffer that restarts (it restores its state from its data
          // directory) is unreachable for a moment: ride it out, up to a
          // limit, rather than failing the run. Other errors are final.
          const absl::StatusCode code = sampled.status().code();
          const bool transient = code == absl::StatusCode::kUnavailable ||
                                 code == absl::StatusCode::kCancelled ||
                                 code == absl::StatusCode::kDeadlineExceeded;
          if (failing_since < 0) failing_since = Now();
          if (!transient || Now() - failing_since > kSampleRetrySeconds) return sampled.status();
          log::Warning("sampling from the replay buffer failed; retrying",
                       {{"run_id", run_id_}, {"error", std::string(sampled.status().message())}});
          stopped_.WaitForNotificationWithTimeout(absl::Seconds(1));  // a stop ends the wait
          continue;
        }
        failing_since = -1;
        batch = std::move(sampled).value();
        if (!batch.timed_out() && batch.groups_size() == alg.batch_size_groups()) break;
      }
      const double wait_seconds = Now() - wait_start;
      SetState(v1::TRAINER_STATE_TRAINING);
      // 2. Split into minibatches by group; each is one optimizer step and
      // one published version.
      const int groups = batch.groups_size();
      // (Inside a batch, the resumed checkpoint brought its start's weights.)
      if (prox_model_ != nullptr && first_minibatch == 0) {
        RETURN_IF_ERROR(prox_model_->LoadWeights(model_->parameters()));
      }
      for (int m = first_minibatch; m < minibatches && step_ < alg.total_steps(); ++m) {
        // A stop is seen between minibatches, not only between batches.
        if (stop_.load()) return absl::CancelledError("stopped");
        const int begin = groups * m / minibatches;
        const int end = groups * (m + 1) / minibatches;
        ASSIGN_OR_RETURN(v1::TrainingStepMetrics metrics,
                         TrainStep(batch, begin, end, *optimizer_,
                                   m == first_minibatch ? wait_seconds : 0.0,
                                   /*batch_start_version=*/(batch_step - 1) * minibatches));
        if (m == first_minibatch) {
          metrics.set_groups_uniform_dropped(batch.uniform_reward_groups_dropped());
        }
        if (step_ <= redo_until_) {
          absl::MutexLock lock(&mu_);
          status_.set_steps_redone(status_.steps_redone() + 1);
        }
        if (deps_.on_step) deps_.on_step(metrics);
        v1::ReportTrainerProgressRequest report = NewReport(v1::TRAINER_STATE_TRAINING);
        *report.mutable_step() = metrics;
        Send(report);
        if (eval_every > 0 && step_ % eval_every == 0 && step_ < alg.total_steps()) {
          RETURN_IF_ERROR(RunEval("periodic", step_));
          last_periodic_eval_step_ = step_;
          SetState(v1::TRAINER_STATE_TRAINING);
        }
        const int64_t checkpoint_every = spec_.checkpoint().every_n_steps();
        if (checkpoint_every > 0 && step_ % checkpoint_every == 0 && step_ < alg.total_steps()) {
          // A periodic checkpoint that cannot be written (a full disk) does
          // not end the run; the final one does.
          if (absl::Status written = WriteCheckpoint("periodic"); !written.ok()) {
            log::Error("checkpoint failed", {{"run_id", run_id_},
                                             {"error", std::string(written.message())}});
          }
        }
      }
      // Without periodic checkpoints there is nothing to resume from: a
      // batch is let go of once trained.
      if (!commit_after_checkpoint_ && step_ % minibatches == 0) CommitBatches(batch_step);
    }
    RETURN_IF_ERROR(RunEval("after", step_));
    after_eval_done_ = true;
    RETURN_IF_ERROR(WriteCheckpoint("final"));
    // The run is over: every batch it sampled, a last partial one included.
    CommitBatches((alg.total_steps() + minibatches - 1) / minibatches);
    return absl::OkStatus();
  }

  // ---- checkpoints and resuming --------------------------------------------

  // Writes <checkpoint.dir>/step-NNNNNNNN (checkpoint.h: the HF model
  // directory and the training state next to it), durably, then prunes to
  // keep_last and commits the batches it covers to the buffer. Nothing to do
  // without a checkpoint dir, or when this step is already written (but a
  // final checkpoint replaces a stopped one of the same step: it records the
  // "after" evaluation).
  absl::Status WriteCheckpoint(absl::string_view why) {
    const v1::CheckpointConfig& config = spec_.checkpoint();
    if (config.dir().empty() || model_ == nullptr) return absl::OkStatus();
    if (step_ == last_checkpoint_step_ && !(why == "final" && !last_checkpoint_final_)) {
      return absl::OkStatus();
    }
    const v1::TrainerState previous = Status().state();
    SetState(v1::TRAINER_STATE_CHECKPOINTING);
    const double start = Now();
    const int minibatches = Minibatches();

    CheckpointContents contents;
    contents.model = model_.get();
    contents.optimizer = optimizer_.get();
    // Inside a batch the later minibatches clip against its start.
    if (prox_model_ != nullptr && step_ % minibatches != 0) contents.proximal = prox_model_.get();
    contents.reference = reference_model_.get();
    switch (spec_.model().dtype()) {
      case v1::DTYPE_BFLOAT16:
        contents.hf.dtype = model::DType::kBF16;
        break;
      case v1::DTYPE_FLOAT16:
        contents.hf.dtype = model::DType::kF16;
        break;
      default:
        contents.hf.dtype = model::DType::kF32;  // What the trainer computes in.
    }
    contents.hf.max_shard_bytes = int64_t{5} << 30;  // save_pretrained's default "5GB".
    contents.hf.extra_contents = checkpoint_side_files_;
    TrainerCheckpointState state;
    state.run_id = run_id_;
    state.run_name = spec_.name();
    state.step = step_;
    state.policy_version = step_;
    state.reason = std::string(why);
    state.source_model = spec_.model().has_hf_model_dir() ? spec_.model().hf_model_dir()
                                                          : spec_.model().builtin();
    state.written_at = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
    state.warm_start_done = warm_start_done_;
    state.warm_start_steps = Status().warm_start_step();
    state.before_eval_done = before_eval_done_;
    state.last_periodic_eval_step = last_periodic_eval_step_;
    state.after_eval_done = after_eval_done_;
    state.minibatches_per_batch = minibatches;
    absl::StatusOr<WrittenCheckpoint> written =
        WriteCheckpointDirectory(config.dir(), std::move(state), contents);
    SetState(previous);
    if (!written.ok()) return written.status();
    last_checkpoint_step_ = step_;
    last_checkpoint_final_ = why == "final";
    {
      absl::MutexLock lock(&mu_);
      status_.set_last_checkpoint_step(step_);
    }
    log::Info("checkpoint written", {{"run_id", run_id_},
                                     {"step", step_},
                                     {"reason", std::string(why)},
                                     {"dir", written->path},
                                     {"bytes", written->size_bytes},
                                     {"seconds", Now() - start}});
    PruneCheckpoints(config.dir(), config.keep_last());
    // Durable now: the buffer may let go of the batches it covers.
    CommitBatches(step_ / minibatches);
    return absl::OkStatus();
  }

  // Tells the buffer that the batches of steps up to `batch_step` are
  // trained for good (checkpointed, or with no checkpoint to resume from):
  // it lets go of them. Best effort: a failed commit is covered by the next
  // one, and until then the buffer only keeps more than it needs.
  void CommitBatches(int64_t batch_step) {
    if (batch_step <= committed_batches_) return;
    v1::CommitTrainedStepsRequest request;
    request.set_run_id(run_id_);
    request.set_step(batch_step);
    absl::StatusOr<v1::CommitTrainedStepsResponse> committed =
        deps_.buffer->CommitTrainedSteps(request);
    if (!committed.ok()) {
      log::Warning("could not commit trained steps to the replay buffer; it keeps their batches "
                   "until a later commit covers them",
                   {{"run_id", run_id_},
                    {"step", batch_step},
                    {"error", std::string(committed.status().message())}});
      return;
    }
    committed_batches_ = batch_step;
  }

  // When the buffer's step position is behind `batch_step` (its journal was
  // lost: it recorded nothing of the steps this trainer trained), commits
  // the steps before it there and returns true; false when the buffer is
  // where it should be (the refusal was for another reason). The batches of
  // the steps since the last checkpoint are gone with the journal: a later
  // resume from that checkpoint is refused rather than redone on other data.
  absl::StatusOr<bool> ReanchorSteps(int64_t batch_step) {
    ASSIGN_OR_RETURN(const v1::BufferStats stats, ReadBufferStats());
    if (batch_step <= std::max(stats.last_recorded_step(), stats.committed_step()) + 1) {
      return false;
    }
    log::Warning("the replay buffer has no record of this run's recent steps (restarted without "
                 "its data directory?); continuing from here: the steps since the last "
                 "checkpoint can no longer be resumed from it",
                 {{"run_id", run_id_},
                  {"step", batch_step},
                  {"buffer_last_recorded_step", stats.last_recorded_step()},
                  {"buffer_committed_step", stats.committed_step()}});
    committed_batches_ = std::min(committed_batches_, stats.committed_step());
    CommitBatches(batch_step - 1);
    return committed_batches_ == batch_step - 1;
  }

  int Minibatches() const { return std::max(1, spec_.algorithm().minibatches_per_batch()); }

  std::unique_ptr<torch::optim::AdamW> NewRlOptimizer(const model::Transformer& model) const {
    const auto& alg = spec_.algorithm();
    return std::make_unique<torch::optim::AdamW>(
        model.parameter_tensors(), torch::optim::AdamWOptions(alg.learning_rate())
                                       .betas({0.9, 0.99})
                                       .weight_decay(alg.weight_decay()));
  }

  // Decoupled PPO recomputing pi_prox over several minibatches keeps the
  // weights of the batch's start for the later minibatches.
  bool NeedsProximalModel() const { return run::KeepsProximalPolicy(spec_.algorithm()); }

  // The buffer's account of the run (empty when it does not know it),
  // riding out a buffer that is restarting as sampling does.
  absl::StatusOr<v1::BufferStats> ReadBufferStats() {
    double failing_since = -1;
    while (true) {
      if (stop_.load()) return absl::CancelledError("stopped");
      v1::GetStatsRequest request;
      request.set_run_id(run_id_);
      absl::StatusOr<v1::GetStatsResponse> stats = deps_.buffer->GetStats(request);
      if (stats.ok()) return stats->stats();
      const absl::StatusCode code = stats.status().code();
      if (code == absl::StatusCode::kNotFound) return v1::BufferStats();
      const bool transient = code == absl::StatusCode::kUnavailable ||
                             code == absl::StatusCode::kDeadlineExceeded;
      if (failing_since < 0) failing_since = Now();
      if (!transient || Now() - failing_since > kSampleRetrySeconds) return stats.status();
      log::Warning("reading the run's state from the replay buffer failed; retrying",
                   {{"run_id", run_id_}, {"error", std::string(stats.status().message())}});
      stopped_.WaitForNotificationWithTimeout(absl::Seconds(1));
    }
  }

  // Resumes from the newest checkpoint of this run that loads (checkpoint.h),
  // when checkpoint.resume allows and there is one; true when it did. Refuses
  // (FAILED_PRECONDITION, PlanResume) a run the buffer says was trained past
  // version 0 that cannot be continued losslessly.
  absl::StatusOr<bool> Resume() {
    const v1::CheckpointConfig& config = spec_.checkpoint();
    std::vector<std::string> warnings;
    std::vector<FoundCheckpoint> found;
    if (!config.dir().empty()) found = FindRunCheckpoints(config.dir(), run_id_, &warnings);
    for (const std::string& warning : warnings) {
      log::Warning("a checkpoint of this run cannot be resumed from",
                   {{"run_id", run_id_}, {"why", warning}});
    }
    ASSIGN_OR_RETURN(const v1::BufferStats buffer, ReadBufferStats());
    ASSIGN_OR_RETURN(ResumePlan plan,
                     PlanResume(run_id_, spec_, std::move(found), buffer, warnings));
    std::vector<std::string> failures;
    for (const FoundCheckpoint& checkpoint : plan.candidates) {
      // Loaded into fresh objects: a checkpoint that fails half-way leaves
      // the model from the run's source untouched.
      const double start = Now();
      ASSIGN_OR_RETURN(std::unique_ptr<model::Transformer> model,
                       model::Transformer::CreateUninitialized(model_->config()));
      std::unique_ptr<torch::optim::AdamW> optimizer = NewRlOptimizer(*model);
      std::unique_ptr<model::Transformer> proximal;
      if (NeedsProximalModel()) {
        ASSIGN_OR_RETURN(proximal, model::Transformer::CreateUninitialized(model_->config()));
      }
      std::unique_ptr<model::Transformer> reference;
      if (objective_.UsesReference()) {
        ASSIGN_OR_RETURN(reference, model::Transformer::CreateUninitialized(model_->config()));
      }
      if (absl::Status loaded =
              LoadCheckpoint(checkpoint, *model, *optimizer, proximal.get(), reference.get());
          !loaded.ok()) {
        log::Warning("could not resume from a checkpoint; trying an older one",
                     {{"run_id", run_id_},
                      {"dir", checkpoint.path},
                      {"error", std::string(loaded.message())}});
        failures.push_back(absl::StrCat(checkpoint.path, ": ", loaded.message()));
        continue;
      }
      const TrainerCheckpointState& state = checkpoint.state;
      model_ = std::move(model);
      optimizer_ = std::move(optimizer);
      prox_model_ = std::move(proximal);
      reference_model_ = std::move(reference);
      step_ = state.step;
      last_checkpoint_step_ = state.step;
      last_checkpoint_final_ = state.reason == "final";
      warm_start_done_ = true;
      before_eval_done_ = state.before_eval_done;
      last_periodic_eval_step_ = state.last_periodic_eval_step;
      after_eval_done_ = state.after_eval_done;
      // Versions after the checkpoint that an earlier incarnation published
      // (the buffer knows them): redone now, on the same batches.
      redo_until_ = std::min(plan.buffer_policy_version, spec_.algorithm().total_steps());
      {
        absl::MutexLock lock(&mu_);
        status_.set_step(step_);
        status_.set_warm_start_step(state.warm_start_steps);
        status_.set_last_checkpoint_step(step_);
        status_.set_resumed_from_step(step_);
      }
      log::Info("resumed from a checkpoint",
                {{"run_id", run_id_},
                 {"dir", checkpoint.path},
                 {"step", step_},
                 {"buffer_policy_version", plan.buffer_policy_version},
                 {"steps_to_redo", std::max<int64_t>(0, redo_until_ - step_)},
                 {"seconds", Now() - start}});
      return true;
    }
    if (!failures.empty() && plan.buffer_policy_version > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot resume losslessly: no checkpoint of run ", run_id_, " in ", config.dir(),
          " loads (", absl::StrJoin(failures, "; "), "); the replay buffer is at version ",
          plan.buffer_policy_version));
    }
    return false;
  }

  // One optimizer step on groups [begin, end) of `batch`, whose first
  // minibatch started at version `batch_start_version` (v_prox).
  absl::StatusOr<v1::TrainingStepMetrics> TrainStep(const v1::SampleResponse& batch, int begin,
                                                    int end, torch::optim::AdamW& optimizer,
                                                    double wait_seconds,
                                                    int64_t batch_start_version) {
    const auto& alg = spec_.algorithm();
    const double compute_start = Now();
    v1::TrainingStepMetrics metrics;
    // Rewards, advantages, staleness over the minibatch's groups.
    RlRowOptions row_options;
    row_options.vocab_size = model_->config().vocab_size;
    row_options.trainer_version = step_;
    row_options.normalize_advantage_by_std = objective_.normalize_advantage_by_std;
    row_options.advantage_eps = objective_.advantage_eps;
    row_options.train_uniform_groups = objective_.TrainsUniformGroups();
    RlRows rows = BuildRlRows(batch, begin, end, row_options);
    for (const auto& [group_id, why] : rows.invalid) {
      log::Warning("left an untrainable group out of the batch",
                   {{"run_id", run_id_}, {"step", step_ + 1}, {"group", group_id}, {"error", why}});
    }
    const int64_t groups = end - begin;
    const int64_t groups_invalid = static_cast<int64_t>(rows.invalid.size());
    double lr = alg.learning_rate();
    if (alg.lr_warmup_steps() > 0) {
      lr *= std::min(1.0, double(step_ + 1) / double(alg.lr_warmup_steps()));
    }
    double loss_value = 0;
    double grad_norm = 0;
    int64_t tokens_trained = 0;
    std::string update_skipped;  // why, when the step made no update
    if (!rows.rows.empty()) {
      RETURN_IF_ERROR(CheckBatchMemory(
          absl::StrCat("step ", step_ + 1), rows.rows,
          {"algorithm.batch_size_groups", "algorithm.minibatches_per_batch (raise it)",
           "algorithm.group_size", "rollout.sampling.max_new_tokens"},
          /*entropy_gradient=*/objective_.EntropyInLoss()));
      PaddedBatch padded = PadRows(rows.rows, pad_id_);
      tokens_trained = padded.real_tokens;
      const int64_t width = padded.inputs.size(1);
      ObjectiveBatch objective_batch;
      objective_batch.mask = padded.mask;
      objective_batch.behaviour = ScatterCompletionValues(rows.behaviour, rows.prefix_lengths, width);
      objective_batch.versions = ScatterCompletionVersions(rows.versions, rows.prefix_lengths, width);
      objective_batch.advantages =
          ScatterCompletionValues(rows.advantages, rows.prefix_lengths, width);
      objective_batch.rewards = rows.rewards;
      objective_batch.groups = rows.groups;
      objective_batch.batch_start_version = batch_start_version;
      objective_batch.current_version = step_;
      objective_batch.temperature = temperature_;
      if (reference_model_ != nullptr) {
        // Before the policy's forward pass: its logits are gone by then.
        torch::NoGradGuard no_grad;
        objective_batch.reference = model::TokenLogProbs(
            reference_model_->Forward(padded.inputs), padded.targets, temperature_);
      }
      SetLearningRate(optimizer, lr);
      optimizer.zero_grad();
      objective_batch.logits = model_->Forward(padded.inputs);
      objective_batch.logp =
          model::TokenLogProbs(objective_batch.logits, padded.targets, temperature_);
      // The proximal policy: the weights before this batch's first update
      // (objective.h). With one minibatch per batch, or none kept, the
      // current forward's log-probs serve (no second forward).
      if (prox_model_ != nullptr) {
        torch::NoGradGuard no_grad;
        objective_batch.proximal = model::TokenLogProbs(prox_model_->Forward(padded.inputs),
                                                        padded.targets, temperature_);
      }
      torch::Tensor loss = ComputeObjective(objective_batch, objective_, &metrics);
      loss.backward();
      const double clip = alg.has_grad_clip_norm() ? alg.grad_clip_norm() : 1.0;
      grad_norm = clip > 0 ? torch::nn::utils::clip_grad_norm_(model_->parameter_tensors(), clip)
                           : torch::nn::utils::clip_grad_norm_(model_->parameter_tensors(),
                                                               std::numeric_limits<double>::infinity());
      loss_value = loss.item<double>();
      ASSIGN_OR_RETURN(update_skipped,
                       GuardedStep(optimizer, model_->parameters(), loss_value, grad_norm,
                                   [this] { return RestorePublishedWeights(); }));
      if (!objective_.EntropyInLoss()) {
        metrics.set_entropy(EntropyFigure(objective_batch.logits, padded.mask, temperature_));
      }
    }
    if (!update_skipped.empty()) {
      log::Warning("skipped the update of a step: it would have made the weights non-finite; "
                   "the version is published with the previous weights",
                   {{"run_id", run_id_},
                    {"step", step_ + 1},
                    {"why", update_skipped},
                    {"groups", absl::StrJoin(rows.group_ids, ",")}});
    }
    ++step_;
    const double step_seconds = Now() - compute_start;
    const double publish_start = Now();
    RETURN_IF_ERROR(Publish(step_));
    const double publish_seconds = Now() - publish_start;

    metrics.set_step(step_);
    metrics.set_policy_version(step_);
    metrics.set_elapsed_seconds(Now() - start_time_);
    metrics.set_loss(loss_value);
    metrics.set_reward_mean(rows.trajectories > 0 ? rows.reward_sum / rows.trajectories : 0.0);
    metrics.set_pass_rate(rows.trajectories > 0 ? double(rows.passed) / rows.trajectories : 0.0);
    metrics.set_grad_norm(grad_norm);
    metrics.set_learning_rate(lr);
    for (int64_t s = 0; s <= rows.staleness_max; ++s) {
      metrics.add_staleness_histogram(rows.staleness_counts[s]);
    }
    metrics.set_staleness_mean(groups > 0 ? double(rows.staleness_sum) / groups : 0.0);
    metrics.set_staleness_max(rows.staleness_max);
    metrics.set_groups(groups);
    metrics.set_groups_zero_advantage(rows.zero_advantage);
    metrics.set_completion_tokens(rows.completion_tokens);
    metrics.set_tokens_trained(tokens_trained);
    metrics.set_trainer_tokens_per_second(step_seconds > 0 ? tokens_trained / step_seconds : 0.0);
    metrics.set_trainer_wait_seconds(wait_seconds);
    metrics.set_step_seconds(step_seconds);
    metrics.set_publish_seconds(publish_seconds);
    metrics.set_groups_invalid(groups_invalid);
    metrics.set_update_skipped(!update_skipped.empty());
    {
      absl::MutexLock lock(&mu_);
      status_.set_groups_invalid(status_.groups_invalid() + groups_invalid);
      if (!update_skipped.empty()) status_.set_updates_skipped(status_.updates_skipped() + 1);
      status_.set_step(step_);
      status_.set_loss(loss_value);
      status_.set_learning_rate(lr);
      status_.set_kl(metrics.kl_to_behaviour());
      status_.set_entropy(metrics.entropy());
      status_.set_clip_fraction(metrics.clip_fraction());
      status_.set_grad_norm(grad_norm);
      status_.set_reward_mean(metrics.reward_mean());
      status_.set_staleness_mean(metrics.staleness_mean());
      status_.set_trained_tokens_per_second(metrics.trainer_tokens_per_second());
      busy_seconds_ += step_seconds + publish_seconds;
      idle_seconds_ += wait_seconds;
      status_.set_idle_fraction(idle_seconds_ / std::max(1e-9, busy_seconds_ + idle_seconds_));
    }
    return metrics;
  }

  // ---- memory ------------------------------------------------------------

  // RESOURCE_EXHAUSTED when the forward and backward of `rows` (padded to
  // the longest) would not fit what the budget leaves after what the run
  // holds throughout; OK without a budget.
  absl::Status CheckBatchMemory(const std::string& what, const std::vector<TokenRow>& rows,
                                const std::vector<std::string>& fields,
                                bool entropy_gradient = false) const {
    if (deps_.memory_budget_bytes <= 0 || rows.empty()) return absl::OkStatus();
    size_t longest = 0;
    for (const auto& [prefix, trained] : rows) {
      longest = std::max(longest, prefix.size() + trained.size());
    }
    const int64_t sequences = static_cast<int64_t>(rows.size());
    const int64_t tokens = std::max<int64_t>(1, static_cast<int64_t>(longest) - 1);
    const int64_t needed =
        run::TrainingBatchBytes(model_->config(), sequences, tokens, entropy_gradient);
    const int64_t left = deps_.memory_budget_bytes - resident_bytes_;
    if (needed <= left) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(
        "trainer: ", what, ": a batch of ", sequences, " sequences x ", tokens,
        " tokens needs about ", run::FormatBytes(needed),
        " (activations, attention, logits and their gradients), more than the ",
        run::FormatBytes(std::max<int64_t>(0, left)), " the trainer's --memory-budget of ",
        run::FormatBytes(deps_.memory_budget_bytes),
        " leaves after its weights, optimizer state and published versions (",
        run::FormatBytes(resident_bytes_), "); lower ", absl::StrJoin(fields, ", "),
        ", or give the trainer a larger --memory-budget"));
  }

  // ---- reporting ---------------------------------------------------------

  void SetState(v1::TrainerState state) {
    absl::MutexLock lock(&mu_);
    status_.set_state(state);
  }

  v1::ReportTrainerProgressRequest NewReport(v1::TrainerState state) {
    v1::ReportTrainerProgressRequest report;
    report.set_run_id(run_id_);
    report.set_state(state);
    absl::MutexLock lock(&mu_);
    report.set_warm_start_step(status_.warm_start_step());
    report.set_policy_version(status_.policy_version());
    return report;
  }

  void Report(v1::TrainerState state) { Send(NewReport(state)); }

  // Progress reports are best effort: a controller that is briefly away must
  // not stop training (its health watchdog fails the run if it is gone), but
  // a controller that says the run is over stops it.
  void Send(const v1::ReportTrainerProgressRequest& report) {
    if (deps_.controller == nullptr) return;
    auto response = deps_.controller->ReportTrainerProgress(report);
    if (!response.ok()) {
      log::Warning("could not report progress to the controller",
                   {{"run_id", run_id_}, {"error", std::string(response.status().message())}});
      return;
    }
    if (response->stop() && report.state() != v1::TRAINER_STATE_FINISHED &&
        report.state() != v1::TRAINER_STATE_FAILED) {
      log::Info("controller asked to stop the run", {{"run_id", run_id_}});
      Stop(/*checkpoint=*/false);
    }
  }

  const std::string run_id_;
  const v1::RunSpec spec_;
  TrainerRunDeps deps_;
  std::atomic<bool> stop_{false};
  // Notified with stop_: what a wait between retries waits on.
  absl::Notification stopped_;
  std::atomic<bool> checkpoint_on_stop_{false};
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  std::vector<int32_t> stop_token_ids_;
  int32_t pad_id_ = 0;
  // Tokenizer files every checkpoint carries (run::CheckpointSideFiles).
  std::map<std::string, std::string> checkpoint_side_files_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<model::Transformer> prox_model_;  // decoupled PPO, > 1 minibatch
  // The frozen policy RL started from (ObjectiveConfig::UsesReference).
  std::unique_ptr<model::Transformer> reference_model_;
  // The objective and its corrections, from the spec's algorithm.
  ObjectiveConfig objective_;
  // What Publish last published: the weights a step that went non-finite
  // goes back to.
  std::shared_ptr<const PublishedVersion> last_published_;
  std::vector<task::TaskItem> train_items_;
  std::vector<task::TaskItem> eval_items_;
  std::vector<task::TaskItem> dev_items_;
  std::vector<TokenRow> sft_rows_;
  double temperature_ = 1.0;
  int64_t max_new_tokens_ = 16;
  int64_t step_ = 0;
  int64_t last_checkpoint_step_ = -1;
  // That checkpoint was the final one (the "after" evaluation is in it).
  bool last_checkpoint_final_ = false;
  // The RL optimizer; null until RL starts (or a checkpoint brings it).
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  // Where the run's schedule stands (a checkpoint records it).
  bool warm_start_done_ = false;
  bool before_eval_done_ = false;
  int64_t last_periodic_eval_step_ = 0;
  bool after_eval_done_ = false;
  // Commit the buffer's step batches after checkpoints (periodic ones are
  // configured), else after training each.
  bool commit_after_checkpoint_ = false;
  // The last batch step the buffer accepted as committed.
  int64_t committed_batches_ = 0;
  // Steps up to this one had been trained by an earlier incarnation (the
  // buffer's policy version when this one resumed); 0 = none.
  int64_t redo_until_ = 0;
  // Bytes the run holds throughout (see CheckBatchMemory).
  int64_t resident_bytes_ = 0;
  double start_time_ = 0;

  mutable absl::Mutex mu_;
  v1::TrainerStatus status_ ABSL_GUARDED_BY(mu_);
  double busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double idle_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

TrainerRun::TrainerRun(std::string run_id, v1::RunSpec spec, TrainerRunDeps deps)
    : run_id_(run_id), impl_(std::make_unique<Impl>(std::move(run_id), std::move(spec), std::move(deps))) {}

TrainerRun::~TrainerRun() = default;

absl::Status TrainerRun::Run() { return impl_->Run(); }
void TrainerRun::Stop(bool checkpoint) { impl_->Stop(checkpoint); }
v1::TrainerStatus TrainerRun::Status() const { return impl_->Status(); }

}  // namespace sluice::trainer
