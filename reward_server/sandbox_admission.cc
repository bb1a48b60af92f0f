#include "reward_server/sandbox_admission.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/retry_after.h"

namespace sluice::reward_server {

absl::Status SandboxAdmissionOptions::Validate() const {
  if (slots < 1) return absl::InvalidArgumentError(absl::StrCat("slots must be >= 1, got ", slots));
  if (max_queued < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_queued must be >= 0, got ", max_queued));
  }
  if (min_retry_after < absl::ZeroDuration() || max_retry_after < min_retry_after) {
    return absl::InvalidArgumentError("retry hints must satisfy 0 <= min_retry_after <= max_retry_after");
  }
  return absl::OkStatus();
}

SandboxAdmission::SandboxAdmission(SandboxAdmissionOptions options,
                                   std::function<absl::Duration()> mean_run_time)
    : options_(options), mean_run_time_(std::move(mean_run_time)) {}

absl::Status SandboxAdmission::TryAdmit(int64_t programs) {
  if (programs <= 0) return absl::OkStatus();
  const int64_t capacity = int64_t{options_.slots} + options_.max_queued;
  int64_t admitted;
  {
    absl::MutexLock lock(&mu_);
    if (admitted_ == 0 || admitted_ + programs <= capacity) {
      admitted_ += programs;
      return absl::OkStatus();
    }
    ++refused_;
    admitted = admitted_;
  }
  absl::Duration per_program = mean_run_time_ ? mean_run_time_() : absl::ZeroDuration();
  if (per_program <= absl::ZeroDuration()) per_program = absl::Milliseconds(100);
  const absl::Duration wait = std::clamp(per_program * (static_cast<double>(admitted) / options_.slots),
                                         options_.min_retry_after, options_.max_retry_after);
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1)));
  return WithRetryAfter(
      absl::ResourceExhaustedError(absl::StrCat(
          "the code sandbox is full: ", admitted, " programs admitted for ", options_.slots,
          " slots (at most ", capacity, "); this batch has ", programs,
          "; retry after ", ms, " ms")),
      absl::Milliseconds(ms));
}

void SandboxAdmission::Release(int64_t programs) {
  if (programs <= 0) return;
  absl::MutexLock lock(&mu_);
  admitted_ = std::max<int64_t>(0, admitted_ - programs);
}

int64_t SandboxAdmission::admitted() const {
  absl::MutexLock lock(&mu_);
  return admitted_;
}

uint64_t SandboxAdmission::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

int64_t CountSandboxedPrograms(const std::vector<ScoreItem>& items,
                               const std::vector<WeightedVerifier>& composition,
                               const std::string& sandboxed_verifier) {
  const bool composition_runs_it =
      std::any_of(composition.begin(), composition.end(),
                  [&](const WeightedVerifier& v) { return v.name == sandboxed_verifier; });
  int64_t count = 0;
  for (const ScoreItem& item : items) {
    if (item.verifier == sandboxed_verifier ||
        (item.verifier.empty() && composition_runs_it)) {
      ++count;
    }
  }
  return count;
}

}  // namespace sluice::reward_server
