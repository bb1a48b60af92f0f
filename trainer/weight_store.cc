#include "trainer/weight_store.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace sluice::trainer {

void WeightStore::Publish(std::shared_ptr<const PublishedVersion> version) {
  absl::MutexLock lock(&mu_);
  if (run_id_.empty()) run_id_ = version->info.run_id();
  versions_.push_back(std::move(version));
  while (static_cast<int>(versions_.size()) > retain_) versions_.pop_front();
}

void WeightStore::Reset(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  run_id_ = run_id;
  versions_.clear();
  ++generation_;
}

bool WeightStore::RunMatches(const std::string& run_id) const {
  return run_id.empty() || run_id == run_id_;
}

absl::StatusOr<std::shared_ptr<const PublishedVersion>> WeightStore::Latest(
    const std::string& run_id) const {
  absl::MutexLock lock(&mu_);
  if (!RunMatches(run_id)) {
    return absl::NotFoundError(absl::StrCat("run ", run_id, " is not this trainer's current run (",
                                            run_id_.empty() ? "none" : run_id_, ")"));
  }
  if (versions_.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no weights published yet for run ", run_id_.empty() ? run_id : run_id_));
  }
  return versions_.back();
}

absl::StatusOr<std::shared_ptr<const PublishedVersion>> WeightStore::Get(
    const std::string& run_id, int64_t version) const {
  absl::MutexLock lock(&mu_);
  if (!RunMatches(run_id)) {
    return absl::NotFoundError(absl::StrCat("run ", run_id, " is not this trainer's current run"));
  }
  for (const auto& v : versions_) {
    if (v->info.version() == version) return v;
  }
  return absl::NotFoundError(absl::StrCat("version ", version, " of run ", run_id_,
                                          " is not retained; ask for the latest"));
}

absl::StatusOr<std::shared_ptr<const PublishedVersion>> WeightStore::WaitForNewer(
    const std::string& run_id, int64_t after_version, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  const int64_t generation = generation_;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || generation_ != generation ||
           (RunMatches(run_id) && !versions_.empty() &&
            versions_.back()->info.version() > after_version);
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (closed_) return absl::CancelledError("trainer is shutting down");
  if (generation_ != generation) return absl::CancelledError("the trainer started another run");
  if (RunMatches(run_id) && !versions_.empty() &&
      versions_.back()->info.version() > after_version) {
    return versions_.back();
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no version after ", after_version, " was published in time"));
}

void WeightStore::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace sluice::trainer
