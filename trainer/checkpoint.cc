#include "trainer/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <type_traits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/model/transformer.h"
#include "common/status_macros.h"

namespace sluice::trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kOptimizerFile[] = "optimizer.pt";
constexpr char kRngFile[] = "rng.pt";
constexpr char kWeightsFile[] = "weights_fp32.pt";
constexpr char kProximalFile[] = "proximal.pt";
constexpr char kReferenceFile[] = "reference.pt";
constexpr char kGeneratorKey[] = "cpu_generator";

std::string CheckpointName(int64_t step) { return absl::StrFormat("step-%08d", step); }

// The weights as an archive: "param_<i>" in parameters() order (archive
// keys cannot hold the dots of HF names), each checked by shape on load.
std::string WeightsArchive(const model::Transformer& model) {
  torch::serialize::OutputArchive archive;
  const std::vector<model::NamedTensor>& parameters = model.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    archive.write(absl::StrCat("param_", i), parameters[i].tensor.detach());
  }
  std::ostringstream out;
  archive.save_to(out);
  return std::move(out).str();
}

absl::Status LoadWeightsArchive(const std::string& path, model::Transformer& model) {
  torch::serialize::InputArchive archive;
  archive.load_from(path);
  std::vector<model::NamedTensor> weights;
  for (size_t i = 0; i < model.parameters().size(); ++i) {
    const model::NamedTensor& parameter = model.parameters()[i];
    torch::Tensor tensor;
    if (!archive.try_read(absl::StrCat("param_", i), tensor)) {
      return absl::DataLossError(absl::StrCat(path, ": no tensor for ", parameter.name));
    }
    if (tensor.sizes() != parameter.tensor.sizes() || tensor.scalar_type() != torch::kFloat32) {
      return absl::DataLossError(absl::StrCat(path, ": ", parameter.name, " does not match the model"));
    }
    weights.push_back({parameter.name, std::move(tensor)});
  }
  return model.LoadWeights(weights);
}

// fsync(2) of a file or directory.
absl::Status SyncPath(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path.string(), " to sync it"));
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) return absl::InternalError(absl::StrCat("fsync of ", path.string(), " failed"));
  return absl::OkStatus();
}

// Every file of `dir` (one level: a checkpoint has no subdirectories) and
// the directory itself.
absl::Status SyncDirectory(const fs::path& dir, int64_t* size_bytes) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (!entry.is_regular_file(error)) continue;
    *size_bytes += static_cast<int64_t>(entry.file_size(error));
    RETURN_IF_ERROR(SyncPath(entry.path(), /*directory=*/false));
  }
  if (error) return absl::InternalError(absl::StrCat("cannot list ", dir.string(), ": ", error.message()));
  return SyncPath(dir, /*directory=*/true);
}

}  // namespace

// ---------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------

