#ifndef SLUICE_TRAINER_TRAINER_METRICS_H_
#define SLUICE_TRAINER_TRAINER_METRICS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/clients/retry_metrics.h"
#include "sluice/v1/controller.pb.h"
#include "trainer/weight_store.h"

namespace sluice::trainer {

// The trainer's Prometheus metrics, fed by the service (trainer_service.h)
// from its run's callbacks (TrainerRunDeps::on_step, on_eval, on_published)
// and from the weight streams and GetWeightSource answers it serves:
//
//   Per RL step (RecordStep), the latest step's figures as gauges:
//   sluice_trainer_step, _policy_version, _loss, _reward_mean, _pass_rate,
//   _kl_to_behaviour, _kl_to_reference, _entropy, _clip_fraction, _grad_norm,
//   _staleness_mean, _batch_staleness_max, _token_staleness_mean,
//   _token_staleness_max, _importance_weight_ess, _importance_weight{stat},
//   _importance_weight_fraction{side}, _tokens_masked_fraction{mechanism},
//   _behaviour_weight_capped_fraction, _worker_quarantined{worker}
//   and as counters and histograms:
//   sluice_trainer_tokens_trained_total, _wait_seconds_total,
//   _updates_skipped_total, _groups_invalid_total, _step_seconds,
//   _verified_groups_total{worker}, _verification_failed_groups_total{worker},
//   _unverifiable_groups_total, _verification_max_abs_diff,
//   _verification_seconds_total
//
//   sluice_trainer_eval_accuracy                  the latest held-out
//                                                 evaluation (RecordEval)
//   sluice_trainer_weight_version_bytes{encoding} the latest published
//                                                 version: full, delta
//   sluice_trainer_weight_delta_encode_seconds_total
//   sluice_trainer_weight_streams_total           weight streams served
//   sluice_trainer_weight_bytes_sent_total        their bytes, all transports
//   sluice_trainer_weight_sync_wire_bytes_total{transport}  grpc, grpc_delta
//   sluice_trainer_weight_sync_full_bytes_total{transport}  what they stand
//                                                 for in full
//   sluice_trainer_weight_sync_seconds{transport} whole streams (histogram)
//   sluice_trainer_weight_sync_gigabytes_per_second{transport}  the latest
//                                                 whole stream's wire rate
//   sluice_trainer_weight_sources_total{source}   GetWeightSource answers:
//                                                 trainer, relay
//   sluice_client_retries_total{service} and its give-ups, of every run's
//   clients (ClientRetryObserver)
//
// Series live for the life of the process, across runs. Thread-safe: the run
// thread and concurrent streams record at once (prometheus-cpp's metrics are
// atomic; nothing here is read back).
class TrainerMetrics {
 public:
  // Registers the families on `registry`, which must outlive this object.
  explicit TrainerMetrics(prometheus::Registry& registry);

  // One RL step's figures: the gauges take its values, the counters its
  // increments (tokens trained, wait, skipped updates, invalid groups, the
  // groups verified per rollout worker).
  void RecordStep(const v1::TrainingStepMetrics& step);

  // A held-out evaluation. The warm start's (phase "warm_start") is left out:
  // the gauge is the trained policy's accuracy.
  void RecordEval(const v1::EvalResult& eval);

  // A version published: its size in full and, with deltas, as a delta and
  // the time its encoding took.
  void RecordPublished(const PublishedVersion& version);

  // A GetWeightSource answer: the version streamed from the trainer
  // (`from_relay` false) or from a worker that holds it.
  void RecordWeightSource(bool from_relay);

  // For RetryOptions::observer of every client a run creates. Valid while
  // this object lives.
  std::function<void(const clients::RetryEvent&)> ClientRetryObserver();

  // The counters of one weight stream (StreamWeights), made by
  // StartWeightStream. Valid while the TrainerMetrics lives.
  class WeightStream {
   public:
    // A chunk of `wire_bytes` written to the receiver, standing for
    // `full_bytes` of the version in full (more than `wire_bytes` for a delta).
    void RecordChunk(int64_t wire_bytes, double full_bytes);
    // The stream sent its last chunk, `wire_bytes` in all, after `seconds`.
    // A stream cut short is never finished: it counts in bytes only.
    void RecordFinished(double seconds, int64_t wire_bytes);

   private:
    friend class TrainerMetrics;
    WeightStream(TrainerMetrics& metrics, const std::string& transport);

    TrainerMetrics& metrics_;
    const std::string transport_;
    prometheus::Counter& wire_bytes_;
    prometheus::Counter& full_bytes_;
  };

  // Counts a stream over `transport` ("grpc": the full version,
  // "grpc_delta": a sparse delta) and creates its series, before any chunk.
  WeightStream StartWeightStream(const std::string& transport);

 private:
  prometheus::Gauge& step_;
  prometheus::Gauge& policy_version_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& reward_mean_;
  prometheus::Gauge& pass_rate_;
  prometheus::Gauge& kl_to_behaviour_;
  prometheus::Gauge& entropy_;
  prometheus::Gauge& clip_fraction_;
  prometheus::Gauge& grad_norm_;
  prometheus::Gauge& staleness_mean_;
  prometheus::Gauge& staleness_max_;
  prometheus::Gauge& importance_weight_ess_;
  prometheus::Family<prometheus::Gauge>& importance_weight_;
  prometheus::Family<prometheus::Gauge>& importance_weight_fraction_;
  prometheus::Family<prometheus::Gauge>& tokens_masked_fraction_;
  prometheus::Gauge& behaviour_weight_capped_fraction_;
  prometheus::Gauge& token_staleness_mean_;
  prometheus::Gauge& token_staleness_max_;
  prometheus::Gauge& kl_to_reference_;
  prometheus::Gauge& eval_accuracy_;
  prometheus::Counter& tokens_trained_;
  prometheus::Counter& wait_seconds_;
  prometheus::Counter& updates_skipped_;
  prometheus::Counter& groups_invalid_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& weight_bytes_sent_;
  prometheus::Counter& weight_streams_;
  prometheus::Family<prometheus::Counter>& weight_sync_wire_bytes_;
  prometheus::Family<prometheus::Counter>& weight_sync_full_bytes_;
  prometheus::Family<prometheus::Histogram>& weight_sync_seconds_;
  prometheus::Family<prometheus::Gauge>& weight_sync_gigabytes_per_second_;
  prometheus::Family<prometheus::Gauge>& weight_version_bytes_;
  prometheus::Counter& weight_delta_encode_seconds_;
  prometheus::Family<prometheus::Counter>& weight_sources_;
  prometheus::Family<prometheus::Counter>& verified_groups_;
  prometheus::Family<prometheus::Counter>& verification_failed_groups_;
  prometheus::Counter& unverifiable_groups_;
  prometheus::Histogram& verification_max_abs_diff_;
  prometheus::Counter& verification_seconds_;
  prometheus::Family<prometheus::Gauge>& worker_quarantined_;
  clients::ClientRetryMetrics client_retries_;
};

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_TRAINER_METRICS_H_
