// libFuzzer target for Hugging Face config.json (ModelConfig::FromJson): the
// controller, the trainer and every rollout worker read it from the model
// directory a run spec names, and size the model from it. Arbitrary text
// must give an error, never a crash; a config that parses must be one the
// rest of the code can do arithmetic on (ParameterCount), and must survive
// ToJson and FromJson unchanged.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace model = sluice::model;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<model::ModelConfig> config = model::ModelConfig::FromJson(input);
  if (!config.ok()) return 0;
  (void)config->ParameterCount();
  absl::StatusOr<model::ModelConfig> again = model::ModelConfig::FromJson(config->ToJson());
  if (!again.ok() || again->ToJson() != config->ToJson()) __builtin_trap();
  return 0;
}
