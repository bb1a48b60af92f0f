#include "services/controller/proto_json.h"

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

}  // namespace
}  // namespace sluice::controller
