#include "common/logging.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace sluice::log {
namespace {

using ::testing::HasSubstr;

TEST(LoggingTest, TextRecordHasTimestampLevelComponentMessageAndFields) {
  const std::string line =
      FormatRecord(Format::kText, "replay_buffer", Level::kInfo, "2026-11-22T10:00:00.000Z",
                   "server started", {{"address", "127.0.0.1:5"}, {"groups", 3}, {"ok", true}});
  EXPECT_EQ(line,
            "2026-11-22T10:00:00.000Z INFO  replay_buffer server started "
            "address=127.0.0.1:5 groups=3 ok=true");
}

TEST(LoggingTest, TextValuesWithSpacesAreQuoted) {
  const std::string line = FormatRecord(Format::kText, "c", Level::kError, "t", "m",
                                        {{"error", "port in use"}, {"empty", ""}});
  EXPECT_THAT(line, HasSubstr("error=\"port in use\""));
  EXPECT_THAT(line, HasSubstr("empty=\"\""));
}

TEST(LoggingTest, JsonRecordIsOneParseableObjectWithTypedFields) {
  const std::string line = FormatRecord(Format::kJson, "trainer", Level::kWarning, "t",
                                        "slow \"step\"\n", {{"step", 7}, {"loss", 0.5}});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json record = nlohmann::json::parse(line);
  EXPECT_EQ(record["level"], "warning");
  EXPECT_EQ(record["component"], "trainer");
  EXPECT_EQ(record["msg"], "slow \"step\"\n");
  EXPECT_EQ(record["step"], 7);
  EXPECT_DOUBLE_EQ(record["loss"].get<double>(), 0.5);
}

TEST(LoggingTest, ParsesLevelsAndFormatsAndRejectsUnknownOnes) {
  EXPECT_EQ(*ParseLevel("WARN"), Level::kWarning);
  EXPECT_EQ(*ParseLevel("debug"), Level::kDebug);
  EXPECT_EQ(*ParseFormat("json"), Format::kJson);
  absl::StatusOr<Level> bad = ParseLevel("verbose");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'verbose'"));
  EXPECT_FALSE(ParseFormat("xml").ok());
}

}  // namespace
}  // namespace sluice::log
