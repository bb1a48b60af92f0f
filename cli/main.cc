// sluice: the command-line interface.
//
//   sluice up [--state-dir DIR] [--runs-dir DIR] [--rollout-workers N] [--restart on-failure|never]
//             [--max-restarts N] [--restart-window D] [--buffer-data-dir DIR|none]
//             [--liveness-period D] [--liveness-timeout D] [--liveness-failures N]
//                                      run and supervise the local stack until Ctrl-C / SIGTERM
//   sluice health --target HOST:PORT   exit 0 when the service is SERVING
//   sluice quickstart [--runs-dir DIR]  up + submit the built-in run + watch + tear down
//   sluice submit SPEC.yaml [--target ADDR | --state-dir DIR] [--watch] [--validate-only]
//   sluice runs get|cancel|watch RUN_ID [--target ADDR | --state-dir DIR]; sluice runs list
//   sluice buffer stats --target ADDR --run-id ID [--json]
//   sluice score --input IN.jsonl --output OUT.jsonl [--verifier V] [--target ADDR]
//   sluice tokenize|detokenize --tokenizer FILE   (JSONL on stdin -> JSONL on stdout)
//   sluice logits --model DIR --ids 1,2,3
//   sluice generate --model DIR (--ids 1,2,3 | --prompt TEXT) --max-new-tokens N [--greedy]
//   sluice init-model --builtin tiny --out DIR [--seed S]
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <thread>
#include <vector>

#include <filesystem>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/build_info.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "cli/buffer_command.h"
#include "cli/local_stack.h"
#include "cli/quickstart_spec.h"
#include "cli/run_client.h"
#include "cli/stack_commands.h"
#include "cli/score_command.h"
#include "cli/token_command.h"
#include "cli/tokenize_command.h"
#include "controller/run_spec.h"
#include "controller/spec_yaml.h"
#include "services/runtime/health_client.h"
#include "services/runtime/service_main.h"
#include "services/runtime/transport_security.h"

namespace {

namespace fs = std::filesystem;
using sluice::cli::LocalStack;
using sluice::cli::LocalStackOptions;
using sluice::cli::QuickstartFlags;
using sluice::cli::StackFlags;

std::string SelfDirectory() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? std::string(".") : self.parent_path().string();
}

// `sluice logits` and `sluice generate` run in sluice-model, next to this
// binary, so that every other command starts without loading LibTorch (about
// a second and 170 MB). Returns only if the exec failed.
int ExecModelCommand(int argc, char** argv) {
  const std::string binary = SelfDirectory() + "/sluice-model";
  std::vector<char*> args(argv, argv + argc);
  args[0] = const_cast<char*>(binary.c_str());
  args.push_back(nullptr);
  execv(binary.c_str(), args.data());
  std::cerr << "sluice " << argv[1] << ": cannot run " << binary << ": " << strerror(errno)
            << " (it is built with sluice; reinstall or rebuild)\n";
  return 1;
}

// `sluice report` is python/sluice/report.py (matplotlib draws the plots):
// runs `python3 -m sluice.report ARGS...` with the package on PYTHONPATH,
// found beside this binary (<bin>/../python in a build tree,
// <bin>/../lib/sluice/python installed). SLUICE_PYTHON picks another
// interpreter (default Debian's /usr/bin/python3, which sees Debian's
// python3-matplotlib). Returns only if the exec failed.
int ExecReportCommand(int argc, char** argv) {
  const fs::path self = SelfDirectory();
  std::string package;
  for (const fs::path& candidate : {self / ".." / "python", self / ".." / "lib" / "sluice" / "python"}) {
    std::error_code error;
    if (fs::exists(candidate / "sluice" / "report.py", error)) {
      package = fs::weakly_canonical(candidate, error).string();
      break;
    }
  }
  if (package.empty()) {
    std::cerr << "sluice report: cannot find the sluice Python package beside " << self.string()
              << " (looked in ../python and ../lib/sluice/python; it is built with sluice)\n";
    return 1;
  }
  const char* existing = getenv("PYTHONPATH");
  const std::string path =
      existing != nullptr && *existing != '\0' ? package + ":" + existing : package;
  setenv("PYTHONPATH", path.c_str(), 1);
  const char* python_env = getenv("SLUICE_PYTHON");
  const std::string python =
      python_env != nullptr && *python_env != '\0' ? python_env : "/usr/bin/python3";
  std::vector<std::string> words = {python, "-m", "sluice.report"};
  for (int i = 2; i < argc; ++i) words.emplace_back(argv[i]);
  std::vector<char*> args;
  for (std::string& word : words) args.push_back(word.data());
  args.push_back(nullptr);
  execv(python.c_str(), args.data());
  std::cerr << "sluice report: cannot run " << python << ": " << strerror(errno)
            << " (install python3 and python3-matplotlib: scripts/install-deps.sh)\n";
  return 1;
}

