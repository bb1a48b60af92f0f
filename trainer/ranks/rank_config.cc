#include "trainer/ranks/rank_config.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sluice::trainer::ranks {
namespace {

constexpr int kMaxWorldSize = 1024;

// The flag's value, else the variable's parsed as an integer; `source` says
// which it was, for errors.
absl::StatusOr<std::optional<int>> IntFrom(const std::optional<int>& flag, const char* flag_name,
                                           const EnvLookup& env, const char* variable,
                                           std::string* source) {
  if (flag.has_value()) {
    *source = flag_name;
    return flag;
  }
  const std::optional<std::string> value = env(variable);
  if (!value.has_value() || value->empty()) return std::optional<int>();
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        variable, "=", *value, " is not an integer (set it to a number or pass ", flag_name, ")"));
  }
  *source = variable;
  return std::optional<int>(parsed);
}

}  // namespace

std::string RankConfig::rendezvous() const { return alone() ? "" : absl::StrCat(host, ":", port); }

std::optional<std::string> ProcessEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

absl::StatusOr<RankConfig> ResolveRankConfig(const RankFlags& flags, const EnvLookup& env) {
  RankConfig config;
  if (flags.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank-timeout must be positive, got ", absl::FormatDuration(flags.timeout)));
  }
  config.timeout = flags.timeout;
  std::string world_source = "--world-size";
  absl::StatusOr<std::optional<int>> world =
      IntFrom(flags.world_size, "--world-size", env, "WORLD_SIZE", &world_source);
  if (!world.ok()) return world.status();
  std::string rank_source = "--rank";
  absl::StatusOr<std::optional<int>> rank =
      IntFrom(flags.rank, "--rank", env, "RANK", &rank_source);
  if (!rank.ok()) return rank.status();
  config.world_size = world->value_or(1);
  config.rank = rank->value_or(0);
  if (config.world_size < 1 || config.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(world_source, " ", config.world_size, " is outside [1, ", kMaxWorldSize, "]"));
  }
  if (config.rank < 0 || config.rank >= config.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(rank_source, " ", config.rank, " is outside [0, ", config.world_size,
                     "): ranks are numbered from 0 to the world size (", world_source, ") - 1"));
  }
  if (config.alone()) return config;

  std::string host;
  std::string port_text;
  std::string port_source;
  if (!flags.rendezvous.empty()) {
    const size_t colon = flags.rendezvous.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rendezvous ", flags.rendezvous, " is not HOST:PORT (rank 0's address and a port)"));
    }
    host = flags.rendezvous.substr(0, colon);
    port_text = flags.rendezvous.substr(colon + 1);
    port_source = "--rendezvous";
  } else {
    host = env("MASTER_ADDR").value_or("");
    port_text = env("MASTER_PORT").value_or("");
    port_source = "MASTER_PORT";
    if (host.empty() || port_text.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          world_source, " ", config.world_size,
          " needs a rendezvous: --rendezvous HOST:PORT (rank 0 serves it) or MASTER_ADDR and "
          "MASTER_PORT"));
    }
  }
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(port_source, ": the port \"", port_text, "\" is not in [1, 65535]"));
  }
  config.host = host;
  config.port = port;
  return config;
}

}  // namespace sluice::trainer::ranks
