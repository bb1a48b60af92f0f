// TrainerRun::Impl's checkpoints and resuming: writing, pruning, committing
// trained batches to the buffer, and picking a run up where it stopped.
#include "trainer/trainer_impl.h"

namespace sluice::trainer {

absl::Status TrainerRun::Impl::WriteCheckpoint(absl::string_view why) {
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

void TrainerRun::Impl::CommitBatches(int64_t batch_step) {
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

absl::StatusOr<bool> TrainerRun::Impl::ReanchorSteps(int64_t batch_step) {
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

std::unique_ptr<torch::optim::AdamW> TrainerRun::Impl::NewRlOptimizer(
    const model::Transformer& model) const {
  const auto& alg = spec_.algorithm();
  return std::make_unique<torch::optim::AdamW>(
      model.parameter_tensors(), torch::optim::AdamWOptions(alg.learning_rate())
                                     .betas({0.9, 0.99})
                                     .weight_decay(alg.weight_decay()));
}

absl::StatusOr<v1::BufferStats> TrainerRun::Impl::ReadBufferStats() {
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

absl::StatusOr<bool> TrainerRun::Impl::Resume() {
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
                     model::Transformer::CreateUninitialized(model_->config(), placement_));
    std::unique_ptr<torch::optim::AdamW> optimizer = NewRlOptimizer(*model);
    std::unique_ptr<model::Transformer> proximal;
    if (NeedsProximalModel()) {
      ASSIGN_OR_RETURN(proximal,
                       model::Transformer::CreateUninitialized(model_->config(), placement_));
    }
    std::unique_ptr<model::Transformer> reference;
    if (objective_.UsesReference()) {
      ASSIGN_OR_RETURN(reference,
                       model::Transformer::CreateUninitialized(model_->config(), placement_));
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

}  // namespace sluice::trainer
