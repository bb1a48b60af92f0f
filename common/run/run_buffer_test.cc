#include "common/run/run_buffer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::run {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Problems(const v1::BufferConfig& buffer, int32_t batch_size_groups) {
  std::vector<std::string> problems;
  ValidateBufferConfig(buffer, batch_size_groups, &problems);
  return problems;
}

TEST(BufferSamplerOptionsTest, AnEmptySectionResolvesToTheDefaults) {
  const absl::StatusOr<BufferSamplerOptions> options =
      BufferSamplerOptions::FromConfig(v1::BufferConfig(), /*seed=*/7);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->kind, v1::SAMPLER_KIND_FIFO);
  EXPECT_EQ(options->priority_alpha, kDefaultPriorityAlpha);
  EXPECT_EQ(options->recency_probability, kDefaultRecencyProbability);
  EXPECT_EQ(options->seed, 7u);
}

TEST(BufferSamplerOptionsTest, AnExplicitZeroAlphaIsKept) {
  v1::BufferConfig buffer;
  buffer.set_priority_alpha(0);
  const absl::StatusOr<BufferSamplerOptions> options = BufferSamplerOptions::FromConfig(buffer, 0);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->priority_alpha, 0);
}

TEST(ValidateBufferConfigTest, AnEmptySectionHasNoProblem) {
  EXPECT_THAT(Problems(v1::BufferConfig(), 32), IsEmpty());
}

TEST(ValidateBufferConfigTest, EveryProblemIsOneLineNamingItsField) {
  v1::BufferConfig buffer;
  buffer.set_recency_probability(1.5);
  buffer.set_priority_epsilon(-1);
  buffer.set_max_times_sampled(-2);
  buffer.set_capacity_groups(8);
  EXPECT_THAT(Problems(buffer, 32),
              ElementsAre(HasSubstr("buffer.recency_probability: must be in [0, 1], got 1.5"),
                          HasSubstr("buffer.priority_epsilon: must be >= 0"),
                          HasSubstr("buffer.max_times_sampled: must be >= 0"),
                          HasSubstr("buffer.capacity_groups: must be 0 (unbounded) or >= "
                                    "max(batch_size_groups, min_size_to_sample_groups) = 32")));
}

TEST(ValidateBufferConfigTest, ATolerantRateLimitMustAllowAWholeBatch) {
  v1::BufferConfig buffer;
  buffer.set_samples_per_insert(2);
  buffer.set_samples_per_insert_tolerance(10);
  EXPECT_THAT(Problems(buffer, 32),
              ElementsAre(HasSubstr("buffer.samples_per_insert_tolerance: must be >= "
                                    "(batch_size_groups + samples_per_insert) / 2 = 17")));
  buffer.set_samples_per_insert_tolerance(17);
  EXPECT_THAT(Problems(buffer, 32), IsEmpty());
}

}  // namespace
}  // namespace sluice::run
