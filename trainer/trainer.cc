#include "trainer/trainer.h"

#include "common/run/run_placement.h"
#include "common/run/run_weight_sync.h"
#include "services/weights/weight_dtype.h"
#include "trainer/trainer_impl.h"

namespace sluice::trainer {
namespace {

using google::protobuf::util::TimeUtil;

// The warm start checks its dev accuracy this often (and after its last step);
// accuracy jumps sharply during SFT, so checks are frequent (each costs ~0.1 s).
constexpr int64_t kWarmStartCheckEvery = 10;
// Size of the dev split (taken from the head of the training pool; the
// held-out eval split is never touched before "before").
constexpr size_t kDevSplitSize = 200;

}  // namespace

double TrainerRun::Impl::Now() { return absl::ToUnixMicros(absl::Now()) / 1e6; }

void TrainerRun::Impl::SetLearningRate(torch::optim::AdamW& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

absl::Status TrainerRun::Impl::Run() {
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

void TrainerRun::Impl::Stop(bool checkpoint) {
  if (checkpoint) checkpoint_on_stop_.store(true);
  if (!stop_.exchange(true)) stopped_.Notify();  // The first Stop notifies.
  if (deps_.buffer != nullptr) deps_.buffer->CancelSample();
}

v1::TrainerStatus TrainerRun::Impl::Status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status TrainerRun::Impl::RunInner() {
  // Model, tokenizer, task: all deterministic in the run's spec and seed.
  const double load_start = Now();
  {
    absl::StatusOr<model::ModelPlacement> placement = run::RunModelPlacement(spec_.model(), true);
    if (!placement.ok()) {
      return absl::Status(placement.status().code(),
                          absl::StrCat("model.device: ", placement.status().message()));
    }
    placement_ = *placement;
    log::Info("model placement", {{"run_id", run_id_}, {"placement", placement_.DebugString()}});
  }
  ASSIGN_OR_RETURN(tokenizer_, run::LoadRunTokenizer(spec_.model()));
  std::string model_name;
  if (spec_.model().has_hf_model_dir()) {
    model_name = spec_.model().hf_model_dir();
    absl::StatusOr<model::HfModel> loaded = model::LoadHfModel(model_name, placement_);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat("model.hf_model_dir: ", loaded.status().message()));
    }
    model_ = std::move(loaded->model);
  } else {
    model_name = spec_.model().builtin();
    ASSIGN_OR_RETURN(model::ModelConfig config, run::LoadRunModelConfig(spec_.model()));
    ASSIGN_OR_RETURN(model_, model::Transformer::Create(config, spec_.seed(), placement_));
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
  ConfigureVerification();

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
      ASSIGN_OR_RETURN(reference_model_,
                       model::Transformer::CreateUninitialized(config, placement_));
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

absl::Status TrainerRun::Impl::WarmStart() {
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
    batch.targets = batch.targets.to(placement_.device);
    batch.mask = batch.mask.to(placement_.device);
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

absl::StatusOr<v1::EvalResult> TrainerRun::Impl::EvaluateOn(
    const std::vector<task::TaskItem>& items, const std::string& phase, int64_t step) {
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

absl::Status TrainerRun::Impl::RunEval(const std::string& phase, int64_t step) {
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

absl::Status TrainerRun::Impl::Publish(int64_t version) {
  // The last line of defence (see step_guard.h): a worker sampling from a
  // non-finite weight would fail every generation.
  if (std::optional<std::string> bad = FirstNonFiniteParameter(model_->parameters())) {
    return absl::InternalError(absl::StrCat("refusing to publish version ", version, ": ",
                                            *bad, " holds a non-finite value"));
  }
  // The run's transfer dtype (weight_sync.dtype): bf16 / f16 versions are
  // rounded from the float32 weights, which stay the trainer's own.
  const run::WeightSync sync = run::ResolveWeightSync(spec_);
  auto published = std::make_shared<PublishedVersion>();
  std::vector<std::string> float32_bytes;
  uint32_t checksum = 0;
  int64_t total = 0;
  for (const auto& [name, tensor] : model_->parameters()) {
    std::string bytes = model::TensorBytes(tensor.detach());
    if (sync.dtype != v1::DTYPE_FLOAT32) {
      absl::StatusOr<std::string> narrowed = weights::Float32BytesTo(sync.dtype, bytes);
      if (!narrowed.ok()) {
        return absl::InternalError(absl::StrCat("refusing to publish version ", version, ": ", name,
                                                ": ", narrowed.status().message()));
      }
      float32_bytes.push_back(std::move(bytes));
      bytes = *std::move(narrowed);
    }
    v1::TensorSpec spec;
    spec.set_name(name);
    spec.set_dtype(sync.dtype);
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
  // Encoded once here, against the version before (the one an up-to-date
  // worker holds), and served from the cache to every worker that asks.
  if (sync.delta && last_published_ != nullptr && last_published_->info.version() < version) {
    published->delta = EncodeVersionDelta(*last_published_, *published);
  }
  last_published_ = published;
  last_published_float32_ = std::move(float32_bytes);
  if (deps_.on_published) deps_.on_published(*published);
  if (policy_history_ != nullptr) policy_history_->Add(published);
  deps_.publisher->Publish(std::move(published));
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
  for (const std::string& worker : quarantined_workers_) update.add_quarantined_worker_ids(worker);
  for (const std::string& connection : quarantined_connections_) {
    update.add_quarantined_connections(connection);
  }
  auto updated = deps_.buffer->UpdatePolicyVersion(update);
  if (!updated.ok()) return updated.status();
  return absl::OkStatus();
}

absl::Status TrainerRun::Impl::RestorePublishedWeights() {
  if (last_published_ == nullptr) {
    return absl::InternalError("no published version to restore the weights from");
  }
  std::vector<model::NamedTensor> weights;
  for (size_t i = 0; i < last_published_->tensors.size(); ++i) {
    const v1::TensorSpec& spec = last_published_->tensors[i];
    // The float32 weights a bf16 / f16 version was rounded from, so that a
    // rollback loses no precision.
    const std::string& bytes = last_published_float32_.empty() ? last_published_->bytes[i]
                                                               : last_published_float32_[i];
    ASSIGN_OR_RETURN(torch::Tensor tensor,
                     model::Float32TensorView(
                         std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), bytes));
    weights.push_back({spec.name(), std::move(tensor)});
  }
  return model_->LoadWeights(weights);
}

void TrainerRun::Impl::SetState(v1::TrainerState state) {
  absl::MutexLock lock(&mu_);
  status_.set_state(state);
}

v1::ReportTrainerProgressRequest TrainerRun::Impl::NewReport(v1::TrainerState state) {
  v1::ReportTrainerProgressRequest report;
  report.set_run_id(run_id_);
  report.set_state(state);
  absl::MutexLock lock(&mu_);
  report.set_warm_start_step(status_.warm_start_step());
  report.set_policy_version(status_.policy_version());
  // Who reports, and what it redid: the controller counts resumes and
  // redone steps from every incarnation's own reports.
  report.set_trainer_incarnation(deps_.incarnation);
  if (status_.resumed_from_step() >= 0) report.set_resumed_from_step(status_.resumed_from_step());
  report.set_steps_redone(status_.steps_redone());
  for (const std::string& worker : quarantined_workers_) report.add_quarantined_worker_ids(worker);
  return report;
}

void TrainerRun::Impl::Send(const v1::ReportTrainerProgressRequest& report) {
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

TrainerRun::TrainerRun(std::string run_id, v1::RunSpec spec, TrainerRunDeps deps)
    : run_id_(run_id), impl_(std::make_unique<Impl>(std::move(run_id), std::move(spec), std::move(deps))) {}

TrainerRun::~TrainerRun() = default;

absl::Status TrainerRun::Run() { return impl_->Run(); }
void TrainerRun::Stop(bool checkpoint) { impl_->Stop(checkpoint); }
v1::TrainerStatus TrainerRun::Status() const { return impl_->Status(); }

}  // namespace sluice::trainer
