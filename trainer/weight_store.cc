#include "trainer/weight_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/weights/weight_delta.h"
#include "services/weights/weight_dtype.h"

namespace sluice::trainer {

std::shared_ptr<const VersionDelta> EncodeVersionDelta(const PublishedVersion& base,
                                                       const PublishedVersion& version) {
  if (base.tensors.size() != version.tensors.size() || base.bytes.size() != base.tensors.size() ||
      version.bytes.size() != version.tensors.size()) {
    return nullptr;
  }
  const absl::Time start = absl::Now();
  auto delta = std::make_shared<VersionDelta>();
  delta->base_version = base.info.version();
  for (size_t i = 0; i < version.tensors.size(); ++i) {
    const v1::TensorSpec& from = base.tensors[i];
    const v1::TensorSpec& to = version.tensors[i];
    if (from.name() != to.name() || from.dtype() != to.dtype() ||
        weights::WeightDtypeSize(to.dtype()) != 2 ||
        base.bytes[i].size() != version.bytes[i].size()) {
      return nullptr;
    }
    absl::StatusOr<weights::EncodedTensor> encoded =
        weights::EncodeTensorDelta(base.bytes[i], version.bytes[i]);
    if (!encoded.ok()) return nullptr;
    v1::TensorSpec spec = to;
    spec.set_encoding(encoded->encoding);
    const int64_t size = encoded->encoding == v1::TENSOR_ENCODING_SPARSE_DELTA
                             ? static_cast<int64_t>(encoded->bytes.size())
                             : to.size_bytes();
    spec.set_encoded_size_bytes(size);
    delta->encoded_bytes += size;
    delta->tensors.push_back(std::move(spec));
    delta->encoded.push_back(std::move(encoded->bytes));
  }
  delta->encode_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return delta;
}

absl::StatusOr<std::string> PublishedFloat32Bytes(const v1::TensorSpec& spec,
                                                  const std::string& bytes) {
  absl::StatusOr<std::string> converted = weights::BytesToFloat32(spec.dtype(), bytes);
  if (!converted.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", spec.name(), ": ", converted.status().message()));
  }
  return converted;
}

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
