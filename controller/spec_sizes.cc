// ValidateRunSpecSizes: every string and list of a run spec within its bound
// (run_spec.h), before anything else reads the spec.
#include <algorithm>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "controller/run_spec.h"
#include "controller/spec_problems.h"

namespace sluice::controller {
namespace {

using spec_internal::AtMost;
using spec_internal::AtMostBytes;
using spec_internal::kMaxStopStringBytes;
using spec_internal::Problems;
using v1::RunSpec;

constexpr int kMaxStopStrings = 16;
constexpr int kMaxVerifiers = 32;
// Upper bounds of the strings and lists. A spec travels whole to every
// service of the run and back to every user (WorkerHeartbeat answers,
// StartTraining, GetRun, WatchRun, ListRuns), whose receivers take at most a
// few MiB a message; each bound is far beyond a real spec's, and
// kMaxRunSpecBytes bounds the whole.
constexpr size_t kMaxNameBytes = 256;
constexpr int kMaxLabels = 64;
// Kubernetes' bound on a label name; values get room for a sentence.
constexpr size_t kMaxLabelKeyBytes = 63;
constexpr size_t kMaxLabelValueBytes = 256;
constexpr size_t kMaxPathBytes = 4096;  // PATH_MAX
// A name among a few known ones (builtin model, device, chat template,
// a dataset's column, a verifier).
constexpr size_t kMaxWordBytes = 128;
// Prompt template and system prompt: text a person writes.
constexpr size_t kMaxTextBytes = 32 << 10;
constexpr int kMaxOperators = 16;
constexpr int kMaxStopTokenIds = 64;
constexpr int kMaxVerifierParams = 32;
constexpr size_t kMaxVerifierParamKeyBytes = 128;
constexpr size_t kMaxVerifierParamValueBytes = 4096;

void ValidateSamplingSizes(const v1::SamplingParams& sampling, absl::string_view path,
                           Problems& problems) {
  AtMost(problems, absl::StrCat(path, ".stop_token_ids"), sampling.stop_token_ids_size(),
         kMaxStopTokenIds, "entries");
  AtMost(problems, absl::StrCat(path, ".stop_strings"), sampling.stop_strings_size(),
         kMaxStopStrings, "entries");
  for (int i = 0; i < std::min(sampling.stop_strings_size(), kMaxStopStrings); ++i) {
    const size_t size = sampling.stop_strings(i).size();
    if (size > kMaxStopStringBytes) {
      problems.Add(absl::StrCat(path, ".stop_strings[", i, "]"), "must be 1 to ",
                   kMaxStopStringBytes, " bytes, got ", size);
    }
  }
}

}  // namespace

absl::Status ValidateRunSpecSizes(const RunSpec& spec) {
  Problems problems;
  AtMostBytes(problems, "name", spec.name(), kMaxNameBytes);
  AtMost(problems, "labels", spec.labels_size(), kMaxLabels, "entries");
  if (spec.labels_size() <= kMaxLabels) {
    // Sorted, so that the lines come in the same order every time.
    const std::map<std::string, std::string> labels(spec.labels().begin(), spec.labels().end());
    for (const auto& [key, value] : labels) {
      if (key.empty() || key.size() > kMaxLabelKeyBytes) {
        problems.Add("labels", "a key must be 1 to ", kMaxLabelKeyBytes, " bytes, got ", key.size(),
                     key.size() > kMaxLabelKeyBytes ? "" : " (an empty key)");
        continue;
      }
      AtMostBytes(problems, absl::StrCat("labels[\"", key, "\"]"), value, kMaxLabelValueBytes);
    }
  }
  const v1::ModelConfig& model = spec.model();
  AtMostBytes(problems, "model.builtin", model.builtin(), kMaxWordBytes);
  AtMostBytes(problems, "model.hf_model_dir", model.hf_model_dir(), kMaxPathBytes);
  AtMostBytes(problems, "model.tokenizer_path", model.tokenizer_path(), kMaxPathBytes);
  AtMostBytes(problems, "model.device", model.device(), kMaxWordBytes);
  const v1::TaskConfig& task = spec.task();
  AtMostBytes(problems, "task.prompt_template", task.prompt_template(), kMaxTextBytes);
  AtMostBytes(problems, "task.chat_template", task.chat_template(), kMaxWordBytes);
  AtMostBytes(problems, "task.system_prompt", task.system_prompt(), kMaxTextBytes);
  AtMost(problems, "task.arithmetic.operators", task.arithmetic().operators_size(), kMaxOperators,
         "entries");
  for (int i = 0; i < std::min(task.arithmetic().operators_size(), kMaxOperators); ++i) {
    AtMostBytes(problems, absl::StrCat("task.arithmetic.operators[", i, "]"),
                task.arithmetic().operators(i), kMaxWordBytes);
  }
  AtMostBytes(problems, "task.dataset.path", task.dataset().path(), kMaxPathBytes);
  AtMostBytes(problems, "task.dataset.prompt_field", task.dataset().prompt_field(), kMaxWordBytes);
  AtMostBytes(problems, "task.dataset.answer_field", task.dataset().answer_field(), kMaxWordBytes);
  ValidateSamplingSizes(spec.rollout().sampling(), "rollout.sampling", problems);
  ValidateSamplingSizes(spec.eval().sampling(), "eval.sampling", problems);
  const v1::RewardConfig& reward = spec.reward();
  AtMost(problems, "reward.verifiers", reward.verifiers_size(), kMaxVerifiers, "entries");
  for (int i = 0; i < std::min(reward.verifiers_size(), kMaxVerifiers); ++i) {
    const v1::WeightedVerifier& verifier = reward.verifiers(i);
    const std::string path = absl::StrCat("reward.verifiers[", i, "]");
    AtMostBytes(problems, path + ".name", verifier.name(), kMaxWordBytes);
    AtMost(problems, path + ".params", verifier.params_size(), kMaxVerifierParams, "entries");
    if (verifier.params_size() > kMaxVerifierParams) continue;
    const std::map<std::string, std::string> params(verifier.params().begin(),
                                                    verifier.params().end());
    for (const auto& [key, value] : params) {
      if (key.size() > kMaxVerifierParamKeyBytes) {
        problems.Add(path + ".params", "a key must be at most ", kMaxVerifierParamKeyBytes,
                     " bytes, got ", key.size());
        continue;
      }
      AtMostBytes(problems, absl::StrCat(path, ".params[\"", key, "\"]"), value,
                  kMaxVerifierParamValueBytes);
    }
  }
  AtMostBytes(problems, "checkpoint.dir", spec.checkpoint().dir(), kMaxPathBytes);
  // The whole, as every service receives it (the bounds above allow more
  // in sum: many verifiers with long parameters).
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > kMaxRunSpecBytes) {
    problems.Add("the run spec", "must be at most ", kMaxRunSpecBytes,
                 " bytes serialized (it goes whole to every service and user), got ", bytes);
  }
  return problems.ToStatus();
}

}  // namespace sluice::controller
