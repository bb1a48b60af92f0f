// `sluice up` and `sluice quickstart` (stack_commands.h).
#include "cli/stack_commands.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/quickstart_spec.h"
#include "cli/run_client.h"
#include "common/logging.h"
#include "controller/run_spec.h"
#include "controller/spec_yaml.h"
#include "services/runtime/service_main.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

void PrintEndpoints(const LocalStack& stack) {
  std::cout << "\n  service          grpc                   metrics\n";
  for (const auto& endpoint : stack.endpoints()) {
    std::cout << "  " << endpoint.name << std::string(17 - endpoint.name.size(), ' ')
              << endpoint.grpc << std::string(23 - std::min<size_t>(22, endpoint.grpc.size()), ' ')
              << endpoint.metrics << "\n";
  }
  std::cout << "\n  endpoints: " << stack.endpoints_path() << "\n" << std::flush;
}

}  // namespace

void AddStackFlags(CLI::App* command, LocalStackOptions* options, StackFlags* flags) {
  command->add_option("--bin-dir", options->bin_dir, "directory of the sluice-* service binaries")
      ->capture_default_str();
  command
      ->add_option("--rollout-workers", options->rollout_workers,
                   "rollout workers to start (rollout_worker-0..N-1, worker ids "
                   "worker-0..N-1); they share the workers' memory evenly and register "
                   "with the controller themselves")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  command
      ->add_option("--buffer-data-dir", flags->buffer_data_dir,
                   "the replay buffer's data directory (write-ahead log and snapshots). The "
                   "buffer is durable by default: <state-dir>/replay_buffer. \"none\" or \"\" "
                   "keeps it in memory only (a restarted buffer starts empty)")
      ->type_name("DIR");
  command
      ->add_option("--restart", flags->restart,
                   "when a service dies: on-failure restarts it with backoff (1s doubling to "
                   "30s; a singleton on the same port, a worker on a new one); never gives up "
                   "at once. A service given up on is reported to the controller; the stack "
                   "stops if it was not a rollout worker")
      ->capture_default_str()
      ->check(CLI::IsMember({"on-failure", "never"}));
  command
      ->add_option("--max-restarts", options->restart.max_restarts,
                   "a service that fails more often than this within --restart-window is in "
                   "a crash loop and given up on")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--restart-window", flags->restart_window,
                   "the window of --max-restarts (e.g. 90s, 2m)")
      ->capture_default_str();
  command
      ->add_option("--liveness-period", flags->liveness_period,
                   "how often each running service's gRPC health is asked, as Kubernetes' "
                   "livenessProbe (0 = never)")
      ->capture_default_str();
  command
      ->add_option("--liveness-timeout", flags->liveness_timeout,
                   "a health check not answered within this long is a liveness failure (an "
                   "answer of any kind, NOT_SERVING included, is not)")
      ->capture_default_str();
  command
      ->add_option("--liveness-failures", options->liveness.failures,
                   "liveness failures in a row after which a service that is still running "
                   "(hung, or stopped with SIGSTOP) is killed and restarted like a dead one")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  command->add_flag("--tls", options->tls,
                    "secure the stack: a local CA and certificates in <state-dir>/tls/ (mutual "
                    "TLS between the services), and bearer tokens for the CLI (operator.token: "
                    "submit, cancel, read; viewer.token: read only). The CLI finds them through "
                    "endpoints.json");
  command
      ->add_option("--torch-threads", options->torch_threads,
                   "LibTorch intra-op threads for the trainer and each rollout worker")
      ->capture_default_str();
  command->add_option("--log-format", options->log_format, "service log format: text or json")
      ->capture_default_str();
  command
      ->add_option("--allowed-path-roots", options->allowed_path_roots,
                   "directories the paths a run spec names (model, tokenizer, dataset, "
                   "checkpoint.dir) may lie in, passed to the controller, the trainer and the "
                   "workers; a relative path in a spec resolves against the first. Default: "
                   "the working directory. The state and runs directories are always added")
      ->type_name("DIR");
}

