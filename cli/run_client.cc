#include "cli/run_client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "controller/proto_json.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/transport_security.h"
#include "sluice/v1/controller.grpc.pb.h"

namespace sluice::cli {
namespace {

// Pauses between attempts to resume a broken watch: quick at first (a
// controller restarted by its supervisor is back within seconds), then no
// more than this.
constexpr absl::Duration kFirstResumeDelay = absl::Milliseconds(250);
constexpr absl::Duration kMaxResumeDelay = absl::Seconds(2);

bool IsTerminal(v1::RunState state) {
  return state == v1::RUN_STATE_SUCCEEDED || state == v1::RUN_STATE_FAILED ||
         state == v1::RUN_STATE_CANCELLED;
}

// "RUN_STATE_WARM_START" -> "warm start"
std::string StateWord(v1::RunState state) {
  std::string name = v1::RunState_Name(state);
  if (name.rfind("RUN_STATE_", 0) == 0) name = name.substr(10);
  for (char& c : name) c = c == '_' ? ' ' : static_cast<char>(std::tolower(c));
  return name;
}

// "SUCCEEDED"
std::string StateName(v1::RunState state) {
  std::string name = v1::RunState_Name(state);
  return name.rfind("RUN_STATE_", 0) == 0 ? name.substr(10) : name;
}

std::string Count(double value) {
  if (value >= 1e6) return absl::StrFormat("%.1fM", value / 1e6);
  if (value >= 1e3) return absl::StrFormat("%.1fk", value / 1e3);
  return absl::StrFormat("%.0f", value);
}

std::string Clock(double seconds) {
  const int64_t total = static_cast<int64_t>(seconds);
  if (total >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", total / 3600, (total / 60) % 60, total % 60);
  }
  return absl::StrFormat("%02d:%02d", total / 60, total % 60);
}

absl::Time SinceOf(const v1::RunCondition& condition) {
  return absl::FromUnixSeconds(condition.since().seconds()) +
         absl::Nanoseconds(condition.since().nanos());
}

std::string Duration(double seconds) {
  if (seconds < 1) return absl::StrFormat("%.2fs", seconds);
  return absl::FormatDuration(absl::Trunc(absl::Seconds(seconds), absl::Seconds(1)));
}

std::unique_ptr<v1::ControllerService::Stub> Connect(const std::string& target) {
  // gRPC backs off up to 2 minutes between reconnects by default; a watch
  // riding out a controller restart wants to see it back within a second.
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return v1::ControllerService::NewStub(
      runtime::CreateChannel(target, arguments));
}

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

// The controller's status, with a hint when it cannot be reached at all.
absl::Status CallError(const std::string& target, const grpc::Status& status) {
  absl::Status error = runtime::FromGrpcStatus(status);
  // Nothing listens there: no hint about TLS (ExplainCallError's for a
  // plaintext client) would help, finding the controller would.
  const bool nothing_listens = absl::StrContains(error.message(), "Connection refused") ||
                               absl::StrContains(error.message(), "No such file or directory");
  const std::string explained =
      nothing_listens
          ? std::string(error.message())
          : runtime::ExplainCallError(status.error_code(), std::string(error.message()));
  if (error.code() == absl::StatusCode::kUnavailable ||
      error.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(
        error.code(),
        absl::StrCat("cannot reach the controller at ", target, ": ", explained,
                     explained == error.message()
                         ? " (is `sluice up` running? pass --target HOST:PORT or --state-dir DIR)"
                         : ""));
  }
  return absl::Status(error.code(), explained);
}

std::string NewRequestId() {
  std::random_device device;
  return absl::StrFormat("cli-%d-%d-%08x", getpid(), absl::ToUnixMillis(absl::Now()),
                         static_cast<uint32_t>(device()));
}

class ProgressPrinter {
 public:
  explicit ProgressPrinter(const SubmitOptions& options) : options_(options) {}
  ~ProgressPrinter() { End(); }

  void Show(const v1::Run& run) {
    if (options_.progress == nullptr) return;
    const std::string line = FormatProgressLine(run);
    if (options_.progress_redraw) {
      *options_.progress << "\r" << line << "\x1b[K" << std::flush;
      open_line_ = true;
    } else if (line != last_line_) {
      *options_.progress << line << "\n" << std::flush;
    }
    last_line_ = line;
  }

