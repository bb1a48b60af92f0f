#include "common/model/device_spec.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace sluice::model {

std::string DeviceSpec::ToString() const {
  if (!cuda) return "cpu";
  return index < 0 ? "cuda" : absl::StrCat("cuda:", index);
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(absl::string_view text) {
  DeviceSpec spec;
  if (text.empty() || text == "cpu") return spec;
  spec.cuda = true;
  if (text == "cuda") return spec;
  absl::string_view index = text;
  int value = 0;
  if (absl::ConsumePrefix(&index, "cuda:") && !index.empty() &&
      index.find_first_not_of("0123456789") == absl::string_view::npos &&
      absl::SimpleAtoi(index, &value) && value <= 1023) {
    spec.index = value;
    return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", text, "\" is not one of cpu, cuda or cuda:N (N a device index)"));
}

}  // namespace sluice::model
