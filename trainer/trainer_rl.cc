// TrainerRun::Impl's RL loop: sampling batches from the replay buffer, one
// optimizer step per minibatch, publishing each version, periodic evaluation.
#include "trainer/trainer_impl.h"

#include "trainer/lr_schedule.h"

namespace sluice::trainer {

absl::Status TrainerRun::Impl::TrainRl() {
  const auto& alg = spec_.algorithm();
  if (optimizer_ == nullptr) optimizer_ = NewRlOptimizer(*model_);
  const int minibatches = Minibatches();
  if (NeedsProximalModel() && prox_model_ == nullptr) {
    // Later minibatches of a batch need the log-probs of the weights as
    // they were before its first update: keep a copy of those weights.
    ASSIGN_OR_RETURN(prox_model_,
                     model::Transformer::CreateUninitialized(model_->config(), placement_));
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
    // Groups whose log-probs are not what their versions give are left out
    // before the batch is split (a resume inside a batch does not verify
    // again: the split must stay the one its first minibatches trained).
    v1::TrainingStepMetrics verification;
    if (policy_history_ != nullptr && first_minibatch == 0) {
      verification = VerifyBatch(batch, batch_step);
    }
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
        metrics.MergeFrom(verification);  // only its verification fields are set
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

absl::StatusOr<v1::TrainingStepMetrics> TrainerRun::Impl::TrainStep(
    const v1::SampleResponse& batch, int begin, int end, torch::optim::AdamW& optimizer,
    double wait_seconds, int64_t batch_start_version) {
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
  const double lr = LearningRateAt(alg, step_ + 1);
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
    // The batch is built on the host and goes to the model's device in one
    // copy per tensor; everything after stays there.
    const torch::Device device = placement_.device;
    PaddedBatch padded = PadRows(rows.rows, pad_id_);
    padded.inputs = padded.inputs.to(device);
    padded.targets = padded.targets.to(device);
    padded.mask = padded.mask.to(device);
    tokens_trained = padded.real_tokens;
    const int64_t width = padded.inputs.size(1);
    ObjectiveBatch objective_batch;
    objective_batch.mask = padded.mask;
    objective_batch.behaviour =
        ScatterCompletionValues(rows.behaviour, rows.prefix_lengths, width).to(device);
    objective_batch.versions =
        ScatterCompletionVersions(rows.versions, rows.prefix_lengths, width).to(device);
    objective_batch.advantages =
        ScatterCompletionValues(rows.advantages, rows.prefix_lengths, width).to(device);
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
  if (last_published_ != nullptr) {
    metrics.set_weight_version_bytes(last_published_->info.total_size_bytes());
    if (last_published_->delta != nullptr) {
      metrics.set_weight_delta_bytes(last_published_->delta->encoded_bytes);
      metrics.set_weight_delta_encode_seconds(last_published_->delta->encode_seconds);
    }
  }

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

absl::Status TrainerRun::Impl::CheckBatchMemory(const std::string& what,
                                                const std::vector<TokenRow>& rows,
                                                const std::vector<std::string>& fields,
                                                bool entropy_gradient) const {
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

}  // namespace sluice::trainer
