#ifndef SLUICE_SERVICES_WEIGHTS_TEST_VERSION_H_
#define SLUICE_SERVICES_WEIGHTS_TEST_VERSION_H_

// A weight version as the trainer streams it, for the weights tests.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "services/weights/version_stream.h"
#include "sluice/v1/trainer.pb.h"

namespace sluice::weights::testing {

struct TestVersion {
  v1::PolicyVersionInfo info;
  v1::WeightsManifest manifest;
  std::vector<v1::WeightsChunk> chunks;  // data chunks, in stream order
  std::vector<std::string> bytes;        // per tensor
};

// Tensors of the given sizes (bytes), chunked as the trainer does.
inline TestVersion MakeTestVersion(int64_t version, const std::vector<int64_t>& sizes,
                                   int64_t chunk_size = 64 << 10) {
  TestVersion v;
  for (size_t t = 0; t < sizes.size(); ++t) {
    std::string bytes(static_cast<size_t>(sizes[t]), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>((i * 131 + t * 7 + version * 3) & 0xff);
    }
    v1::TensorSpec* spec = v.manifest.add_tensors();
    spec->set_name(absl::StrCat("layer", t, ".weight"));
    spec->set_dtype(v1::DTYPE_FLOAT32);
    spec->add_shape(sizes[t] / 4);
    spec->set_size_bytes(sizes[t]);
    spec->set_crc32c(Crc32c(bytes));
    int64_t offset = 0;
    do {
      const int64_t n = std::min<int64_t>(chunk_size, sizes[t] - offset);
      v1::WeightsChunk chunk;
      chunk.set_version(version);
      chunk.set_tensor_name(spec->name());
      chunk.set_dtype(spec->dtype());
      chunk.set_tensor_size_bytes(sizes[t]);
      chunk.set_offset_bytes(offset);
      chunk.set_data(bytes.data() + offset, n);
      chunk.set_is_last_chunk_of_tensor(offset + n == sizes[t]);
      chunk.set_crc32c(Crc32c(chunk.data()));
      v.chunks.push_back(std::move(chunk));
      offset += n;
    } while (offset < sizes[t]);
    v.bytes.push_back(std::move(bytes));
  }
  v.info.set_run_id("run-1");
  v.info.set_version(version);
  v.info.set_tensor_count(static_cast<int32_t>(sizes.size()));
  v.info.set_checksum(VersionChecksum(v.bytes));
  *v.manifest.mutable_version() = v.info;
  return v;
}

}  // namespace sluice::weights::testing

#endif  // SLUICE_SERVICES_WEIGHTS_TEST_VERSION_H_
