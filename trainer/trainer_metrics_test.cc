#include "trainer/trainer_metrics.h"

#include <optional>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace sluice::trainer {
namespace {

// The value of the series of `family` whose labels include `label` (or the
// unlabelled one); nullopt when there is none.
std::optional<double> Value(prometheus::Registry& registry, const std::string& family,
                            const std::pair<std::string, std::string>& label = {}) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& metric : f.metric) {
      bool matches = label.first.empty();
      for (const prometheus::ClientMetric::Label& l : metric.label) {
        if (l.name == label.first && l.value == label.second) matches = true;
      }
      if (!matches) continue;
      switch (f.type) {
        case prometheus::MetricType::Counter:
          return metric.counter.value;
        case prometheus::MetricType::Gauge:
          return metric.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(metric.histogram.sample_count);
        default:
          return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

TEST(TrainerMetricsTest, AStepSetsTheLatestGaugesAndAddsToTheCounters) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry);
  v1::TrainingStepMetrics step;
  step.set_step(3);
  step.set_loss(0.5);
  step.set_importance_weight_max(2.5);
  step.set_tokens_trained(100);
  step.set_update_skipped(true);
  v1::WorkerVerification* worker = step.add_verification_by_worker();
  worker->set_worker_id("w1");
  worker->set_groups_verified(4);
  step.add_workers_quarantined("w2");

  metrics.RecordStep(step);
  step.set_step(4);
  step.set_update_skipped(false);
  metrics.RecordStep(step);

  EXPECT_EQ(Value(registry, "sluice_trainer_step"), 4);
  EXPECT_EQ(Value(registry, "sluice_trainer_loss"), 0.5);
  EXPECT_EQ(Value(registry, "sluice_trainer_importance_weight", {"stat", "max"}), 2.5);
  EXPECT_EQ(Value(registry, "sluice_trainer_tokens_trained_total"), 200);
  EXPECT_EQ(Value(registry, "sluice_trainer_updates_skipped_total"), 1);
  EXPECT_EQ(Value(registry, "sluice_trainer_step_seconds"), 2);  // Observations.
  EXPECT_EQ(Value(registry, "sluice_trainer_verified_groups_total", {"worker", "w1"}), 8);
  EXPECT_EQ(Value(registry, "sluice_trainer_worker_quarantined", {"worker", "w2"}), 1);
}

TEST(TrainerMetricsTest, TheWarmStartEvaluationIsNotThePolicyAccuracy) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry);
  v1::EvalResult eval;
  eval.set_phase("rl");
  eval.set_accuracy(0.75);
  metrics.RecordEval(eval);
  eval.set_phase("warm_start");
  eval.set_accuracy(0.25);
  metrics.RecordEval(eval);
  EXPECT_EQ(Value(registry, "sluice_trainer_eval_accuracy"), 0.75);
}

TEST(TrainerMetricsTest, AWeightStreamIsCountedAtStartItsBytesPerChunkItsRateWhenWhole) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry);
  TrainerMetrics::WeightStream stream = metrics.StartWeightStream("grpc_delta");
  EXPECT_EQ(Value(registry, "sluice_trainer_weight_streams_total"), 1);
  EXPECT_EQ(
      Value(registry, "sluice_trainer_weight_sync_wire_bytes_total", {"transport", "grpc_delta"}),
      0);
  stream.RecordChunk(1000, 4000.0);
  stream.RecordChunk(500, 2000.0);
  EXPECT_EQ(Value(registry, "sluice_trainer_weight_bytes_sent_total"), 1500);
  EXPECT_EQ(
      Value(registry, "sluice_trainer_weight_sync_wire_bytes_total", {"transport", "grpc_delta"}),
      1500);
  EXPECT_EQ(
      Value(registry, "sluice_trainer_weight_sync_full_bytes_total", {"transport", "grpc_delta"}),
      6000);
  // A stream cut short counts in bytes only.
  EXPECT_EQ(Value(registry, "sluice_trainer_weight_sync_seconds", {"transport", "grpc_delta"}),
            std::nullopt);
  stream.RecordFinished(0.5, 1500);
  EXPECT_EQ(Value(registry, "sluice_trainer_weight_sync_seconds", {"transport", "grpc_delta"}), 1);
  EXPECT_EQ(Value(registry, "sluice_trainer_weight_sync_gigabytes_per_second",
                  {"transport", "grpc_delta"}),
            1500 / 0.5 / 1e9);
}

TEST(TrainerMetricsTest, WeightSourcesAreLabelledTrainerOrRelay) {
  prometheus::Registry registry;
  TrainerMetrics metrics(registry);
  metrics.RecordWeightSource(/*from_relay=*/false);
  metrics.RecordWeightSource(/*from_relay=*/true);
  metrics.RecordWeightSource(/*from_relay=*/true);
  EXPECT_EQ(Value(registry, "sluice_trainer_weight_sources_total", {"source", "trainer"}), 1);
  EXPECT_EQ(Value(registry, "sluice_trainer_weight_sources_total", {"source", "relay"}), 2);
}

}  // namespace
}  // namespace sluice::trainer
