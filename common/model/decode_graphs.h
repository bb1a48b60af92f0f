#ifndef SLUICE_COMMON_MODEL_DECODE_GRAPHS_H_
#define SLUICE_COMMON_MODEL_DECODE_GRAPHS_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/model/transformer.h"

namespace sluice::model {

// The engine's decode step (Transformer::ForwardRows) replayed from CUDA
// graphs. On a GPU an eager decode step is ~25 small kernels per layer, each
// launched from the host: at batch 1 a 0.5B model spends ~11 ms launching
// what the memory system does in ~0.25 ms (docs/gpu.md). A graph launches
// them all at once.
//
// Shapes are made static by buckets: the running batch is padded to the
// next power of two (capped at max_rows; padded rows decode token 0 at
// position 0 into cache rows no running sample holds), and the attended
// width to the next power of two >= 64 (capped at the capacity; columns
// past a row's length are masked as always). One graph per (batch, width)
// bucket, captured the first time it is needed and replayed from then on;
// all share one memory pool (they never run at once).
//
// The graphs read the weights of a model the engine owns, into which each
// new policy version is copied (a device-to-device copy of the weights:
// ~0.5 ms for a 0.5B bf16 model), so a weight swap costs no capture. They
// read and write the engine's KV cache, which must never be reallocated
// while they live.
class DecodeGraphs {
 public:
  virtual ~DecodeGraphs() = default;
  // Copies `policy`'s weights into the graphs' model (same config and
  // placement).
  virtual void SetWeights(const Transformer& policy) = 0;
  // ForwardRows(ids, lengths, cache) for `ids` [B, 1] and `lengths` [B]
  // (host tensors, int64), `longest` = max(lengths): logits [B, vocab] in
  // the compute dtype, valid until the next call. Throws c10::Error when a
  // capture fails (the engine then goes on eagerly).
  virtual torch::Tensor Forward(const torch::Tensor& ids, const torch::Tensor& lengths,
                                int64_t longest, KVCache& cache) = 0;
  virtual int64_t captures() const = 0;
  virtual int64_t replays() const = 0;
};

// Decode graphs for a model of `config` placed as `placement`, for a cache
// of max_rows x capacity; nullptr when this build cannot capture CUDA graphs
// (a LibTorch without CUDA) or the placement is not a CUDA device. Errors
// (out of memory for the weights' copy) are INTERNAL.
absl::StatusOr<std::unique_ptr<DecodeGraphs>> MakeDecodeGraphs(const ModelConfig& config,
                                                               const ModelPlacement& placement,
                                                               int64_t max_rows, int64_t capacity);

}  // namespace sluice::model

#endif  // SLUICE_COMMON_MODEL_DECODE_GRAPHS_H_
