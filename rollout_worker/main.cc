// sluice-rollout-worker: see rollout_worker_service.h and README.md.
#include <unistd.h>

#include <memory>
#include <string>

#include <chrono>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/torch_threads.h"
#include "grpcpp/grpcpp.h"
#include "rollout_worker/controller_link.h"
#include "rollout_worker/rollout_worker_service.h"
#include "services/runtime/allowed_path_roots.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/memory_budget.h"
#include "services/runtime/server_options.h"
#include "services/runtime/service_main.h"
#include "services/runtime/transport_security.h"
#include "services/weights/weight_relay_service.h"
#include "sluice/v1/controller.grpc.pb.h"

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
  sluice::runtime::AllowedPathRootsFlag path_roots(main.app());
  std::string advertise_address;
  main.app().add_option(
      "--advertise-address", advertise_address,
      "HOST:PORT other hosts reach this worker at: reported in heartbeats and told to the "
      "trainer for relayed weights (default: the listen address, or 127.0.0.1 with a wildcard "
      "listen address, which only workers on this host can reach)");
  bool weight_relay = true;
  main.app()
      .add_option("--weight-relay", weight_relay,
                  "Serve the weight versions this worker receives to other workers (the "
                  "trainer's fan-out tree; costs one more copy of the weights in memory). "
                  "Turn off where other workers cannot reach this one")
      ->capture_default_str();
  // Outlives the server: started once it has bound its port, stopped at
  // shutdown.
  std::shared_ptr<sluice::rollout_worker::ControllerLink> link;
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
    if (worker_id.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      worker_id = absl::StrCat(host, "-", getpid());
    }
    auto service = std::make_shared<rollout_worker::RolloutWorkerServiceImpl>(
        context.metrics_registry(), worker_id, budget, *std::move(allowed_paths));
    context.AddService(service, sluice::v1::RolloutWorkerService::service_full_name());
    std::shared_ptr<weights::RelayCache> relay_cache;
    if (weight_relay) {
      relay_cache = std::make_shared<weights::RelayCache>();
      context.AddService(
          std::make_shared<weights::WeightRelayServiceImpl>(relay_cache, context.metrics_registry()),
          sluice::v1::WeightRelay::service_full_name());
    }
    const std::string relay_listen_address = context.options().listen_address;
    context.OnStarted([service, relay_cache, relay_listen_address, advertise_address](int port) {
      if (relay_cache != nullptr) {
        service->EnableWeightRelay(relay_cache,
                                   advertise_address.empty()
                                       ? runtime::DefaultAdvertiseAddress(relay_listen_address, port)
                                       : advertise_address);
      }
    });
    if (!controller_address.empty()) {
      std::shared_ptr<v1::ControllerService::Stub> stub = v1::ControllerService::NewStub(
          runtime::CreateChannel(controller_address));
      rollout_worker::HeartbeatCall heartbeat = [stub](const v1::WorkerHeartbeatRequest& request)
          -> absl::StatusOr<v1::WorkerHeartbeatResponse> {
        grpc::ClientContext call;
        call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        v1::WorkerHeartbeatResponse response;
        const grpc::Status status = stub->WorkerHeartbeat(&call, request, &response);
        if (!status.ok()) return runtime::FromGrpcStatus(status);
        return response;
      };
      const std::string listen_address = context.options().listen_address;
      context.OnStarted([&link, service, heartbeat, listen_address, advertise_address](int port) {
        link = std::make_shared<rollout_worker::ControllerLink>(
            rollout_worker::ControllerLinkOptions{
                .worker_id = service->worker_id(),
                .incarnation = service->incarnation(),
                .address = advertise_address.empty()
                               ? runtime::DefaultAdvertiseAddress(listen_address, port)
                               : advertise_address},
            heartbeat, service.get());
        link->Start();
      });
    } else {
      log::Warning("no --controller-address: this worker serves only runs started with "
                   "StartRollouts", {});
    }
    // Heartbeats stop first (no new runs; the controller is told the worker
    // leaves), then the runs.
    context.OnShutdown([service, &link] {
      if (link) link->Leave();
      service->Shutdown();
    });
    return absl::OkStatus();
  });
}
