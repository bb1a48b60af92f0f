#ifndef SLUICE_TRAINER_CHECKPOINT_STATE_H_
#define SLUICE_TRAINER_CHECKPOINT_STATE_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/v1/common.pb.h"
#include "sluice/v1/replay_buffer.pb.h"

// What a checkpoint says about its run (trainer_state.json), finding a run's
// checkpoints, and deciding how a (re)started run begins. No LibTorch here:
// the trainer's service uses it to refuse a run before starting it;
// checkpoint.h writes and loads the checkpoints themselves.
namespace sluice::trainer {

inline constexpr char kTrainerStateFile[] = "trainer_state.json";

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
  std::string reference_file;

  std::string ToJson() const;
  // INVALID_ARGUMENT naming the field for text that is not such a state.
  static absl::StatusOr<TrainerCheckpointState> FromJson(const std::string& text);

  // Batches (SampleRequest.step) this checkpoint's weights have fully
  // trained on: the steps the trainer commits to the buffer.
  int64_t batch_steps() const { return step / std::max(1, minibatches_per_batch); }
};

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

#endif  // SLUICE_TRAINER_CHECKPOINT_STATE_H_
