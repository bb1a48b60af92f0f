#include "replay_buffer/samplers/sum_tree.h"

#include <utility>

namespace sluice::replay_buffer {
namespace {

// Small enough that an idle run costs nothing; growth doubles from here.
constexpr size_t kInitialCapacity = 16;

inline void Prefetch(const double* address) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(address);
#else
  (void)address;
#endif
}

}  // namespace

SumTree::SumTree() : capacity_(kInitialCapacity), nodes_(2 * kInitialCapacity, 0.0) {}

void SumTree::Set(size_t slot, double weight) {
  if (slot >= capacity_) Grow(slot + 1);
  size_t node = capacity_ + slot;
  nodes_[node] = weight;
  for (node /= 2; node >= 1; node /= 2) {
    nodes_[node] = nodes_[2 * node] + nodes_[2 * node + 1];
  }
}

size_t SumTree::Find(double target) const {
  const double* nodes = nodes_.data();
  size_t node = 1;
  while (node < capacity_) {
    // The descent is a chain of dependent loads that miss the cache below
    // the top levels (100k slots: 2 MiB of nodes). Prefetch the four nodes'
    // worth of descendants four levels down (16 * node ... + 15, two cache
    // lines) so that their loads overlap with this level's work.
    if (16 * node < 2 * capacity_) {
      Prefetch(nodes + 16 * node);
      Prefetch(nodes + 16 * node + 8);
    }
    const double left = nodes[2 * node];
    const double right = nodes[2 * node + 1];
    // Invariant: nodes[node] > 0, so left > 0 or right > 0. Go right when the
    // target is past the left subtree and the right one is not empty (then
    // right > 0); go left otherwise (then left > 0, since target >= 0). Either
    // way the next node is > 0 again. Branch-free on purpose: the direction
    // is a coin flip at every level, and mispredicting it cost more than the
    // loads (with the prefetch above; without it, a branchy loop is faster on
    // large trees because speculation does the prefetching).
    const size_t go_right =
        static_cast<size_t>(!(target < left)) & static_cast<size_t>(right > 0.0);
    target -= left * static_cast<double>(go_right);
    node = 2 * node + go_right;
  }
  return node - capacity_;
}

void SumTree::Grow(size_t num_slots) {
  if (num_slots <= capacity_) return;
  size_t capacity = capacity_;
  while (capacity < num_slots) capacity *= 2;
  std::vector<double> nodes(2 * capacity, 0.0);
  for (size_t slot = 0; slot < capacity_; ++slot) nodes[capacity + slot] = nodes_[capacity_ + slot];
  capacity_ = capacity;
  nodes_ = std::move(nodes);
  RebuildInnerNodes();
}

void SumTree::RebuildInnerNodes() {
  for (size_t node = capacity_ - 1; node >= 1; --node) {
    nodes_[node] = nodes_[2 * node] + nodes_[2 * node + 1];
  }
}

}  // namespace sluice::replay_buffer