constexpr char kStateDirHelp[] =
    "the state directory of the `sluice up` to talk to (its endpoints.json names the controller "
    "and, with --tls, the CA and operator token); default $SLUICE_STATE_DIR, else .sluice/";

// Client commands are ordinary foreground programs: Ctrl-C ends them.
void UnblockTerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

struct SubmitFlags {
  std::string spec_path;
  std::string target;
  std::string state_dir;
  bool watch = false;
  bool validate_only = false;
  int64_t interval_ms = 1000;
};

// After a validated spec's JSON: what the fields it leaves 0 or UNSPECIFIED
// mean, so that "every default resolved" holds for them too.
void PrintZeroDefaults(const sluice::v1::RunSpec& resolved) {
  const std::vector<std::string> lines = sluice::controller::DescribeZeroDefaults(resolved);
  if (lines.empty()) return;
  std::cerr << "sluice submit: fields left 0 or UNSPECIFIED above mean:\n";
  for (const std::string& line : lines) std::cerr << "  " << line << "\n";
}

// Says why the spec is refused, one problem per line; exit code 2.
int InvalidSpec(const std::string& spec_path, const absl::Status& status) {
  std::cerr << "sluice submit: " << spec_path << " is not a valid run spec:\n  "
            << absl::StrReplaceAll(status.message(), {{"\n", "\n  "}}) << "\n";
  return 2;
}

int RunSubmit(const SubmitFlags& flags) {
  absl::StatusOr<sluice::v1::RunSpec> spec = sluice::controller::LoadRunSpecFile(flags.spec_path);
  if (!spec.ok()) {
    std::cerr << "sluice submit: "
              << absl::StrReplaceAll(spec.status().message(), {{"\n", "\n  "}}) << "\n";
    return 2;
  }
  if (flags.validate_only && flags.target.empty() && flags.state_dir.empty()) {
    // Offline: the same checks SubmitRun makes, without a controller; only
    // the services' memory budgets are theirs to judge.
    absl::StatusOr<sluice::controller::OfflineValidation> valid =
        sluice::controller::ValidateSpecOffline(*spec);
    if (!valid.ok()) return InvalidSpec(flags.spec_path, valid.status());
    std::cout << sluice::cli::RunToJson(valid->spec) << "\n";
    PrintZeroDefaults(valid->spec);
    std::cerr << "sluice submit: " << flags.spec_path
              << " is valid (above: the spec with every default resolved; checked offline, "
                 "--target or --state-dir also asks a controller)\n"
              << "sluice submit: estimated memory: "
              << sluice::controller::DescribeRunMemory(valid->memory)
              << "; the controller checks it against the services' --memory-budget at submit\n";
    return 0;
  }
  const absl::StatusOr<std::string> target =
      sluice::cli::ResolveControllerTarget(flags.target, flags.state_dir);
  if (!target.ok()) {
    std::cerr << "sluice submit: " << target.status().message() << "\n";
    return 1;
  }
  sluice::cli::SubmitOptions options;
  options.validate_only = flags.validate_only;
  options.watch = flags.watch;
  options.watch_interval_ms = flags.interval_ms;
  options.out = &std::cout;
  options.progress = &std::cerr;
  options.progress_redraw = isatty(STDERR_FILENO) == 1;
  if (flags.watch && !spec->description().empty()) {
    std::cerr << "sluice submit: " << (spec->name().empty() ? flags.spec_path : spec->name())
              << ": " << spec->description() << "\n";
  }
  if (flags.watch) {
    std::cerr << "sluice submit: following the run (Ctrl-C stops following; the run goes on, "
                 "`sluice runs cancel RUN_ID` stops it)\n";
  }
  absl::StatusOr<sluice::v1::Run> run = sluice::cli::SubmitAndWatch(*target, *spec, options);
  if (!run.ok()) {
    if (run.status().code() == absl::StatusCode::kInvalidArgument) {
      return InvalidSpec(flags.spec_path, run.status());
    }
    std::cerr << "sluice submit: " << run.status().message() << "\n";
    return 1;
  }
  if (flags.validate_only) {
    std::cout << sluice::cli::RunToJson(run->spec()) << "\n";
    PrintZeroDefaults(run->spec());
    std::cerr << "sluice submit: " << flags.spec_path
              << " is valid (above: the spec with every default resolved)\n";
    return 0;
  }
  if (!flags.watch) return 0;
  return run->state() == sluice::v1::RUN_STATE_SUCCEEDED ? 0 : 1;
}

