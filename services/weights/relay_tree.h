#ifndef SLUICE_SERVICES_WEIGHTS_RELAY_TREE_H_
#define SLUICE_SERVICES_WEIGHTS_RELAY_TREE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sluice::weights {

struct RelayTreeOptions {
  // Workers the trainer streams a version to itself. 1 keeps the trainer's
  // egress at one version per version however many workers there are.
  int root_fanout = 1;
  // Workers each relaying worker streams a version to.
  int fanout = 2;
  // Versions whose trees are kept (older ones are forgotten).
  int keep_versions = 8;
};

// Where one worker downloads one version from.
struct RelayAssignment {
  std::string source_address;  // empty = the trainer
  int depth = 1;               // hops from the trainer
};

// Counters since construction.
struct RelayTreeStats {
  int64_t assignments = 0;
  int64_t direct = 0;             // served by the trainer
  int64_t relayed = 0;            // served by a worker
  int64_t failed_sources = 0;     // sources reported failed
  int64_t root_overflows = 0;     // trainer past root_fanout: no live relay had room
};

// The trainer's plan of a fan-out tree per version (SHARDCAST / Laminar
// relays): a worker asking for a version is placed under the shallowest
// live node with room, the trainer first (up to root_fanout), then workers
// that relay (up to fanout each). A node serves while it is still receiving
// (cut-through), so a deeper tree adds a chunk's latency per hop, not a
// version's. A source a worker reports failed is dead for that version: its
// children ask again and are re-placed, never under their own subtree. When
// no live relay has room the trainer serves: a version always reaches
// everyone. Thread-safe; no I/O.
class RelayTree {
 public:
  explicit RelayTree(RelayTreeOptions options = {});

  // Places `worker_id` (relaying at `relay_address`, empty = it does not
  // relay) for `version`, after marking `failed_sources` dead for it.
  RelayAssignment Assign(int64_t version, const std::string& worker_id,
                         const std::string& relay_address,
                         const std::vector<std::string>& failed_sources) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets every tree (a new run).
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);

  RelayTreeStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Node {
    std::string worker_id;
    std::string address;  // empty: a leaf that does not relay
    std::string parent;   // worker_id of the parent; empty = the trainer
    int depth = 1;
    int children = 0;
    bool dead = false;
  };
  struct Tree {
    int root_children = 0;
    std::map<std::string, Node> nodes;  // by worker_id
  };

  // True when `ancestor` is `worker_id` or above it in `tree`.
  static bool IsAncestor(const Tree& tree, const std::string& ancestor, std::string worker_id);
  void Detach(Tree& tree, Node& node);

  const RelayTreeOptions options_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Tree> trees_ ABSL_GUARDED_BY(mu_);
  RelayTreeStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_RELAY_TREE_H_
