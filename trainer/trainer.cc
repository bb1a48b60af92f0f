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
#include "trainer/advantages.h"
#include "trainer/evaluator.h"
#include "trainer/policy_loss.h"
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

WeightCapMode ToCapMode(v1::BehaviourWeightMode mode) {
  switch (mode) {
    case v1::BEHAVIOUR_WEIGHT_MODE_MASK:
      return WeightCapMode::kMask;
    case v1::BEHAVIOUR_WEIGHT_MODE_NONE:
      return WeightCapMode::kNone;
    default:
      return WeightCapMode::kTruncate;
  }
}

// Right-padded token rows and, per row, where its trained tokens start.
struct PaddedBatch {
  torch::Tensor inputs;   // [R, L-1]: the sequence minus its last token
  torch::Tensor targets;  // [R, L-1]: the sequence shifted by one
  torch::Tensor mask;     // [R, L-1]: 1 where the target is a trained token
  int64_t real_tokens = 0;
};

// `rows[r]` = prefix ++ trained; the loss covers the `trained` part.
PaddedBatch PadRows(const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& rows,
                    int32_t pad_id) {
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

// Scatters per-completion-token values (logprobs) into the [R, L-1] target
// layout of PadRows: completion token j of row r sits at target index
// prefix_r - 1 + j.
torch::Tensor ScatterCompletionValues(const std::vector<std::vector<float>>& values,
                                      const std::vector<int64_t>& prefix_lengths, int64_t width) {
  const int64_t r_count = static_cast<int64_t>(values.size());
  std::vector<float> out(r_count * width, 0.0f);
  for (int64_t r = 0; r < r_count; ++r) {
    for (size_t j = 0; j < values[r].size(); ++j) {
      const int64_t t = prefix_lengths[r] - 1 + static_cast<int64_t>(j);
      if (t < width) out[r * width + t] = values[r][j];
    }
  }
  return torch::from_blob(out.data(), {r_count, width}, torch::kFloat32).clone();
}

}  // namespace

