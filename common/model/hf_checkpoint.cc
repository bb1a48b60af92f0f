#include "common/model/hf_checkpoint.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sluice::model {
namespace {

namespace fs = std::filesystem;

constexpr char kLmHead[] = "lm_head.weight";
constexpr char kEmbed[] = "model.embed_tokens.weight";

torch::ScalarType TorchType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return torch::kFloat32;
    case DType::kF16: return torch::kFloat16;
    case DType::kBF16: return torch::kBFloat16;
    case DType::kI64: return torch::kInt64;
    case DType::kI32: return torch::kInt32;
  }
  return torch::kFloat32;
}

// A tensor over the view's bytes in the memory-mapped file, in the file's
// dtype: no copy, no conversion (LoadWeights converts to float32 as it copies
// into the parameters, one tensor at a time, so loading never holds a second
// float32 copy of the model). Valid while the file stays open; read only.
// Copied instead when the bytes are not aligned to the element size.
torch::Tensor ViewTensor(const TensorView& view) {
  const auto options = torch::TensorOptions().dtype(TorchType(view.dtype));
  const size_t element = torch::elementSize(TorchType(view.dtype));
  void* data = const_cast<unsigned char*>(view.data.data());
  if (!view.data.empty() && reinterpret_cast<uintptr_t>(data) % element == 0) {
    return torch::from_blob(data, view.shape, options);
  }
  torch::Tensor tensor = torch::empty(view.shape, options);
  if (!view.data.empty()) std::memcpy(tensor.data_ptr(), view.data.data(), view.data.size());
  return tensor;
}

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path.string(), ": ", std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::Status WriteFileAtomically(const fs::path& path, const std::string& contents) {
  const std::string temp = absl::StrCat(path.string(), ".tmp.", getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << contents;
    if (!out.flush()) {
      std::remove(temp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", temp));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", temp, " to ", path.string()));
  }
  return absl::OkStatus();
}

std::string TorchDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    default: return "float32";
  }
}

}  // namespace

absl::StatusOr<HfModel> LoadHfModel(const std::string& dir, const ModelPlacement& placement) {
  const fs::path config_path = fs::path(dir) / "config.json";
  std::error_code error;
  if (!fs::exists(config_path, error)) {
    return absl::NotFoundError(absl::StrCat("no config.json in ", dir));
  }
  absl::StatusOr<std::string> config_text = ReadFile(config_path);
  if (!config_text.ok()) return config_text.status();
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(*config_text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(config_path.string(), ": ", config.status().message()));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> checkpoint =
      SafetensorsCheckpoint::Open(dir);
  if (!checkpoint.ok()) return checkpoint.status();

  std::vector<NamedTensor> weights;
  for (const std::unique_ptr<SafetensorsFile>& file : (*checkpoint)->files()) {
    for (const TensorView& view : file->tensors()) {
      if (config->tie_word_embeddings && view.name == kLmHead) {
        // Some exporters write the tied head anyway; it must at least fit.
        const TensorView* embed = (*checkpoint)->Find(kEmbed);
        if (embed != nullptr && embed->shape != view.shape) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor \"", kLmHead, "\" in ", file->path(),
              " does not match the tied \"", kEmbed, "\"'s shape"));
        }
        continue;
      }
      weights.push_back({view.name, ViewTensor(view)});
    }
  }
  absl::StatusOr<std::unique_ptr<Transformer>> model =
      Transformer::CreateUninitialized(*config, placement);
  if (!model.ok()) return model.status();
  if (absl::Status status = (*model)->LoadWeights(weights); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat("weights in ", dir, ": ", status.message()));
  }
  return HfModel{*std::move(config), *std::move(model)};
}

absl::Status SaveHfModel(const std::string& dir, const Transformer& model,
                         const SaveHfOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SaveHfModel: dtype must be F32, BF16 or F16, got ", DTypeName(options.dtype)));
  }
  for (const std::string& extra : options.extra_files) {
    std::error_code error;
    if (!fs::is_regular_file(extra, error)) {
      return absl::NotFoundError(absl::StrCat("SaveHfModel: no file ", extra));
    }
  }
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create directory ", dir, ": ", error.message()));
  }

  // Bytes must outlive the write: TensorToWrite only points at them.
  std::vector<std::string> bytes;
  bytes.reserve(model.parameters().size());
  std::vector<TensorToWrite> tensors;
  {
    torch::NoGradGuard no_grad;
    for (const NamedTensor& param : model.parameters()) {
      torch::Tensor tensor = param.tensor.detach().to(TorchType(options.dtype)).contiguous();
      bytes.push_back(TensorBytes(tensor));
      tensors.push_back({param.name, options.dtype,
                         std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()),
                         bytes.back()});
    }
  }
  absl::StatusOr<std::vector<std::string>> written =
      WriteShardedSafetensors(dir, tensors, options.max_shard_bytes, {{"format", "pt"}});
  if (!written.ok()) return written.status();

  ModelConfig config = model.config();
  config.torch_dtype = TorchDtypeName(options.dtype);
  if (absl::Status status = WriteFileAtomically(fs::path(dir) / "config.json", config.ToJson() + "\n");
      !status.ok()) {
    return status;
  }
  for (const std::string& extra : options.extra_files) {
    const fs::path target = fs::path(dir) / fs::path(extra).filename();
    if (fs::exists(target, error) && fs::equivalent(extra, target, error)) continue;
    absl::StatusOr<std::string> contents = ReadFile(extra);
    if (!contents.ok()) return contents.status();
    if (absl::Status status = WriteFileAtomically(target, *contents); !status.ok()) return status;
  }
  for (const auto& [name, contents] : options.extra_contents) {
    const fs::path target = fs::path(dir) / fs::path(name).filename();
    if (absl::Status status = WriteFileAtomically(target, contents); !status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace sluice::model