  // Leaves the redrawn line in place and moves below it.
  void End() {
    if (open_line_) *options_.progress << "\n" << std::flush;
    open_line_ = false;
  }

 private:
  const SubmitOptions& options_;
  std::string last_line_;
  bool open_line_ = false;
};

absl::StatusOr<v1::Run> Follow(const std::string& target, v1::ControllerService::Stub& stub,
                               v1::Run last, const SubmitOptions& options) {
  ProgressPrinter printer(options);
  printer.Show(last);
  // Since when the controller has not answered (the stream broke and no
  // update or GetRun got through since); InfiniteFuture while it answers.
  absl::Time unanswered_since = absl::InfiniteFuture();
  absl::Duration delay = kFirstResumeDelay;
  while (!IsTerminal(last.state())) {
    grpc::ClientContext context;  // No deadline: a run takes as long as it takes.
    v1::WatchRunRequest request;
    request.set_run_id(last.run_id());
    request.set_min_interval_ms(options.watch_interval_ms);
    std::unique_ptr<grpc::ClientReader<v1::RunUpdate>> reader = stub.WatchRun(&context, request);
    v1::RunUpdate update;
    while (reader->Read(&update)) {
      last = std::move(*update.mutable_run());
      unanswered_since = absl::InfiniteFuture();
      delay = kFirstResumeDelay;
      printer.Show(last);
    }
    const grpc::Status status = reader->Finish();
    if (IsTerminal(last.state())) break;
    if (options.stop_watching != nullptr && options.stop_watching->load()) {
      printer.End();
      return absl::CancelledError(absl::StrCat("stopped watching run ", last.run_id(),
                                               " (in state ", v1::RunState_Name(last.state()),
                                               "): the controller is being stopped"));
    }
    if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
        status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
      printer.End();
      return CallError(target, status);
    }
    // The stream broke: the controller restarting (it re-adopts the run from
    // its runs directory), or the network. Resume while it comes back within
    // options.resume_for.
    const absl::Time now = absl::Now();
    if (unanswered_since == absl::InfiniteFuture()) unanswered_since = now;
    if (now - unanswered_since >= options.resume_for) {
      printer.End();
      absl::Status error = CallError(target, status);
      return absl::Status(
          error.code(), absl::StrCat("lost track of run ", last.run_id(), ": no answer for ",
                                     absl::FormatDuration(absl::Trunc(now - unanswered_since,
                                                                      absl::Seconds(1))),
                                     ": ", error.message()));
    }
    absl::SleepFor(delay);
    delay = std::min(2 * delay, kMaxResumeDelay);
    absl::StatusOr<v1::Run> current = GetRun(target, last.run_id(), options.call_timeout);
    if (current.ok()) {
      last = std::move(*current);
      unanswered_since = absl::InfiniteFuture();
      printer.Show(last);
    } else if (current.status().code() == absl::StatusCode::kNotFound) {
      printer.End();
      return current.status();
    }
  }
  printer.End();
  if (options.out != nullptr) *options.out << FormatOutcome(last) << std::flush;
  return last;
}

}  // namespace

namespace {

// The state directory a client verb reads endpoints.json from: --state-dir,
// else $SLUICE_STATE_DIR; empty = neither.
std::string StateDirFrom(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* env = std::getenv("SLUICE_STATE_DIR");
  return env == nullptr ? std::string() : std::string(env);
}

// endpoints.json as `sluice up` writes it; discarded when it cannot be read.
nlohmann::json ReadEndpoints(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json(nlohmann::json::value_t::discarded);
  nlohmann::json endpoints = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!endpoints.is_object()) return nlohmann::json(nlohmann::json::value_t::discarded);
  return endpoints;
}

std::string ControllerAddressIn(const nlohmann::json& endpoints) {
  if (endpoints.is_discarded()) return "";
  const auto services = endpoints.find("services");
  if (services == endpoints.end() || !services->is_object()) return "";
  const auto controller = services->find("controller");
  if (controller == services->end() || !controller->is_object()) return "";
  const auto grpc = controller->find("grpc");
  return grpc != controller->end() && grpc->is_string() ? grpc->get<std::string>() : "";
}

// The endpoints.json files a client verb looks at, in order.
std::vector<std::string> EndpointsCandidates(const std::string& state_dir_flag) {
  const std::string state_dir = StateDirFrom(state_dir_flag);
  if (!state_dir.empty()) return {(std::filesystem::path(state_dir) / "endpoints.json").string()};
  return {".sluice/stack/endpoints.json", ".sluice/endpoints.json"};
}

}  // namespace