class TrainerRun::Impl {
 public:
  Impl(std::string run_id, v1::RunSpec spec, TrainerRunDeps deps)
      : run_id_(std::move(run_id)), spec_(std::move(spec)), deps_(std::move(deps)) {
    status_.set_run_id(run_id_);
    status_.set_state(v1::TRAINER_STATE_LOADING);
    status_.set_policy_version(-1);
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
    WarnAboutExistingCheckpoints();
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

    if (spec_.warm_start().sft_steps() > 0) RETURN_IF_ERROR(WarmStart());
    RETURN_IF_ERROR(RunEval("before", 0));
    RETURN_IF_ERROR(Publish(0));
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
      std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> rows;
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
    torch::optim::AdamW optimizer(
        model_->parameter_tensors(),
        torch::optim::AdamWOptions(alg.learning_rate()).betas({0.9, 0.99}).weight_decay(alg.weight_decay()));
    const int minibatches = std::max(1, alg.minibatches_per_batch());
    if (minibatches > 1 && alg.objective() != v1::OBJECTIVE_GRPO) {
      // Later minibatches of a batch need the log-probs of the weights as
      // they were before its first update: keep a copy of those weights.
      ASSIGN_OR_RETURN(prox_model_, model::Transformer::CreateUninitialized(model_->config()));
    }
    SetState(v1::TRAINER_STATE_WAITING_FOR_DATA);
    Report(v1::TRAINER_STATE_WAITING_FOR_DATA);
    while (step_ < alg.total_steps()) {
      if (stop_.load()) return absl::CancelledError("stopped");
      // 1. A batch of B groups, none staler than eta.
      SetState(v1::TRAINER_STATE_WAITING_FOR_DATA);
      const double wait_start = Now();
      v1::SampleResponse batch;
      double failing_since = -1;
      while (true) {
        if (stop_.load()) return absl::CancelledError("stopped");
        v1::SampleRequest request;
        request.set_run_id(run_id_);
        request.set_batch_size_groups(alg.batch_size_groups());
        request.set_max_staleness(alg.max_staleness());
        request.set_trainer_policy_version(step_);
        request.set_timeout_ms(kSampleTimeoutMs);
        absl::StatusOr<v1::SampleResponse> sampled = deps_.buffer->Sample(request);
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
      if (prox_model_ != nullptr) RETURN_IF_ERROR(prox_model_->LoadWeights(model_->parameters()));
      for (int m = 0; m < minibatches && step_ < alg.total_steps(); ++m) {
        // A stop is seen between minibatches, not only between batches.
        if (stop_.load()) return absl::CancelledError("stopped");
        const int begin = groups * m / minibatches;
        const int end = groups * (m + 1) / minibatches;
        ASSIGN_OR_RETURN(v1::TrainingStepMetrics metrics,
                         TrainStep(batch, begin, end, optimizer, m == 0 ? wait_seconds : 0.0));
        if (deps_.on_step) deps_.on_step(metrics);
        v1::ReportTrainerProgressRequest report = NewReport(v1::TRAINER_STATE_TRAINING);
        *report.mutable_step() = metrics;
        Send(report);
        const int64_t every = spec_.eval().every_n_steps();
        if (every > 0 && step_ % every == 0 && step_ < alg.total_steps()) {
          RETURN_IF_ERROR(RunEval("periodic", step_));
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
    }
    RETURN_IF_ERROR(RunEval("after", step_));
    return WriteCheckpoint("final");
  }

  // ---- checkpoints -------------------------------------------------------

  // Writes the model as a complete Hugging Face directory
  // <checkpoint.dir>/step-NNNNNNNN (config.json, safetensors, the tokenizer
  // files, and trainer_state.json with the step and run), loadable unchanged
  // by transformers, vLLM or SGLang and by a later run as hf_model_dir. It is
  // written under a hidden temporary name and renamed, so a directory named
  // step-* is always complete; then all but the newest keep_last are
  // removed. Nothing to do without a checkpoint dir, or when this step is
  // already written.
  absl::Status WriteCheckpoint(absl::string_view why) {
    namespace fs = std::filesystem;
    const v1::CheckpointConfig& config = spec_.checkpoint();
    if (config.dir().empty() || model_ == nullptr || step_ == last_checkpoint_step_) {
      return absl::OkStatus();
    }
    const v1::TrainerState previous = Status().state();
    SetState(v1::TRAINER_STATE_CHECKPOINTING);
    const double start = Now();
    const std::string name = absl::StrFormat("step-%08d", step_);
    const fs::path root(config.dir());
    const fs::path final_dir = root / name;
    const fs::path temp_dir = root / absl::StrCat(".", name, ".tmp");
    std::error_code error;
    fs::remove_all(temp_dir, error);

    model::SaveHfOptions options;
    switch (spec_.model().dtype()) {
      case v1::DTYPE_BFLOAT16:
        options.dtype = model::DType::kBF16;
        break;
      case v1::DTYPE_FLOAT16:
        options.dtype = model::DType::kF16;
        break;
      default:
        options.dtype = model::DType::kF32;  // What the trainer computes in.
    }
    options.max_shard_bytes = int64_t{5} << 30;  // save_pretrained's default "5GB".
    options.extra_contents = checkpoint_side_files_;
    nlohmann::ordered_json state = {
        {"run_id", run_id_},
        {"run_name", spec_.name()},
        {"step", step_},
        {"policy_version", step_},
        {"reason", std::string(why)},
        {"source_model", spec_.model().has_hf_model_dir() ? spec_.model().hf_model_dir()
                                                          : spec_.model().builtin()},
        {"written_at", absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone())}};
    options.extra_contents["trainer_state.json"] = state.dump(2) + "\n";
    absl::Status status = model::SaveHfModel(temp_dir.string(), *model_, options);
    if (status.ok()) {
      fs::remove_all(final_dir, error);
      fs::rename(temp_dir, final_dir, error);
      if (error) {
        status = absl::InternalError(absl::StrCat("cannot rename ", temp_dir.string(), " to ",
                                                  final_dir.string(), ": ", error.message()));
      }
    }
    SetState(previous);
    if (!status.ok()) {
      fs::remove_all(temp_dir, error);
      return absl::Status(status.code(), absl::StrCat("checkpoint at step ", step_, ": ",
                                                      status.message()));
    }
    last_checkpoint_step_ = step_;
    {
      absl::MutexLock lock(&mu_);
      status_.set_last_checkpoint_step(step_);
    }
    log::Info("checkpoint written", {{"run_id", run_id_},
                                     {"step", step_},
                                     {"reason", std::string(why)},
                                     {"dir", final_dir.string()},
                                     {"seconds", Now() - start}});
    PruneCheckpoints(root, config.keep_last());
    return absl::OkStatus();
  }

  // checkpoint.resume is not implemented: a run always starts from its
  // model source. Say so when there is something it could have resumed.
  void WarnAboutExistingCheckpoints() {
    namespace fs = std::filesystem;
    const v1::CheckpointConfig& config = spec_.checkpoint();
    if (config.dir().empty() || !config.resume()) return;
    std::error_code error;
    for (const fs::directory_entry& entry : fs::directory_iterator(config.dir(), error)) {
      if (!absl::StartsWith(entry.path().filename().string(), "step-")) continue;
      log::Warning("checkpoint.dir already holds checkpoints; resuming is not supported yet, so "
                   "this run starts from its model source (to continue from a checkpoint, name "
                   "its directory as model.hf_model_dir)",
                   {{"run_id", run_id_}, {"dir", config.dir()}});
      return;
    }
  }

  // Removes all but the newest `keep` step-* directories (0 = keep all).
  void PruneCheckpoints(const std::filesystem::path& root, int keep) {
    namespace fs = std::filesystem;
    if (keep <= 0) return;
    std::vector<std::pair<int64_t, fs::path>> steps;
    std::error_code error;
    for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
      const std::string name = entry.path().filename().string();
      int64_t step = 0;
      if (!entry.is_directory(error) || !absl::StartsWith(name, "step-") ||
          !absl::SimpleAtoi(name.substr(5), &step)) {
        continue;
      }
      steps.emplace_back(step, entry.path());
    }
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + keep < steps.size(); ++i) {
      fs::remove_all(steps[i].second, error);
      if (error) {
        log::Warning("could not remove an old checkpoint",
                     {{"dir", steps[i].second.string()}, {"error", error.message()}});
      }
    }
  }

