#include "services/weights/version_stream.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/weights/test_version.h"

namespace sluice::weights {
namespace {

using testing::MakeTestVersion;
using testing::TestVersion;

TEST(VersionStreamTest, ReceivesChecksAndAssemblesAVersion) {
  const TestVersion v = MakeTestVersion(3, {200000, 0, 4, 70000});
  VersionStream stream("run-1", v.info);
  ASSERT_TRUE(stream.SetManifest(v.manifest).ok());
  for (const auto& chunk : v.chunks) ASSERT_TRUE(stream.Append(chunk).ok());
  EXPECT_EQ(stream.chunks(), static_cast<int64_t>(v.chunks.size()));
  auto weights = stream.Complete();
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->tensor_bytes, v.bytes);
  EXPECT_TRUE(stream.complete());
}

TEST(VersionStreamTest, RefusesBadCrcOutOfOrderAndForeignChunks) {
  const TestVersion v = MakeTestVersion(3, {200000, 100});
  VersionStream stream("run-1", v.info);
  v1::WeightsChunk early = v.chunks[0];
  EXPECT_TRUE(absl::IsDataLoss(stream.Append(early))) << "before the manifest";
  ASSERT_TRUE(stream.SetManifest(v.manifest).ok());
  v1::WeightsChunk bad = v.chunks[0];
  bad.mutable_data()->at(5) ^= 1;
  EXPECT_TRUE(absl::IsDataLoss(stream.Append(bad)));
  EXPECT_TRUE(absl::IsDataLoss(stream.Append(v.chunks[1]))) << "a gap";
  v1::WeightsChunk other = v.chunks[0];
  other.set_version(4);
  EXPECT_TRUE(absl::IsDataLoss(stream.Append(other)));
  EXPECT_EQ(stream.chunks(), 0);
  ASSERT_TRUE(stream.Append(v.chunks[0]).ok());
  // Ended early: not whole.
  EXPECT_TRUE(absl::IsDataLoss(stream.Complete().status()));
  EXPECT_TRUE(stream.failed());
}

TEST(VersionStreamTest, ChecksumCatchesBytesAlteredWithFreshCrcs) {
  TestVersion v = MakeTestVersion(3, {100000});
  v.chunks[1].mutable_data()->at(0) ^= 0x40;
  v.chunks[1].set_crc32c(Crc32c(v.chunks[1].data()));
  v.manifest.mutable_tensors(0)->set_crc32c(0);  // a relay could drop it too
  VersionStream stream("run-1", v.info);
  ASSERT_TRUE(stream.SetManifest(v.manifest).ok());
  for (const auto& chunk : v.chunks) ASSERT_TRUE(stream.Append(chunk).ok());
  absl::Status status = stream.Complete().status();
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("checksum"), std::string::npos) << status;
}

TEST(VersionStreamTest, AResumeMustListTheSameTensors) {
  const TestVersion v = MakeTestVersion(3, {1000, 2000});
  const TestVersion other = MakeTestVersion(3, {1000, 2004});
  VersionStream stream("run-1", v.info);
  ASSERT_TRUE(stream.SetManifest(v.manifest).ok());
  EXPECT_TRUE(stream.SetManifest(v.manifest).ok());
  EXPECT_TRUE(absl::IsDataLoss(stream.SetManifest(other.manifest)));
}

TEST(VersionStreamTest, ReadersGetEachChunkAsItArrivesThenTheEnd) {
  const TestVersion v = MakeTestVersion(3, {300000});
  VersionStream stream("run-1", v.info);
  std::vector<std::string> read;
  std::thread reader([&] {
    auto manifest = stream.WaitManifest(absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(manifest.ok());
    for (int64_t i = 0;; ++i) {
      auto chunk = stream.WaitChunk(i, absl::Now() + absl::Seconds(10));
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      if (*chunk == nullptr) break;
      read.push_back((*chunk)->data());
    }
  });
  ASSERT_TRUE(stream.SetManifest(v.manifest).ok());
  for (const auto& chunk : v.chunks) {
    absl::SleepFor(absl::Milliseconds(2));
    ASSERT_TRUE(stream.Append(chunk).ok());
  }
  reader.join();
  ASSERT_EQ(read.size(), v.chunks.size());
  for (size_t i = 0; i < read.size(); ++i) EXPECT_EQ(read[i], v.chunks[i].data());
}

TEST(VersionStreamTest, ReadersOfAFailedOrStalledStreamGetUnavailable) {
  const TestVersion v = MakeTestVersion(3, {300000});
  VersionStream stream("run-1", v.info);
  ASSERT_TRUE(stream.SetManifest(v.manifest).ok());
  ASSERT_TRUE(stream.Append(v.chunks[0]).ok());
  EXPECT_TRUE(absl::IsUnavailable(
      stream.WaitChunk(1, absl::Now() + absl::Milliseconds(20)).status()));
  std::thread failer([&] {
    absl::SleepFor(absl::Milliseconds(20));
    stream.Fail(absl::UnavailableError("source went away"));
  });
  auto chunk = stream.WaitChunk(1, absl::Now() + absl::Seconds(10));
  failer.join();
  EXPECT_TRUE(absl::IsUnavailable(chunk.status()));
  EXPECT_NE(chunk.status().message().find("source went away"), std::string::npos);
  // Chunk 0 is still served (a reader resumes from elsewhere later).
  EXPECT_TRUE(stream.WaitChunk(0, absl::Now()).ok());
}

TEST(RelayCacheTest, FindWaitsForAVersionToBeginAndTrimKeepsTheNewest) {
  RelayCache cache;
  const TestVersion v1 = MakeTestVersion(1, {1000});
  const TestVersion v2 = MakeTestVersion(2, {1000});
  EXPECT_TRUE(absl::IsNotFound(cache.Find("run-1", 1, absl::Now()).status()));
  std::thread begin([&] {
    absl::SleepFor(absl::Milliseconds(20));
    cache.Begin("run-1", v1.info);
  });
  auto found = cache.Find("run-1", 1, absl::Now() + absl::Seconds(10));
  begin.join();
  ASSERT_TRUE(found.ok());
  EXPECT_EQ((*found)->version(), 1);
  // Begin again: the same stream (a resume), until it fails.
  EXPECT_EQ(cache.Begin("run-1", v1.info), *found);
  (*found)->Fail(absl::DataLossError("bad"));
  auto fresh = cache.Begin("run-1", v1.info);
  EXPECT_NE(fresh, *found);
  ASSERT_TRUE(fresh->SetManifest(v1.manifest).ok());
  for (const auto& c : v1.chunks) ASSERT_TRUE(fresh->Append(c).ok());
  ASSERT_TRUE(fresh->Complete().ok());
  auto second = cache.Begin("run-1", v2.info);
  ASSERT_TRUE(second->SetManifest(v2.manifest).ok());
  for (const auto& c : v2.chunks) ASSERT_TRUE(second->Append(c).ok());
  ASSERT_TRUE(second->Complete().ok());
  cache.Trim("run-1");
  EXPECT_TRUE(absl::IsNotFound(cache.Find("run-1", 1, absl::Now()).status()));
  auto newest = cache.Find("run-1", -1, absl::Now());
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ((*newest)->version(), 2);
  cache.Forget("run-1");
  EXPECT_TRUE(absl::IsNotFound(cache.Find("run-1", -1, absl::Now()).status()));
}

}  // namespace
}  // namespace sluice::weights
