#ifndef SLUICE_TRAINER_RANKS_RANK_CONFIG_H_
#define SLUICE_TRAINER_RANKS_RANK_CONFIG_H_

// Which rank of the trainer's group this process is, and where the group
// meets: from --rank, --world-size and --rendezvous, or from the variables
// torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a flag wins
// over its variable. World size 1, the default, is one trainer alone.
// No LibTorch here: the binary resolves and checks its flags before it
// loads a model.

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::trainer::ranks {

// What the command line said; unset: not given.
struct RankFlags {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::string rendezvous;  // "HOST:PORT"; empty: not given.
  // How long joining the group, and any collective after, may take before
  // the rank gives up (a rank that died or stopped is found by it).
  absl::Duration timeout = absl::Seconds(60);
};

struct RankConfig {
  int rank = 0;
  int world_size = 1;
  // Where rank 0 serves the group's store; empty for world size 1.
  std::string host;
  int port = 0;
  absl::Duration timeout = absl::Seconds(60);

  bool alone() const { return world_size == 1; }
  // "HOST:PORT", or "" alone.
  std::string rendezvous() const;
};

// An environment variable's value; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// The process's environment.
std::optional<std::string> ProcessEnv(const std::string& name);

// Flags, then the environment; INVALID_ARGUMENT naming the flag or variable
// and what to change: a rank outside [0, world size), a world size below 1
// or above 1024, a world size above 1 without a rendezvous, a rendezvous
// that is not HOST:PORT with a port in [1, 65535], a value that is not an
// integer, a timeout that is not positive.
absl::StatusOr<RankConfig> ResolveRankConfig(const RankFlags& flags, const EnvLookup& env);

}  // namespace sluice::trainer::ranks

#endif  // SLUICE_TRAINER_RANKS_RANK_CONFIG_H_
