#include "replay_buffer/rate_limiter.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(RateLimiterTest, DefaultsFollowTheBatchSize) {
  v1::BufferConfig config;
  const RateLimiter::Options options = RateLimiter::OptionsFrom(config, 8);
  EXPECT_EQ(options.samples_per_insert, 0);
  EXPECT_EQ(options.min_size_to_sample, 0);
  EXPECT_EQ(options.ratio_min_size, 8);
  EXPECT_EQ(options.tolerance, 16);
  config.set_min_size_to_sample_groups(20);
  config.set_samples_per_insert_tolerance(5);
  EXPECT_EQ(RateLimiter::OptionsFrom(config, 8).min_size_to_sample, 20);
  EXPECT_EQ(RateLimiter::OptionsFrom(config, 8).ratio_min_size, 20);
  EXPECT_EQ(RateLimiter::OptionsFrom(config, 8).tolerance, 5);
}

TEST(RateLimiterTest, WithoutARatioOnlySizeMatters) {
  RateLimiter limiter(
      {.samples_per_insert = 0, .min_size_to_sample = 4, .ratio_min_size = 4, .tolerance = 8});
  EXPECT_TRUE(limiter.CanInsert(1000));
  EXPECT_TRUE(limiter.RatioAllowsSample(1000));
  EXPECT_FALSE(limiter.HasEnough(3, 2));  // min size 4
  EXPECT_FALSE(limiter.HasEnough(5, 6));  // batch 6
  EXPECT_TRUE(limiter.HasEnough(6, 6));
}

// spi = 2, min 4, tolerance 5 (>= (B + spi) / 2 for B = 4 and 8): the
// reachable range of diff = 2 * inserts - samples is [8 - 5, 8 + 5].
TEST(RateLimiterTest, RatioBlocksEachSideAtItsEdgeOfTheBand) {
  RateLimiter limiter(
      {.samples_per_insert = 2, .min_size_to_sample = 4, .ratio_min_size = 4, .tolerance = 5});
  // Filling: inserts always allowed below min size, whatever the ratio.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(limiter.CanInsert(i)) << i;
    limiter.OnInsert();
  }
  // diff = 12; one more insert would make 14 > 13.
  EXPECT_FALSE(limiter.CanInsert(6));
  // A batch of 4 leaves diff 8 >= 3: allowed; a batch of 10 would leave 2 < 3.
  EXPECT_TRUE(limiter.RatioAllowsSample(4));
  EXPECT_FALSE(limiter.RatioAllowsSample(10));
  limiter.OnSample(4);  // diff 8
  EXPECT_TRUE(limiter.CanInsert(6));
  EXPECT_TRUE(limiter.RatioAllowsSample(4));  // 8 - 4 = 4 >= 3
  limiter.OnSample(4);                        // diff 4
  EXPECT_FALSE(limiter.RatioAllowsSample(4)); // 0 < 3
  EXPECT_TRUE(limiter.RatioAllowsSample(1));  // 3 >= 3
  // An undelivered batch gives its credit back.
  limiter.OnReturned(4);
  EXPECT_TRUE(limiter.RatioAllowsSample(4));
  // A group evicted untrained takes its credit away.
  limiter.OnDroppedUntrained();
  EXPECT_EQ(limiter.inserts(), 5);
  EXPECT_EQ(limiter.samples(), 4);
}

// Whenever inserts are blocked, a whole batch can be sampled: the condition
// validation enforces (2 * tolerance >= B + spi), checked over a grid.
TEST(RateLimiterTest, BothSidesNeverBlockTogetherWhenValid) {
  for (const double spi : {0.25, 0.5, 1.0, 2.0, 3.0, 8.0}) {
    for (const int batch : {1, 4, 32}) {
      const double tolerance = (batch + spi) / 2;
      v1::BufferConfig config;
      config.set_samples_per_insert(spi);
      config.set_samples_per_insert_tolerance(tolerance);
      std::vector<std::string> problems;
      RateLimiter::Validate(config, batch, &problems);
      ASSERT_THAT(problems, IsEmpty());
      RateLimiter limiter(RateLimiter::OptionsFrom(config, batch));
      // Drive inserts until blocked (size past min), then check sampling.
      int64_t size = 0;
      for (int step = 0; step < 10000; ++step) {
        if (limiter.CanInsert(size)) {
          limiter.OnInsert();
          ++size;
          continue;
        }
        ASSERT_TRUE(limiter.HasEnough(size, batch)) << spi << " " << batch;
        ASSERT_TRUE(limiter.RatioAllowsSample(batch)) << spi << " " << batch;
        limiter.OnSample(batch);
        // Groups leave after one sample when spi <= 1, else they stay.
        if (spi <= 1) size -= batch;
      }
    }
  }
}

TEST(RateLimiterTest, ValidationNamesTheFieldAndTheBound) {
  v1::BufferConfig config;
  config.set_samples_per_insert(2);
  config.set_samples_per_insert_tolerance(3);
  std::vector<std::string> problems;
  RateLimiter::Validate(config, 8, &problems);
  ASSERT_THAT(problems, ElementsAre(HasSubstr(
                            "buffer.samples_per_insert_tolerance: must be >= (batch_size_groups + "
                            "samples_per_insert) / 2 = 5, got 3")));
  problems.clear();
  config.set_samples_per_insert(-1);
  RateLimiter::Validate(config, 8, &problems);
  EXPECT_THAT(problems,
              ElementsAre("buffer.samples_per_insert: must be >= 0 (0 = off), got -1"));
  problems.clear();
  config.set_samples_per_insert(1);
  config.set_samples_per_insert_tolerance(-2);
  RateLimiter::Validate(config, 8, &problems);
  EXPECT_THAT(problems, ElementsAre(HasSubstr("buffer.samples_per_insert_tolerance: must be >= 0")));
}

}  // namespace
}  // namespace sluice::replay_buffer