absl::StatusOr<std::string> ResolveControllerTarget(const std::string& flag,
                                                    const std::string& state_dir_flag) {
  if (!flag.empty()) return flag;
  const std::string state_dir = StateDirFrom(state_dir_flag);
  for (const std::string& path : EndpointsCandidates(state_dir_flag)) {
    std::string address = ControllerAddressIn(ReadEndpoints(path));
    if (!address.empty()) return address;
  }
  if (!state_dir.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no controller address in ", (std::filesystem::path(state_dir) / "endpoints.json").string(),
        " (", state_dir_flag.empty() ? "$SLUICE_STATE_DIR" : "--state-dir",
        "): is `sluice up --state-dir ", state_dir,
        "` running? (it writes endpoints.json once every service is healthy)"));
  }
  return std::string(kDefaultControllerTarget);
}

runtime::ClientSecurity ResolveClientSecurity(const runtime::ClientSecurity& flags,
                                              const std::string& state_dir_flag) {
  if (flags.tls() || !flags.token_file.empty() || !flags.cert_file.empty()) return flags;
  runtime::ClientSecurity security = flags;
  const auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
  };
  security.token_file = env("SLUICE_TOKEN_FILE");
  security.ca_file = env("SLUICE_TLS_CA");
  security.cert_file = env("SLUICE_TLS_CERT");
  security.key_file = env("SLUICE_TLS_KEY");
  if (security.tls() || !security.token_file.empty()) return security;
  for (const std::string& path : EndpointsCandidates(state_dir_flag)) {
    const nlohmann::json endpoints = ReadEndpoints(path);
    if (endpoints.is_discarded()) continue;
    const auto found = endpoints.find("security");
    if (found == endpoints.end() || !found->is_object()) return security;
    security.ca_file = found->value("tls_ca", "");
    security.token_file = found->value("token_file", "");
    return security;
  }
  return security;
}

namespace {

// The warm start's latest dev evaluation, or null before the first.
const v1::EvalResult* LatestWarmStartEval(const v1::Run& run) {
  const auto& evals = run.summary().evals();
  for (auto it = evals.rbegin(); it != evals.rend(); ++it) {
    if (it->phase() == "warm_start") return &*it;
  }
  return nullptr;
}

// "ETA 01:10": what is left of `total` units at the rate `done` took
// `seconds`; empty until there is a rate to go by.
std::string Eta(int64_t done, int64_t total, double seconds, absl::string_view prefix = "") {
  if (done <= 0 || seconds <= 0 || total <= done) return "";
  return absl::StrCat("ETA ", prefix, Clock(seconds / done * (total - done)));
}

}  // namespace

