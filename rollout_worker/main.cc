// sluice-rollout-worker: see rollout_worker_service.h and README.md.
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

#include "CLI/CLI.hpp"
#include "common/logging.h"
#include "common/torch_threads.h"
#include "rollout_worker/rollout_worker_service.h"
#include "services/runtime/memory_budget.h"
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
  std::string worker_id;
  main.app().add_option("--worker-id", worker_id,
                        "Name of this worker in leases and trajectories (default: <host>-<pid>)");
  std::string controller_address;
  main.app()
      .add_option("--controller-address", controller_address,
                  "HOST:PORT of the controller; the worker registers with it, heartbeats, and "
                  "serves the runs it is assigned (the controller never calls the worker)");
  sluice::runtime::MemoryBudgetFlag memory_budget(main.app());
  return main.Run(argc, argv, [&](ServiceContext& context) {
    using namespace sluice;
    const int64_t budget = memory_budget.Apply(context);
    const TorchThreads threads = ConfigureTorchThreads(torch_threads);
    const bool resident = KeepTensorMemoryResident();
    log::Info("torch threads", {{"intra_op", threads.intra_op},
                                {"inter_op", threads.inter_op},
                                {"tensor_memory_resident", resident}});
    if (worker_id.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      worker_id = absl::StrCat(host, "-", getpid());
    }
    auto service = std::make_shared<rollout_worker::RolloutWorkerServiceImpl>(
        context.metrics_registry(), worker_id, budget);
    context.OnShutdown([service] { service->Shutdown(); });
    context.AddService(service, sluice::v1::RolloutWorkerService::service_full_name());
    return absl::OkStatus();
  });
}
