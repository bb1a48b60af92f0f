// sluice-replay-buffer: see replay_buffer_service.h and README.md.
#include <memory>

#include "CLI/CLI.hpp"
#include "replay_buffer/replay_buffer_service.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  sluice::runtime::ServiceMain main({
      .component = "replay_buffer",
      .binary = "sluice-replay-buffer",
      .description = "Sluice replay buffer: holds scored groups, gates generation by the staleness bound, samples batches for the trainer, and never loses an acknowledged insert.",
      .default_port = 50054,
      .default_metrics_port = 9094,
  });
  return main.Run(argc, argv, [&](ServiceContext& context) {
    using namespace sluice;
    context.AddService(std::make_shared<replay_buffer::ReplayBufferServiceImpl>(),
                       sluice::v1::ReplayBufferService::service_full_name());
    return absl::OkStatus();
  });
}
