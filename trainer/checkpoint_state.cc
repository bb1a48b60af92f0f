#include "trainer/checkpoint_state.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace sluice::trainer {
namespace {

namespace fs = std::filesystem;

std::string ReadWholeFile(const fs::path& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

// ---------------------------------------------------------------------------
// trainer_state.json
// ---------------------------------------------------------------------------

std::string TrainerCheckpointState::ToJson() const {
  const auto file = [](const std::string& name) -> nlohmann::ordered_json {
    return name.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(name);
  };
  nlohmann::ordered_json json = {
      {"format_version", format_version},
      {"run_id", run_id},
      {"run_name", run_name},
      {"step", step},
      {"policy_version", policy_version},
      {"reason", reason},
      {"source_model", source_model},
      {"written_at", written_at},
      {"warm_start", {{"done", warm_start_done}, {"steps", warm_start_steps}}},
      {"evaluations",
       {{"before", before_eval_done},
        {"last_periodic_step", last_periodic_eval_step},
        {"after", after_eval_done}}},
      {"minibatches_per_batch", minibatches_per_batch},
      {"training_state",
       {{"optimizer", file(optimizer_file)},
        {"rng", file(rng_file)},
        {"weights_fp32", file(weights_file)},
        {"proximal", file(proximal_file)},
        {"reference", file(reference_file)}}}};
  return json.dump(2) + "\n";
}

absl::StatusOr<TrainerCheckpointState> TrainerCheckpointState::FromJson(const std::string& text) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError("trainer_state.json: not a JSON object");
  }
  TrainerCheckpointState state;
  // Reads json[path...] into `out` when present; a value of another type is
  // an error naming its path.
  std::string problem;
  const auto read = [&](const nlohmann::json& object, const char* key, auto* out,
                        const std::string& where) {
    if (!problem.empty() || !object.is_object() || !object.contains(key)) return;
    const nlohmann::json& value = object[key];
    using T = std::decay_t<decltype(*out)>;
    if constexpr (std::is_same_v<T, std::string>) {
      if (value.is_null()) return;  // an absent file
      if (!value.is_string()) problem = absl::StrCat(where, key, ": must be a string");
      else *out = value.get<std::string>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!value.is_boolean()) problem = absl::StrCat(where, key, ": must be true or false");
      else *out = value.get<bool>();
    } else {
      if (!value.is_number_integer()) problem = absl::StrCat(where, key, ": must be an integer");
      else *out = value.get<T>();
    }
  };
  // Written before resuming existed: no version, no training state.
  state.format_version = 1;
  read(json, "format_version", &state.format_version, "");
  read(json, "run_id", &state.run_id, "");
  read(json, "run_name", &state.run_name, "");
  read(json, "step", &state.step, "");
  read(json, "policy_version", &state.policy_version, "");
  read(json, "reason", &state.reason, "");
  read(json, "source_model", &state.source_model, "");
  read(json, "written_at", &state.written_at, "");
  if (json.contains("warm_start")) {
    read(json["warm_start"], "done", &state.warm_start_done, "warm_start.");
    read(json["warm_start"], "steps", &state.warm_start_steps, "warm_start.");
  }
  if (json.contains("evaluations")) {
    const nlohmann::json& evaluations = json["evaluations"];
    read(evaluations, "before", &state.before_eval_done, "evaluations.");
    read(evaluations, "last_periodic_step", &state.last_periodic_eval_step, "evaluations.");
    read(evaluations, "after", &state.after_eval_done, "evaluations.");
  }
  read(json, "minibatches_per_batch", &state.minibatches_per_batch, "");
  if (json.contains("training_state")) {
    const nlohmann::json& files = json["training_state"];
    read(files, "optimizer", &state.optimizer_file, "training_state.");
    read(files, "rng", &state.rng_file, "training_state.");
    read(files, "weights_fp32", &state.weights_file, "training_state.");
    read(files, "proximal", &state.proximal_file, "training_state.");
    read(files, "reference", &state.reference_file, "training_state.");
  }
  if (!problem.empty()) return absl::InvalidArgumentError(absl::StrCat("trainer_state.json: ", problem));
  if (state.run_id.empty()) return absl::InvalidArgumentError("trainer_state.json: run_id: required");
  if (state.step < 0 || state.minibatches_per_batch < 1) {
    return absl::InvalidArgumentError(
        "trainer_state.json: step must be >= 0 and minibatches_per_batch >= 1");
  }
  for (const std::string* name : {&state.optimizer_file, &state.rng_file, &state.weights_file,
                                  &state.proximal_file, &state.reference_file}) {
    if (name->find('/') != std::string::npos || *name == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer_state.json: training_state names a file outside the checkpoint: ",
                       *name));
    }
  }
  return state;
}

// ---------------------------------------------------------------------------
// Finding
// ---------------------------------------------------------------------------