int RunRunsCommand(const std::string& command, const std::string& run_id,
                   const std::string& target_flag, const std::string& state_dir,
                   const std::string& reason) {
  const std::string prefix = "sluice runs " + command + ": ";
  const absl::StatusOr<std::string> resolved =
      sluice::cli::ResolveControllerTarget(target_flag, state_dir);
  if (!resolved.ok()) {
    std::cerr << prefix << resolved.status().message() << "\n";
    return 1;
  }
  const std::string& target = *resolved;
  if (command == "list") {
    absl::StatusOr<sluice::v1::ListRunsResponse> runs =
        sluice::cli::ListRuns(target, sluice::v1::ListRunsRequest());
    if (!runs.ok()) {
      std::cerr << prefix << runs.status().message() << "\n";
      return 1;
    }
    if (runs->runs().empty()) {
      std::cout << "no runs (submit one with `sluice submit SPEC.yaml`)\n";
      return 0;
    }
    std::cout << sluice::cli::FormatRunListHeader() << "\n";
    for (const auto& run : runs->runs()) {
      std::cout << sluice::cli::FormatRunListLine(run) << "\n";
    }
    return 0;
  }
  if (command == "cancel") {
    absl::StatusOr<sluice::v1::CancelRunResponse> cancelled =
        sluice::cli::CancelRun(target, run_id, reason);
    if (!cancelled.ok()) {
      std::cerr << prefix << cancelled.status().message() << "\n";
      return cancelled.status().code() == absl::StatusCode::kNotFound ? 2 : 1;
    }
    std::cout << sluice::cli::FormatCancelOutcome(*cancelled) << "\n";
    return 0;
  }
  absl::StatusOr<sluice::v1::Run> run;
  if (command == "get") {
    run = sluice::cli::GetRun(target, run_id);
  } else {
    sluice::cli::SubmitOptions options;
    options.out = &std::cout;
    options.progress = &std::cerr;
    options.progress_redraw = isatty(STDERR_FILENO) == 1;
    run = sluice::cli::WatchRun(target, run_id, options);
    if (run.ok()) return run->state() == sluice::v1::RUN_STATE_SUCCEEDED ? 0 : 1;
  }
  if (!run.ok()) {
    std::cerr << prefix << run.status().message() << "\n";
    return run.status().code() == absl::StatusCode::kNotFound ? 2 : 1;
  }
  std::cout << sluice::cli::RunToJson(*run) << "\n";
  std::cerr << sluice::cli::FormatConditions(*run, absl::Now());
  return 0;
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
  if (argc >= 2 && (std::string(argv[1]) == "logits" || std::string(argv[1]) == "generate" ||
                    std::string(argv[1]) == "init-model")) {
    return ExecModelCommand(argc, argv);
  }
  if (argc >= 2 && std::string(argv[1]) == "report") {
    return ExecReportCommand(argc, argv);
  }
  // Before any thread exists: `sluice up` reads SIGTERM/SIGINT from a signalfd.
  sluice::runtime::BlockTerminationSignals();
  sluice::log::Init("sluice", sluice::log::Level::kWarning, sluice::log::Format::kText);

  CLI::App app("Sluice: asynchronous RL post-training for language models.", "sluice");
  app.set_version_flag("--version", absl::StrCat("sluice ", sluice::kVersion));
  app.require_subcommand(1);

  // How the client commands dial: flags of every command (CLI11 lets a
  // subcommand take its parent's options), else $SLUICE_TOKEN_FILE and
  // $SLUICE_TLS_CA, else what a `sluice up --tls` stack wrote in
  // endpoints.json.
  sluice::runtime::ClientSecurity client_security;
  app.fallthrough();
  const char* security_group = "Security";
  app.add_option("--tls-ca", client_security.ca_file,
                 "CA bundle (PEM) that verifies the server: dial with TLS")
      ->type_name("FILE")
      ->group(security_group);
  app.add_option("--tls-cert", client_security.cert_file,
                 "client certificate (PEM) for mutual TLS; its common name is <role>:<identity>")
      ->type_name("FILE")
      ->group(security_group);
  app.add_option("--tls-key", client_security.key_file, "private key (PEM) of --tls-cert")
      ->type_name("FILE")
      ->group(security_group);
  app.add_option("--token-file", client_security.token_file,
                 "file holding the bearer token to send (authorization: Bearer ...)")
      ->type_name("FILE")
      ->group(security_group);
  app.add_option("--tls-server-name", client_security.server_name,
                 "name to verify in the server's certificate when it is not the host dialed")
      ->type_name("NAME")
      ->group(security_group);

  sluice::cli::TokenCreateFlags token_flags;
  CLI::App* token = sluice::cli::AddTokenCommand(app, &token_flags);

  LocalStackOptions stack_options;
  stack_options.bin_dir = SelfDirectory();
  stack_options.state_dir = ".sluice";

  CLI::App* up = app.add_subcommand(
      "up", "Start the services on loopback and supervise them until Ctrl-C/SIGTERM: a service "
            "that dies is restarted with backoff, a crash loop is given up on");
  up->add_option("--state-dir", stack_options.state_dir,
                 "where endpoints.json, logs/ and the replay buffer's data are written; one "
                 "`sluice up` at a time per directory")
      ->capture_default_str();
  StackFlags stack_flags;
  AddStackFlags(up, &stack_options, &stack_flags);
  int up_ready_fd = -1;
  up->add_option("--ready-fd", up_ready_fd,
                 "write the path of endpoints.json to this inherited fd once all are healthy")
      ->group("");

  std::string up_runs_dir = "sluice-runs";
  up->add_option("--runs-dir", up_runs_dir,
                 "where the controller writes each run's files (<runs-dir>/<run-id>/)")
      ->capture_default_str();

  std::string runs_dir = "sluice-runs";
  QuickstartFlags quickstart_flags;
  CLI::App* quickstart = app.add_subcommand(
      "quickstart",
      "Run the embedded default: start the local stack, submit the built-in run (a tiny "
      "model learning 2-digit addition: warm start, then asynchronous RL), watch it, stop the "
      "stack");
  quickstart->add_option("--runs-dir", runs_dir,
                         "where each run's files go (<runs-dir>/<run-id>/); the stack's state "
                         "and logs go to <runs-dir>/stack/")
      ->capture_default_str();
  quickstart->add_option("--spec", quickstart_flags.spec_path,
                         "run this spec (YAML) instead of the built-in one");
  quickstart->add_option("--seed", quickstart_flags.seed, "override the spec's seed");
  quickstart->add_option("--max-staleness", quickstart_flags.max_staleness,
                         "override the spec's eta (0 = synchronous)")
      ->check(CLI::NonNegativeNumber);
  AddStackFlags(quickstart, &stack_options, &stack_flags);

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

  SubmitFlags submit_flags;
  CLI::App* submit = app.add_subcommand(
      "submit", "Submit a run spec (YAML) to the controller; print the run id");
  submit->add_option("spec", submit_flags.spec_path, "run spec YAML file")
      ->required()
      ->type_name("SPEC.yaml");
  submit->add_option("--target", submit_flags.target,
                     "controller HOST:PORT (default: the stack of --state-dir, else the local "
                     "stack's in .sluice/, else 127.0.0.1:50051)");
  submit->add_option("--state-dir", submit_flags.state_dir, kStateDirHelp)->type_name("DIR");
  submit->add_flag("--watch", submit_flags.watch,
                   "follow the run until it ends; exit 0 only if it SUCCEEDED. Rides out a "
                   "controller restart: reconnects until the controller has not answered for "
                   "a minute");
  submit->add_flag("--validate-only", submit_flags.validate_only,
                   "check the spec offline (as SubmitRun would, and estimate its memory) and "
                   "print it with defaults resolved; start nothing. With --target, the "
                   "controller checks it too (verifiers, memory budgets)");
  submit->add_option("--interval-ms", submit_flags.interval_ms,
                     "with --watch: how often progress is redrawn")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);

  CLI::App* runs = app.add_subcommand("runs", "Inspect and manage runs");
  runs->require_subcommand(1);
  std::string runs_target;
  std::string runs_state_dir;
  std::string run_id;
  std::string cancel_reason;
  std::string runs_command;
  for (const auto& [name, help] : std::vector<std::pair<std::string, std::string>>{
           {"get", "Print a run as JSON"},
           {"cancel", "Cancel a run (workers abort, the trainer stops)"},
           {"watch",
            "Follow a run until it ends; exit 0 only if it SUCCEEDED. Rides out a controller "
            "restart (it re-adopts the run): reconnects until the controller has not answered "
            "for a minute"}}) {
    CLI::App* command = runs->add_subcommand(name, help);
    command->add_option("run_id", run_id, "the run")->required()->type_name("RUN_ID");
    command->add_option("--target", runs_target, "controller HOST:PORT");
    command->add_option("--state-dir", runs_state_dir, kStateDirHelp)->type_name("DIR");
    if (name == "cancel") command->add_option("--reason", cancel_reason, "why (stored in the run)");
    command->callback([&runs_command, name = name] { runs_command = name; });
  }
  CLI::App* list = runs->add_subcommand("list", "List runs, newest first");
  list->add_option("--target", runs_target, "controller HOST:PORT");
  list->add_option("--state-dir", runs_state_dir, kStateDirHelp)->type_name("DIR");
  list->callback([&runs_command] { runs_command = "list"; });

  sluice::cli::BufferStatsFlags buffer_stats_flags;
  CLI::App* buffer = sluice::cli::AddBufferCommand(app, &buffer_stats_flags);

  sluice::cli::ScoreFlags score_flags;
  CLI::App* score = sluice::cli::AddScoreCommand(app, &score_flags);

  sluice::cli::TokenizeFlags tokenize_flags;
  const sluice::cli::TokenizeCommands tokenize = sluice::cli::AddTokenizeCommands(app, &tokenize_flags);
  // Listed for --help; ExecModelCommand runs them before parsing.
  app.add_subcommand("logits", "Print a Hugging Face model's logits at every position (JSON); "
                               "see `sluice logits --help`")
      ->allow_extras();
  app.add_subcommand("generate", "Continue token ids or a prompt with a Hugging Face model "
                                 "(JSON); see `sluice generate --help`")
      ->allow_extras();
  app.add_subcommand("report", "Plot a run's metrics and evaluations (PNG/SVG and an HTML page) "
                               "from its run directory; see `sluice report --help`")
      ->allow_extras();
  app.add_subcommand("init-model", "Write a builtin model as a Hugging Face directory (a run's "
                                   "hf_model_dir); see `sluice init-model --help`")
      ->allow_extras();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  if (*token) return sluice::cli::RunTokenCreate(token_flags, std::cout, std::cerr);
  if (!*up && !*quickstart) {
    client_security = sluice::cli::ResolveClientSecurity(
        client_security, *submit ? submit_flags.state_dir : runs_state_dir);
    if (absl::Status valid = client_security.Validate(); !valid.ok()) {
      std::cerr << "sluice: " << valid.message() << "\n";
      return 2;
    }
    sluice::runtime::SetProcessClientSecurity(client_security);
  }
  if (*up) {
    if (!ApplyStackFlags(stack_flags, "up", &stack_options)) return 2;
    stack_options.runs_dir = up_runs_dir;
    return RunUp(stack_options, up_ready_fd);
  }
  if (*quickstart) {
    if (!ApplyStackFlags(stack_flags, "quickstart", &stack_options)) return 2;
    stack_options.state_dir = (fs::path(runs_dir) / "stack").string();
    stack_options.runs_dir = runs_dir;
    return RunQuickstart(stack_options, quickstart_flags);
  }
  if (*health) return RunHealth(target, service, timeout_ms);
  if (*submit) {
    UnblockTerminationSignals();
    return RunSubmit(submit_flags);
  }
  if (*runs) {
    UnblockTerminationSignals();
    return RunRunsCommand(runs_command, run_id, runs_target, runs_state_dir, cancel_reason);
  }
  if (*buffer) {
    UnblockTerminationSignals();
    return sluice::cli::RunBufferStats(buffer_stats_flags, std::cout, std::cerr);
  }
  if (*score) {
    UnblockTerminationSignals();
    return sluice::cli::RunScore(score_flags, std::cerr);
  }
  if (*tokenize.tokenize) {
    return sluice::cli::RunTokenize(tokenize_flags, std::cin, std::cout, std::cerr);
  }
  if (*tokenize.detokenize) {
    return sluice::cli::RunDetokenize(tokenize_flags, std::cin, std::cout, std::cerr);
  }
  return 2;
}
