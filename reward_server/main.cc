// sluice-reward-server: see reward_server_service.h and README.md.
#include <memory>

#include "CLI/CLI.hpp"
#include "reward_server/reward_server_service.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  sluice::runtime::ServiceMain main({
      .component = "reward_server",
      .binary = "sluice-reward-server",
      .description = "Sluice reward server: scores responses with verifiers (math equivalence, code in a sandbox, format) under hard per-item deadlines.",
      .default_port = 50053,
      .default_metrics_port = 9093,
  });
  return main.Run(argc, argv, [&](ServiceContext& context) {
    using namespace sluice;
    context.AddService(std::make_shared<reward_server::RewardServerServiceImpl>(),
                       sluice::v1::RewardService::service_full_name());
    return absl::OkStatus();
  });
}
