// sluice-trainer: see trainer_service.h and README.md.
#include <memory>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "common/torch_threads.h"
#include "trainer/trainer_service.h"
#include "services/runtime/allowed_path_roots.h"
#include "services/runtime/memory_budget.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  sluice::runtime::ServiceMain main({
      .component = "trainer",
      .binary = "sluice-trainer",
      .description = "Sluice trainer: samples batches from the replay buffer, optimises the policy (GRPO, decoupled PPO, trajectory balance) and publishes each new weight version as a chunked stream.",
      .default_port = 50055,
      .default_metrics_port = 9095,
  });
  int torch_threads = 1;
  main.app()
      .add_option("--torch-threads", torch_threads,
                  "LibTorch intra-op threads; the services of one machine share its cores, so "
                  "each takes a fixed share (0 keeps LibTorch's default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sluice::runtime::MemoryBudgetFlag memory_budget(main.app());
  sluice::runtime::AllowedPathRootsFlag path_roots(main.app());
  sluice::weights::RelayTreeOptions relay;
  main.app()
      .add_option("--weight-relay-root-fanout", relay.root_fanout,
                  "Workers the trainer streams each weight version to itself; the others get it "
                  "from workers that hold it (a fan-out tree), so the trainer's egress stays "
                  "about this many versions per version however many workers there are")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  main.app()
      .add_option("--weight-relay-fanout", relay.fanout,
                  "Workers each relaying worker streams a weight version to")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return main.Run(argc, argv, [&](ServiceContext& context) {
    using namespace sluice;
    const int64_t budget = memory_budget.Apply(context);
    absl::StatusOr<PathPolicy> allowed_paths = path_roots.Apply();
    if (!allowed_paths.ok()) return allowed_paths.status();
    const TorchThreads threads = ConfigureTorchThreads(torch_threads);
    const bool resident = KeepTensorMemoryResident();
    log::Info("torch threads", {{"intra_op", threads.intra_op},
                                {"inter_op", threads.inter_op},
                                {"tensor_memory_resident", resident}});
    auto service =
        std::make_shared<trainer::TrainerServiceImpl>(context.metrics_registry(), budget, relay,
                                                      *std::move(allowed_paths));
    context.OnShutdown([service] { service->Shutdown(); });
    context.AddService(service, sluice::v1::TrainerService::service_full_name());
    return absl::OkStatus();
  });
}
