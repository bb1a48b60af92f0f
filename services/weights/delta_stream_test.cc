#include "services/weights/delta_stream.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "services/weights/version_stream.h"
#include "services/weights/weight_delta.h"

namespace sluice::weights {
namespace {

// A bf16 version as a worker holds it.
clients::FetchedWeights Bf16Version(int64_t version, const std::vector<std::string>& tensors) {
  clients::FetchedWeights v;
  for (size_t t = 0; t < tensors.size(); ++t) {
    v1::TensorSpec* spec = v.manifest.add_tensors();
    spec->set_name(absl::StrCat("layer", t, ".weight"));
    spec->set_dtype(v1::DTYPE_BFLOAT16);
    spec->add_shape(static_cast<int64_t>(tensors[t].size() / 2));
    spec->set_size_bytes(static_cast<int64_t>(tensors[t].size()));
    spec->set_crc32c(Crc32c(tensors[t]));
  }
  v.tensor_bytes = tensors;
  v.manifest.mutable_version()->set_run_id("run-1");
  v.manifest.mutable_version()->set_version(version);
  v.manifest.mutable_version()->set_checksum(VersionChecksum(tensors));
  return v;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::string Flip(std::string s, size_t every) {
  for (size_t i = 0; i < s.size(); i += every) s[i] ^= 1;
  return s;
}

// What the trainer streams for `target` against `base`: the manifest, then
// each tensor's encoding in chunks of `chunk` bytes.
struct DeltaWire {
  v1::WeightsManifest manifest;
  std::vector<v1::WeightsChunk> chunks;
};

DeltaWire EncodeDelta(const clients::FetchedWeights& base, const clients::FetchedWeights& target,
                      int64_t chunk = 1000) {
  DeltaWire wire;
  wire.manifest = target.manifest;
  wire.manifest.set_delta_base_version(base.manifest.version().version());
  for (int i = 0; i < target.manifest.tensors_size(); ++i) {
    EncodedTensor encoded = *EncodeTensorDelta(base.tensor_bytes[i], target.tensor_bytes[i]);
    v1::TensorSpec* spec = wire.manifest.mutable_tensors(i);
    spec->set_encoding(encoded.encoding);
    const std::string& bytes = encoded.encoding == v1::TENSOR_ENCODING_SPARSE_DELTA
                                   ? encoded.bytes
                                   : target.tensor_bytes[i];
    spec->set_encoded_size_bytes(static_cast<int64_t>(bytes.size()));
    int64_t offset = 0;
    do {
      const int64_t n = std::min<int64_t>(chunk, static_cast<int64_t>(bytes.size()) - offset);
      v1::WeightsChunk c;
      c.set_version(target.manifest.version().version());
      c.set_tensor_name(spec->name());
      c.set_tensor_size_bytes(static_cast<int64_t>(bytes.size()));
      c.set_offset_bytes(offset);
      c.set_data(bytes.data() + offset, n);
      c.set_crc32c(Crc32c(c.data()));
      wire.chunks.push_back(std::move(c));
      offset += n;
    } while (offset < static_cast<int64_t>(bytes.size()));
  }
  return wire;
}

class DeltaStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string a = RandomBytes(40000, 1), b = RandomBytes(6000, 2);
    base_ = Bf16Version(3, {a, b});
    // The first tensor barely changes (a delta), the second entirely (FULL).
    target_ = Bf16Version(4, {Flip(a, 400), RandomBytes(6000, 3)});
    wire_ = EncodeDelta(base_, target_);
  }
  clients::FetchedWeights base_, target_;
  DeltaWire wire_;
};

TEST_F(DeltaStreamTest, RebuildsTheVersionFromASmallDelta) {
  ASSERT_EQ(wire_.manifest.tensors(0).encoding(), v1::TENSOR_ENCODING_SPARSE_DELTA);
  ASSERT_EQ(wire_.manifest.tensors(1).encoding(), v1::TENSOR_ENCODING_FULL);
  DeltaStream stream(base_);
  ASSERT_TRUE(stream.SetManifest(wire_.manifest).ok());
  for (const auto& chunk : wire_.chunks) ASSERT_TRUE(stream.Append(chunk).ok());
  absl::StatusOr<clients::FetchedWeights> rebuilt = stream.Complete();
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
  EXPECT_TRUE(rebuilt->tensor_bytes == target_.tensor_bytes);
  EXPECT_FALSE(rebuilt->manifest.has_delta_base_version());
  EXPECT_EQ(rebuilt->manifest.tensors(0).encoding(), v1::TENSOR_ENCODING_FULL);
  EXPECT_EQ(stream.full_bytes(), 46000);
  EXPECT_LT(stream.wire_bytes(), 6000 + 40000 / 4);
}

TEST_F(DeltaStreamTest, AFullManifestIsFailedPreconditionWithTheTrainersReason) {
  v1::WeightsManifest full = target_.manifest;
  full.set_full_reason("base version 3 is not retained");
  DeltaStream stream(base_);
  const absl::Status status = stream.SetManifest(full);
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "not retained")) << status;
  v1::WeightsManifest other_base = wire_.manifest;
  other_base.set_delta_base_version(2);
  EXPECT_TRUE(absl::IsDataLoss(stream.SetManifest(other_base)));
}