std::string FormatProgressLine(const v1::Run& run) {
  const v1::RunProgress& p = run.progress();
  const v1::RunSummary& s = run.summary();
  std::vector<std::string> parts;
  parts.push_back(absl::StrFormat("%-10s", StateWord(run.state())));
  parts.push_back(Clock(p.elapsed_seconds()));
  std::string phase = p.phase();
  if (run.state() == v1::RUN_STATE_WARM_START) {
    // The warm start's own figures: SFT steps (at most sft_steps; it stops
    // at its dev-accuracy target) and that accuracy against the target.
    const v1::WarmStartConfig& w = run.spec().warm_start();
    const bool early_stop = w.target_accuracy() > 0;
    parts.push_back(
        absl::StrCat("sft step ", p.warm_start_step(), "/", early_stop ? "<=" : "", w.sft_steps()));
    if (const v1::EvalResult* dev = LatestWarmStartEval(run); dev != nullptr) {
      parts.push_back(early_stop ? absl::StrFormat("dev %.1f%% (target %.0f%%)",
                                                   100 * dev->accuracy(), 100 * w.target_accuracy())
                                 : absl::StrFormat("dev %.1f%%", 100 * dev->accuracy()));
    } else if (early_stop) {
      parts.push_back(absl::StrFormat("target dev %.0f%%", 100 * w.target_accuracy()));
    }
    // At most this much more: it may stop sooner at its target.
    if (std::string eta = Eta(p.warm_start_step(), w.sft_steps(), s.warm_start_seconds(),
                              early_stop ? "<= " : "");
        !eta.empty()) {
      parts.push_back(std::move(eta));
    }
    // "warm start 240/600" says again what the figures say.
    if (absl::StartsWith(phase, "warm start ") && !absl::StartsWith(phase, "warm start eval")) {
      phase.clear();
    }
  } else if (run.state() == v1::RUN_STATE_TRAINING || run.state() == v1::RUN_STATE_EVALUATING ||
             p.step() > 0) {
    parts.push_back(absl::StrCat("step ", p.step(), "/", p.total_steps()));
    parts.push_back(absl::StrCat("v", p.policy_version()));
    parts.push_back(absl::StrFormat("reward %.3f", p.reward_mean()));
    parts.push_back(absl::StrFormat("pass %.1f%%", 100 * p.pass_rate()));
    parts.push_back(absl::StrFormat("stale %.1f/%d", p.staleness_mean(), p.staleness_max()));
    parts.push_back(absl::StrCat("gen ", Count(p.generated_tokens_per_second()), " tok/s"));
    parts.push_back(absl::StrCat("train ", Count(p.trained_tokens_per_second()), " tok/s"));
    if (p.has_latest_eval_accuracy()) {
      parts.push_back(
          absl::StrFormat("eval %.1f%% @%d", 100 * p.latest_eval_accuracy(), p.latest_eval_step()));
    }
    if (run.state() == v1::RUN_STATE_TRAINING) {
      if (std::string eta = Eta(p.step(), p.total_steps(), s.rl_seconds()); !eta.empty()) {
        parts.push_back(std::move(eta));
      }
    }
  }
  std::string line = absl::StrJoin(parts, "  ");
  if (!phase.empty()) absl::StrAppend(&line, "  | ", phase);
  if (run.conditions_size() > 0) {
    const absl::Time now = absl::Now();
    std::vector<std::string> waits;
    for (const v1::RunCondition& c : run.conditions()) {
      waits.push_back(
          absl::StrCat(c.service().empty() ? "" : c.service() + " ", c.kind(), " ",
                       Duration(std::max(0.0, absl::ToDoubleSeconds(now - SinceOf(c))))));
    }
    absl::StrAppend(&line, "  | waiting: ", absl::StrJoin(waits, "; "));
  }
  return line;
}

std::string FormatConditions(const v1::Run& run, absl::Time now) {
  std::string text;
  for (const v1::RunCondition& c : run.conditions()) {
    const absl::Time since = SinceOf(c);
    absl::StrAppend(
        &text, "waiting (since ", absl::FormatTime("%H:%M:%S", since, absl::LocalTimeZone()), ", ",
        Duration(std::max(0.0, absl::ToDoubleSeconds(now - since))), "): ", c.message(), "\n");
  }
  return text;
}

std::string FormatRunListHeader() {
  return absl::StrFormat("%-26s  %-22s  %-20s  %-19s  %-9s  %s", "RUN ID", "STATE", "NAME",
                         "CREATED (UTC)", "WALL", "STEP");
}

std::string FormatRunListLine(const v1::Run& run) {
  std::string state = StateName(run.state());
  if (run.state() == v1::RUN_STATE_QUEUED && run.queue_position() > 0) {
    absl::StrAppend(&state, " (position ", run.queue_position(), ")");
  }
  std::string created = "-";
  if (run.has_created_at()) {
    created =
        absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(run.created_at().seconds()),
                         absl::UTCTimeZone());
  }
  // How long it ran (ended runs) or has been running.
  std::string wall = "-";
  if (run.summary().wall_seconds() > 0) {
    wall = Clock(run.summary().wall_seconds());
  } else if (run.progress().elapsed_seconds() > 0) {
    wall = Clock(run.progress().elapsed_seconds());
  }
  return absl::StrFormat("%-26s  %-22s  %-20s  %-19s  %-9s  %d/%d", run.run_id(), state,
                         run.spec().name(), created, wall, run.progress().step(),
                         run.progress().total_steps());
}

