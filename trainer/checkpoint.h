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
#include "common/model/transformer.h"
#include "trainer/checkpoint_state.h"

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
//   reference.pt         the frozen reference policy (the weights when RL
//                        started), when the run keeps one (kl_coef > 0, or
//                        trajectory balance with tb_use_reference): it is
//                        not a function of the spec once the weights moved
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

// What the training loop hands WriteCheckpointDirectory.
struct CheckpointContents {
  const model::Transformer* model = nullptr;
  // Null before the first RL step.
  const torch::optim::AdamW* optimizer = nullptr;
  // Non-null only inside a batch (see proximal.pt).
  const model::Transformer* proximal = nullptr;
  // Non-null when the run keeps a reference policy (see reference.pt).
  const model::Transformer* reference = nullptr;
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

// Puts a checkpoint's weights into `model` (float32: weights_fp32.pt when
// present, else the safetensors), its optimizer state into `optimizer`
// (when it has one; `optimizer` must be built over model's parameters), its
// proximal weights into `proximal` (when it has them; required then) and its
// reference policy into `reference` (non-null exactly when the run keeps
// one: a checkpoint without reference.pt then does not load, nor one with
// it for a run that keeps none), and restores the LibTorch CPU generator.
// DATA_LOSS naming the file for one that does not load or does not match
// the model.
absl::Status LoadCheckpoint(const FoundCheckpoint& checkpoint, model::Transformer& model,
                            torch::optim::AdamW& optimizer, model::Transformer* proximal,
                            model::Transformer* reference = nullptr);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_CHECKPOINT_H_
