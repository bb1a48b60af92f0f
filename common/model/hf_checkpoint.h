#ifndef SLUICE_COMMON_MODEL_HF_CHECKPOINT_H_
#define SLUICE_COMMON_MODEL_HF_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/transformer.h"

// Hugging Face model directories (what transformers' save_pretrained writes
// and from_pretrained reads) for the Llama / Qwen2 decoders of transformer.h:
//   config.json
//   model.safetensors | model-0000i-of-0000N.safetensors + model.safetensors.index.json
//   tokenizer.json, tokenizer_config.json (optional; not read here)
namespace sluice::model {

struct HfModel {
  ModelConfig config;
  std::unique_ptr<Transformer> model;
};

// Reads config.json (ModelConfig::FromJson) and the weights (single file or
// sharded) into a float32 Transformer; F32, BF16 and F16 tensors are
// accepted and converted to float32. With tie_word_embeddings, lm_head.weight
// is absent (as save_pretrained writes it) or, if present, must equal
// model.embed_tokens.weight's shape and is ignored. Errors, each naming the
// file, tensor or config field: NOT_FOUND for a missing config.json or
// weights; INVALID_ARGUMENT for a bad config (unknown architecture, missing
// field), a corrupt weights file, a missing, unknown, mis-shaped or
// non-floating-point tensor.
// The model is placed as `placement` says (the weights converted as they
// load).
absl::StatusOr<HfModel> LoadHfModel(const std::string& dir, const ModelPlacement& placement = {});

struct SaveHfOptions {
  // F32 or BF16 (F16 also works); anything else is INVALID_ARGUMENT.
  DType dtype = DType::kF32;
  // Largest shard; <= 0 = one model.safetensors whatever its size.
  int64_t max_shard_bytes = 0;
  // Files copied into the directory under their own base names (e.g. the
  // tokenizer.json and tokenizer_config.json the model was trained with).
  std::vector<std::string> extra_files;
  // Files written into the directory from memory: base name -> contents
  // (e.g. a built-in model's tokenizer.json). Written after extra_files.
  std::map<std::string, std::string> extra_contents;
};

// Writes `model` as a complete HF directory `dir` (created if needed):
// config.json (torch_dtype set from options.dtype), the weights in HF names
// (lm_head.weight omitted when tied, as transformers does), plus the extra
// files. Each file is replaced atomically; stale weight files of an earlier
// save are removed. INVALID_ARGUMENT for an unsupported dtype, NOT_FOUND for
// a missing extra file, INTERNAL for I/O errors. Reads the parameters, so
// it must not overlap with LoadWeights or an optimizer step.
absl::Status SaveHfModel(const std::string& dir, const Transformer& model,
                         const SaveHfOptions& options = {});

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_HF_CHECKPOINT_H_
