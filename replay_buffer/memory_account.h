#ifndef SLUICE_REPLAY_BUFFER_MEMORY_ACCOUNT_H_
#define SLUICE_REPLAY_BUFFER_MEMORY_ACCOUNT_H_

#include <atomic>
#include <cstdint>

namespace sluice::replay_buffer {

// The bytes of the groups held by every table of one replay buffer, against
// the buffer's memory budget (sluice-replay-buffer --memory-budget).
//
// A table charges what it stores and releases what it drops (sampled for
// the last time, evicted), so used_bytes() is the sum of the tables'
// RunStats.size_bytes. An insert that would take the total past the budget
// is refused with RETRYABLE_ERROR (TryCharge): the group is not stored, and
// the same insert succeeds later, once the trainer has sampled and groups
// have left. What a restore or a replay brings back is charged whatever the
// budget (Charge): acknowledged groups are never dropped, even when a
// buffer restarts with a smaller budget; inserts then wait until the total
// is back under it. ConfigureRun refuses a new table whose estimate does
// not fit what is left (replay_buffer.h).
//
// Shared by the tables (RunTableOptions.memory); lock-free and thread-safe.
// TryCharge is atomic, so concurrent inserts into different tables never
// overshoot the budget together.
class MemoryAccount {
 public:
  // `budget_bytes` <= 0: no budget (everything fits; still counted).
  explicit MemoryAccount(int64_t budget_bytes) : budget_bytes_(budget_bytes) {}

  MemoryAccount(const MemoryAccount&) = delete;
  MemoryAccount& operator=(const MemoryAccount&) = delete;

  int64_t budget_bytes() const { return budget_bytes_; }
  int64_t used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }

  // Adds `bytes` (>= 0) when the total stays within the budget and returns
  // true; adds nothing and returns false otherwise. O(1).
  bool TryCharge(int64_t bytes);
  // Adds `bytes` whatever the budget.
  void Charge(int64_t bytes) { used_bytes_.fetch_add(bytes, std::memory_order_relaxed); }
  // Takes back what a Charge or a successful TryCharge added.
  void Release(int64_t bytes) { used_bytes_.fetch_sub(bytes, std::memory_order_relaxed); }

 private:
  const int64_t budget_bytes_;
  std::atomic<int64_t> used_bytes_{0};
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_MEMORY_ACCOUNT_H_
