#include "controller/proto_json.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sluice/v1/controller.pb.h"

namespace sluice::controller {
namespace {

TEST(ProtoToJsonTest, SixtyFourBitIntegersAreNumbersAndDefaultsArePrinted) {
  v1::Run run;
  run.set_run_id("run-1");
  run.mutable_spec()->set_seed(18446744073709551615ULL);
  run.mutable_summary()->set_steps(12);
  run.mutable_created_at()->set_seconds(1767225600);
  v1::TrainingStepMetrics step;
  step.add_staleness_histogram(3);
  step.add_staleness_histogram(1);

  const nlohmann::json json = nlohmann::json::parse(ProtoToJson(run, /*pretty=*/true));
  EXPECT_EQ(json["run_id"], "run-1");
  EXPECT_EQ(json["spec"]["seed"].get<uint64_t>(), 18446744073709551615ULL);
  EXPECT_EQ(json["summary"]["steps"].get<int64_t>(), 12);
  EXPECT_EQ(json["summary"]["tokens_generated"].get<int64_t>(), 0);  // Default printed.
  EXPECT_EQ(json["state"], "RUN_STATE_UNSPECIFIED");
  // Well-known types keep their proto JSON form.
  EXPECT_EQ(json["created_at"], "2026-01-01T00:00:00Z");

  const std::string line = ProtoToJson(step, /*pretty=*/false);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(line)["staleness_histogram"], nlohmann::json({3, 1}));
}

// What the files held before (nlohmann's ordered_json printing the proto
// order): the same text, byte for byte, for a message with nested messages,
// lists, maps, oneofs and 64-bit integers.
TEST(ProtoToJsonTest, FieldsKeepTheProtoOrderAndTheTextItsLayout) {
  v1::RunSpec spec;
  spec.set_name("order");
  spec.set_seed(7);
  spec.mutable_model()->set_builtin("tiny");
  spec.mutable_task()->mutable_arithmetic()->add_operators("+");
  spec.mutable_task()->mutable_arithmetic()->add_operators("-");
  (*spec.mutable_labels())["b"] = "2";
  (*spec.mutable_labels())["a"] = "1";
  const std::string pretty = ProtoToJson(spec, /*pretty=*/true);
  // The reference: the same proto JSON parsed into ordered_json (field order
  // as protobuf printed it) with the same integer conversion, dumped.
  nlohmann::ordered_json expected = nlohmann::ordered_json::parse(pretty);
  EXPECT_EQ(pretty, expected.dump(2));
  EXPECT_EQ(ProtoToJson(spec, /*pretty=*/false), expected.dump());
  EXPECT_LT(pretty.find("\"name\""), pretty.find("\"seed\""));
  EXPECT_LT(pretty.find("\"seed\""), pretty.find("\"model\""));
  EXPECT_LT(pretty.find("\"model\""), pretty.find("\"labels\""));
  EXPECT_NE(pretty.find("\"seed\": 7"), std::string::npos);
  EXPECT_NE(pretty.find("\"a\": \"1\",\n    \"b\": \"2\""), std::string::npos) << pretty;
  EXPECT_NE(pretty.find("\"operators\": [\n        \"+\",\n        \"-\"\n      ]"),
            std::string::npos)
      << pretty;
}

// 200,000 labels: the conversion is O(n log n). Before it was quadratic
// (ordered_json looks up every key in a list): 40,000 labels took seconds,
// 200,000 would take a minute. Counted, not timed: the output is checked
// whole, and the test's time shows in ctest.
TEST(ProtoToJsonTest, AMapOfManyEntriesIsConvertedWhole) {
  v1::RunSpec spec;
  constexpr int kLabels = 200000;
  for (int i = 0; i < kLabels; ++i) (*spec.mutable_labels())["k" + std::to_string(i)] = "v";
  const nlohmann::json json = nlohmann::json::parse(ProtoToJson(spec, /*pretty=*/false));
  EXPECT_EQ(json["labels"].size(), static_cast<size_t>(kLabels));
}

}  // namespace
}  // namespace sluice::controller
