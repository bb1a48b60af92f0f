#include "common/blas_info.h"

#include "gtest/gtest.h"

namespace sluice {
namespace {

// This test binary does not link LibTorch or any BLAS, so detection must say
// so rather than guess.
TEST(BlasInfoTest, ReportsNoneWhenNoBlasIsLoaded) {
  const BlasInfo info = DetectBlas();
  EXPECT_EQ(info.vendor, "none");
  EXPECT_TRUE(info.library_path.empty());
  EXPECT_EQ(info.threads, -1);
}

}  // namespace
}  // namespace sluice
