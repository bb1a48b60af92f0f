// sluice: the command-line interface.
//
//   sluice up [--state-dir DIR]        run the local stack until Ctrl-C / SIGTERM
//   sluice health --target HOST:PORT   exit 0 when the service is SERVING
//   sluice quickstart [--runs-dir DIR] bring the stack up, show it healthy, stop it
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/build_info.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "services/cli/local_stack.h"
#include "services/runtime/health_client.h"
#include "services/runtime/service_main.h"

namespace {

namespace fs = std::filesystem;
using sluice::cli::LocalStack;
using sluice::cli::LocalStackOptions;

std::string SelfDirectory() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? std::string(".") : self.parent_path().string();
}

void PrintEndpoints(const LocalStack& stack) {
  std::cout << "\n  service          grpc                   metrics\n";
  for (const auto& endpoint : stack.endpoints()) {
    std::cout << "  " << endpoint.name << std::string(17 - endpoint.name.size(), ' ')
              << endpoint.grpc << std::string(23 - std::min<size_t>(22, endpoint.grpc.size()), ' ')
              << endpoint.metrics << "\n";
  }
  std::cout << "\n  endpoints: " << stack.endpoints_path() << "\n" << std::flush;
}

void AddStackFlags(CLI::App* command, LocalStackOptions* options) {
  command->add_option("--bin-dir", options->bin_dir, "directory of the sluice-* service binaries")
      ->capture_default_str();
  command->add_option("--torch-threads", options->torch_threads,
                      "LibTorch intra-op threads for the trainer and the rollout worker")
      ->capture_default_str();
  command->add_option("--log-format", options->log_format, "service log format: text or json")
      ->capture_default_str();
}

int RunUp(LocalStackOptions options, int ready_fd) {
  LocalStack stack(options);
  if (absl::Status status = stack.Start(); !status.ok()) {
    std::cerr << "sluice up: " << status.message() << "\n";
    return 1;
  }
  if (ready_fd >= 0) {
    if (absl::Status reported = sluice::ReportReady(ready_fd, stack.endpoints_path());
        !reported.ok()) {
      std::cerr << "sluice up: " << reported.message() << "\n";
    }
  }
  std::cout << "sluice up: all " << stack.endpoints().size() << " services healthy";
  PrintEndpoints(stack);
  std::cout << "  logs:      " << (fs::path(options.state_dir) / "logs").string()
            << "\n\nPress Ctrl-C (or send SIGTERM) to stop.\n" << std::flush;
  std::string reason;
  const absl::Status supervised = stack.Supervise(&reason);
  if (!supervised.ok()) {
    std::cerr << "sluice up: " << supervised.message() << "\nsluice up: stopping the others\n";
    stack.Stop().IgnoreError();
    return 1;
  }
  std::cout << "sluice up: " << reason << ", stopping services\n" << std::flush;
  if (absl::Status stopped = stack.Stop(); !stopped.ok()) {
    std::cerr << "sluice up: " << stopped.message() << "\n";
    return 1;
  }
  std::cout << "sluice up: stopped\n";
  return 0;
}

// Until the training loop lands, the quickstart proves the stack: every
// service up, SERVING, and exporting metrics; then a clean stop.
int RunQuickstart(LocalStackOptions options) {
  const absl::Time start = absl::Now();
  LocalStack stack(options);
  std::cout << "sluice quickstart: starting the local stack in " << options.state_dir << "\n"
            << std::flush;
  if (absl::Status status = stack.Start(); !status.ok()) {
    std::cerr << "sluice quickstart: " << status.message() << "\n";
    return 1;
  }
  PrintEndpoints(stack);
  bool all_ok = true;
  for (const auto& endpoint : stack.endpoints()) {
    absl::StatusOr<std::string> health =
        sluice::runtime::CheckHealth(endpoint.grpc, "", absl::Seconds(5));
    absl::StatusOr<std::string> metrics =
        sluice::runtime::HttpGet(endpoint.metrics, absl::Seconds(5));
    const bool ok = health.ok() && *health == "SERVING" && metrics.ok() &&
                    metrics->find("sluice_build_info") != std::string::npos;
    all_ok = all_ok && ok;
    std::cout << "  " << (ok ? "ok  " : "FAIL") << " " << endpoint.name << ": health "
              << (health.ok() ? *health : std::string(health.status().message()))
              << ", /metrics "
              << (metrics.ok() ? absl::StrCat(metrics->size(), " bytes")
                               : std::string(metrics.status().message()))
              << "\n";
  }
  std::cout << "sluice quickstart: stopping the stack\n" << std::flush;
  const absl::Status stopped = stack.Stop();
  if (!stopped.ok()) std::cerr << "sluice quickstart: " << stopped.message() << "\n";
  all_ok = all_ok && stopped.ok();
  std::cout << "sluice quickstart: " << (all_ok ? "all services healthy and stopped cleanly"
                                                : "FAILED")
            << " in " << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))
            << "\n(the training loop that quickstart will run arrives with the next release)\n";
  return all_ok ? 0 : 1;
}

int RunHealth(const std::string& target, const std::string& service, int timeout_ms) {
  absl::StatusOr<std::string> status =
      sluice::runtime::CheckHealth(target, service, absl::Milliseconds(timeout_ms));
  if (!status.ok()) {
    std::cerr << "sluice health: " << status.status().message() << "\n";
    return 1;
  }
  std::cout << target << (service.empty() ? "" : " " + service) << ": " << *status << "\n";
  return *status == "SERVING" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists: `sluice up` reads SIGTERM/SIGINT from a signalfd.
  sluice::runtime::BlockTerminationSignals();
  sluice::log::Init("sluice", sluice::log::Level::kWarning, sluice::log::Format::kText);

  CLI::App app("Sluice: asynchronous RL post-training for language models.", "sluice");
  app.set_version_flag("--version", absl::StrCat("sluice ", sluice::kVersion));
  app.require_subcommand(1);

  LocalStackOptions stack_options;
  stack_options.bin_dir = SelfDirectory();
  stack_options.state_dir = ".sluice";

  CLI::App* up = app.add_subcommand(
      "up", "Start all five services on loopback and supervise them until Ctrl-C/SIGTERM");
  up->add_option("--state-dir", stack_options.state_dir,
                 "where endpoints.json and logs/ are written")
      ->capture_default_str();
  AddStackFlags(up, &stack_options);
  int up_ready_fd = -1;
  up->add_option("--ready-fd", up_ready_fd,
                 "write the path of endpoints.json to this inherited fd once all are healthy")
      ->group("");

  std::string runs_dir = "sluice-runs";
  CLI::App* quickstart = app.add_subcommand(
      "quickstart", "Bring the local stack up, show every service healthy, and stop it");
  quickstart->add_option("--runs-dir", runs_dir, "where the stack's state and logs go")
      ->capture_default_str();
  AddStackFlags(quickstart, &stack_options);

  std::string target;
  std::string service;
  int timeout_ms = 5000;
  CLI::App* health =
      app.add_subcommand("health", "Check one service's gRPC health (exit 0 when SERVING)");
  health->add_option("--target", target, "HOST:PORT of the service")->required();
  health->add_option("--service", service, "service name; empty for the whole server");
  health->add_option("--timeout-ms", timeout_ms, "give up after this long")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  if (*up) return RunUp(stack_options, up_ready_fd);
  if (*quickstart) {
    stack_options.state_dir = (fs::path(runs_dir) / "stack").string();
    return RunQuickstart(stack_options);
  }
  if (*health) return RunHealth(target, service, timeout_ms);
  return 2;
}
