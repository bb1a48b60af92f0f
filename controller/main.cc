// sluice-controller: see controller_service.h, run_registry.h and
// docs/run-lifecycle.md.
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "controller/controller_metrics.h"
#include "controller/controller_service.h"
#include "controller/grpc_clients.h"
#include "controller/run_registry.h"
#include "controller/worker_registry.h"
#include "services/runtime/allowed_path_roots.h"
#include "services/runtime/server_options.h"
#include "services/runtime/service_main.h"

int main(int argc, char** argv) {
  using sluice::runtime::ServiceContext;
  namespace controller = sluice::controller;
  sluice::runtime::ServiceMain main({
      .component = "controller",
      .binary = "sluice-controller",
      .description = "Sluice controller: accepts runs (SubmitRun, GetRun, WatchRun, CancelRun, "
                     "ListRuns), validates run specs, drives warm start, RL and evaluation, and "
                     "leases prompts to rollout workers.",
      .default_port = 50051,
      .default_metrics_port = 9091,
  });
  controller::RunRegistryOptions registry_options;
  controller::ServiceAddresses addresses;
  std::string advertise_address;
  CLI::App& app = main.app();
  app.add_option("--runs-dir", registry_options.runs_dir,
                 "where each run's files go (<runs-dir>/<run-id>/spec.json, state.json, "
                 "metrics.jsonl, evals.jsonl, prompt_feed.jsonl, summary.json). It is the "
                 "record: a controller started on the runs directory of one that stopped or "
                 "died lists its ended runs, queues its queued runs again and re-adopts its "
                 "active run. Stopping the controller (SIGTERM) ends no run; cancel one to end "
                 "it")
      ->capture_default_str();
  app.add_option("--trainer-address", addresses.trainer, "trainer HOST:PORT")
      ->type_name("HOST:PORT");
  app.add_option("--replay-buffer-address", addresses.replay_buffer, "replay buffer HOST:PORT")
      ->type_name("HOST:PORT");
  app.add_option("--reward-server-address", addresses.reward_server, "reward server HOST:PORT")
      ->type_name("HOST:PORT");
  controller::WorkerRegistryOptions worker_options;
  int64_t heartbeat_interval_ms = absl::ToInt64Milliseconds(worker_options.heartbeat_interval);
  app.add_option("--worker-heartbeat-interval-ms", heartbeat_interval_ms,
                 "how often rollout workers heartbeat (they register themselves: start them "
                 "with --controller-address pointing here)")
      ->check(CLI::Range(int64_t{10}, int64_t{60000}))
      ->capture_default_str();
  int64_t worker_ttl_ms = absl::ToInt64Milliseconds(worker_options.worker_ttl);
  app.add_option("--worker-ttl-ms", worker_ttl_ms,
                 "a rollout worker silent this long is lost: its prompt leases and generation "
                 "slots go to the others")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  int64_t worker_clock_skew_ms = absl::ToInt64Milliseconds(worker_options.max_clock_skew);
  app.add_option("--worker-clock-skew-ms", worker_clock_skew_ms,
                 "a rollout worker's incarnation (its start time) may lead this controller's "
                 "clock by at most this much; one further ahead is refused, so that a forged "
                 "incarnation cannot lock a worker id's real process out")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  app.add_option("--max-queued-runs", registry_options.max_queued_runs,
                 "runs that may wait in the queue behind the active one; SubmitRun refuses one "
                 "more with RESOURCE_EXHAUSTED")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  int64_t worker_grace_ms = absl::ToInt64Milliseconds(registry_options.driver.worker_grace);
  app.add_option("--worker-grace-ms", worker_grace_ms,
                 "fail a run served by fewer than rollout.min_workers workers for this long")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  int64_t unreachable_timeout_ms =
      absl::ToInt64Milliseconds(registry_options.driver.service_unreachable_timeout);
  app.add_option("--service-unreachable-timeout-ms", unreachable_timeout_ms,
                 "fail a run whose trainer, replay buffer or reward server has been unreachable "
                 "this long; shorter outages (a restart) are waited out")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  int64_t stall_timeout_ms = absl::ToInt64Milliseconds(registry_options.driver.stall_timeout);
  app.add_option("--stall-timeout-ms", stall_timeout_ms,
                 "fail an active run that made no progress (no step, evaluation, new version or "
                 "generated tokens) for this long, saying what each service reports; 0 = never")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--trusted-worker-ids", registry_options.trusted_worker_ids,
                 "rollout worker ids this deployment started itself (`sluice up` passes the "
                 "workers it supervises): their groups are verified at "
                 "algorithm.rollout_verification.trusted_fraction (default 1/16) instead of "
                 "fraction (default 1) when a spec names no trusted workers of its own. With "
                 "authentication on, only a worker that authenticates as one of these ids can "
                 "insert its groups")
      ->delimiter(',')
      ->type_name("ID,...");
  sluice::runtime::AllowedPathRootsFlag path_roots(app);
  app.add_option("--advertise-address", advertise_address,
                 "how the other services reach this controller; default 127.0.0.1:<bound port> "
                 "when listening on a wildcard or loopback address, else the listen host")
      ->type_name("HOST:PORT");

  // Outlive the server: WatchRun handlers and driver threads use them until
  // the server has stopped.
  std::unique_ptr<controller::ControllerMetrics> metrics;
  std::unique_ptr<controller::RunRegistry> registry;
  std::shared_ptr<controller::ControllerServiceImpl> service;
  const int code = main.Run(argc, argv, [&](ServiceContext& context) {
    absl::StatusOr<sluice::PathPolicy> allowed_paths = path_roots.Apply();
    if (!allowed_paths.ok()) return allowed_paths.status();
    registry_options.allowed_paths = *std::move(allowed_paths);
    registry_options.driver.stall_timeout = absl::Milliseconds(stall_timeout_ms);
    registry_options.driver.worker_grace = absl::Milliseconds(worker_grace_ms);
    registry_options.driver.service_unreachable_timeout =
        absl::Milliseconds(unreachable_timeout_ms);
    if (worker_ttl_ms <= 2 * heartbeat_interval_ms) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--worker-ttl-ms (", worker_ttl_ms, ") must be more than twice "
          "--worker-heartbeat-interval-ms (", heartbeat_interval_ms,
          "), or one late heartbeat loses a healthy worker"));
    }
    worker_options.heartbeat_interval = absl::Milliseconds(heartbeat_interval_ms);
    worker_options.worker_ttl = absl::Milliseconds(worker_ttl_ms);
    worker_options.max_clock_skew = absl::Milliseconds(worker_clock_skew_ms);
    metrics = std::make_unique<controller::ControllerMetrics>(context.metrics_registry());
    controller::ServiceClients clients = controller::MakeGrpcServiceClients(addresses);
    clients.workers = std::make_shared<controller::WorkerRegistry>(worker_options);
    registry = std::make_unique<controller::RunRegistry>(registry_options, std::move(clients),
                                                         metrics.get());
    service = std::make_shared<controller::ControllerServiceImpl>(registry.get());
    context.AddService(service, sluice::v1::ControllerService::service_full_name());
    const std::string listen_address = context.options().listen_address;
    // The runs of the last controller on this runs directory come back
    // before the server answers, so that the trainer and the workers of the
    // active run, still reporting, find it rather than be told it is gone.
    // That needs the address they are given, known now unless the port is
    // chosen at bind time (port 0), when nobody can reach this controller
    // before it is told the address anyway: then right after the bind.
    std::string known_address = advertise_address;
    if (known_address.empty()) {
      absl::StatusOr<sluice::runtime::HostPort> listen =
          sluice::runtime::ParseHostPort(listen_address, "listen_address");
      if (listen.ok() && listen->port != 0) {
        known_address = sluice::runtime::DefaultAdvertiseAddress(listen_address, listen->port);
      }
    }
    const auto restore = [&]() -> absl::Status {
      absl::StatusOr<controller::RunRegistryRestore> restored = registry->Restore();
      return restored.status();
    };
    if (!known_address.empty()) {
      registry->SetControllerAddress(known_address);
      if (absl::Status restored = restore(); !restored.ok()) return restored;
    }
    context.OnStarted([&, listen_address, known_address, restore](int port) {
      const std::string address = !known_address.empty() ? known_address
                                  : advertise_address.empty()
                                      ? sluice::runtime::DefaultAdvertiseAddress(listen_address, port)
                                      : advertise_address;
      if (known_address.empty()) {
        registry->SetControllerAddress(address);
        if (absl::Status restored = restore(); !restored.ok()) {
          sluice::log::Error("cannot restore the runs",
                             {{"runs_dir", registry_options.runs_dir},
                              {"error", std::string(restored.message())}});
        }
      }
      sluice::log::Info(
          "controller ready",
          {{"advertise_address", address},
           {"runs_dir", registry_options.runs_dir},
           {"trainer", addresses.trainer.empty() ? "-" : addresses.trainer},
           {"replay_buffer", addresses.replay_buffer.empty() ? "-" : addresses.replay_buffer},
           {"reward_server", addresses.reward_server.empty() ? "-" : addresses.reward_server}});
    });
    // Wake the watchers (their streams end UNAVAILABLE; `sluice runs watch`
    // reconnects to the next controller), flush every run's record and join
    // the driver threads. No run ends and no service is stopped: the next
    // controller on this runs directory re-adopts the active run.
    context.OnShutdown([&] {
      service->BeginShutdown();
      registry->Shutdown();
    });
    return absl::OkStatus();
  });
  return code;
}
