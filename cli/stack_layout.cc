#include "cli/stack_layout.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/state_dir.h"

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;

bool UsesTorch(const std::string& kind) { return kind == "trainer" || kind == "rollout_worker"; }

std::string Absolute(const fs::path& path) {
  std::error_code error;
  const fs::path absolute = fs::absolute(path, error);
  return (error ? path : absolute).lexically_normal().string();
}

}  // namespace

std::string StackLayout::endpoints_path() const {
  return (fs::path(options_.state_dir) / "endpoints.json").string();
}

std::string StackLayout::tls_dir() const { return Absolute(fs::path(options_.state_dir) / "tls"); }

std::string StackLayout::log_path(const std::string& service_name) const {
  return Absolute(fs::path(options_.state_dir) / "logs" / (service_name + ".log"));
}

std::string StackLayout::runs_dir() const {
  return Absolute(options_.runs_dir.empty() ? fs::path(options_.state_dir) / ".." / "runs"
                                            : fs::path(options_.runs_dir));
}

std::vector<std::string> StackLayout::allowed_path_roots() const {
  std::vector<std::string> roots;
  for (const std::string& root : options_.allowed_path_roots) roots.push_back(Absolute(root));
  if (roots.empty()) roots.push_back(Absolute(fs::current_path()));
  for (const std::string& own : {Absolute(options_.state_dir), runs_dir()}) {
    const bool covered = std::any_of(roots.begin(), roots.end(), [&](const std::string& root) {
      return own == root || absl::StartsWith(own, root == "/" ? root : root + "/");
    });
    if (!covered) roots.push_back(own);
  }
  return roots;
}

std::string StackLayout::buffer_data_dir() const {
  if (!options_.buffer_data_dir.has_value()) {
    return Absolute(fs::path(options_.state_dir) / "replay_buffer");
  }
  if (options_.buffer_data_dir->empty() || *options_.buffer_data_dir == "none") return "";
  return Absolute(*options_.buffer_data_dir);
}

std::vector<std::string> StackLayout::Argv(const ServiceEndpoint& service, const std::string& port,
                                           int ready_fd, const std::vector<ServiceEndpoint>& stack,
                                           const std::optional<StackSecurity>& security) const {
  std::vector<std::string> argv = {(fs::path(options_.bin_dir) / BinaryFor(service.kind)).string(),
                                   absl::StrCat("--listen-address=127.0.0.1:", port),
                                   "--metrics-port=0", absl::StrCat("--ready-fd=", ready_fd),
                                   absl::StrCat("--log-format=", options_.log_format)};
  for (std::string& flag : FlagsFor(service, stack)) argv.push_back(std::move(flag));
  if (security.has_value()) {
    const fs::path stem = fs::path(security->dir) / service.name;
    argv.push_back(absl::StrCat("--tls-cert=", stem.string(), ".pem"));
    argv.push_back(absl::StrCat("--tls-key=", stem.string(), ".key"));
    argv.push_back(absl::StrCat("--tls-ca=", security->ca_cert));
    argv.push_back(absl::StrCat("--auth-tokens=", security->tokens_file));
  }
  return argv;
}

std::vector<std::string> StackLayout::ControllerFlags(
    const std::vector<ServiceEndpoint>& stack) const {
  std::vector<std::string> flags = {absl::StrCat("--runs-dir=", runs_dir())};
  // The workers this stack starts are its own: their groups are verified
  // at a sampled fraction, any other worker's in full
  // (common/run/run_verification.h).
  std::vector<std::string> own_workers;
  for (const ServiceEndpoint& endpoint : stack) {
    if (!endpoint.worker_id.empty()) own_workers.push_back(endpoint.worker_id);
  }
  if (!own_workers.empty()) {
    flags.push_back(absl::StrCat("--trusted-worker-ids=", absl::StrJoin(own_workers, ",")));
  }
  for (const ServiceEndpoint& endpoint : stack) {
    if (endpoint.kind == "trainer") {
      flags.push_back(absl::StrCat("--trainer-address=", endpoint.grpc));
    } else if (endpoint.kind == "replay_buffer") {
      flags.push_back(absl::StrCat("--replay-buffer-address=", endpoint.grpc));
    } else if (endpoint.kind == "reward_server") {
      flags.push_back(absl::StrCat("--reward-server-address=", endpoint.grpc));
    }
  }
  return flags;
}

std::string StackLayout::MemoryBudgetFlag(const std::string& kind) const {
  const MemoryShares& shares = options_.memory_shares;
  double share = 0;
  if (kind == "trainer") {
    share = shares.trainer;
  } else if (kind == "replay_buffer") {
    share = shares.replay_buffer;
  } else if (kind == "rollout_worker" && options_.rollout_workers > 0) {
    share = shares.rollout_workers / options_.rollout_workers;
  }
  if (share <= 0) return "";
  return absl::StrFormat("--memory-budget=%g%%", share);
}

std::vector<std::string> StackLayout::FlagsFor(const ServiceEndpoint& service,
                                               const std::vector<ServiceEndpoint>& stack) const {
  const std::string& kind = service.kind;
  std::vector<std::string> flags;
  if (UsesTorch(kind)) flags.push_back(absl::StrCat("--torch-threads=", options_.torch_threads));
  if (std::string flag = MemoryBudgetFlag(kind); !flag.empty()) flags.push_back(flag);
  if (kind == "controller" || kind == "trainer" || kind == "rollout_worker") {
    for (const std::string& root : allowed_path_roots()) {
      flags.push_back(absl::StrCat("--allowed-path-roots=", root));
    }
  }
  if (kind == "controller") {
    for (std::string& flag : ControllerFlags(stack)) flags.push_back(std::move(flag));
  } else if (kind == "replay_buffer") {
    if (const std::string dir = buffer_data_dir(); !dir.empty()) {
      flags.push_back(absl::StrCat("--data-dir=", dir));
    }
  } else if (kind == "rollout_worker") {
    for (const ServiceEndpoint& other : stack) {
      if (other.kind == "controller") {
        flags.push_back(absl::StrCat("--controller-address=", other.grpc));
      }
    }
    flags.push_back(absl::StrCat("--worker-id=", service.worker_id));
  }
  return flags;
}

}  // namespace sluice::cli
