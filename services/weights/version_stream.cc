#include "services/weights/version_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace sluice::weights {

namespace {

// PolicyVersionInfo.checksum's text for a crc32c over a version's bytes.
std::string FormatChecksum(uint32_t crc) { return absl::StrFormat("crc32c:%08x", crc); }

}  // namespace

std::string VersionChecksum(const std::vector<std::string>& tensor_bytes) {
  uint32_t crc = 0;
  for (const std::string& bytes : tensor_bytes) crc = Crc32c(bytes, crc);
  return FormatChecksum(crc);
}

VersionStream::VersionStream(std::string run_id, v1::PolicyVersionInfo info)
    : run_id_(std::move(run_id)), info_(std::move(info)) {}

absl::Status VersionStream::SetManifest(const v1::WeightsManifest& manifest) {
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return failure_;
  if (manifest.version().version() != info_.version()) {
    return absl::DataLossError(absl::StrCat("manifest of version ", manifest.version().version(),
                                            " where version ", info_.version(), " was asked"));
  }
  if (!have_manifest_) {
    manifest_ = manifest;
    have_manifest_ = true;
    return absl::OkStatus();
  }
  bool same = manifest.tensors_size() == manifest_.tensors_size();
  for (int i = 0; same && i < manifest.tensors_size(); ++i) {
    same = manifest.tensors(i).name() == manifest_.tensors(i).name() &&
           manifest.tensors(i).size_bytes() == manifest_.tensors(i).size_bytes();
  }
  if (!same) {
    return absl::DataLossError(
        absl::StrCat("a resumed stream of version ", info_.version(), " lists other tensors"));
  }
  return absl::OkStatus();
}

absl::Status VersionStream::Append(v1::WeightsChunk chunk) {
  absl::MutexLock lock(&mu_);
  if (!failure_.ok()) return failure_;
  if (complete_) return absl::FailedPreconditionError("the version is already complete");
  if (!have_manifest_) return absl::DataLossError("a weight chunk before the manifest");
  if (chunk.version() != info_.version()) {
    return absl::DataLossError(absl::StrCat("a chunk of version ", chunk.version(),
                                            " in a stream of version ", info_.version()));
  }
  if (Crc32c(chunk.data()) != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat("CRC32C mismatch in tensor ", chunk.tensor_name(),
                                            " at offset ", chunk.offset_bytes()));
  }
  // The next tensor starts at offset 0 once the current one is whole.
  int index = tensor_index_;
  int64_t received = tensor_received_;
  if (index < 0 || (received == manifest_.tensors(index).size_bytes() && chunk.offset_bytes() == 0)) {
    ++index;
    received = 0;
  }
  if (index >= manifest_.tensors_size() || manifest_.tensors(index).name() != chunk.tensor_name()) {
    return absl::DataLossError(
        absl::StrCat("unexpected chunk of tensor ", chunk.tensor_name(), " in weight stream"));
  }
  const int64_t size = manifest_.tensors(index).size_bytes();
  if (chunk.offset_bytes() != received ||
      received + static_cast<int64_t>(chunk.data().size()) > size) {
    return absl::DataLossError(absl::StrCat("chunk of ", chunk.tensor_name(), " at offset ",
                                            chunk.offset_bytes(), " but ", received, " of ", size,
                                            " bytes received"));
  }
  tensor_index_ = index;
  tensor_received_ = received + static_cast<int64_t>(chunk.data().size());
  // The version's checksum runs over the bytes in stream order: computed
  // here, while the chunk is in cache, not in another pass at the end.
  running_crc_ = Crc32c(chunk.data(), running_crc_);
  chunks_.push_back(std::make_shared<const v1::WeightsChunk>(std::move(chunk)));
  chunk_tensors_.push_back(index);
  return absl::OkStatus();
}

int64_t VersionStream::chunks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(chunks_.size());
}

absl::StatusOr<clients::FetchedWeights> VersionStream::Complete() {
  absl::Status problem;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return failure_;
    if (!have_manifest_) {
      problem = absl::DataLossError("weight stream ended before its manifest");
    } else if (!Whole()) {
      problem = absl::DataLossError(absl::StrCat("weight stream of version ", info_.version(),
                                                 " ended after ", chunks_.size(),
                                                 " chunks, before its last tensor was whole"));
    }
  }
  absl::StatusOr<clients::FetchedWeights> assembled =
      problem.ok() ? Assemble() : absl::StatusOr<clients::FetchedWeights>(problem);
  absl::MutexLock lock(&mu_);
  if (!assembled.ok()) {
    failure_ = assembled.status();
    return failure_;
  }
  complete_ = true;
  return assembled;
}

bool VersionStream::Whole() const {
  const int last = manifest_.tensors_size() - 1;
  return have_manifest_ && (last < 0 || (tensor_index_ == last &&
                                         tensor_received_ == manifest_.tensors(last).size_bytes()));
}

void VersionStream::Fail(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  if (failure_.ok() && !complete_) failure_ = why.ok() ? absl::UnknownError("failed") : why;
}

bool VersionStream::failed() const {
  absl::MutexLock lock(&mu_);
  return !failure_.ok();
}

