// sluice-reward-server: see reward_server_service.h and scorer.h.
#include <memory>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/reward_server_service.h"
#include "reward_server/scorer.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  namespace reward = sluice::reward_server;
  sluice::runtime::ServiceMain main({
      .component = "reward_server",
      .binary = "sluice-reward-server",
      .description = "Sluice reward server: scores responses with verifiers (math equivalence, code in a sandbox, format) under hard per-item deadlines.",
      .default_port = 50053,
      .default_metrics_port = 9093,
  });
  reward::ScorerOptions scorer_options;
  reward::RewardServiceOptions service_options;
  main.app()
      .add_option("--workers", scorer_options.num_workers,
                  "threads running verifiers; items beyond this many wait in a queue")
      ->capture_default_str();
  main.app()
      .add_option("--max-batch-items", service_options.max_batch_items,
                  "largest number of items one ScoreBatch may carry")
      ->capture_default_str();

  return main.Run(argc, argv, [&](ServiceContext& context) -> absl::Status {
    if (absl::Status valid = scorer_options.Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--workers: ", valid.message()));
    }
    if (absl::Status valid = service_options.Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--max-batch-items: ", valid.message()));
    }
    ASSIGN_OR_RETURN(reward::VerifierRegistry registry, reward::MakeBuiltinVerifierRegistry());
    ASSIGN_OR_RETURN(std::unique_ptr<reward::Scorer> scorer,
                     reward::Scorer::Create(
                         std::make_shared<const reward::VerifierRegistry>(std::move(registry)),
                         scorer_options));
    std::shared_ptr<reward::Scorer> shared_scorer = std::move(scorer);
    context.AddService(std::make_shared<reward::RewardServerServiceImpl>(
                           shared_scorer, context.metrics_registry(), service_options),
                       sluice::v1::RewardService::service_full_name());
    // In-flight batches return at once with UNAVAILABLE items instead of
    // holding the drain for up to an item deadline.
    context.OnShutdown([shared_scorer] { shared_scorer->Shutdown(); });
    return absl::OkStatus();
  });
}
