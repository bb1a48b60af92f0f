#include "reward_server/reward_metrics.h"

#include <algorithm>

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
                             .Add({})),
      sandbox_slots_(prometheus::BuildGauge()
                         .Name("sluice_reward_sandbox_slots")
                         .Help("Slots of the code sandbox pool, by state (busy, idle, "
                               "not_started).")
                         .Register(registry)),
      sandbox_waiting_(prometheus::BuildGauge()
                           .Name("sluice_reward_sandbox_waiting_runs")
                           .Help("Programs waiting for a free sandbox slot.")
                           .Register(registry)
                           .Add({})),
      sandbox_admitted_(prometheus::BuildGauge()
                            .Name("sluice_reward_sandbox_admitted_programs")
                            .Help("Sandboxed programs of the batches being scored (the "
                                  "backlog that admission bounds).")
                            .Register(registry)
                            .Add({})),
      sandbox_runs_(prometheus::BuildCounter()
                        .Name("sluice_reward_sandbox_runs_total")
                        .Help("Programs run in the sandbox pool.")
                        .Register(registry)
                        .Add({})),
      sandbox_started_(prometheus::BuildCounter()
                           .Name("sluice_reward_sandbox_slots_started_total")
                           .Help("Sandbox slots started (at start-up and to replace "
                                 "recycled or killed ones).")
                           .Register(registry)
                           .Add({})),
      sandbox_recycled_(prometheus::BuildCounter()
                            .Name("sluice_reward_sandbox_slots_recycled_total")
                            .Help("Sandbox slots replaced between programs, by reason (dirty: "
                                  "the check after a program found something left; "
                                  "max_runs).")
                            .Register(registry)),
      sandbox_killed_(prometheus::BuildCounter()
                          .Name("sluice_reward_sandbox_slots_killed_total")
                          .Help("Sandbox slots killed during a program, by reason (deadline, "
                                "output_limit, unresponsive, died, protocol).")
                          .Register(registry)),
      refused_batches_(prometheus::BuildCounter()
                           .Name("sluice_reward_refused_batches_total")
                           .Help("ScoreBatch calls refused with RESOURCE_EXHAUSTED and a retry "
                                 "hint before scoring, by reason.")
                           .Register(registry)) {}

void RewardMetrics::RecordSandboxPool(const sandbox::SandboxPoolStats& stats, int64_t admitted) {
  sandbox_slots_.Add({{"state", "busy"}}).Set(stats.busy);
  sandbox_slots_.Add({{"state", "idle"}}).Set(std::max(0, stats.live - stats.busy));
  sandbox_slots_.Add({{"state", "not_started"}}).Set(std::max(0, stats.slots - stats.live));
  sandbox_waiting_.Set(stats.waiting);
  sandbox_admitted_.Set(static_cast<double>(admitted));
  absl::MutexLock lock(&mu_);
  const auto delta = [](uint64_t now, uint64_t before) {
    return now > before ? static_cast<double>(now - before) : 0.0;
  };
  sandbox_runs_.Increment(delta(stats.runs, last_pool_.runs));
  sandbox_started_.Increment(delta(stats.slots_started, last_pool_.slots_started));
  for (const auto& [reason, count] : stats.recycled_by_reason) {
    sandbox_recycled_.Add({{"reason", reason}})
        .Increment(delta(count, last_pool_.recycled_by_reason[reason]));
  }
  for (const auto& [reason, count] : stats.killed_by_reason) {
    sandbox_killed_.Add({{"reason", reason}})
        .Increment(delta(count, last_pool_.killed_by_reason[reason]));
  }
  last_pool_ = stats;
}

void RewardMetrics::RecordRefusedBatch(const std::string& reason) {
  refused_batches_.Add({{"reason", reason}}).Increment();
}

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
