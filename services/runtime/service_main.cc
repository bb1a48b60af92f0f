#include "services/runtime/service_main.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/blas_info.h"
#include "common/build_info.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "nlohmann/json.hpp"
#include "services/runtime/auth.h"
#include "services/runtime/bounded_methods.h"
#include "services/runtime/config_file.h"
#include "services/runtime/metrics.h"
#include "services/runtime/request_limits.h"
#include "services/runtime/rpc_metrics_interceptor.h"
#include "services/runtime/transport_security.h"

namespace sluice::runtime {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

// Whether `host` (of a listen address) means every interface.
bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*";
}

// Host clients should dial: a wildcard listen address is reachable on loopback.
std::string DialHost(const std::string& host) {
  if (host == "0.0.0.0") return "127.0.0.1";
  if (host == "[::]") return "[::1]";
  return host;
}

void AddRequestLimitFlags(CLI::App& app, RequestLimits& limits) {
  const char* group = "Request limits (what one client may ask; see request_limits.h)";
  app.add_option("--max-streams-per-peer", limits.max_streams_per_peer,
                 "streams (watches, samples, inserts, weight downloads) one client connection "
                 "may hold open at once; more are refused RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->group(group);
  app.add_option("--max-streams", limits.max_streams,
                 "streams open at once on this service from users and anonymous callers "
                 "together; authenticated services (worker, trainer, controller) have a pool of "
                 "this size of their own")
      ->capture_default_str()
      ->group(group);
  app.add_option("--max-id-bytes", limits.max_id_bytes,
                 "longest identifier (run_id, worker_id, group_id, ...) a request may carry")
      ->capture_default_str()
      ->group(group);
  app.add_option("--max-items-per-request", limits.max_items_per_request,
                 "most items (prompts per lease, slots per acquire, groups per sample or insert "
                 "message, trajectories per group) one request may ask for")
      ->capture_default_str()
      ->group(group);
  app.add_option("--max-wait-ms", limits.max_wait_ms,
                 "longest a long-poll (sample, slot acquire) waits before answering timed out, "
                 "whatever the request asks and with or without a client deadline")
      ->capture_default_str()
      ->group(group);
}

}  // namespace

void ServiceHealth::SetServing(const std::string& full_name, bool serving) {
  absl::MutexLock lock(&mu_);
  if (detached_) return;
  serving_[full_name] = serving;
  if (health_ != nullptr) health_->SetServingStatus(full_name, serving);
}

bool ServiceHealth::serving(const std::string& full_name) const {
  absl::MutexLock lock(&mu_);
  auto it = serving_.find(full_name);
  return it == serving_.end() || it->second;
}

void ServiceHealth::Attach(grpc::HealthCheckServiceInterface* health,
                           const std::vector<std::string>& names) {
  absl::MutexLock lock(&mu_);
  health_ = health;
  for (const std::string& name : names) {
    auto it = serving_.find(name);
    health_->SetServingStatus(name, it == serving_.end() || it->second);
  }
}

void ServiceHealth::Detach() {
  absl::MutexLock lock(&mu_);
  detached_ = true;
  health_ = nullptr;
}

void AddSecurityFlags(CLI::App& app, ServerOptions& options) {
  const char* group = "Security (TLS and tokens; see docs/security.md)";
  app.add_option("--tls-cert", options.tls.cert_file,
                 "certificate (PEM) served to clients and presented as this service's client "
                 "certificate; its common name <role>:<identity> is who this service is")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-key", options.tls.key_file, "private key (PEM) of --tls-cert")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--tls-ca", options.tls.ca_file,
                 "CA bundle (PEM) that verifies the services this one calls and the client "
                 "certificates of its callers")
      ->type_name("FILE")
      ->group(group);
  app.add_flag("--tls-require-client-cert", options.tls.require_client_cert,
               "refuse connections without a client certificate signed by --tls-ca (mutual "
               "TLS); callers are then identified by their certificates")
      ->group(group);
  app.add_option("--tls-server-name", options.client.server_name,
                 "name to verify in the certificates of the services this one calls, when it "
                 "is not the host dialed")
      ->type_name("NAME")
      ->group(group);
  app.add_option("--auth-tokens", options.auth_tokens_file,
                 "YAML file of accepted bearer tokens (SHA-256, role, identity; `sluice token "
                 "create` writes entries); every call then needs a token or a client "
                 "certificate. Re-read when it changes")
      ->type_name("FILE")
      ->group(group);
  app.add_option("--token-file", options.client.token_file,
                 "bearer token this service sends when it calls the others (default: "
                 "$SLUICE_TOKEN_FILE)")
      ->type_name("FILE")
      ->group(group);
}

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  // A peer that goes away mid-write must be an error, not a dead process.
  signal(SIGPIPE, SIG_IGN);
}

