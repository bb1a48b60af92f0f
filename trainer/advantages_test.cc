#include "trainer/advantages.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;

TEST(GroupAdvantagesTest, NormalisesByGroupMeanAndPopulationStd) {
  // mean 0.25, population std sqrt(0.1875) = 0.4330127.
  const auto adv = GroupAdvantages({1, 0, 0, 0}, /*normalize_by_std=*/true, /*eps=*/0);
  EXPECT_THAT(adv, ElementsAre(DoubleNear(0.75 / 0.4330127, 1e-6), DoubleNear(-0.25 / 0.4330127, 1e-6),
                               DoubleNear(-0.25 / 0.4330127, 1e-6), DoubleNear(-0.25 / 0.4330127, 1e-6)));
  double sum = 0;
  for (double a : adv) sum += a;
  EXPECT_NEAR(sum, 0.0, 1e-9);
}

TEST(GroupAdvantagesTest, CentresOnlyWithoutStdNormalisation) {
  EXPECT_THAT(GroupAdvantages({1, 0.5, 0}, false, 1e-6),
              ElementsAre(DoubleNear(0.5, 1e-12), DoubleNear(0.0, 1e-12), DoubleNear(-0.5, 1e-12)));
}

TEST(GroupAdvantagesTest, UniformGroupsCarryNoSignal) {
  EXPECT_TRUE(IsUniform({1, 1, 1}));
  EXPECT_TRUE(IsUniform({0, 0}));
  EXPECT_FALSE(IsUniform({0, 1}));
  EXPECT_THAT(GroupAdvantages({1, 1, 1}, true, 1e-6), ElementsAre(0.0, 0.0, 0.0));
  EXPECT_TRUE(GroupAdvantages({}, true, 1e-6).empty());
}

}  // namespace
}  // namespace sluice::trainer
