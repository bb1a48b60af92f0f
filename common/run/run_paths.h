#ifndef SLUICE_COMMON_RUN_RUN_PATHS_H_
#define SLUICE_COMMON_RUN_RUN_PATHS_H_

#include "absl/status/status.h"
#include "common/path_policy.h"
#include "sluice/v1/common.pb.h"

// The paths a run spec names, confined to a service's allowed roots
// (PathPolicy, --allowed-path-roots). Every service that opens one of them
// calls ConfineRunSpecPaths first, with its own policy: the controller at
// SubmitRun (what users talk to), and the trainer and the rollout workers
// again when asked to start (another client may call them directly).
namespace sluice::run {

// Which of a spec's paths a service opens, and so confines. The controller
// and the trainer: all of them; a rollout worker: the model's only (a
// worker on another host has no business judging where the trainer writes).
struct RunSpecPathUse {
  bool model = true;       // model.hf_model_dir, model.tokenizer_path
  bool dataset = true;     // task.dataset.path
  bool checkpoint = true;  // checkpoint.dir
};

// Checks the path fields of `spec` that `use` selects against `policy` and
// rewrites the relative ones to the resolved path under the first root (absolute ones
// are left as written), so that every service opens the same file:
//
//   model.hf_model_dir      read: config.json, weights, tokenizer files
//   model.tokenizer_path    read: tokenizer.json or its directory
//   task.dataset.path       read: the dataset file
//   checkpoint.dir          written: step-*/ checkpoints; read to resume
//
// Empty fields (unset) are left alone. INVALID_ARGUMENT with one line per
// field outside the roots, in PathPolicy's uniform message, which says
// nothing about what exists there; `spec` is unchanged then. Call it before
// anything opens a path of the spec. A path field added to RunSpec must be
// added here.
absl::Status ConfineRunSpecPaths(const PathPolicy& policy, v1::RunSpec* spec,
                                 RunSpecPathUse use = {});

}  // namespace sluice::run

#endif  // SLUICE_COMMON_RUN_RUN_PATHS_H_