void LogStartupReport(const std::string& binary) {
  const BlasInfo blas = DetectBlas();
  const char* openblas_env = std::getenv("OPENBLAS_NUM_THREADS");
  log::Info("starting", {{"binary", binary},
                         {"version", kVersion},
                         {"build", kBuildType},
                         {"pid", static_cast<int64_t>(getpid())},
                         {"cpus", std::thread::hardware_concurrency()},
                         {"blas", blas.vendor},
                         {"blas_library", blas.library_path.empty() ? "-" : blas.library_path},
                         {"blas_threads", blas.threads},
                         {"OPENBLAS_NUM_THREADS", openblas_env ? openblas_env : "unset"}});
  if (blas.vendor == "reference") {
    log::Warning(
        "LibTorch is using the reference BLAS (~50x slower than OpenBLAS); install "
        "libopenblas0-pthread (scripts/install-deps.sh does)",
        {{"blas_library", blas.library_path}});
  }
}

ServiceMain::ServiceMain(ServiceInfo info)
    : info_(std::move(info)), app_(std::make_unique<CLI::App>(info_.description, info_.binary)) {
  options_.listen_address = absl::StrCat("0.0.0.0:", info_.default_port);
  options_.metrics_port = info_.default_metrics_port;

  CLI::App& app = *app_;
  // A flag given twice (once from the config file, once on the command line)
  // takes its last value: the command line wins.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version", absl::StrCat(info_.binary, " ", kVersion));
  app.add_option("--config", "YAML file whose keys are these flags' long names with "
                             "underscores (listen_address: ...); flags override it")
      ->type_name("FILE");
  app.add_option("--listen,--listen-address", options_.listen_address,
                 "gRPC listen address host:port; port 0 picks a free one")
      ->capture_default_str()
      ->type_name("HOST:PORT");
  app.add_option("--metrics-port", options_.metrics_port,
                 "Prometheus /metrics HTTP port on the listen host; 0 picks a free one, "
                 "-1 disables")
      ->capture_default_str();
  app.add_option("--max-message-size-bytes", options_.max_message_size_bytes,
                 "largest gRPC message received or sent")
      ->capture_default_str();
  app.add_option("--shutdown-deadline-ms", options_.shutdown_deadline_ms,
                 "on SIGTERM/SIGINT, how long in-flight calls may take to finish")
      ->capture_default_str();
  app.add_option("--log-level", options_.log_level, "debug, info, warning or error")
      ->capture_default_str();
  app.add_option("--log-format", options_.log_format, "text or json")->capture_default_str();
  app.add_option("--metrics-listen-address", options_.metrics_listen_address,
                 "bind /metrics to this host:port instead (e.g. a private address while gRPC "
                 "listens publicly); overrides --metrics-port")
      ->type_name("HOST:PORT");
  AddSecurityFlags(app, options_);
  AddRequestLimitFlags(app, options_.limits);
  app.add_option("--ready-fd", options_.ready_fd,
                 "write one JSON line with the bound addresses to this inherited file "
                 "descriptor once serving (used by `sluice up`)")
      ->group("");
}

ServiceMain::~ServiceMain() = default;

