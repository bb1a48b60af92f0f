#ifndef SLUICE_COMMON_MODEL_SAFETENSORS_H_
#define SLUICE_COMMON_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

// Hugging Face's safetensors format, read and written without torch (the
// controller and tools inspect checkpoints without loading LibTorch).
//
// A file is: an 8-byte little-endian u64 N, N bytes of JSON header
//   {"__metadata__": {"k": "v", ...},
//    "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// then the data region; offsets are relative to the start of the data region.
// Tensors are little-endian, C order. This code assumes a little-endian host.
//
// A sharded checkpoint (HF save_pretrained with max_shard_size) is a
// directory with model-00001-of-0000N.safetensors files and
// model.safetensors.index.json: {"metadata": {"total_size": bytes},
// "weight_map": {tensor name: shard file name}}.
namespace sluice::model {

enum class DType { kF32, kF16, kBF16, kI64, kI32 };

// "F32", "F16", "BF16", "I64", "I32".
absl::string_view DTypeName(DType dtype);
// Bytes per element: 4, 2, 2, 8, 4.
int64_t DTypeSize(DType dtype);
// The inverse of DTypeName; INVALID_ARGUMENT for anything else ("F64", "Q4").
absl::StatusOr<DType> ParseDType(absl::string_view name);

// One tensor of an open file. `data` points into the file's mapping and is
// valid while the SafetensorsFile lives; it is not aligned in general.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> data;  // num_elements() * DTypeSize(dtype) bytes

  int64_t num_elements() const;
};

// A safetensors file, memory-mapped read-only and validated once by Open:
// afterwards every view is within the file. Immutable, so thread-safe.
class SafetensorsFile {
 public:
  // Maps `path` and validates the whole header: the header length fits in
  // the file, the header is a JSON object, every tensor has a known dtype, a
  // non-negative shape whose byte size equals its data_offsets range, offsets
  // within the data region, and no two tensors overlap; "__metadata__" must
  // map strings to strings. Errors (never a crash, for any file content):
  // NOT_FOUND when the file does not exist, INVALID_ARGUMENT naming the path
  // and the byte offset or tensor at fault otherwise.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // nullptr when absent. O(log n).
  const TensorView* Find(absl::string_view name) const;
  // Sorted by name.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;

  std::string path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of an HF model directory: model.safetensors, or the shards
// listed by model.safetensors.index.json (model.safetensors wins when both
// exist, as in transformers). Immutable, thread-safe.
class SafetensorsCheckpoint {
 public:
  // NOT_FOUND when `dir` has neither file. INVALID_ARGUMENT (naming the
  // file, tensor or shard) for a malformed index or one over 100 MB, a shard name that is not a
  // plain file name, a missing shard file, any error of
  // SafetensorsFile::Open, a tensor found in two shards, a tensor the index
  // maps to a shard that lacks it, or one a shard holds that the index does
  // not map to that shard.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  // nullptr when absent. O(log n).
  const TensorView* Find(absl::string_view name) const;
  // Every tensor of every shard, sorted by name.
  std::vector<std::string> names() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> index_;
};

// A tensor to write; `data` must stay valid during the call and hold exactly
// product(shape) * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::string_view data;
};

// Writes one safetensors file: compact JSON header padded with spaces to a
// multiple of 8 bytes (so that data is 8-aligned in the file), tensors in
// sorted-name order, `metadata` as "__metadata__" (omitted when empty).
// Atomic: written to a temporary file beside `path`, then renamed.
// INVALID_ARGUMENT for an empty or duplicate name, "__metadata__" as a name, a
// negative dimension, or a byte count that does not match the shape;
// INTERNAL for I/O errors.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into directory `dir` (created if needed) with HF's names:
// model.safetensors when the total data fits in `max_shard_bytes` (<= 0 =
// unlimited), otherwise model-0000i-of-0000N.safetensors shards filled
// greedily in sorted-name order (a tensor larger than the limit gets a shard
// of its own) plus model.safetensors.index.json. Weight files of a previous
// save in `dir` that this one does not overwrite (model.safetensors, the
// index, model-*-of-*.safetensors) are removed, so the directory holds one
// consistent checkpoint. Returns the file names written. Errors as
// WriteSafetensors.
absl::StatusOr<std::vector<std::string>> WriteShardedSafetensors(
    const std::string& dir, const std::vector<TensorToWrite>& tensors, int64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_SAFETENSORS_H_
