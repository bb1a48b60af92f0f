#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_SUM_TREE_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_SUM_TREE_H_

#include <cstddef>
#include <vector>

namespace sluice::replay_buffer {

// Non-negative weights over slots 0..capacity()-1, with O(log n) update and
// O(log n) draw of a slot with probability weight / Total(). The weighted
// samplers (PRIORITIZED, RECENCY) keep one weight per held key in it.
//
// Layout: a complete binary tree in one flat array (as Reverb's prioritized
// selector): node 1 is the root, node i has children 2i and 2i+1, and the
// leaves (the slots) are nodes [capacity, 2 * capacity). capacity is a power of
// two and doubles when a slot beyond it is set (O(n) once, amortized O(1)).
//
// Invariant: every inner node holds exactly fl(left + right), the floating-
// point sum of its two children as they are now. Set() recomputes each node on
// the path from its children instead of adding a delta (Reverb adds deltas and
// rebuilds the tree when the drift passes 1e-4). So rounding errors cannot
// accumulate: after any sequence of updates the tree is bit for bit the tree a
// fresh build over the same leaves gives, Total() is the pairwise sum of the
// leaves (relative error <= log2(capacity) * 2^-53), a subtree whose leaves
// are all 0 sums to exactly 0, and zeroing weights and restoring them leaves
// no trace. No periodic rebuild is needed; the cost is one extra load per
// level (the sibling, which shares the node's 16-byte-aligned pair and so its
// cache line).
//
// Not thread-safe.
class SumTree {
 public:
  SumTree();

  // Slots that can be set without growing.
  size_t capacity() const { return capacity_; }

  // Sum of all weights. O(1).
  double Total() const { return nodes_[1]; }

  // The weight of `slot` (0 for a slot never set or beyond capacity). O(1).
  double Get(size_t slot) const { return slot < capacity_ ? nodes_[capacity_ + slot] : 0.0; }

  // Sets the weight of `slot` (>= 0, finite; the caller sanitizes), growing
  // the capacity to a power of two above `slot` if needed. O(log capacity),
  // O(capacity) when it grows.
  void Set(size_t slot, double weight);

  // Sets every slot's weight at once: weight_of(slot) for slots in
  // [0, num_slots), 0 for the others; grows to fit num_slots. O(capacity).
  template <typename WeightOf>
  void Assign(size_t num_slots, WeightOf weight_of) {
    Grow(num_slots);
    for (size_t slot = 0; slot < capacity_; ++slot) {
      nodes_[capacity_ + slot] = slot < num_slots ? weight_of(slot) : 0.0;
    }
    RebuildInnerNodes();
  }

  // A slot drawn with probability Get(slot) / Total(), given `target` uniform
  // in [0, Total()). Requires Total() > 0. Never returns a slot of weight 0,
  // even when rounding pushes `target` to or past a boundary (a descent that
  // would enter an empty subtree takes its sibling instead). O(log capacity).
  size_t Find(double target) const;

 private:
  // Makes capacity_ >= num_slots (doubling), keeping the leaves. O(capacity).
  void Grow(size_t num_slots);
  // Recomputes every inner node from the leaves, bottom up. O(capacity).
  void RebuildInnerNodes();

  size_t capacity_;
  std::vector<double> nodes_;  // 2 * capacity_; nodes_[0] unused.
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_SUM_TREE_H_