int ServiceMain::Run(int argc, char** argv, const Setup& setup) {
  BlockTerminationSignals();

  // Config file keys become flags placed before the command line's own.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);
  if (const std::string config = FindConfigFlag(argc, argv); !config.empty()) {
    absl::StatusOr<std::vector<std::string>> from_file = ConfigFileToArgs(config, *app_);
    if (!from_file.ok()) {
      std::cerr << info_.binary << ": " << from_file.status().message() << "\n";
      return 2;
    }
    for (auto it = from_file->rbegin(); it != from_file->rend(); ++it) args.push_back(*it);
  }
  try {
    app_->parse(args);  // CLI11 takes the arguments reversed.
  } catch (const CLI::ParseError& e) {
    const int code = app_->exit(e);
    return code == 0 ? 0 : 2;
  }

  // The service dials others with its own certificate as client certificate.
  options_.client.ca_file = options_.tls.ca_file;
  options_.client.cert_file = options_.tls.cert_file;
  options_.client.key_file = options_.tls.key_file;
  if (options_.client.token_file.empty()) {
    if (const char* env = std::getenv("SLUICE_TOKEN_FILE"); env != nullptr) {
      options_.client.token_file = env;
    }
  }
  if (absl::Status valid = options_.Validate(); !valid.ok()) {
    std::cerr << info_.binary << ": invalid configuration:\n"
              << "  " << absl::StrReplaceAll(valid.message(), {{"\n", "\n  "}}) << "\n";
    return 2;
  }
  log::Init(info_.component, *log::ParseLevel(options_.log_level),
            *log::ParseFormat(options_.log_format));
  LogStartupReport(info_.binary);

  SetProcessClientSecurity(options_.client);
  AuthPolicy auth;
  if (!options_.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenStore>> tokens =
        TokenStore::Load(options_.auth_tokens_file);
    if (!tokens.ok()) {
      std::cerr << info_.binary << ": invalid configuration:\n  " << tokens.status().message()
                << "\n";
      return 2;
    }
    auth.tokens = std::move(*tokens);
  }
  auth.certificates = options_.tls.enabled() && !options_.tls.ca_file.empty();
  auth.certificates_required = options_.tls.require_client_cert;
  SetAuthEnforcedForProcess(auth.enforced());

  Metrics metrics(info_.component);
  InstallRequestLimits(options_.limits, &metrics.registry());
  ServiceContext context(options_, metrics.registry());
  if (absl::Status status = setup(context); !status.ok()) {
    log::Error("setup failed", {{"error", std::string(status.message())}});
    std::cerr << info_.binary << ": " << status.message() << "\n";
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  for (const std::function<void()>& hook : context.collect_hooks()) metrics.OnCollect(hook);

  const HostPort listen = *ParseHostPort(options_.listen_address, "listen_address");
  int metrics_port = -1;
  if (options_.metrics_port != ServerOptions::kMetricsDisabled ||
      !options_.metrics_listen_address.empty()) {
    absl::StatusOr<int> port = metrics.Serve(options_.MetricsBindAddress());
    if (!port.ok()) {
      log::Error("cannot start", {{"error", std::string(port.status().message())}});
      std::cerr << info_.binary << ": " << port.status().message() << "\n";
      return 1;
    }
    metrics_port = *port;
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(options_.listen_address, MakeServerCredentials(options_.tls),
                           &grpc_port);
  // gRPC enables SO_REUSEPORT by default, which would let a second server
  // silently share a port that is already in use.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_size_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options_.max_message_size_bytes));
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(std::make_unique<RpcMetricsInterceptorFactory>(&metrics.rpc()));
  if (auth.enforced()) interceptors.push_back(std::make_unique<AuthInterceptorFactory>(auth));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  for (const auto& [service, name] : context.services()) {
    // Every method authorizes its caller before reading a byte of its
    // request, and bounds the request before parsing it.
    if (absl::Status bounded = BoundEveryMethod(*service, name, options_.max_message_size_bytes);
        !bounded.ok()) {
      log::Error("cannot start", {{"error", std::string(bounded.message())}});
      std::cerr << info_.binary << ": " << bounded.message() << "\n";
      return 1;
    }
    builder.RegisterService(service.get());
  }

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    const std::string error = absl::StrCat("cannot listen on ", options_.listen_address,
                                           ": address in use or unavailable");
    log::Error("cannot start", {{"error", error}});
    std::cerr << info_.binary << ": " << error << "\n";
    return 1;
  }
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  health->SetServingStatus("", true);
  std::vector<std::string> service_names;
  for (const auto& [service, name] : context.services()) service_names.push_back(name);
  context.health()->Attach(health, service_names);
  for (const auto& callback : context.started_callbacks()) callback(grpc_port);

  const std::string dial_host = DialHost(listen.host);
  const std::string grpc_address = absl::StrCat(dial_host, ":", grpc_port);
  const std::string metrics_host =
      options_.metrics_listen_address.empty()
          ? dial_host
          : DialHost(ParseHostPort(options_.metrics_listen_address, "")->host);
  const std::string metrics_url =
      metrics_port < 0 ? "" : absl::StrCat("http://", metrics_host, ":", metrics_port, "/metrics");
  log::Info("serving", {{"grpc", grpc_address},
                        {"metrics", metrics_url.empty() ? "disabled" : metrics_url},
                        {"max_message_size_bytes", options_.max_message_size_bytes},
                        {"tls", !options_.tls.enabled()          ? "off"
                                : options_.tls.require_client_cert ? "mutual"
                                                                   : "server"},
                        {"auth", !auth.enforced() ? "off"
                                 : auth.tokens != nullptr
                                     ? absl::StrCat("tokens (", auth.tokens->size(), ")",
                                                    auth.certificates ? " + certificates" : "")
                                     : std::string("certificates")},
                        {"dials", options_.client.Describe()}});
  if (IsWildcardHost(listen.host) && !options_.tls.enabled() && !auth.enforced()) {
    // On every interface with neither TLS nor authentication, any host that
    // reaches the port can call every RPC of this service.
    log::Warning("listening on every interface in plaintext and without authentication: any "
                 "host that can reach this port can call every RPC (submit, cancel or feed "
                 "runs, fetch weights). Bind --listen-address to 127.0.0.1 or a private "
                 "interface, restrict the port (firewall, Kubernetes NetworkPolicy), or turn on "
                 "--tls-cert/--tls-key/--tls-ca and --auth-tokens or --tls-require-client-cert",
                 {{"listen_address", options_.listen_address}});
  } else if (IsWildcardHost(listen.host) && !auth.enforced()) {
    log::Warning("listening on every interface without authentication: TLS encrypts calls, but "
                 "any host that can reach this port can call every RPC; add --auth-tokens or "
                 "--tls-require-client-cert",
                 {{"listen_address", options_.listen_address}});
  } else if (IsWildcardHost(listen.host) && !options_.tls.enabled()) {
    log::Warning("listening on every interface in plaintext: bearer tokens and every message "
                 "cross the network unencrypted; add --tls-cert/--tls-key/--tls-ca",
                 {{"listen_address", options_.listen_address}});
  }
  if (options_.ready_fd >= 0) {
    nlohmann::json ready = {{"grpc", grpc_address},
                            {"metrics", metrics_url},
                            {"pid", static_cast<int64_t>(getpid())},
                            {"component", info_.component}};
    if (absl::Status reported = ReportReady(options_.ready_fd, ready.dump()); !reported.ok()) {
      log::Warning("cannot report ready", {{"error", std::string(reported.message())}});
    }
  }

  const sigset_t signals = TerminationSignals();
  int signal_number = 0;
  while (sigwait(&signals, &signal_number) != 0) {
  }
  const absl::Time shutdown_start = absl::Now();
  log::Info("shutting down", {{"signal", strsignal(signal_number)},
                              {"deadline_ms", options_.shutdown_deadline_ms}});
  // A second signal means "now": the operator no longer wants to wait.
  std::thread([signals] {
    int again = 0;
    while (sigwait(&signals, &again) != 0) {
    }
    log::Warning("second signal during shutdown; exiting without draining",
                 {{"signal", strsignal(again)}});
    std::_Exit(1);
  }).detach();

  context.health()->Detach();
  health->SetServingStatus(false);
  for (const auto& callback : context.shutdown_callbacks()) callback();
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(options_.shutdown_deadline_ms));
  server->Wait();
  metrics.StopServing();
  log::Info("stopped", {{"drain_ms", absl::ToInt64Milliseconds(absl::Now() - shutdown_start)}});
  return 0;
}

}  // namespace sluice::runtime
