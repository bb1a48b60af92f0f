#include "trainer/trainer_metrics.h"

#include <string>

namespace sluice::trainer {

TrainerMetrics::TrainerMetrics(prometheus::Registry& registry)
    : step_(prometheus::BuildGauge()
                .Name("sluice_trainer_step")
                .Help("RL optimizer steps completed in the current run")
                .Register(registry)
                .Add({})),
      policy_version_(prometheus::BuildGauge()
                          .Name("sluice_trainer_policy_version")
                          .Help("Latest policy version published")
                          .Register(registry)
                          .Add({})),
      loss_(prometheus::BuildGauge()
                .Name("sluice_trainer_loss")
                .Help("Policy loss of the latest step")
                .Register(registry)
                .Add({})),
      reward_mean_(prometheus::BuildGauge()
                       .Name("sluice_trainer_reward_mean")
                       .Help("Mean training reward of the latest batch")
                       .Register(registry)
                       .Add({})),
      pass_rate_(prometheus::BuildGauge()
                     .Name("sluice_trainer_pass_rate")
                     .Help("Fraction of the latest batch's trajectories with reward >= 1")
                     .Register(registry)
                     .Add({})),
      kl_to_behaviour_(
          prometheus::BuildGauge()
              .Name("sluice_trainer_kl_to_behaviour")
              .Help("KL of the trained policy to the behaviour policy on the latest batch")
              .Register(registry)
              .Add({})),
      entropy_(prometheus::BuildGauge()
                   .Name("sluice_trainer_entropy")
                   .Help("Mean token entropy of the policy on the latest batch")
                   .Register(registry)
                   .Add({})),
      clip_fraction_(prometheus::BuildGauge()
                         .Name("sluice_trainer_clip_fraction")
                         .Help("Fraction of tokens whose ratio was clipped in the latest step")
                         .Register(registry)
                         .Add({})),
      grad_norm_(prometheus::BuildGauge()
                     .Name("sluice_trainer_grad_norm")
                     .Help("Gradient norm of the latest step before clipping")
                     .Register(registry)
                     .Add({})),
      staleness_mean_(prometheus::BuildGauge()
                          .Name("sluice_trainer_staleness_mean")
                          .Help("Mean group staleness (versions) of the latest batch")
                          .Register(registry)
                          .Add({})),
      staleness_max_(prometheus::BuildGauge()
                         .Name("sluice_trainer_batch_staleness_max")
                         .Help("Maximum group staleness (versions) in the latest batch")
                         .Register(registry)
                         .Add({})),
      importance_weight_ess_(prometheus::BuildGauge()
                                 .Name("sluice_trainer_importance_weight_ess")
                                 .Help("Normalised effective sample size (sum w)^2 / (N sum "
                                       "w^2) of the latest step's importance weights: 1 "
                                       "on-policy, falling as the data goes off-policy")
                                 .Register(registry)
                                 .Add({})),
      importance_weight_(prometheus::BuildGauge()
                             .Name("sluice_trainer_importance_weight")
                             .Help("Tails of the latest step's importance weights, by stat "
                                   "(max, min, p99, p01)")
                             .Register(registry)),
      importance_weight_fraction_(
          prometheus::BuildGauge()
              .Name("sluice_trainer_importance_weight_fraction")
              .Help("Fraction of the latest step's tokens with importance weight above 2 "
                    "(side=above_2) or below 0.5 (side=below_half)")
              .Register(registry)),
      tokens_masked_fraction_(prometheus::BuildGauge()
                                  .Name("sluice_trainer_tokens_masked_fraction")
                                  .Help("Fraction of the latest step's tokens dropped from the "
                                        "loss, by mechanism (cap, floor, second_moment)")
                                  .Register(registry)),
      behaviour_weight_capped_fraction_(
          prometheus::BuildGauge()
              .Name("sluice_trainer_behaviour_weight_capped_fraction")
              .Help("Fraction of the latest step's tokens whose behaviour weight exceeded "
                    "behaviour_weight_cap")
              .Register(registry)
              .Add({})),
      token_staleness_mean_(prometheus::BuildGauge()
                                .Name("sluice_trainer_token_staleness_mean")
                                .Help("Mean staleness (versions) of the latest step's trained "
                                      "tokens: trainer version - the token's version")
                                .Register(registry)
                                .Add({})),
      token_staleness_max_(prometheus::BuildGauge()
                               .Name("sluice_trainer_token_staleness_max")
                               .Help("Maximum staleness (versions) of the latest step's trained "
                                     "tokens")
                               .Register(registry)
                               .Add({})),
      kl_to_reference_(prometheus::BuildGauge()
                           .Name("sluice_trainer_kl_to_reference")
                           .Help("Mean k3 estimate of KL(policy || reference) on the latest "
                                 "step's tokens (0 without a reference policy)")
                           .Register(registry)
                           .Add({})),
      eval_accuracy_(prometheus::BuildGauge()
                         .Name("sluice_trainer_eval_accuracy")
                         .Help("Accuracy of the latest held-out evaluation")
                         .Register(registry)
                         .Add({})),
      tokens_trained_(prometheus::BuildCounter()
                          .Name("sluice_trainer_tokens_trained_total")
                          .Help("Token positions trained on in RL steps")
                          .Register(registry)
                          .Add({})),
      wait_seconds_(prometheus::BuildCounter()
                        .Name("sluice_trainer_wait_seconds_total")
                        .Help("Seconds spent waiting for batches from the replay buffer")
                        .Register(registry)
                        .Add({})),
      updates_skipped_(prometheus::BuildCounter()
                           .Name("sluice_trainer_updates_skipped_total")
                           .Help("RL steps that made no update: non-finite loss, gradient "
                                 "norm or updated weights")
                           .Register(registry)
                           .Add({})),
      groups_invalid_(prometheus::BuildCounter()
                          .Name("sluice_trainer_groups_invalid_total")
                          .Help("Sampled groups left out of the loss as untrainable (ids "
                                "outside the vocabulary, non-finite values)")
                          .Register(registry)
                          .Add({})),
      step_seconds_(
          prometheus::BuildHistogram()
              .Name("sluice_trainer_step_seconds")
              .Help("Compute time of one RL step")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                               2.5, 5, 10})),
      weight_bytes_sent_(prometheus::BuildCounter()
                             .Name("sluice_trainer_weight_bytes_sent_total")
                             .Help("Weight bytes the trainer streamed (its egress for weights; "
                                   "with relays about one version per version)")
                             .Register(registry)
                             .Add({})),
      weight_streams_(prometheus::BuildCounter()
                          .Name("sluice_trainer_weight_streams_total")
                          .Help("Weight streams the trainer served")
                          .Register(registry)
                          .Add({})),
      weight_sync_wire_bytes_(prometheus::BuildCounter()
                                  .Name("sluice_trainer_weight_sync_wire_bytes_total")
                                  .Help("Weight bytes the trainer sent, by transport (grpc: full "
                                        "versions, grpc_delta: sparse deltas)")
                                  .Register(registry)),
      weight_sync_full_bytes_(prometheus::BuildCounter()
                                  .Name("sluice_trainer_weight_sync_full_bytes_total")
                                  .Help("What the weights the trainer sent take in full, by "
                                        "transport: against wire bytes, what deltas saved")
                                  .Register(registry)),
      weight_sync_seconds_(prometheus::BuildHistogram()
                               .Name("sluice_trainer_weight_sync_seconds")
                               .Help("Duration of one whole weight stream, by transport")
                               .Register(registry)),
      weight_sync_gigabytes_per_second_(
          prometheus::BuildGauge()
              .Name("sluice_trainer_weight_sync_gigabytes_per_second")
              .Help("Wire rate (1e9 bytes/s) of the latest whole weight stream, by transport")
              .Register(registry)),
      weight_version_bytes_(prometheus::BuildGauge()
                                .Name("sluice_trainer_weight_version_bytes")
                                .Help("The latest published version's size, by encoding: full "
                                      "(in weight_sync.dtype) and delta (against the version "
                                      "before; absent without deltas)")
                                .Register(registry)),
      weight_delta_encode_seconds_(prometheus::BuildCounter()
                                       .Name("sluice_trainer_weight_delta_encode_seconds_total")
                                       .Help("Seconds spent encoding versions as sparse deltas "
                                             "at publish")
                                       .Register(registry)
                                       .Add({})),
      weight_sources_(prometheus::BuildCounter()
                          .Name("sluice_trainer_weight_sources_total")
                          .Help("GetWeightSource answers, by source: trainer (streamed from "
                                "the trainer) or relay (from a worker holding the version)")
                          .Register(registry)),
      verified_groups_(prometheus::BuildCounter()
                           .Name("sluice_trainer_verified_groups_total")
                           .Help("Sampled groups whose behaviour log-probs the trainer "
                                 "recomputed and found within the tolerance, by rollout worker")
                           .Register(registry)),
      verification_failed_groups_(
          prometheus::BuildCounter()
              .Name("sluice_trainer_verification_failed_groups_total")
              .Help("Sampled groups whose behaviour log-probs, tokens or versions did not "
                    "match the trainer's recomputation (left out of the batch), by rollout "
                    "worker")
              .Register(registry)),
      unverifiable_groups_(prometheus::BuildCounter()
                               .Name("sluice_trainer_unverifiable_groups_total")
                               .Help("Groups chosen for verification that claimed a version "
                                     "whose weights the trainer no longer held")
                               .Register(registry)
                               .Add({})),
      verification_max_abs_diff_(
          prometheus::BuildHistogram()
              .Name("sluice_trainer_verification_max_abs_diff")
              .Help("Per step: the largest |reported - recomputed| behaviour log-prob over "
                    "the verified groups' tokens (honest float32 noise is below 1e-5)")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2,
                                                               1e-1, 1})),
      verification_seconds_(prometheus::BuildCounter()
                                .Name("sluice_trainer_verification_seconds_total")
                                .Help("Seconds spent recomputing rollout log-probs to verify "
                                      "workers")
                                .Register(registry)
                                .Add({})),
      worker_quarantined_(prometheus::BuildGauge()
                              .Name("sluice_trainer_worker_quarantined")
                              .Help("1 for each rollout worker the trainer's verification "
                                    "quarantined in this process")
                              .Register(registry)),
      client_retries_(registry) {}

