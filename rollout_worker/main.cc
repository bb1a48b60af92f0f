// sluice-rollout-worker: see rollout_worker_service.h and README.md.
#include <memory>

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "common/torch_threads.h"
#include "rollout_worker/rollout_worker_service.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  sluice::runtime::ServiceMain main({
      .component = "rollout_worker",
      .binary = "sluice-rollout-worker",
      .description = "Sluice rollout worker: generates groups of completions with per-token behaviour log-probabilities and policy versions, has them scored, and inserts them into the replay buffer.",
      .default_port = 50052,
      .default_metrics_port = 9092,
  });
  int torch_threads = 1;
  main.app()
      .add_option("--torch-threads", torch_threads,
                  "LibTorch intra-op threads; the services of one machine share its cores, so "
                  "each takes a fixed share (0 keeps LibTorch's default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return main.Run(argc, argv, [&](ServiceContext& context) {
    using namespace sluice;
        const TorchThreads threads = ConfigureTorchThreads(torch_threads);
        log::Info("torch threads", {{"intra_op", threads.intra_op}, {"inter_op", threads.inter_op}});
    context.AddService(std::make_shared<rollout_worker::RolloutWorkerServiceImpl>(),
                       sluice::v1::RolloutWorkerService::service_full_name());
    return absl::OkStatus();
  });
}
