#include "common/model/decode_graphs.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

#ifdef SLUICE_TORCH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace sluice::model {

#ifdef SLUICE_TORCH_CUDA
namespace {

int64_t NextPowerOfTwo(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

class CudaDecodeGraphs final : public DecodeGraphs {
 public:
  CudaDecodeGraphs(std::unique_ptr<Transformer> model, int64_t max_rows, int64_t capacity)
      : model_(std::move(model)), max_rows_(max_rows), capacity_(capacity) {
    const auto options = torch::TensorOptions().dtype(torch::kInt64).device(model_->device());
    ids_ = torch::zeros({max_rows_, 1}, options);
    lengths_ = torch::zeros({max_rows_}, options);
    pool_ = at::cuda::graph_pool_handle();
  }

  void SetWeights(const Transformer& policy) override {
    // Copied in place (device to device): the graphs keep reading the same
    // parameter buffers.
    const absl::Status loaded = model_->LoadWeights(policy.parameters());
    TORCH_CHECK(loaded.ok(), "decode graphs: ", loaded.ToString());
  }

  torch::Tensor Forward(const torch::Tensor& ids, const torch::Tensor& lengths, int64_t longest,
                        KVCache& cache) override {
    const int64_t batch = ids.size(0);
    const int64_t rows = std::min(NextPowerOfTwo(batch), max_rows_);
    const int64_t width = std::min(std::max<int64_t>(64, NextPowerOfTwo(longest + 1)), capacity_);
    TORCH_CHECK(longest + 1 <= width, "decode graphs: row length ", longest,
                " does not fit the cache's ", capacity_, " positions");
    // The step's inputs into the graphs' static buffers; padded rows decode
    // token 0 at position 0.
    torch::Tensor ids_view = ids_.narrow(0, 0, rows);
    torch::Tensor lengths_view = lengths_.narrow(0, 0, rows);
    ids_view.narrow(0, 0, batch).copy_(ids);
    lengths_view.narrow(0, 0, batch).copy_(lengths);
    if (rows > batch) {
      ids_view.narrow(0, batch, rows - batch).zero_();
      lengths_view.narrow(0, batch, rows - batch).zero_();
    }
    const std::pair<int64_t, int64_t> key(rows, width);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      Captured captured;
      c10::cuda::CUDAStream stream =
          c10::cuda::getStreamFromPool(/*isHighPriority=*/false, model_->device().index());
      // The capture runs on a side stream, after the current stream's work
      // (the inputs just copied).
      c10::cuda::getCurrentCUDAStream(model_->device().index()).synchronize();
      {
        c10::cuda::CUDAStreamGuard guard(stream);
        // Warm-up (cuBLAS handles and workspaces are made outside the
        // capture). These runs compute this very step: writing the new
        // keys and values again is idempotent.
        for (int i = 0; i < 2; ++i) model_->ForwardRows(ids_view, lengths_view, cache, width - 1);
        stream.synchronize();
        captured.graph = std::make_unique<at::cuda::CUDAGraph>();
        captured.graph->capture_begin(pool_);
        captured.logits = model_->ForwardRows(ids_view, lengths_view, cache, width - 1);
        captured.graph->capture_end();
      }
      stream.synchronize();
      it = graphs_.emplace(key, std::move(captured)).first;
      ++captures_;
    }
    it->second.graph->replay();
    ++replays_;
    return it->second.logits.narrow(0, 0, batch).squeeze(1);
  }

  int64_t captures() const override { return captures_; }
  int64_t replays() const override { return replays_; }

 private:
  struct Captured {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    torch::Tensor logits;  // [rows, 1, vocab], rewritten by each replay
  };
  std::unique_ptr<Transformer> model_;
  const int64_t max_rows_;
  const int64_t capacity_;
  torch::Tensor ids_, lengths_;  // static inputs [max_rows, 1], [max_rows]
  decltype(at::cuda::graph_pool_handle()) pool_;
  std::map<std::pair<int64_t, int64_t>, Captured> graphs_;
  int64_t captures_ = 0;
  int64_t replays_ = 0;
};

}  // namespace
#endif  // SLUICE_TORCH_CUDA

absl::StatusOr<std::unique_ptr<DecodeGraphs>> MakeDecodeGraphs(const ModelConfig& config,
                                                               const ModelPlacement& placement,
                                                               int64_t max_rows, int64_t capacity) {
#ifdef SLUICE_TORCH_CUDA
  if (!placement.device.is_cuda()) return std::unique_ptr<DecodeGraphs>();
  absl::StatusOr<std::unique_ptr<Transformer>> model =
      Transformer::CreateUninitialized(config, placement);
  if (!model.ok()) {
    return absl::InternalError(
        absl::StrCat("decode graphs: cannot make their model: ", model.status().message()));
  }
  return std::unique_ptr<DecodeGraphs>(new CudaDecodeGraphs(*std::move(model), max_rows, capacity));
#else
  (void)config;
  (void)placement;
  (void)max_rows;
  (void)capacity;
  return std::unique_ptr<DecodeGraphs>();
#endif
}

}  // namespace sluice::model
