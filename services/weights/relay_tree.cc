#include "services/weights/relay_tree.h"

#include <algorithm>
#include <utility>

namespace sluice::weights {

RelayTree::RelayTree(RelayTreeOptions options) : options_(options) {}

bool RelayTree::IsAncestor(const Tree& tree, const std::string& ancestor, std::string worker_id) {
  // Parents were placed before their children, so the walk ends at the
  // trainer; the bound guards against a cycle all the same.
  for (size_t hops = 0; hops <= tree.nodes.size() && !worker_id.empty(); ++hops) {
    if (worker_id == ancestor) return true;
    auto it = tree.nodes.find(worker_id);
    if (it == tree.nodes.end()) return false;
    worker_id = it->second.parent;
  }
  return false;
}

void RelayTree::Detach(Tree& tree, Node& node) {
  if (node.parent.empty()) {
    tree.root_children = std::max(0, tree.root_children - 1);
  } else if (auto it = tree.nodes.find(node.parent); it != tree.nodes.end()) {
    it->second.children = std::max(0, it->second.children - 1);
  }
  node.parent.clear();
}

RelayAssignment RelayTree::Assign(int64_t version, const std::string& worker_id,
                                  const std::string& relay_address,
                                  const std::vector<std::string>& failed_sources) {
  absl::MutexLock lock(&mu_);
  trees_.try_emplace(version);
  // Forget the oldest trees, never the one asked for (a straggler may ask
  // for an old version that is still retained).
  while (static_cast<int>(trees_.size()) > std::max(1, options_.keep_versions)) {
    auto oldest = trees_.begin();
    if (oldest->first == version) ++oldest;
    trees_.erase(oldest);
  }
  Tree& tree = trees_.at(version);
  for (const std::string& failed : failed_sources) {
    for (auto& [id, node] : tree.nodes) {
      if (!node.dead && !node.address.empty() && node.address == failed) {
        node.dead = true;
        ++stats_.failed_sources;
      }
    }
  }
  // A worker asking again (its source failed, or it restarted) is re-placed.
  auto [it, inserted] = tree.nodes.try_emplace(worker_id);
  Node& self = it->second;
  if (!inserted) Detach(tree, self);
  self.worker_id = worker_id;
  self.address = relay_address;
  self.dead = false;

  ++stats_.assignments;
  if (tree.root_children < std::max(1, options_.root_fanout)) {
    ++tree.root_children;
    self.depth = 1;
    ++stats_.direct;
    return {"", 1};
  }
  // The shallowest live relay with room, not in this worker's own subtree
  // (that would wait on itself); ties go to the first by worker id.
  Node* best = nullptr;
  for (auto& [id, node] : tree.nodes) {
    // Not a node at the asker's own address either: two workers advertising
    // the same one (127.0.0.1:port on different hosts) would dial themselves.
    if (node.dead || node.address.empty() || id == worker_id) continue;
    if (!relay_address.empty() && node.address == relay_address) continue;
    if (node.children >= std::max(1, options_.fanout)) continue;
    if (IsAncestor(tree, worker_id, id)) continue;
    if (best == nullptr || node.depth < best->depth) best = &node;
  }
  if (best == nullptr) {
    ++tree.root_children;
    self.depth = 1;
    ++stats_.direct;
    ++stats_.root_overflows;
    return {"", 1};
  }
  ++best->children;
  self.parent = best->worker_id;
  self.depth = best->depth + 1;
  ++stats_.relayed;
  return {best->address, self.depth};
}

void RelayTree::Reset() {
  absl::MutexLock lock(&mu_);
  trees_.clear();
}

RelayTreeStats RelayTree::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace sluice::weights
