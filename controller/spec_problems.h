#ifndef SLUICE_CONTROLLER_SPEC_PROBLEMS_H_
#define SLUICE_CONTROLLER_SPEC_PROBLEMS_H_

// What the run spec's checks share (run_spec.cc's validation, spec_sizes.cc's
// bounds, spec_defaults.cc's defaults): the list of "path: problem" lines
// and the bound helpers. Internal to the controller's sluice_run_spec.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/common.pb.h"

namespace sluice::controller::spec_internal {

constexpr size_t kMaxStopStringBytes = 256;

// Collects "path: problem" lines.
class Problems {
 public:
  template <typename... Args>
  void Add(absl::string_view path, const Args&... args) {
    lines_.push_back(absl::StrCat(path, ": ", args...));
  }
  // A line that already reads "path: problem".
  void AddLine(std::string line) { lines_.push_back(std::move(line)); }
  bool empty() const { return lines_.empty(); }
  absl::Status ToStatus() const {
    if (lines_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrJoin(lines_, "\n"));
  }

 private:
  std::vector<std::string> lines_;
};

// "must be <= N (a sane bound ...)" for an integer over its bound.
template <typename T, typename Bound>
void AtMost(Problems& problems, absl::string_view path, T value, Bound bound,
            absl::string_view why = "") {
  if (value <= static_cast<T>(bound)) return;
  problems.Add(path, "must be <= ", bound, why.empty() ? "" : " (", why, why.empty() ? "" : ")",
               ", got ", value);
}

// "must be at most N bytes, got M" for a string over its bound.
inline void AtMostBytes(Problems& problems, absl::string_view path, absl::string_view value,
                        size_t bound) {
  if (value.size() <= bound) return;
  problems.Add(path, "must be at most ", bound, " bytes, got ", value.size());
}

// The verifier a dataset format's rows are scored with when reward.verifiers
// is empty; nullptr for JSONL (the user says) and formats without a reader.
inline const char* DefaultDatasetVerifier(v1::DatasetFormat format) {
  switch (format) {
    case v1::DATASET_FORMAT_GSM8K:
    case v1::DATASET_FORMAT_MATH:
      return "math";
    case v1::DATASET_FORMAT_HUMANEVAL:
      return "code";
    default:
      return nullptr;
  }
}

}  // namespace sluice::controller::spec_internal

#endif  // SLUICE_CONTROLLER_SPEC_PROBLEMS_H_
