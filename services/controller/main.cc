// sluice-controller: see controller_service.h and README.md.
#include <memory>

#include "CLI/CLI.hpp"
#include "services/controller/controller_service.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  sluice::runtime::ServiceMain main({
      .component = "controller",
      .binary = "sluice-controller",
      .description = "Sluice controller: accepts runs (SubmitRun, GetRun, WatchRun, CancelRun, ListRuns), validates run specs, drives warm start, RL and evaluation, and leases prompts to rollout workers.",
      .default_port = 50051,
      .default_metrics_port = 9091,
  });
  return main.Run(argc, argv, [&](ServiceContext& context) {
    using namespace sluice;
    context.AddService(std::make_shared<controller::ControllerServiceImpl>(),
                       sluice::v1::ControllerService::service_full_name());
    return absl::OkStatus();
  });
}
