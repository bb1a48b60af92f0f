#include "reward_server/reward_metrics.h"

#include "absl/time/time.h"
#include "services/runtime/metrics.h"

namespace sluice::reward_server {
namespace {

std::string VerifierLabel(const VerifyOutcome& outcome) {
  if (outcome.error_kind == VerifierErrorKind::kUnknownVerifier) return "unknown";
  if (outcome.verifier_name.empty()) return "none";
  return outcome.verifier_name;
}

bool Judged(const VerifyOutcome& outcome) {
  return outcome.error_kind != VerifierErrorKind::kUnknownVerifier &&
         outcome.error_kind != VerifierErrorKind::kInvalidInput && !outcome.retryable;
}

}  // namespace

RewardMetrics::RewardMetrics(prometheus::Registry& registry, size_t mean_window)
    : mean_window_(mean_window == 0 ? 1 : mean_window),
      batches_(prometheus::BuildCounter()
                   .Name("sluice_reward_batches_total")
                   .Help("ScoreBatch calls scored.")
                   .Register(registry)
                   .Add({})),
      items_(prometheus::BuildCounter()
                 .Name("sluice_reward_items_total")
                 .Help("Items scored, by top-level verifier and error kind.")
                 .Register(registry)),
      item_seconds_(prometheus::BuildHistogram()
                        .Name("sluice_reward_item_seconds")
                        .Help("Time spent verifying one item, by verifier.")
                        .Register(registry)),
      mean_(prometheus::BuildGauge()
                .Name("sluice_reward_mean")
                .Help("Mean reward of the most recent items, by verifier.")
                .Register(registry)),
      queued_items_(prometheus::BuildGauge()
                        .Name("sluice_reward_queued_items")
                        .Help("Verifier jobs waiting for a verifier thread (the score queue).")
                        .Register(registry)
                        .Add({})),
      busy_workers_(prometheus::BuildGauge()
                        .Name("sluice_reward_busy_workers")
                        .Help("Verifier threads running a verifier now.")
                        .Register(registry)
                        .Add({})),
      abandoned_workers_(prometheus::BuildGauge()
                             .Name("sluice_reward_abandoned_workers")
                             .Help("Threads still inside a verifier past its deadline "
                                   "(in-process verifiers cannot be interrupted).")
                             .Register(registry)
                             .Add({})) {}

void RewardMetrics::RecordScorerStats(const Scorer::Stats& stats) {
  queued_items_.Set(static_cast<double>(stats.queued_jobs));
  busy_workers_.Set(stats.busy_workers);
  abandoned_workers_.Set(stats.abandoned_workers);
}

RewardMetrics::PerVerifier& RewardMetrics::ForVerifierLocked(const std::string& verifier) {
  auto [it, inserted] = verifiers_.try_emplace(verifier);
  if (inserted) {
    it->second.seconds =
        &item_seconds_.Add({{"verifier", verifier}}, runtime::LatencyBucketsSeconds());
    it->second.mean = &mean_.Add({{"verifier", verifier}});
  }
  return it->second;
}

void RewardMetrics::RecordBatch(const BatchScores& scores) {
  batches_.Increment();
  absl::MutexLock lock(&mu_);
  for (const ItemScore& item : scores.items) {
    const VerifyOutcome& outcome = item.outcome;
    const std::string verifier = VerifierLabel(outcome);
    items_
        .Add({{"verifier", verifier},
              {"error_kind", std::string(VerifierErrorKindName(outcome.error_kind))}})
        .Increment();
    if (!Judged(outcome)) continue;
    PerVerifier& per_verifier = ForVerifierLocked(verifier);
    per_verifier.seconds->Observe(absl::ToDoubleSeconds(outcome.duration));
    per_verifier.recent.push_back(outcome.reward);
    per_verifier.recent_sum += outcome.reward;
    if (per_verifier.recent.size() > mean_window_) {
      per_verifier.recent_sum -= per_verifier.recent.front();
      per_verifier.recent.pop_front();
    }
    per_verifier.mean->Set(per_verifier.recent_sum /
                           static_cast<double>(per_verifier.recent.size()));
  }
}

}  // namespace sluice::reward_server
