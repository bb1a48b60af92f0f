#ifndef SLUICE_COMMON_MODEL_TEST_MODELS_H_
#define SLUICE_COMMON_MODEL_TEST_MODELS_H_

// Models for the generation and engine tests (test-only).

#include <memory>
#include <string>
#include <vector>

#include "common/model/model_config.h"
#include "common/model/transformer.h"
#include "gtest/gtest.h"

namespace sluice::model::testing {

// A builtin-shaped model with O(1) logits: the 0.02 initialisation gives
// near-uniform distributions, under which greedy choices would hinge on float
// rounding, so its weights are redrawn at 0.1 (norms around 1).
inline std::shared_ptr<const Transformer> TestModel(uint64_t seed, int64_t vocab,
                                                    const std::string& name = "tiny") {
  absl::StatusOr<std::unique_ptr<Transformer>> model =
      Transformer::Create(*BuiltinModelConfig(name, vocab), seed);
  EXPECT_TRUE(model.ok());
  torch::manual_seed(seed);
  std::vector<NamedTensor> weights;
  for (const NamedTensor& param : (*model)->parameters()) {
    torch::Tensor value = torch::randn(param.tensor.sizes()) * 0.1;
    if (param.name.find("norm") != std::string::npos) value = 1.0 + value;
    weights.push_back({param.name, value});
  }
  EXPECT_TRUE((*model)->LoadWeights(weights).ok());
  return std::shared_ptr<const Transformer>(std::move(*model));
}

}  // namespace sluice::model::testing

#endif  // SLUICE_COMMON_MODEL_TEST_MODELS_H_
