#include "trainer/ranks/rank_config.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::trainer::ranks {
namespace {

using ::testing::HasSubstr;

EnvLookup Env(std::map<std::string, std::string> values) {
  return [values](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

TEST(RankConfigTest, NothingGivenIsOneTrainerAlone) {
  absl::StatusOr<RankConfig> config = ResolveRankConfig({}, Env({}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->alone());
  EXPECT_EQ(config->rank, 0);
  EXPECT_EQ(config->rendezvous(), "");
}

TEST(RankConfigTest, TorchrunsVariablesAreReadAndFlagsWinOverThem) {
  const EnvLookup env = Env(
      {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29500"}});
  absl::StatusOr<RankConfig> config = ResolveRankConfig({}, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 1);
  EXPECT_EQ(config->world_size, 4);
  EXPECT_EQ(config->rendezvous(), "10.0.0.5:29500");

  RankFlags flags;
  flags.rank = 3;
  flags.rendezvous = "trainer-0.trainer:7000";
  config = ResolveRankConfig(flags, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rank, 3);
  EXPECT_EQ(config->world_size, 4);
  EXPECT_EQ(config->host, "trainer-0.trainer");
  EXPECT_EQ(config->port, 7000);

  flags.rendezvous = "[::1]:7001";
  config = ResolveRankConfig(flags, env);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->host, "::1");
}

TEST(RankConfigTest, MistakesNameTheFlagOrVariableAndWhatToChange) {
  RankFlags flags;
  flags.rank = 2;
  flags.world_size = 2;
  flags.rendezvous = "127.0.0.1:7000";
  EXPECT_THAT(ResolveRankConfig(flags, Env({})).status().message(),
              HasSubstr("--rank 2 is outside [0, 2)"));
  EXPECT_THAT(ResolveRankConfig({}, Env({{"WORLD_SIZE", "2"}, {"RANK", "5"}})).status().message(),
              HasSubstr("RANK 5 is outside [0, 2)"));
  EXPECT_THAT(ResolveRankConfig({}, Env({{"WORLD_SIZE", "two"}})).status().message(),
              HasSubstr("WORLD_SIZE=two is not an integer"));
  flags = RankFlags();
  flags.world_size = 0;
  EXPECT_THAT(ResolveRankConfig(flags, Env({})).status().message(),
              HasSubstr("--world-size 0 is outside [1, 1024]"));
  flags.world_size = 2;
  EXPECT_THAT(ResolveRankConfig(flags, Env({})).status().message(),
              HasSubstr("needs a rendezvous: --rendezvous HOST:PORT"));
  flags.rendezvous = "localhost";
  EXPECT_THAT(ResolveRankConfig(flags, Env({})).status().message(),
              HasSubstr("--rendezvous localhost is not HOST:PORT"));
  flags.rendezvous = "localhost:99999";
  EXPECT_THAT(ResolveRankConfig(flags, Env({})).status().message(),
              HasSubstr("is not in [1, 65535]"));
  flags.rendezvous = "localhost:7000";
  flags.timeout = absl::ZeroDuration();
  EXPECT_THAT(ResolveRankConfig(flags, Env({})).status().message(),
              HasSubstr("--rank-timeout must be positive"));
}

}  // namespace
}  // namespace sluice::trainer::ranks