absl::StatusOr<WrittenCheckpoint> WriteCheckpointDirectory(const std::string& root,
                                                           TrainerCheckpointState state,
                                                           const CheckpointContents& contents) {
  const std::string name = CheckpointName(state.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path temp_dir = fs::path(root) / absl::StrCat(".", name, ".tmp");
  const fs::path old_dir = fs::path(root) / absl::StrCat(".", name, ".old");
  std::error_code error;
  fs::create_directories(root, error);
  fs::remove_all(temp_dir, error);

  model::SaveHfOptions options = contents.hf;
  // LibTorch reports serialization errors as exceptions.
  try {
    if (contents.optimizer != nullptr) {
      torch::serialize::OutputArchive archive;
      contents.optimizer->save(archive);
      std::ostringstream out;
      archive.save_to(out);
      options.extra_contents[kOptimizerFile] = std::move(out).str();
      state.optimizer_file = kOptimizerFile;
    }
    {
      at::Generator generator = at::detail::getDefaultCPUGenerator();
      torch::Tensor generator_state;
      {
        std::lock_guard<std::mutex> lock(generator.mutex());
        generator_state = generator.get_state();
      }
      torch::serialize::OutputArchive archive;
      archive.write(kGeneratorKey, generator_state, /*is_buffer=*/true);
      std::ostringstream out;
      archive.save_to(out);
      options.extra_contents[kRngFile] = std::move(out).str();
      state.rng_file = kRngFile;
    }
    if (options.dtype != model::DType::kF32) {
      options.extra_contents[kWeightsFile] = WeightsArchive(*contents.model);
      state.weights_file = kWeightsFile;
    }
    if (contents.proximal != nullptr) {
      options.extra_contents[kProximalFile] = WeightsArchive(*contents.proximal);
      state.proximal_file = kProximalFile;
    }
    if (contents.reference != nullptr) {
      options.extra_contents[kReferenceFile] = WeightsArchive(*contents.reference);
      state.reference_file = kReferenceFile;
    }
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return absl::InternalError(absl::StrCat("checkpoint at step ", state.step,
                                            ": serializing the training state: ",
                                            what.substr(0, what.find('\n'))));
  }
  options.extra_contents[kTrainerStateFile] = state.ToJson();

  WrittenCheckpoint written;
  written.path = final_dir.string();
  absl::Status status = model::SaveHfModel(temp_dir.string(), *contents.model, options);
  if (status.ok()) status = SyncDirectory(temp_dir, &written.size_bytes);
  if (status.ok()) {
    // A checkpoint of the same step (a final one after a stopped one) is
    // replaced only once the new one is complete.
    fs::remove_all(old_dir, error);
    if (fs::exists(final_dir, error)) fs::rename(final_dir, old_dir, error);
    error.clear();
    fs::rename(temp_dir, final_dir, error);
    if (error) {
      status = absl::InternalError(absl::StrCat("cannot rename ", temp_dir.string(), " to ",
                                                final_dir.string(), ": ", error.message()));
    } else {
      status = SyncPath(root, /*directory=*/true);
      fs::remove_all(old_dir, error);
    }
  }
  if (!status.ok()) {
    fs::remove_all(temp_dir, error);
    return absl::Status(status.code(),
                        absl::StrCat("checkpoint at step ", state.step, ": ", status.message()));
  }
  return written;
}

void PruneCheckpoints(const std::string& root, int keep) {
  if (keep <= 0) return;
  std::vector<std::pair<int64_t, fs::path>> steps;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    if (!entry.is_directory(error) || !absl::StartsWith(name, "step-") ||
        !absl::SimpleAtoi(name.substr(5), &step)) {
      continue;
    }
    steps.emplace_back(step, entry.path());
  }
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + keep < steps.size(); ++i) {
    fs::remove_all(steps[i].second, error);
    if (error) {
      log::Warning("could not remove an old checkpoint",
                   {{"dir", steps[i].second.string()}, {"error", error.message()}});
    }
  }
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

absl::Status LoadCheckpoint(const FoundCheckpoint& checkpoint, model::Transformer& model,
                            torch::optim::AdamW& optimizer, model::Transformer* proximal,
                            model::Transformer* reference) {
  const TrainerCheckpointState& state = checkpoint.state;
  const fs::path dir(checkpoint.path);
  std::string file;  // what is being read, for the error
  try {
    if (!state.weights_file.empty()) {
      file = (dir / state.weights_file).string();
      RETURN_IF_ERROR(LoadWeightsArchive(file, model));
    } else {
      file = (dir / "model.safetensors").string();
      absl::StatusOr<model::HfModel> loaded = model::LoadHfModel(checkpoint.path);
      if (!loaded.ok()) return absl::DataLossError(std::string(loaded.status().message()));
      RETURN_IF_ERROR(model.LoadWeights(loaded->model->parameters()));
    }
    if (!state.proximal_file.empty()) {
      file = (dir / state.proximal_file).string();
      if (proximal == nullptr) {
        return absl::DataLossError(absl::StrCat(file, ": proximal weights of a run that keeps none"));
      }
      RETURN_IF_ERROR(LoadWeightsArchive(file, *proximal));
    }
    if (reference != nullptr && state.reference_file.empty()) {
      return absl::DataLossError(absl::StrCat(
          checkpoint.path, ": no reference policy (reference.pt) for a run that keeps one"));
    }
    if (!state.reference_file.empty()) {
      file = (dir / state.reference_file).string();
      if (reference == nullptr) {
        return absl::DataLossError(absl::StrCat(file, ": a reference policy of a run that keeps none"));
      }
      RETURN_IF_ERROR(LoadWeightsArchive(file, *reference));
    }
    if (!state.optimizer_file.empty()) {
      file = (dir / state.optimizer_file).string();
      torch::serialize::InputArchive archive;
      archive.load_from(file);
      optimizer.load(archive);
    }
    file = (dir / state.rng_file).string();
    torch::serialize::InputArchive archive;
    archive.load_from(file);
    torch::Tensor generator_state;
    archive.read(kGeneratorKey, generator_state, /*is_buffer=*/true);
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(generator_state);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return absl::DataLossError(absl::StrCat(file, ": ", what.substr(0, what.find('\n'))));
  }
  return absl::OkStatus();
}

}  // namespace sluice::trainer
