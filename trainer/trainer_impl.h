// TrainerRun::Impl, internal to the trainer: one run's loop (trainer.cc: loading,
// warm start, evaluation, publishing, reporting), its RL steps (trainer_rl.cc)
// and its checkpoints and resuming (trainer_checkpoints.cc).
#ifndef SLUICE_TRAINER_TRAINER_IMPL_H_
#define SLUICE_TRAINER_TRAINER_IMPL_H_

#include "trainer/trainer.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
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
#include "common/run/run_verification.h"
#include "common/status_macros.h"
#include "common/task/arithmetic.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "google/protobuf/util/time_util.h"
#include "nlohmann/json.hpp"
#include "trainer/checkpoint.h"
#include "trainer/evaluator.h"
#include "trainer/objective.h"
#include "trainer/policy_history.h"
#include "trainer/rl_batch.h"
#include "trainer/rollout_verifier.h"
#include "trainer/step_guard.h"

namespace sluice::trainer {

class TrainerRun::Impl {
 public:
  Impl(std::string run_id, v1::RunSpec spec, TrainerRunDeps deps)
      : run_id_(std::move(run_id)), spec_(std::move(spec)), deps_(std::move(deps)) {
    status_.set_run_id(run_id_);
    status_.set_state(v1::TRAINER_STATE_LOADING);
    status_.set_policy_version(-1);
    status_.set_resumed_from_step(-1);
  }

  absl::Status Run();
  void Stop(bool checkpoint);
  v1::TrainerStatus Status() const;

 private:
  // How long a Sample call waits before the loop looks at stop_ again.
  static constexpr int64_t kSampleTimeoutMs = 1000;
  // How long the trainer keeps retrying a replay buffer that is unreachable
  // (restarting) before it fails the run.
  static constexpr double kSampleRetrySeconds = 120;

  // Wall-clock seconds since the epoch.
  static double Now();
  static void SetLearningRate(torch::optim::AdamW& optimizer, double lr);
  absl::Status RunInner();

  // ---- warm start --------------------------------------------------------

  absl::Status WarmStart();

  // ---- evaluation --------------------------------------------------------

  absl::StatusOr<v1::EvalResult> EvaluateOn(const std::vector<task::TaskItem>& items,
                                            const std::string& phase, int64_t step);
  absl::Status RunEval(const std::string& phase, int64_t step);

  // ---- publishing --------------------------------------------------------

  absl::Status Publish(int64_t version);

  // Puts the weights of the last published version back into the model.
  absl::Status RestorePublishedWeights();

  // ---- RL ----------------------------------------------------------------

  absl::Status TrainRl();

  // ---- checkpoints and resuming --------------------------------------------

  // Writes <checkpoint.dir>/step-NNNNNNNN (checkpoint.h: the HF model
  // directory and the training state next to it), durably, then prunes to
  // keep_last and commits the batches it covers to the buffer. Nothing to do
  // without a checkpoint dir, or when this step is already written (but a
  // final checkpoint replaces a stopped one of the same step: it records the
  // "after" evaluation).
  absl::Status WriteCheckpoint(absl::string_view why);

  // Tells the buffer that the batches of steps up to `batch_step` are
  // trained for good (checkpointed, or with no checkpoint to resume from):
  // it lets go of them. Best effort: a failed commit is covered by the next
  // one, and until then the buffer only keeps more than it needs.
  void CommitBatches(int64_t batch_step);

  // When the buffer's step position is behind `batch_step` (its journal was
  // lost: it recorded nothing of the steps this trainer trained), commits
  // the steps before it there and returns true; false when the buffer is
  // where it should be (the refusal was for another reason). The batches of
  // the steps since the last checkpoint are gone with the journal: a later
  // resume from that checkpoint is refused rather than redone on other data.
  absl::StatusOr<bool> ReanchorSteps(int64_t batch_step);
  int Minibatches() const { return std::max(1, spec_.algorithm().minibatches_per_batch()); }

  std::unique_ptr<torch::optim::AdamW> NewRlOptimizer(const model::Transformer& model) const;

  // Decoupled PPO recomputing pi_prox over several minibatches keeps the
  // weights of the batch's start for the later minibatches.
  bool NeedsProximalModel() const { return run::KeepsProximalPolicy(spec_.algorithm()); }

  // The buffer's account of the run (empty when it does not know it),
  // riding out a buffer that is restarting as sampling does.
  absl::StatusOr<v1::BufferStats> ReadBufferStats();

