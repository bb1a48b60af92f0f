#ifndef SLUICE_TRAINER_CHECKPOINT_H_
#define SLUICE_TRAINER_CHECKPOINT_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/hf_checkpoint.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/replay_buffer.pb.h"

namespace torch::optim {
class AdamW;
}  // namespace torch::optim

namespace sluice::model {
class Transformer;
}  // namespace sluice::model

// The trainer's checkpoints and how a run resumes from one.
//
// A checkpoint is <checkpoint.dir>/step-NNNNNNNN/, a complete Hugging Face
// model directory (config.json, safetensors, the tokenizer files: loadable
// as it is by transformers, vLLM or SGLang, or by a later run as
// model.hf_model_dir) with the training state next to it:
//
//   trainer_state.json   TrainerCheckpointState: run, step, policy version,
//                        warm start and evaluations done, the files below
//   optimizer.pt         AdamW's state (moments and step count per
//                        parameter), a LibTorch archive; absent before the
//                        first RL step (there is no state yet)
//   rng.pt               the LibTorch CPU generator's state
//   weights_fp32.pt      the float32 weights, when model.dtype makes the
//                        safetensors lossy (bfloat16, float16)
//   proximal.pt          the weights at the start of the batch, when the
//                        checkpoint falls between two minibatches of a batch
//                        (decoupled PPO with minibatches_per_batch > 1)
//
// Everything else a run computes is a function of its spec and its seed
// (the model's initialisation, the warm start's sampling of SFT rows,
// evaluation sampling seeded by the step), so these files and the replay
// buffer's recorded batches (SampleRequest.step) are all a resume needs to
// continue exactly where the checkpoint was taken.
//
// Written under a hidden temporary name, every file and the directory
// fsynced, then renamed: a directory named step-* is complete and durable,
// which is what lets the trainer commit its steps to the buffer right
// after (CommitTrainedSteps).

namespace sluice::trainer {

// trainer_state.json.
struct TrainerCheckpointState {
  // 1: written before resuming existed (no training state: not resumable).
  static constexpr int kFormatVersion = 2;
  int format_version = kFormatVersion;
  std::string run_id;
  std::string run_name;
  // RL optimizer steps trained; the policy version the weights are.
  int64_t step = 0;
  int64_t policy_version = 0;
  // periodic, final or stopped.
  std::string reason;
  std::string source_model;
  std::string written_at;
  bool warm_start_done = false;
  int64_t warm_start_steps = 0;
  // The evaluation schedule: "before" done, the last periodic evaluation's
  // step (0 = none), "after" done.
  bool before_eval_done = false;
  int64_t last_periodic_eval_step = 0;
  bool after_eval_done = false;
  // Steps per sampled batch; step % minibatches_per_batch != 0 means the
  // checkpoint is inside a batch (proximal_file then holds its start).
  int32_t minibatches_per_batch = 1;
  // The training state's files in the directory; "" = absent.
  std::string optimizer_file;
  std::string rng_file;
  std::string weights_file;
  std::string proximal_file;

  std::string ToJson() const;
  // INVALID_ARGUMENT naming the field for text that is not such a state.
  static absl::StatusOr<TrainerCheckpointState> FromJson(const std::string& text);

  // Batches (SampleRequest.step) this checkpoint's weights have fully
  // trained on: the steps the trainer commits to the buffer.
  int64_t batch_steps() const { return step / std::max(1, minibatches_per_batch); }
};

// What the training loop hands WriteCheckpointDirectory.
struct CheckpointContents {
  const model::Transformer* model = nullptr;
  // Null before the first RL step.
  const torch::optim::AdamW* optimizer = nullptr;
  // Non-null only inside a batch (see proximal.pt).
  const model::Transformer* proximal = nullptr;
  // HF files: dtype, shard size, tokenizer files.
  model::SaveHfOptions hf;
};

struct WrittenCheckpoint {
  std::string path;
  int64_t size_bytes = 0;
};

// Writes <root>/step-NNNNNNNN (see the file comment); `state` gets the file
// names filled in. Replaces an existing directory of the same step. INTERNAL
// naming the path for an I/O error (the temporary directory is removed).
absl::StatusOr<WrittenCheckpoint> WriteCheckpointDirectory(const std::string& root,
                                                           TrainerCheckpointState state,
                                                           const CheckpointContents& contents);

// Removes all but the newest `keep` step-* directories of `root` (0 = keep
// all); what cannot be removed is logged.
void PruneCheckpoints(const std::string& root, int keep);

// A checkpoint of the run found in checkpoint.dir.
struct FoundCheckpoint {
  std::string path;
  TrainerCheckpointState state;
};

// The step-* directories of `root` holding a resumable checkpoint of
// `run_id`, newest first. Checkpoints of other runs are left out quietly;
// this run's that cannot be resumed from (unreadable trainer_state.json, an
// older format, a missing file, a warm start cut short) are left out with a
// line each in `warnings`. Reads only trainer_state.json and lists files.
std::vector<FoundCheckpoint> FindRunCheckpoints(const std::string& root, const std::string& run_id,
                                                std::vector<std::string>* warnings);

// Puts a checkpoint's weights into `model` (float32: weights_fp32.pt when
// present, else the safetensors), its optimizer state into `optimizer`
// (when it has one; `optimizer` must be built over model's parameters) and
// its proximal weights into `proximal` (when it has them; required then),
// and restores the LibTorch CPU generator. DATA_LOSS naming the file for
// one that does not load or does not match the model.
absl::Status LoadCheckpoint(const FoundCheckpoint& checkpoint, model::Transformer& model,
                            torch::optim::AdamW& optimizer, model::Transformer* proximal);

// How a (re)started run begins, from the checkpoints found and what the
// replay buffer knows of the run.
struct ResumePlan {
  // Newest first; empty: start from the model source.
  std::vector<FoundCheckpoint> candidates;
  // The buffer's policy version: the previous incarnations trained up to it.
  int64_t buffer_policy_version = 0;
};

// FAILED_PRECONDITION, naming the run, checkpoint.dir and the buffer's
// position, when the run cannot continue losslessly:
//  - no usable checkpoint (or checkpoint.resume is false) while the buffer
//    says the run already trained past version 0: "cannot resume
//    losslessly: no checkpoint of run X in DIR; the replay buffer is at
//    version N";
//  - the newest usable checkpoint is older than what the buffer was told to
//    let go of (its batches are gone).
// Pure: the caller lists the checkpoints (FindRunCheckpoints) and reads the
// buffer's stats (empty when the buffer does not know the run).
absl::StatusOr<ResumePlan> PlanResume(const std::string& run_id, const v1::RunSpec& spec,
                                      std::vector<FoundCheckpoint> found,
                                      const v1::BufferStats& buffer,
                                      const std::vector<std::string>& warnings);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_CHECKPOINT_H_
