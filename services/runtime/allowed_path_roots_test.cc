#include "services/runtime/allowed_path_roots.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/runtime/config_file.h"

namespace sluice::runtime {
namespace {

using ::testing::ElementsAre;

// Parses `args` as a service would (ServiceMain takes the last value of a
// flag given twice) and applies the flag.
absl::StatusOr<PathPolicy> Parse(std::vector<std::string> args) {
  CLI::App app;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  AllowedPathRootsFlag flag(app);
  app.add_option("--config");
  std::vector<std::string> argv = {"service"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<const char*> raw;
  for (const std::string& arg : argv) raw.push_back(arg.c_str());
  app.parse(static_cast<int>(raw.size()), raw.data());
  return flag.Apply();
}

TEST(AllowedPathRootsFlagTest, DefaultIsTheWorkingDirectory) {
  absl::StatusOr<PathPolicy> policy = Parse({});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_THAT(policy->roots(), ElementsAre(std::filesystem::current_path().string()));
}

TEST(AllowedPathRootsFlagTest, EveryFlagAddsRootsInOrder) {
  absl::StatusOr<PathPolicy> policy =
      Parse({"--allowed-path-roots=/data/", "--allowed-path-roots", "/models", "/ckpt"});
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_THAT(policy->roots(), ElementsAre("/data", "/models", "/ckpt"));
}

TEST(AllowedPathRootsFlagTest, AConfigFileListBecomesTheRoots) {
  const std::string path = ::testing::TempDir() + "/allowed-path-roots.yaml";
  std::ofstream(path) << "allowed_path_roots: [/var/lib/sluice, /models]\n";
  CLI::App app;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  AllowedPathRootsFlag flag(app);
  absl::StatusOr<std::vector<std::string>> args = ConfigFileToArgs(path, app);
  ASSERT_TRUE(args.ok()) << args.status();
  absl::StatusOr<PathPolicy> policy = Parse(*args);
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_THAT(policy->roots(), ElementsAre("/var/lib/sluice", "/models"));
}

TEST(AllowedPathRootsFlagTest, AnEmptyRootIsAUsageError) {
  EXPECT_THROW(Parse({"--allowed-path-roots="}).IgnoreError(), CLI::ParseError);
}

}  // namespace
}  // namespace sluice::runtime
