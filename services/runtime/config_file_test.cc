#include "services/runtime/config_file.h"

#include <fstream>

#include "CLI/CLI.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

class ConfigFileTest : public ::testing::Test {
 protected:
  ConfigFileTest() {
    app_.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app_.add_option("--config");
    app_.add_option("--listen,--listen-address", listen_);
    app_.add_option("--metrics-port", metrics_port_);
    app_.add_option("--tag", tags_)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
  CLI::App app_;
  std::string listen_;
  int metrics_port_ = 0;
  std::vector<std::string> tags_;
};

TEST_F(ConfigFileTest, KeysBecomeFlagsAndTheCommandLineWins) {
  const std::string path =
      WriteFile("a.yaml", "listen_address: 0.0.0.0:7\nmetrics_port: 9\ntag: [x, y]\n");
  absl::StatusOr<std::vector<std::string>> args = ConfigFileToArgs(path, app_);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(*args, ElementsAre("--listen-address=0.0.0.0:7", "--metrics-port=9", "--tag=x",
                                 "--tag=y"));
  // As ServiceMain does: file first, command line after, reversed for CLI11.
  std::vector<std::string> argv = {"--metrics-port=5"};
  for (auto it = args->rbegin(); it != args->rend(); ++it) argv.push_back(*it);
  app_.parse(argv);
  EXPECT_EQ(listen_, "0.0.0.0:7");
  EXPECT_EQ(metrics_port_, 5);
  EXPECT_THAT(tags_, ElementsAre("x", "y"));
}

TEST_F(ConfigFileTest, UnknownKeyNamesTheKeyAndTheKnownOnes) {
  const std::string path = WriteFile("b.yaml", "listen_adress: 1\n");
  absl::StatusOr<std::vector<std::string>> args = ConfigFileToArgs(path, app_);
  ASSERT_FALSE(args.ok());
  EXPECT_THAT(std::string(args.status().message()),
              HasSubstr("unknown key 'listen_adress' (known keys: listen, listen_address"));
}

TEST_F(ConfigFileTest, UnreadableFileIsNotFound) {
  absl::StatusOr<std::vector<std::string>> args = ConfigFileToArgs("/nonexistent/x.yaml", app_);
  EXPECT_EQ(args.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(args.status().message()), HasSubstr("/nonexistent/x.yaml"));
}

TEST_F(ConfigFileTest, MalformedYamlAndNonMappingsAreInvalid) {
  EXPECT_EQ(ConfigFileToArgs(WriteFile("c.yaml", "listen: [unclosed\n"), app_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfigFileToArgs(WriteFile("d.yaml", "- a\n- b\n"), app_).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ConfigFileToArgs(WriteFile("e.yaml", "listen: {host: a}\n"), app_).status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(ConfigFileTest, FindsConfigFlagInBothSpellings) {
  const char* a[] = {"bin", "--x", "--config", "f.yaml"};
  EXPECT_EQ(FindConfigFlag(4, a), "f.yaml");
  const char* b[] = {"bin", "--config=g.yaml"};
  EXPECT_EQ(FindConfigFlag(2, b), "g.yaml");
  const char* c[] = {"bin", "--", "--config=g.yaml"};
  EXPECT_EQ(FindConfigFlag(3, c), "");
}

}  // namespace
}  // namespace sluice::runtime