// False (with a message on stderr) when a flag's value is refused.
bool ApplyStackFlags(const StackFlags& flags, const std::string& command,
                     LocalStackOptions* options) {
  options->restart.restart_on_failure = flags.restart == "on-failure";
  if (!absl::ParseDuration(flags.restart_window, &options->restart.window) ||
      options->restart.window <= absl::ZeroDuration()) {
    std::cerr << "sluice " << command << ": --restart-window must be a positive duration such as "
              << "90s or 2m, got \"" << flags.restart_window << "\"\n";
    return false;
  }
  for (const auto& [flag, text, duration] :
       {std::tuple{"--liveness-period", &flags.liveness_period, &options->liveness.period},
        std::tuple{"--liveness-timeout", &flags.liveness_timeout, &options->liveness.timeout}}) {
    const std::string value = *text == "0" ? "0s" : *text;
    if (!absl::ParseDuration(value, duration) || *duration < absl::ZeroDuration()) {
      std::cerr << "sluice " << command << ": " << flag
                << " must be a duration such as 5s or 500ms, got \"" << *text << "\"\n";
      return false;
    }
  }
  if (absl::Status valid = options->liveness.Validate(); !valid.ok()) {
    std::cerr << "sluice " << command << ": " << valid.message() << "\n";
    return false;
  }
  options->buffer_data_dir = flags.buffer_data_dir;
  options->console_prefix = "sluice " + command;
  return true;
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
            << "\n  runs:      " << stack.runs_dir()
            << "\n\nPress Ctrl-C (or send SIGTERM) to stop.\n"
            << std::flush;
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

// The embedded default: the local stack, the built-in run spec, a live watch
// of the run, then the stack torn down. The run's files land in
// <runs-dir>/<run-id>/; the stack's state and logs in <runs-dir>/stack/.
//
// The watch runs on its own thread while this one supervises the services:
// a service that dies is named at once (and the controller fails the run,
// which ends the watch); Ctrl-C cancels the run and stops the stack.
int RunQuickstart(LocalStackOptions options, const QuickstartFlags& flags) {
  const absl::Time start = absl::Now();
  absl::StatusOr<sluice::v1::RunSpec> spec =
      flags.spec_path.empty() ? sluice::controller::ParseRunSpecYaml(
                                    sluice::cli::kQuickstartSpecYaml, "built-in quickstart spec")
                              : sluice::controller::LoadRunSpecFile(flags.spec_path);
  if (!spec.ok()) {
    std::cerr << "sluice quickstart: " << spec.status().message() << "\n";
    return 2;
  }
  if (flags.seed.has_value()) spec->set_seed(*flags.seed);
  if (flags.max_staleness.has_value()) {
    spec->mutable_algorithm()->set_max_staleness(*flags.max_staleness);
  }

  LocalStack stack(options);
  std::cout << "sluice quickstart: starting the local stack in " << options.state_dir << "\n"
            << std::flush;
  if (absl::Status status = stack.Start(); !status.ok()) {
    std::cerr << "sluice quickstart: " << status.message() << "\n";
    return 1;
  }
  PrintEndpoints(stack);
  std::string controller;
  for (const auto& endpoint : stack.endpoints()) {
    if (endpoint.name == "controller") controller = endpoint.grpc;
  }
  std::cout << "sluice quickstart: submitting \"" << spec->name() << "\" (seed " << spec->seed()
            << ", eta " << spec->algorithm().max_staleness() << ")\n"
            << std::flush;

  const int wake_fd = eventfd(0, EFD_CLOEXEC);
  if (wake_fd < 0) {
    std::cerr << "sluice quickstart: eventfd: " << strerror(errno) << "\n";
    stack.Stop().IgnoreError();
    return 1;
  }
  sluice::cli::SubmitOptions submit;
  submit.watch = true;
  submit.out = &std::cout;
  submit.progress = &std::cerr;
  submit.progress_redraw = isatty(STDERR_FILENO) != 0;
  std::atomic<bool> stopping_stack{false};
  submit.stop_watching = &stopping_stack;
  absl::StatusOr<sluice::v1::Run> run = absl::UnknownError("not finished");
  std::thread watcher([&] {
    run = sluice::cli::SubmitAndWatch(controller, *spec, submit);
    const uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  });

  std::string reason;
  const absl::Status supervised = stack.Supervise(&reason, wake_fd);
  bool watcher_done = supervised.ok() && reason == "woken";
  if (!supervised.ok()) {
    // A service died. The controller notices within a few seconds and fails
    // the run naming it; give it that long, then stop everything.
    std::cerr << "\nsluice quickstart: " << supervised.message() << "\n";
  } else if (!watcher_done) {
    std::cerr << "\nsluice quickstart: " << reason << ", cancelling the run\n";
    sluice::v1::ListRunsRequest active;
    for (auto state : {sluice::v1::RUN_STATE_QUEUED, sluice::v1::RUN_STATE_PENDING,
                       sluice::v1::RUN_STATE_WARM_START, sluice::v1::RUN_STATE_TRAINING,
                       sluice::v1::RUN_STATE_EVALUATING}) {
      active.add_states(state);
    }
    if (auto runs = sluice::cli::ListRuns(controller, active, absl::Seconds(5)); runs.ok()) {
      for (const auto& r : runs->runs()) {
        sluice::cli::CancelRun(controller, r.run_id(), "quickstart interrupted", absl::Seconds(10))
            .IgnoreError();
      }
    }
  }
  if (!watcher_done) {
    pollfd pfd{wake_fd, POLLIN, 0};
    if (poll(&pfd, 1, 20000) <= 0) {
      // The controller itself is gone or stuck: stopping the stack ends the
      // watch (its stream breaks).
      std::cerr << "sluice quickstart: the run did not end by itself; stopping the stack\n";
    }
  }
  // The watch ends with the controller's stream, not after a minute of
  // trying to reconnect to a controller that is not coming back.
  stopping_stack.store(true);
  const absl::Status stopped = stack.Stop();
  watcher.join();
  close(wake_fd);
  std::cout << "sluice quickstart: stack stopped\n";
  if (!stopped.ok()) std::cerr << "sluice quickstart: " << stopped.message() << "\n";

  if (!run.ok()) {
    std::cerr << "sluice quickstart: " << run.status().message() << "\n";
    return 1;
  }
  const std::string summary =
      (fs::path(stack.runs_dir()) / run->run_id() / "summary.json").string();
  std::cout << "sluice quickstart: " << sluice::v1::RunState_Name(run->state()) << " in "
            << absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Seconds(1)))
            << "; eval accuracy " << run->summary().eval_before() << " -> "
            << run->summary().eval_after() << "\n"
            << "  run files: " << fs::path(summary).parent_path().string() << "/"
            << " (summary.json, metrics.jsonl, evals.jsonl, spec.json; state.json and "
               "prompt_feed.jsonl are the controller's record of the run, see "
               "docs/run-lifecycle.md)\n";
  return run->state() == sluice::v1::RUN_STATE_SUCCEEDED && supervised.ok() ? 0 : 1;
}

}  // namespace sluice::cli