bool VersionStream::complete() const {
  absl::MutexLock lock(&mu_);
  return complete_;
}

absl::StatusOr<clients::FetchedWeights> VersionStream::Assemble() const {
  std::vector<std::shared_ptr<const v1::WeightsChunk>> chunks;
  std::vector<int> tensors;
  clients::FetchedWeights fetched;
  uint32_t running_crc = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!have_manifest_) return absl::FailedPreconditionError("no manifest received");
    chunks = chunks_;
    tensors = chunk_tensors_;
    fetched.manifest = manifest_;
    running_crc = running_crc_;
  }
  const std::string checksum = FormatChecksum(running_crc);
  if (!info_.checksum().empty() && checksum != info_.checksum()) {
    return absl::DataLossError(absl::StrCat("version ", info_.version(), " has checksum ",
                                            checksum, ", the trainer published ", info_.checksum()));
  }
  const int n = fetched.manifest.tensors_size();
  fetched.tensor_bytes.resize(n);
  for (int i = 0; i < n; ++i) {
    fetched.tensor_bytes[i].reserve(static_cast<size_t>(fetched.manifest.tensors(i).size_bytes()));
  }
  // Append placed every chunk (its tensor, contiguous offsets).
  for (size_t c = 0; c < chunks.size(); ++c) {
    fetched.tensor_bytes[tensors[c]].append(chunks[c]->data());
  }
  for (int i = 0; i < n; ++i) {
    const v1::TensorSpec& spec = fetched.manifest.tensors(i);
    if (static_cast<int64_t>(fetched.tensor_bytes[i].size()) != spec.size_bytes()) {
      return absl::DataLossError(absl::StrCat(
          "tensor ", spec.name(), ": ", fetched.tensor_bytes[i].size(), " of ", spec.size_bytes(),
          " bytes received"));
    }
    // The version's checksum (from the trainer, not the relay) covers every
    // byte; a tensor's own CRC is checked only when there is none.
    if (info_.checksum().empty() && spec.crc32c() != 0 &&
        Crc32c(fetched.tensor_bytes[i]) != spec.crc32c()) {
      return absl::DataLossError(absl::StrCat("tensor ", spec.name(), " of version ",
                                              info_.version(), " fails its CRC32C"));
    }
  }
  return fetched;
}

absl::StatusOr<v1::WeightsManifest> VersionStream::WaitManifest(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return have_manifest_ || !failure_.ok();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (!failure_.ok()) {
    return absl::UnavailableError(absl::StrCat("relay lost its source: ", failure_.message()));
  }
  if (!have_manifest_) return absl::UnavailableError("relay's source sent no manifest in time");
  return manifest_;
}

absl::StatusOr<std::shared_ptr<const v1::WeightsChunk>> VersionStream::WaitChunk(
    int64_t index, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto ready = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int64_t>(chunks_.size()) > index || Whole() || !failure_.ok();
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (static_cast<int64_t>(chunks_.size()) > index) return chunks_[index];
  // Every byte is here: the end, without waiting for this relay's own
  // checksum pass (each receiver checks the version itself).
  if (Whole()) return std::shared_ptr<const v1::WeightsChunk>();
  if (!failure_.ok()) {
    return absl::UnavailableError(absl::StrCat("relay lost its source: ", failure_.message()));
  }
  return absl::UnavailableError("relay's source stalled");
}

std::shared_ptr<VersionStream> RelayCache::Begin(const std::string& run_id,
                                                 const v1::PolicyVersionInfo& info) {
  absl::MutexLock lock(&mu_);
  auto& versions = runs_[run_id];
  auto it = versions.find(info.version());
  if (it != versions.end() && !it->second->failed()) return it->second;
  auto stream = std::make_shared<VersionStream>(run_id, info);
  versions[info.version()] = stream;
  return stream;
}

void RelayCache::Trim(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  auto run = runs_.find(run_id);
  if (run == runs_.end()) return;
  auto& versions = run->second;
  int complete = 0;
  int64_t keep_from = -1;
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (it->second->complete() && ++complete == std::max(1, keep_complete_)) {
      keep_from = it->first;
      break;
    }
  }
  if (keep_from < 0) return;
  versions.erase(versions.begin(), versions.lower_bound(keep_from));
}

absl::StatusOr<std::shared_ptr<VersionStream>> RelayCache::Find(const std::string& run_id,
                                                                int64_t version,
                                                                absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<VersionStream> found;
  auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto run = runs_.find(run_id);
    if (run == runs_.end() || run->second.empty()) return false;
    if (version < 0) {
      found = run->second.rbegin()->second;
      return true;
    }
    auto it = run->second.find(version);
    if (it == run->second.end()) return false;
    found = it->second;
    return true;
  };
  mu_.AwaitWithDeadline(absl::Condition(&present), deadline);
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("this worker holds no version ", version, " of run ",
                                            run_id));
  }
  return found;
}

void RelayCache::Forget(const std::string& run_id) {
  absl::MutexLock lock(&mu_);
  runs_.erase(run_id);
}

}  // namespace sluice::weights
