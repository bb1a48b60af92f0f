// libFuzzer target for safetensors files and sharded checkpoints
// (SafetensorsFile::Open, SafetensorsCheckpoint::Open): the trainer and the
// tools read the weights of whatever model directory a run spec names.
// Arbitrary bytes must give an error, never a crash or a read outside the
// file; Open promises that afterwards every tensor's bytes lie within it,
// which the target checks by reading each tensor's first and last byte.
//
// An input that starts with '{' is a model.safetensors.index.json, read
// beside two fixed shard files (model-00001-of-00002.safetensors holding
// "a" and "b", model-00002-of-00002.safetensors holding "c"); anything else
// is a model.safetensors file.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/fuzz/fuzz_files.h"
#include "common/model/safetensors.h"

namespace {

namespace model = sluice::model;

volatile uint8_t touched;

// Reads each tensor's first and last byte, so that a view past the mapping
// faults (and AddressSanitizer names it).
void Touch(const model::TensorView& view) {
  if (view.data.empty()) return;
  touched = view.data.front();
  touched = view.data.back();
  if (static_cast<int64_t>(view.data.size()) !=
      view.num_elements() * model::DTypeSize(view.dtype)) {
    __builtin_trap();
  }
}

// The directory of the sharded checkpoint, with its two shards written.
const std::string& ShardedDir() {
  static const std::string* const dir = [] {
    auto* path = new std::string(sluice::fuzz::ScratchDir() + "/sharded");
    std::filesystem::create_directories(*path);
    const float values[4] = {1, 2, 3, 4};
    const absl::string_view bytes(reinterpret_cast<const char*>(values), sizeof(values));
    const absl::Status first = model::WriteSafetensors(
        *path + "/model-00001-of-00002.safetensors",
        {{"a", model::DType::kF32, {2}, bytes.substr(0, 8)},
         {"b", model::DType::kF32, {1}, bytes.substr(8, 4)}});
    const absl::Status second = model::WriteSafetensors(
        *path + "/model-00002-of-00002.safetensors",
        {{"c", model::DType::kF32, {1}, bytes.substr(12, 4)}});
    if (!first.ok() || !second.ok()) __builtin_trap();
    return path;
  }();
  return *dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  if (!input.empty() && input.front() == '{') {
    const std::string& dir = ShardedDir();
    sluice::fuzz::WriteScratchFile("sharded/model.safetensors.index.json", input);
    absl::StatusOr<std::unique_ptr<model::SafetensorsCheckpoint>> checkpoint =
        model::SafetensorsCheckpoint::Open(dir);
    if (checkpoint.ok()) {
      for (const std::string& name : (*checkpoint)->names()) Touch(*(*checkpoint)->Find(name));
    }
    return 0;
  }
  const std::string path = sluice::fuzz::WriteScratchFile("model.safetensors", input);
  absl::StatusOr<std::unique_ptr<model::SafetensorsFile>> file =
      model::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  for (const model::TensorView& view : (*file)->tensors()) {
    if ((*file)->Find(view.name) != &view) __builtin_trap();
    Touch(view);
  }
  return 0;
}
