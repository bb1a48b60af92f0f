#include "replay_buffer/memory_account.h"

namespace sluice::replay_buffer {

bool MemoryAccount::TryCharge(int64_t bytes) {
  if (budget_bytes_ <= 0) {
    Charge(bytes);
    return true;
  }
  int64_t used = used_bytes_.load(std::memory_order_relaxed);
  do {
    if (bytes > budget_bytes_ - used) return false;
  } while (!used_bytes_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

}  // namespace sluice::replay_buffer