void TrainerMetrics::RecordStep(const v1::TrainingStepMetrics& m) {
  step_.Set(static_cast<double>(m.step()));
  policy_version_.Set(static_cast<double>(m.policy_version()));
  loss_.Set(m.loss());
  reward_mean_.Set(m.reward_mean());
  pass_rate_.Set(m.pass_rate());
  kl_to_behaviour_.Set(m.kl_to_behaviour());
  entropy_.Set(m.entropy());
  clip_fraction_.Set(m.clip_fraction());
  grad_norm_.Set(m.grad_norm());
  staleness_mean_.Set(m.staleness_mean());
  staleness_max_.Set(static_cast<double>(m.staleness_max()));
  importance_weight_ess_.Set(m.importance_weight_ess());
  importance_weight_.Add({{"stat", "max"}}).Set(m.importance_weight_max());
  importance_weight_.Add({{"stat", "min"}}).Set(m.importance_weight_min());
  importance_weight_.Add({{"stat", "p99"}}).Set(m.importance_weight_p99());
  importance_weight_.Add({{"stat", "p01"}}).Set(m.importance_weight_p01());
  importance_weight_fraction_.Add({{"side", "above_2"}})
      .Set(m.importance_weight_above_2_fraction());
  importance_weight_fraction_.Add({{"side", "below_half"}})
      .Set(m.importance_weight_below_half_fraction());
  tokens_masked_fraction_.Add({{"mechanism", "cap"}}).Set(m.tokens_masked_cap_fraction());
  tokens_masked_fraction_.Add({{"mechanism", "floor"}}).Set(m.tokens_masked_floor_fraction());
  tokens_masked_fraction_.Add({{"mechanism", "second_moment"}})
      .Set(m.tokens_masked_second_moment_fraction());
  tokens_masked_fraction_.Add({{"mechanism", "stale"}}).Set(m.tokens_masked_stale_fraction());
  behaviour_weight_capped_fraction_.Set(m.behaviour_weight_capped_fraction());
  token_staleness_mean_.Set(m.token_staleness_mean());
  token_staleness_max_.Set(static_cast<double>(m.token_staleness_max()));
  kl_to_reference_.Set(m.kl_to_reference());
  tokens_trained_.Increment(static_cast<double>(m.tokens_trained()));
  wait_seconds_.Increment(m.trainer_wait_seconds());
  if (m.update_skipped()) updates_skipped_.Increment();
  groups_invalid_.Increment(static_cast<double>(m.groups_invalid()));
  step_seconds_.Observe(m.step_seconds());
  for (const v1::WorkerVerification& w : m.verification_by_worker()) {
    verified_groups_.Add({{"worker", w.worker_id()}})
        .Increment(static_cast<double>(w.groups_verified()));
    verification_failed_groups_.Add({{"worker", w.worker_id()}})
        .Increment(static_cast<double>(w.groups_failed()));
  }
  unverifiable_groups_.Increment(static_cast<double>(m.groups_unverifiable()));
  if (m.groups_verified() > 0) verification_max_abs_diff_.Observe(m.verification_max_abs_diff());
  verification_seconds_.Increment(m.verification_seconds());
  for (const std::string& worker : m.workers_quarantined()) {
    worker_quarantined_.Add({{"worker", worker}}).Set(1);
  }
}