TEST_F(DeltaStreamTest, ResumesFromAnyChunkUnderTheSameManifest) {
  DeltaStream stream(base_);
  ASSERT_TRUE(stream.SetManifest(wire_.manifest).ok());
  const size_t cut = wire_.chunks.size() / 2;
  for (size_t i = 0; i < cut; ++i) ASSERT_TRUE(stream.Append(wire_.chunks[i]).ok());
  EXPECT_EQ(stream.chunks(), static_cast<int64_t>(cut));
  ASSERT_TRUE(stream.SetManifest(wire_.manifest).ok());
  for (size_t i = cut; i < wire_.chunks.size(); ++i)
    ASSERT_TRUE(stream.Append(wire_.chunks[i]).ok());
  ASSERT_TRUE(stream.Complete().ok());
  v1::WeightsManifest changed = wire_.manifest;
  changed.mutable_tensors(0)->set_encoded_size_bytes(7);
  DeltaStream other(base_);
  ASSERT_TRUE(other.SetManifest(wire_.manifest).ok());
  EXPECT_TRUE(absl::IsDataLoss(other.SetManifest(changed))) << "another delta on resume";
}

TEST_F(DeltaStreamTest, CorruptChunksAWrongBaseAndAShortStreamAreDataLoss) {
  {
    DeltaStream stream(base_);
    ASSERT_TRUE(stream.SetManifest(wire_.manifest).ok());
    v1::WeightsChunk bad = wire_.chunks[0];
    bad.mutable_data()->at(3) ^= 1;
    EXPECT_TRUE(absl::IsDataLoss(stream.Append(bad)));
    EXPECT_TRUE(absl::IsDataLoss(stream.Append(wire_.chunks[1]))) << "a gap";
  }
  {
    // A delta whose CRCs are all right but was made against other bytes.
    clients::FetchedWeights wrong = base_;
    wrong.tensor_bytes[0] = Flip(wrong.tensor_bytes[0], 1000);
    DeltaStream stream(wrong);
    ASSERT_TRUE(stream.SetManifest(wire_.manifest).ok());
    for (const auto& chunk : wire_.chunks) ASSERT_TRUE(stream.Append(chunk).ok());
    const absl::Status status = stream.Complete().status();
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "wrong base")) << status;
  }
  {
    DeltaStream stream(base_);
    ASSERT_TRUE(stream.SetManifest(wire_.manifest).ok());
    for (size_t i = 0; i + 1 < wire_.chunks.size(); ++i) {
      ASSERT_TRUE(stream.Append(wire_.chunks[i]).ok());
    }
    EXPECT_TRUE(absl::IsDataLoss(stream.Complete().status())) << "short";
  }
  {
    // A tampered version checksum: every tensor passes, the whole does not.
    v1::WeightsManifest manifest = wire_.manifest;
    manifest.mutable_version()->set_checksum("crc32c:00000000");
    DeltaStream stream(base_);
    ASSERT_TRUE(stream.SetManifest(manifest).ok());
    for (const auto& chunk : wire_.chunks) ASSERT_TRUE(stream.Append(chunk).ok());
    EXPECT_TRUE(absl::IsDataLoss(stream.Complete().status()));
  }
}

}  // namespace
}  // namespace sluice::weights
