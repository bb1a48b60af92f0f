#include "replay_buffer/samplers/fifo_sampler.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(FifoSamplerTest, SelectsOldestKeysFirstWithoutRemovingThem) {
  FifoSampler sampler;
  for (int64_t key : {5, 1, 3, 4, 2}) sampler.Insert(key);
  EXPECT_THAT(sampler.Select(3), ElementsAre(1, 2, 3));
  EXPECT_THAT(sampler.Select(3), ElementsAre(1, 2, 3));
  sampler.Delete(2);
  sampler.Delete(42);  // unknown: ignored
  EXPECT_THAT(sampler.Select(3), ElementsAre(1, 3, 4));
  EXPECT_EQ(sampler.size(), 4);
}

TEST(FifoSamplerTest, SelectsAtMostWhatIsHeld) {
  FifoSampler sampler;
  EXPECT_THAT(sampler.Select(2), IsEmpty());
  sampler.Insert(7);
  EXPECT_THAT(sampler.Select(2), ElementsAre(7));
}

TEST(CreateSamplerTest, OtherKindsAreRejectedNotSilentlyFifo) {
  EXPECT_EQ((*CreateSampler(v1::SAMPLER_KIND_UNSPECIFIED))->kind(), v1::SAMPLER_KIND_FIFO);
  EXPECT_EQ((*CreateSampler(v1::SAMPLER_KIND_FIFO))->kind(), v1::SAMPLER_KIND_FIFO);
  const absl::Status status = CheckSamplerAvailable(v1::SAMPLER_KIND_UNIFORM, "buffer.sampler");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "buffer.sampler: SAMPLER_KIND_UNIFORM is not available yet; this release "
            "implements SAMPLER_KIND_FIFO");
  EXPECT_THAT(std::string(CreateSampler(v1::SAMPLER_KIND_PRIORITIZED).status().message()),
              HasSubstr("SAMPLER_KIND_PRIORITIZED"));
}

}  // namespace
}  // namespace sluice::replay_buffer
