#include "trainer/policy_history.h"

#include <utility>
#include <vector>

namespace sluice::trainer {

void PolicyHistory::Add(std::shared_ptr<const PublishedVersion> version) {
  const int64_t number = version->info.version();
  // A resumed run republishes its checkpoint's version; an update that was
  // skipped publishes the same weights under the next number.
  while (!versions_.empty() && versions_.back()->info.version() >= number) {
    models_.erase(versions_.back()->info.version());
    versions_.pop_back();
  }
  versions_.push_back(std::move(version));
  while (static_cast<int>(versions_.size()) > retain_) {
    models_.erase(versions_.front()->info.version());
    versions_.pop_front();
  }
}

std::shared_ptr<const model::Transformer> PolicyHistory::Get(int64_t version) {
  if (auto it = models_.find(version); it != models_.end()) return it->second;
  for (const auto& published : versions_) {
    if (published->info.version() != version) continue;
    absl::StatusOr<std::unique_ptr<model::Transformer>> model =
        model::Transformer::CreateUninitialized(config_);
    if (!model.ok()) return nullptr;
    std::vector<model::NamedTensor> weights;
    // bf16 / f16 versions widened to float32 as the rollout worker widens
    // them: the recomputation sees the weights the worker sampled with.
    std::vector<std::string> widened(published->tensors.size());
    for (size_t i = 0; i < published->tensors.size(); ++i) {
      const v1::TensorSpec& spec = published->tensors[i];
      const std::string* bytes = &published->bytes[i];
      if (spec.dtype() == v1::DTYPE_BFLOAT16 || spec.dtype() == v1::DTYPE_FLOAT16) {
        absl::StatusOr<std::string> float32 = PublishedFloat32Bytes(spec, *bytes);
        if (!float32.ok()) return nullptr;
        widened[i] = *std::move(float32);
        bytes = &widened[i];
      }
      absl::StatusOr<torch::Tensor> tensor = model::Float32TensorView(
          std::vector<int64_t>(spec.shape().begin(), spec.shape().end()), *bytes);
      if (!tensor.ok()) return nullptr;
      weights.push_back({spec.name(), *std::move(tensor)});
    }
    if (!(*model)->LoadWeights(weights).ok()) return nullptr;
    std::shared_ptr<const model::Transformer> built(std::move(*model));
    models_[version] = built;
    return built;
  }
  return nullptr;
}

}  // namespace sluice::trainer