std::vector<FoundCheckpoint> FindRunCheckpoints(const std::string& root, const std::string& run_id,
                                                std::vector<std::string>* warnings) {
  std::vector<FoundCheckpoint> found;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!entry.is_directory(error) || !absl::StartsWith(name, "step-") ||
        !absl::SimpleAtoi(name.substr(5), &step)) {
      continue;
    }
    const fs::path dir = entry.path();
    const auto skip = [&](absl::string_view why) {
      warnings->push_back(absl::StrCat(dir.string(), ": ", why));
    };
    bool readable = false;
    const std::string text = ReadWholeFile(dir / kTrainerStateFile, &readable);
    if (!readable) {
      skip("no trainer_state.json");
      continue;
    }
    absl::StatusOr<TrainerCheckpointState> state = TrainerCheckpointState::FromJson(text);
    if (!state.ok()) {
      skip(state.status().message());
      continue;
    }
    if (state->run_id != run_id) continue;  // another run's
    if (state->format_version < TrainerCheckpointState::kFormatVersion) {
      skip("written by an older Sluice, without the optimizer state; not resumable");
      continue;
    }
    if (state->format_version > TrainerCheckpointState::kFormatVersion) {
      skip(absl::StrCat("format_version ", state->format_version,
                        " is newer than this trainer reads (",
                        TrainerCheckpointState::kFormatVersion, ")"));
      continue;
    }
    if (state->step != step) {
      skip(absl::StrCat("trainer_state.json says step ", state->step));
      continue;
    }
    if (!state->warm_start_done) {
      skip("taken during the warm start, which a run redoes from the start");
      continue;
    }
    std::vector<std::string> missing;
    if (!fs::exists(dir / "config.json", error)) missing.push_back("config.json");
    if (!fs::exists(dir / "model.safetensors", error) &&
        !fs::exists(dir / "model.safetensors.index.json", error)) {
      missing.push_back("model.safetensors");
    }
    for (const std::string& file : {state->optimizer_file, state->rng_file, state->weights_file,
                                    state->proximal_file, state->reference_file}) {
      if (!file.empty() && !fs::exists(dir / file, error)) missing.push_back(file);
    }
    if (state->rng_file.empty()) missing.push_back("the RNG state");
    if (state->step > 0 && state->optimizer_file.empty()) missing.push_back("the optimizer state");
    if (!missing.empty()) {
      skip(absl::StrCat("missing ", absl::StrJoin(missing, ", ")));
      continue;
    }
    found.push_back({dir.string(), *std::move(state)});
  }
  std::sort(found.begin(), found.end(), [](const FoundCheckpoint& a, const FoundCheckpoint& b) {
    return a.state.step > b.state.step;
  });
  return found;
}

// ---------------------------------------------------------------------------
// Planning a resume
// ---------------------------------------------------------------------------

absl::StatusOr<ResumePlan> PlanResume(const std::string& run_id, const v1::RunSpec& spec,
                                      std::vector<FoundCheckpoint> found,
                                      const v1::BufferStats& buffer,
                                      const std::vector<std::string>& warnings) {
  const v1::CheckpointConfig& config = spec.checkpoint();
  const bool resume = !config.has_resume() || config.resume();
  ResumePlan plan;
  plan.buffer_policy_version = buffer.policy_version();
  if (resume) {
    // Newest first; one older than what the buffer let go of cannot be
    // continued from: the batches of the steps after it are gone.
    for (FoundCheckpoint& checkpoint : found) {
      if (checkpoint.state.batch_steps() >= buffer.committed_step()) {
        plan.candidates.push_back(std::move(checkpoint));
      }
    }
  }
  if (!plan.candidates.empty()) return plan;
  if (buffer.policy_version() <= 0 && buffer.committed_step() <= 0) {
    return plan;  // nothing was trained: starting from the model source loses nothing
  }
  const std::string where =
      config.dir().empty() ? "(checkpoint.dir is not set)" : absl::StrCat("in ", config.dir());
  const std::string position =
      absl::StrCat("the replay buffer is at version ", buffer.policy_version(),
                   buffer.committed_step() > 0
                       ? absl::StrCat(" and let go of the batches up to step ",
                                      buffer.committed_step())
                       : "");
  std::string why;
  if (!resume) {
    why = absl::StrCat("checkpoint.resume is false for run ", run_id, ", but ", position);
  } else if (found.empty()) {
    why = absl::StrCat("no checkpoint of run ", run_id, " ", where, "; ", position);
    if (!warnings.empty()) absl::StrAppend(&why, " (not resumable: ", absl::StrJoin(warnings, "; "), ")");
  } else {
    why = absl::StrCat("the newest checkpoint of run ", run_id, " ", where, " is step ",
                       found.front().state.step, ", but ", position,
                       " (committed after a newer checkpoint, which is gone)");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot resume losslessly: ", why,
      ". Starting it again from its model source would train versions the workers and the "
      "buffer already hold differently; submit it as a new run, or give the trainer its "
      "checkpoint.dir back"));
}

}  // namespace sluice::trainer