  // Resumes from the newest checkpoint of this run that loads (checkpoint.h),
  // when checkpoint.resume allows and there is one; true when it did. Refuses
  // (FAILED_PRECONDITION, PlanResume) a run the buffer says was trained past
  // version 0 that cannot be continued losslessly.
  absl::StatusOr<bool> Resume();

  // One optimizer step on groups [begin, end) of `batch`, whose first
  // minibatch started at version `batch_start_version` (v_prox).
  absl::StatusOr<v1::TrainingStepMetrics> TrainStep(const v1::SampleResponse& batch, int begin,
                                                    int end, torch::optim::AdamW& optimizer,
                                                    double wait_seconds,
                                                    int64_t batch_start_version);

  // ---- rollout verification (trainer_verification.cc) ----------------------

  // From the spec's algorithm.rollout_verification; keeps no history when
  // verification is off.
  void ConfigureVerification();

  // Verifies the chosen groups of `batch` (rollout_verifier.h) against the
  // versions they claim, counts them per worker, quarantines a worker whose
  // failed groups reach the threshold, and removes the failed groups from
  // `batch`: they are not trained on. The buffer's account is unchanged (it
  // handed the batch out for `batch_step`; commits are per step). Returns
  // the step's verification figures (only those fields set).
  v1::TrainingStepMetrics VerifyBatch(v1::SampleResponse& batch, int64_t batch_step);

  // ---- memory ------------------------------------------------------------

  // RESOURCE_EXHAUSTED when the forward and backward of `rows` (padded to
  // the longest) would not fit what the budget leaves after what the run
  // holds throughout; OK without a budget.
  absl::Status CheckBatchMemory(const std::string& what, const std::vector<TokenRow>& rows,
                                const std::vector<std::string>& fields,
                                bool entropy_gradient = false) const;

  // ---- reporting ---------------------------------------------------------

  void SetState(v1::TrainerState state);
  v1::ReportTrainerProgressRequest NewReport(v1::TrainerState state);
  void Report(v1::TrainerState state) { Send(NewReport(state)); }

  // Progress reports are best effort: a controller that is briefly away must
  // not stop training (its health watchdog fails the run if it is gone), but
  // a controller that says the run is over stops it.
  void Send(const v1::ReportTrainerProgressRequest& report);
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
  // Where the run's models live (run_placement.h): the policy, its
  // proximal and reference copies.
  model::ModelPlacement placement_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<model::Transformer> prox_model_;  // decoupled PPO, > 1 minibatch
  // The frozen policy RL started from (ObjectiveConfig::UsesReference).
  std::unique_ptr<model::Transformer> reference_model_;
  // The objective and its corrections, from the spec's algorithm.
  ObjectiveConfig objective_;
  // What Publish last published: the weights a step that went non-finite
  // goes back to.
  std::shared_ptr<const PublishedVersion> last_published_;
  // Its float32 weights when it was published in bf16 / f16 (empty for a
  // float32 version, whose bytes are them): one float32 copy of the model,
  // against the published versions' halved size.
  std::vector<std::string> last_published_float32_;
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
  // Rollout verification: the fractions of groups verified by trust
  // (run_verification.h), the verifier's options, the weights of recent
  // versions (null when nothing is verified), and per attribution
  // (Group.inserted_by: an authenticated worker, or a connection) the groups
  // verified and failed, and who is quarantined (in that order): workers by
  // their authenticated identity, connections by address; a worker id that
  // nobody proved is never quarantined. The counts live with this
  // incarnation; the buffer keeps the quarantine.
  run::RolloutVerificationPolicy verify_policy_;
  RolloutVerifierOptions verify_options_;
  int64_t quarantine_after_failed_groups_ = 3;
  std::unique_ptr<PolicyHistory> policy_history_;
  struct WorkerVerificationCounts {
    int64_t verified = 0;
    int64_t failed = 0;
  };
  std::map<std::string, WorkerVerificationCounts> worker_verification_;
  std::vector<std::string> quarantined_workers_;
  std::vector<std::string> quarantined_connections_;
  // Bytes the run holds throughout (see CheckBatchMemory).
  int64_t resident_bytes_ = 0;
  double start_time_ = 0;
  mutable absl::Mutex mu_;
  v1::TrainerStatus status_ ABSL_GUARDED_BY(mu_);
  double busy_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  double idle_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAINER_IMPL_H_
