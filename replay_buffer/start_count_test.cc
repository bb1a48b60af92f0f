#include "replay_buffer/start_count.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace sluice::replay_buffer {
namespace {

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/start_count_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(CountStartTest, EveryStartOnADirectoryIsCounted) {
  const std::string dir = FreshDir("counts");
  for (int64_t expected = 1; expected <= 5; ++expected) {
    absl::StatusOr<int64_t> starts = CountStart(dir);
    ASSERT_TRUE(starts.ok()) << starts.status();
    EXPECT_EQ(*starts, expected);
  }
  std::ifstream in(dir + "/starts");
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "5");
  EXPECT_FALSE(std::filesystem::exists(dir + "/starts.tmp"));
}

TEST(CountStartTest, AFileThatHoldsNoNumberIsCountedFromAgain) {
  const std::string dir = FreshDir("garbage");
  std::ofstream(dir + "/starts") << "not a number\n";
  absl::StatusOr<int64_t> starts = CountStart(dir);
  ASSERT_TRUE(starts.ok()) << starts.status();
  EXPECT_EQ(*starts, 1);
  EXPECT_EQ(*CountStart(dir), 2);
}

TEST(CountStartTest, AnUnwritableDirectoryIsAnErrorNamingTheFile) {
  const absl::StatusOr<int64_t> starts = CountStart("/nonexistent-dir-for-sluice-test");
  EXPECT_FALSE(starts.ok());
  EXPECT_NE(std::string(starts.status().message()).find("/nonexistent-dir-for-sluice-test/starts"),
            std::string::npos)
      << starts.status();
}

}  // namespace
}  // namespace sluice::replay_buffer