void TrainerMetrics::RecordEval(const v1::EvalResult& eval) {
  if (eval.phase() != "warm_start") eval_accuracy_.Set(eval.accuracy());
}

void TrainerMetrics::RecordPublished(const PublishedVersion& version) {
  weight_version_bytes_.Add({{"encoding", "full"}})
      .Set(static_cast<double>(version.info.total_size_bytes()));
  if (version.delta != nullptr) {
    weight_version_bytes_.Add({{"encoding", "delta"}})
        .Set(static_cast<double>(version.delta->encoded_bytes));
    weight_delta_encode_seconds_.Increment(version.delta->encode_seconds);
  }
}

void TrainerMetrics::RecordWeightSource(bool from_relay) {
  weight_sources_.Add({{"source", from_relay ? "relay" : "trainer"}}).Increment();
}

std::function<void(const clients::RetryEvent&)> TrainerMetrics::ClientRetryObserver() {
  return client_retries_.Observer();
}

TrainerMetrics::WeightStream TrainerMetrics::StartWeightStream(const std::string& transport) {
  weight_streams_.Increment();
  return WeightStream(*this, transport);
}

TrainerMetrics::WeightStream::WeightStream(TrainerMetrics& metrics, const std::string& transport)
    : metrics_(metrics),
      transport_(transport),
      wire_bytes_(metrics.weight_sync_wire_bytes_.Add({{"transport", transport}})),
      full_bytes_(metrics.weight_sync_full_bytes_.Add({{"transport", transport}})) {}

void TrainerMetrics::WeightStream::RecordChunk(int64_t wire_bytes, double full_bytes) {
  metrics_.weight_bytes_sent_.Increment(static_cast<double>(wire_bytes));
  wire_bytes_.Increment(static_cast<double>(wire_bytes));
  full_bytes_.Increment(full_bytes);
}

void TrainerMetrics::WeightStream::RecordFinished(double seconds, int64_t wire_bytes) {
  metrics_.weight_sync_seconds_
      .Add({{"transport", transport_}},
           prometheus::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30})
      .Observe(seconds);
  if (seconds > 0) {
    metrics_.weight_sync_gigabytes_per_second_.Add({{"transport", transport_}})
        .Set(static_cast<double>(wire_bytes) / seconds / 1e9);
  }
}

}  // namespace sluice::trainer