  absl::StatusOr<v1::TrainingStepMetrics> TrainStep(const v1::SampleResponse& batch, int begin,
                                                    int end, torch::optim::AdamW& optimizer,
                                                    double wait_seconds) {
    const auto& alg = spec_.algorithm();
    const double compute_start = Now();
    v1::TrainingStepMetrics metrics;
    // Rewards, advantages, staleness over the minibatch's groups.
    std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> rows;
    std::vector<std::vector<float>> behaviour;
    std::vector<std::vector<float>> advantage_rows;
    std::vector<int64_t> prefix_lengths;
    std::map<int64_t, int64_t> staleness_counts;
    double reward_sum = 0;
    int64_t trajectories = 0;
    int64_t passed = 0;
    int64_t staleness_sum = 0;
    int64_t staleness_max = 0;
    int64_t zero_advantage = 0;
    int64_t completion_tokens = 0;
    const bool normalize = !alg.has_normalize_advantage_by_std() || alg.normalize_advantage_by_std();
    int64_t groups_invalid = 0;
    std::vector<std::string> group_ids;
    const int64_t vocab_size = model_->config().vocab_size;
    for (int g = begin; g < end; ++g) {
      const v1::SampledGroup& sampled = batch.groups(g);
      group_ids.push_back(sampled.group().group_id());
      if (absl::Status trainable = CheckTrainableGroup(sampled.group(), vocab_size, step_);
          !trainable.ok()) {
        // The buffer refuses such groups; one that got past it is left out
        // rather than failing the run or poisoning the step.
        ++groups_invalid;
        log::Warning("left an untrainable group out of the batch",
                     {{"run_id", run_id_},
                      {"step", step_ + 1},
                      {"group", sampled.group().group_id()},
                      {"error", std::string(trainable.message())}});
        continue;
      }
      const int64_t staleness = sampled.staleness();
      staleness_counts[staleness]++;
      staleness_sum += staleness;
      staleness_max = std::max(staleness_max, staleness);
      std::vector<double> rewards;
      for (const auto& t : sampled.group().trajectories()) {
        rewards.push_back(t.reward());
        reward_sum += t.reward();
        passed += t.reward() >= 1.0 - 1e-9 ? 1 : 0;
        ++trajectories;
        completion_tokens += t.completion_token_ids_size();
      }
      if (IsUniform(rewards)) {
        ++zero_advantage;
        continue;
      }
      const std::vector<double> adv = GroupAdvantages(rewards, normalize, alg.advantage_eps());
      int i = 0;
      for (const auto& t : sampled.group().trajectories()) {
        const double a = adv[i++];
        if (t.finish_reason() == v1::FINISH_REASON_ABORTED || t.completion_token_ids_size() == 0) {
          continue;  // excluded from the loss
        }
        rows.emplace_back(std::vector<int32_t>(t.prompt_token_ids().begin(), t.prompt_token_ids().end()),
                          std::vector<int32_t>(t.completion_token_ids().begin(),
                                               t.completion_token_ids().end()));
        prefix_lengths.push_back(t.prompt_token_ids_size());
        behaviour.emplace_back(t.behaviour_logprobs().begin(), t.behaviour_logprobs().end());
        advantage_rows.emplace_back(t.completion_token_ids_size(), static_cast<float>(a));
      }
    }
    const int64_t groups = end - begin;
    double lr = alg.learning_rate();
    if (alg.lr_warmup_steps() > 0) {
      lr *= std::min(1.0, double(step_ + 1) / double(alg.lr_warmup_steps()));
    }
    double loss_value = 0;
    double grad_norm = 0;
    int64_t tokens_trained = 0;
    std::string update_skipped;  // why, when the step made no update
    if (!rows.empty()) {
      RETURN_IF_ERROR(CheckBatchMemory(
          absl::StrCat("step ", step_ + 1), rows,
          {"algorithm.batch_size_groups", "algorithm.minibatches_per_batch (raise it)",
           "algorithm.group_size", "rollout.sampling.max_new_tokens"}));
      PaddedBatch padded = PadRows(rows, pad_id_);
      tokens_trained = padded.real_tokens;
      const int64_t width = padded.inputs.size(1);
      torch::Tensor behav = ScatterCompletionValues(behaviour, prefix_lengths, width);
      torch::Tensor advantages = ScatterCompletionValues(advantage_rows, prefix_lengths, width);
      SetLearningRate(optimizer, lr);
      optimizer.zero_grad();
      torch::Tensor logits = model_->Forward(padded.inputs);
      torch::Tensor logp = model::TokenLogProbs(logits, padded.targets, temperature_);
      // The proximal policy: the weights before this batch's first update.
      // GRPO uses the behaviour policy instead. With one minibatch per batch
      // the proximal weights are the current ones, so their log-probs are
      // this forward pass's, detached (no second forward).
      torch::Tensor prox;
      if (alg.objective() == v1::OBJECTIVE_GRPO) {
        prox = behav;
      } else if (prox_model_ == nullptr) {
        prox = logp.detach();
      } else {
        torch::NoGradGuard no_grad;
        prox = model::TokenLogProbs(prox_model_->Forward(padded.inputs), padded.targets,
                                    temperature_);
      }
      PolicyLossOptions loss_options;
      loss_options.clip_eps_low = alg.clip_eps_low();
      loss_options.clip_eps_high = alg.clip_eps_high() > 0 ? alg.clip_eps_high() : alg.clip_eps_low();
      loss_options.behaviour_weight_cap = alg.behaviour_weight_cap();
      loss_options.cap_mode = ToCapMode(alg.behaviour_weight_mode());
      PolicyLoss loss = DecoupledPpoLoss(logp, prox, behav, advantages, padded.mask, loss_options);
      loss.loss.backward();
      const double clip = alg.has_grad_clip_norm() ? alg.grad_clip_norm() : 1.0;
      grad_norm = clip > 0 ? torch::nn::utils::clip_grad_norm_(model_->parameter_tensors(), clip)
                           : torch::nn::utils::clip_grad_norm_(model_->parameter_tensors(),
                                                               std::numeric_limits<double>::infinity());
      loss_value = loss.loss.item<double>();
      ASSIGN_OR_RETURN(update_skipped,
                       GuardedStep(optimizer, model_->parameters(), loss_value, grad_norm,
                                   [this] { return RestorePublishedWeights(); }));
      {
        torch::NoGradGuard no_grad;
        const torch::Tensor entropy = model::Entropy(logits.detach(), temperature_);
        metrics.set_entropy((entropy * padded.mask).sum().item<double>() /
                            std::max(1.0, padded.mask.sum().item<double>()));
      }
      metrics.set_clip_fraction(loss.clip_fraction);
      metrics.set_behaviour_weight_capped_fraction(loss.capped_fraction);
      metrics.set_kl_to_behaviour(loss.kl_to_behaviour);
    }
    if (!update_skipped.empty()) {
      log::Warning("skipped the update of a step: it would have made the weights non-finite; "
                   "the version is published with the previous weights",
                   {{"run_id", run_id_},
                    {"step", step_ + 1},
                    {"why", update_skipped},
                    {"groups", absl::StrJoin(group_ids, ",")}});
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
    metrics.set_reward_mean(trajectories > 0 ? reward_sum / trajectories : 0.0);
    metrics.set_pass_rate(trajectories > 0 ? double(passed) / trajectories : 0.0);
    metrics.set_grad_norm(grad_norm);
    metrics.set_learning_rate(lr);
    for (int64_t s = 0; s <= staleness_max; ++s) metrics.add_staleness_histogram(staleness_counts[s]);
    metrics.set_staleness_mean(groups > 0 ? double(staleness_sum) / groups : 0.0);
    metrics.set_staleness_max(staleness_max);
    metrics.set_groups(groups);
    metrics.set_groups_zero_advantage(zero_advantage);
    metrics.set_completion_tokens(completion_tokens);
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
  absl::Status CheckBatchMemory(
      const std::string& what,
      const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& rows,
      const std::vector<std::string>& fields) const {
    if (deps_.memory_budget_bytes <= 0 || rows.empty()) return absl::OkStatus();
    size_t longest = 0;
    for (const auto& [prefix, trained] : rows) {
      longest = std::max(longest, prefix.size() + trained.size());
    }
    const int64_t sequences = static_cast<int64_t>(rows.size());
    const int64_t tokens = std::max<int64_t>(1, static_cast<int64_t>(longest) - 1);
    const int64_t needed = run::TrainingBatchBytes(model_->config(), sequences, tokens);
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
  // What Publish last published: the weights a step that went non-finite
  // goes back to.
  std::shared_ptr<const PublishedVersion> last_published_;
  std::vector<task::TaskItem> train_items_;
  std::vector<task::TaskItem> eval_items_;
  std::vector<task::TaskItem> dev_items_;
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> sft_rows_;
  double temperature_ = 1.0;
  int64_t max_new_tokens_ = 16;
  int64_t step_ = 0;
  int64_t last_checkpoint_step_ = -1;
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
