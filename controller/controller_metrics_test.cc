#include "controller/controller_metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace sluice::controller {
namespace {

// The value of the sample of `name` whose labels include all of `labels`.
double Value(prometheus::Registry& registry, const std::string& name,
             const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      bool match = true;
      for (const auto& [key, value] : labels) {
        bool found = false;
        for (const prometheus::ClientMetric::Label& label : metric.label) {
          found = found || (label.name == key && label.value == value);
        }
        match = match && found;
      }
      if (match) return family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                                        : metric.gauge.value;
    }
  }
  return -1;
}

TEST(ControllerMetricsTest, RecoveryCountsBecomeCountersThatOnlyGrow) {
  prometheus::Registry registry;
  ControllerMetrics metrics(registry);
  v1::Run run;
  run.set_run_id("run-1");
  run.set_state(v1::RUN_STATE_TRAINING);
  run.mutable_progress()->set_workers_live(2);
  v1::RecoveryStats& recovery = *run.mutable_summary()->mutable_recovery();
  (*recovery.mutable_restarts())["trainer"] = 1;
  recovery.set_workers_lost(2);
  metrics.OnRunUpdated(run);
  metrics.OnRunUpdated(run);  // Unchanged: nothing counted twice.
  EXPECT_EQ(Value(registry, "sluice_run_recovery_restarts_total",
                  {{"run_id", "run-1"}, {"service", "trainer"}}),
            1);
  EXPECT_EQ(Value(registry, "sluice_run_recovery_events_total",
                  {{"run_id", "run-1"}, {"event", "workers_lost"}}),
            2);
  EXPECT_EQ(Value(registry, "sluice_run_workers_live", {{"run_id", "run-1"}}), 2);

  (*recovery.mutable_restarts())["trainer"] = 3;
  (*recovery.mutable_restarts())["replay_buffer"] = 1;
  recovery.set_late_groups_refused(5);
  metrics.OnRunUpdated(run);
  EXPECT_EQ(Value(registry, "sluice_run_recovery_restarts_total",
                  {{"run_id", "run-1"}, {"service", "trainer"}}),
            3);
  EXPECT_EQ(Value(registry, "sluice_run_recovery_restarts_total",
                  {{"run_id", "run-1"}, {"service", "replay_buffer"}}),
            1);
  EXPECT_EQ(Value(registry, "sluice_run_recovery_events_total",
                  {{"run_id", "run-1"}, {"event", "late_groups_refused"}}),
            5);
}

}  // namespace
}  // namespace sluice::controller
