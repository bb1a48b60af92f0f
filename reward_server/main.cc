// sluice-reward-server: see reward_server_service.h and scorer.h.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "reward_server/builtin_verifiers.h"
#include "reward_server/code_verifier.h"
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
  reward::BuiltinVerifierOptions verifier_options;
  reward::sandbox::SandboxOptions& sandbox = verifier_options.code.sandbox;
  bool require_sandbox = false;
  int sandbox_slots = -1;
  int64_t sandbox_memory_mb = static_cast<int64_t>(sandbox.address_space_bytes >> 20);
  main.app()
      .add_option("--workers", scorer_options.num_workers,
                  "threads running verifiers; items beyond this many wait in a queue")
      ->capture_default_str();
  main.app()
      .add_option("--max-batch-items", service_options.max_batch_items,
                  "largest number of items one ScoreBatch may carry")
      ->capture_default_str();

  main.app()
      .add_option("--python", verifier_options.code.python_path,
                  "python3 the code verifier runs inside its sandbox")
      ->capture_default_str();
  main.app()
      .add_option("--bwrap", sandbox.bwrap_path, "bubblewrap, the code sandbox's launcher")
      ->capture_default_str();
  main.app()
      .add_option("--sandbox-memory-mb", sandbox_memory_mb,
                  "address-space limit of each sandboxed program (RLIMIT_AS)")
      ->capture_default_str();
  main.app()
      .add_option("--sandbox-max-processes", sandbox.max_processes,
                  "processes and threads one sandboxed program may hold at once")
      ->capture_default_str();
  main.app()
      .add_option("--sandbox-uid-base", sandbox.uid_base,
                  "when root: first uid of the range sandboxed programs run as (one per "
                  "concurrent run)")
      ->capture_default_str();
  main.app()
      .add_option("--sandbox-slots", sandbox_slots,
                  "prepared sandboxes (a warm python3 each) running programs at once; 0 = a "
                  "fresh sandbox per program (slower); default: --workers")
      ->capture_default_str();
  main.app()
      .add_option("--sandbox-preload", verifier_options.code.sandbox_preload_modules,
                  "modules each sandbox slot's warm python3 imports once, comma-separated "
                  "(replaces the default list; \"\" = none)")
      ->delimiter(',')
      ->capture_default_str();
  main.app()
      .add_option("--sandbox-max-queued", service_options.sandbox_max_queued,
                  "programs admitted beyond the sandbox slots; a batch past this answers "
                  "RESOURCE_EXHAUSTED with a retry hint")
      ->capture_default_str();
  main.app().add_flag("--require-sandbox", require_sandbox,
                      "refuse to start when the code sandbox does not work (default: start, "
                      "log why, and answer code items with error kind sandbox)");

  return main.Run(argc, argv, [&](ServiceContext& context) -> absl::Status {
    if (absl::Status valid = scorer_options.Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--workers: ", valid.message()));
    }
    if (absl::Status valid = service_options.Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--max-batch-items / --sandbox-max-queued: ", valid.message()));
    }
    if (sandbox_memory_mb <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sandbox-memory-mb: must be > 0, got ", sandbox_memory_mb));
    }
    sandbox.address_space_bytes = static_cast<uint64_t>(sandbox_memory_mb) << 20;
    if (sandbox_slots < -1 || sandbox_slots > 1024) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sandbox-slots: must be in [0, 1024] (or -1: --workers), got ",
                       sandbox_slots));
    }
    verifier_options.code.sandbox_slots =
        sandbox_slots == -1 ? scorer_options.num_workers : sandbox_slots;
    std::vector<std::string>& preload = verifier_options.code.sandbox_preload_modules;
    preload.erase(std::remove(preload.begin(), preload.end(), ""), preload.end());
    if (absl::Status valid = verifier_options.code.Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("code sandbox flags: ", valid.message()));
    }
    // Run one program through the sandbox now, so that an operator learns at
    // start-up, not from a run's rewards, that code cannot be verified here.
    if (absl::Status sandbox_ok = reward::CheckSandboxAvailable(verifier_options.code);
        !sandbox_ok.ok()) {
      if (require_sandbox) {
        return absl::FailedPreconditionError(
            absl::StrCat("--require-sandbox: ", sandbox_ok.message()));
      }
      sluice::log::Error("the code sandbox does not work; \"code\" items will get error kind "
                         "sandbox (math, format, length and exact_match are unaffected)",
                         {{"reason", std::string(sandbox_ok.message())}});
    } else {
      sluice::log::Info("code sandbox ready", {{"bwrap", sandbox.bwrap_path},
                                               {"python", verifier_options.code.python_path}});
    }
    ASSIGN_OR_RETURN(reward::VerifierRegistry registry,
                     reward::MakeBuiltinVerifierRegistry(verifier_options));
    ASSIGN_OR_RETURN(std::unique_ptr<reward::Scorer> scorer,
                     reward::Scorer::Create(
                         std::make_shared<const reward::VerifierRegistry>(std::move(registry)),
                         scorer_options));
    std::shared_ptr<reward::Scorer> shared_scorer = std::move(scorer);
    std::shared_ptr<const reward::sandbox::SandboxPool> pool =
        reward::FindSandboxPool(shared_scorer->registry());
    if (pool != nullptr) {
      // Start every slot now: the first programs should not pay for it.
      if (absl::Status warm = pool->Warm(); !warm.ok()) {
        sluice::log::Error("could not start every code sandbox slot; they will be retried as "
                           "programs arrive", {{"reason", std::string(warm.message())}});
      } else {
        sluice::log::Info("code sandbox pool ready",
                          {{"slots", absl::StrCat(pool->pool_options().slots)}});
      }
    }
    auto service = std::make_shared<reward::RewardServerServiceImpl>(
        shared_scorer, context.metrics_registry(), service_options, pool);
    context.AddService(service, sluice::v1::RewardService::service_full_name());
    context.OnMetricsCollect([service] { service->UpdateScorerGauges(); });
    // In-flight batches return at once with UNAVAILABLE items instead of
    // holding the drain for up to an item deadline.
    context.OnShutdown([shared_scorer] { shared_scorer->Shutdown(); });
    return absl::OkStatus();
  });
}
