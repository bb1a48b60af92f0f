// sluice-replay-buffer: see replay_buffer_service.h and README.md.
#include <cstdint>
#include <memory>

#include "CLI/CLI.hpp"
#include "replay_buffer/replay_buffer.h"
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
  int64_t lease_ttl_ms = 60000;
  main.app()
      .add_option("--lease-ttl-ms", lease_ttl_ms,
                  "how long a generation slot counts as running without an insert, release "
                  "or renewal")
      ->capture_default_str();
  return main.Run(argc, argv, [&](ServiceContext& context) -> absl::Status {
    using namespace sluice;
    replay_buffer::RunTableOptions options;
    options.lease_ttl = absl::Milliseconds(lease_ttl_ms);
    absl::StatusOr<std::unique_ptr<replay_buffer::ReplayBuffer>> buffer =
        replay_buffer::ReplayBuffer::Create(options);
    if (!buffer.ok()) return buffer.status();
    auto service = std::make_shared<replay_buffer::ReplayBufferServiceImpl>(
        std::move(buffer).value(), context.metrics_registry());
    context.OnShutdown([service] { service->Shutdown(); });
    context.AddService(service, sluice::v1::ReplayBufferService::service_full_name());
    return absl::OkStatus();
  });
}
