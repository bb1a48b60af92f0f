#include "services/weights/delta_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "services/weights/version_stream.h"
#include "services/weights/weight_delta.h"

namespace sluice::weights {

namespace {

int64_t EncodedSize(const v1::TensorSpec& spec) {
  if (spec.encoding() == v1::TENSOR_ENCODING_SPARSE_DELTA) return spec.encoded_size_bytes();
  return spec.encoded_size_bytes() > 0 ? spec.encoded_size_bytes() : spec.size_bytes();
}

bool SameDelta(const v1::WeightsManifest& a, const v1::WeightsManifest& b) {
  if (a.version().version() != b.version().version() ||
      a.delta_base_version() != b.delta_base_version() || a.tensors_size() != b.tensors_size()) {
    return false;
  }
  for (int i = 0; i < a.tensors_size(); ++i) {
    const v1::TensorSpec& x = a.tensors(i);
    const v1::TensorSpec& y = b.tensors(i);
    if (x.name() != y.name() || x.encoding() != y.encoding() || EncodedSize(x) != EncodedSize(y) ||
        x.crc32c() != y.crc32c()) {
      return false;
    }
  }
  return true;
}

}  // namespace

DeltaStream::DeltaStream(const clients::FetchedWeights& base) : base_(base) {}

absl::Status DeltaStream::SetManifest(const v1::WeightsManifest& manifest) {
  const int64_t base_version = base_.manifest.version().version();
  if (!manifest.has_delta_base_version()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the trainer sends version ", manifest.version().version(), " in full, not as a delta: ",
        manifest.full_reason().empty() ? "no reason given" : manifest.full_reason()));
  }
  if (manifest.delta_base_version() != base_version) {
    return absl::DataLossError(absl::StrCat("a delta against version ",
                                            manifest.delta_base_version(), " where version ",
                                            base_version, " is held"));
  }
  if (have_manifest_) {
    if (!SameDelta(manifest, manifest_)) {
      return absl::DataLossError(absl::StrCat("a resumed delta stream of version ",
                                              manifest_.version().version(),
                                              " describes another delta"));
    }
    return absl::OkStatus();
  }
  std::vector<int> base_index;
  for (const v1::TensorSpec& spec : manifest.tensors()) {
    int found = -1;
    for (int j = 0; j < base_.manifest.tensors_size(); ++j) {
      if (base_.manifest.tensors(j).name() == spec.name()) {
        found = j;
        break;
      }
    }
    if (spec.encoding() == v1::TENSOR_ENCODING_SPARSE_DELTA &&
        (found < 0 || base_.manifest.tensors(found).dtype() != spec.dtype())) {
      return absl::DataLossError(absl::StrCat("the delta's tensor ", spec.name(),
                                              " has no counterpart of its dtype in version ",
                                              base_version));
    }
    if (EncodedSize(spec) < 0) {
      return absl::DataLossError(absl::StrCat("tensor ", spec.name(), ": negative encoded size"));
    }
    base_index.push_back(found);
  }
  manifest_ = manifest;
  base_index_ = std::move(base_index);
  encoded_.assign(manifest_.tensors_size(), std::string());
  have_manifest_ = true;
  return absl::OkStatus();
}

absl::Status DeltaStream::Append(const v1::WeightsChunk& chunk) {
  if (!have_manifest_) return absl::DataLossError("a weight chunk before the manifest");
  if (chunk.version() != manifest_.version().version()) {
    return absl::DataLossError(absl::StrCat("a chunk of version ", chunk.version(),
                                            " in a delta stream of version ",
                                            manifest_.version().version()));
  }
  if (Crc32c(chunk.data()) != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat("CRC32C mismatch in tensor ", chunk.tensor_name(),
                                            " at offset ", chunk.offset_bytes()));
  }
  int index = tensor_index_;
  if (index < 0 ||
      (static_cast<int64_t>(encoded_[index].size()) == EncodedSize(manifest_.tensors(index)) &&
       chunk.offset_bytes() == 0)) {
    ++index;
  }
  if (index >= manifest_.tensors_size() || manifest_.tensors(index).name() != chunk.tensor_name()) {
    return absl::DataLossError(
        absl::StrCat("unexpected chunk of tensor ", chunk.tensor_name(), " in delta stream"));
  }
  const int64_t size = EncodedSize(manifest_.tensors(index));
  const int64_t received = static_cast<int64_t>(encoded_[index].size());
  if (chunk.offset_bytes() != received ||
      received + static_cast<int64_t>(chunk.data().size()) > size) {
    return absl::DataLossError(absl::StrCat("chunk of ", chunk.tensor_name(), " at offset ",
                                            chunk.offset_bytes(), " but ", received, " of ", size,
                                            " encoded bytes received"));
  }
  tensor_index_ = index;
  encoded_[index].append(chunk.data());
  ++chunks_;
  wire_bytes_ += static_cast<int64_t>(chunk.data().size());
  return absl::OkStatus();
}

int64_t DeltaStream::full_bytes() const {
  int64_t total = 0;
  for (const v1::TensorSpec& spec : manifest_.tensors()) total += spec.size_bytes();
  return total;
}

absl::StatusOr<clients::FetchedWeights> DeltaStream::Complete() {
  if (!have_manifest_) return absl::DataLossError("delta stream ended before its manifest");
  clients::FetchedWeights result;
  result.manifest = manifest_;
  result.manifest.clear_delta_base_version();
  result.tensor_bytes.reserve(encoded_.size());
  for (int i = 0; i < manifest_.tensors_size(); ++i) {
    const v1::TensorSpec& spec = manifest_.tensors(i);
    if (static_cast<int64_t>(encoded_[i].size()) != EncodedSize(spec)) {
      return absl::DataLossError(absl::StrCat(
          "delta stream of version ", manifest_.version().version(), " ended with ",
          encoded_[i].size(), " of ", EncodedSize(spec), " bytes of tensor ", spec.name()));
    }
    const absl::string_view base = base_index_[i] >= 0
                                       ? absl::string_view(base_.tensor_bytes[base_index_[i]])
                                       : absl::string_view();
    ASSIGN_OR_RETURN(std::string bytes, DecodeTensor(spec, base, std::move(encoded_[i])));
    result.tensor_bytes.push_back(std::move(bytes));
    v1::TensorSpec& out = *result.manifest.mutable_tensors(i);
    out.set_encoding(v1::TENSOR_ENCODING_FULL);
    out.clear_encoded_size_bytes();
  }
  encoded_.assign(manifest_.tensors_size(), std::string());
  const std::string& expected = manifest_.version().checksum();
  if (const std::string checksum = VersionChecksum(result.tensor_bytes);
      !expected.empty() && checksum != expected) {
    return absl::DataLossError(absl::StrCat("version ", manifest_.version().version(),
                                            " rebuilt from a delta has checksum ", checksum,
                                            ", the trainer published ", expected));
  }
  return result;
}

}  // namespace sluice::weights