std::string FormatOutcome(const v1::Run& run) {
  const v1::RunSummary& s = run.summary();
  std::string text = absl::StrCat("run ", run.run_id(), " ", StateName(run.state()), " after ",
                                  Duration(s.wall_seconds()));
  if (!run.error_message().empty()) absl::StrAppend(&text, ": ", run.error_message());
  absl::StrAppend(&text, "\n");
  absl::StrAppend(&text, absl::StrFormat("eval accuracy (held-out, greedy): %.3f -> %.3f\n",
                                         s.eval_before(), s.eval_after()));
  // What the run is for, so that a run meant to check plumbing is not read
  // as one that failed to learn.
  if (!run.spec().description().empty()) {
    absl::StrAppend(&text, "about this run: ", run.spec().description(), "\n");
  }
  absl::StrAppend(
      &text,
      absl::StrFormat("steps %d, groups trained %d (generated %d, evicted stale %d), "
                      "max staleness %d (eta %d), tokens generated %s, final reward %.3f\n",
                      s.steps(), s.groups_trained(), s.groups_generated(), s.groups_evicted_stale(),
                      s.max_observed_staleness(), s.eta(), Count(static_cast<double>(s.tokens_generated())),
                      s.final_reward_mean()));
  return text;
}

std::string FormatCancelOutcome(const v1::CancelRunResponse& response) {
  const v1::Run& run = response.run();
  if (!response.already_ended()) {
    return absl::StrCat(run.run_id(), " ", v1::RunState_Name(run.state()),
                        run.error_message().empty() ? "" : ": " + run.error_message());
  }
  std::string when;
  if (run.has_finished_at()) {
    when = absl::StrCat(" at ", absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                                                 absl::FromUnixSeconds(run.finished_at().seconds()),
                                                 absl::UTCTimeZone()));
  }
  return absl::StrCat("run ", run.run_id(), " had already ended (", StateName(run.state()), when,
                      run.error_message().empty() ? "" : ": " + run.error_message(),
                      "); nothing was cancelled");
}

std::string RunToJson(const google::protobuf::Message& message) {
  return controller::ProtoToJson(message, /*pretty=*/true);
}

absl::StatusOr<v1::Run> SubmitAndWatch(const std::string& target, const v1::RunSpec& spec,
                                       const SubmitOptions& options) {
  std::unique_ptr<v1::ControllerService::Stub> stub = Connect(target);
  v1::SubmitRunRequest request;
  *request.mutable_spec() = spec;
  request.set_validate_only(options.validate_only);
  request.set_request_id(options.request_id.empty() ? NewRequestId() : options.request_id);
  v1::SubmitRunResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options.call_timeout);
  const grpc::Status status = stub->SubmitRun(&context, request, &response);
  if (!status.ok()) return CallError(target, status);
  v1::Run run = std::move(*response.mutable_run());
  if (options.validate_only) return run;
  if (options.out != nullptr) *options.out << run.run_id() << "\n" << std::flush;
  if (!options.watch) return run;
  return Follow(target, *stub, std::move(run), options);
}

absl::StatusOr<v1::Run> WatchRun(const std::string& target, const std::string& run_id,
                                 const SubmitOptions& options) {
  std::unique_ptr<v1::ControllerService::Stub> stub = Connect(target);
  absl::StatusOr<v1::Run> run = GetRun(target, run_id, options.call_timeout);
  if (!run.ok()) return run.status();
  return Follow(target, *stub, std::move(*run), options);
}

absl::StatusOr<v1::Run> GetRun(const std::string& target, const std::string& run_id,
                               absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  v1::GetRunRequest request;
  request.set_run_id(run_id);
  v1::GetRunResponse response;
  const grpc::Status status = Connect(target)->GetRun(&context, request, &response);
  if (!status.ok()) return CallError(target, status);
  return std::move(*response.mutable_run());
}

absl::StatusOr<v1::CancelRunResponse> CancelRun(const std::string& target,
                                                const std::string& run_id,
                                                const std::string& reason, absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  v1::CancelRunRequest request;
  request.set_run_id(run_id);
  request.set_reason(reason);
  v1::CancelRunResponse response;
  const grpc::Status status = Connect(target)->CancelRun(&context, request, &response);
  if (!status.ok()) return CallError(target, status);
  return response;
}

absl::StatusOr<v1::ListRunsResponse> ListRuns(const std::string& target,
                                              const v1::ListRunsRequest& request,
                                              absl::Duration timeout) {
  grpc::ClientContext context;
  SetDeadline(context, timeout);
  v1::ListRunsResponse response;
  const grpc::Status status = Connect(target)->ListRuns(&context, request, &response);
  if (!status.ok()) return CallError(target, status);
  return response;
}

}  // namespace sluice::cli
