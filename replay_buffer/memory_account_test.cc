#include "replay_buffer/memory_account.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace sluice::replay_buffer {
namespace {

TEST(MemoryAccountTest, TryChargeAddsOnlyWhatFitsTheBudget) {
  MemoryAccount account(100);
  EXPECT_TRUE(account.TryCharge(60));
  EXPECT_FALSE(account.TryCharge(41));
  EXPECT_EQ(account.used_bytes(), 60);
  EXPECT_TRUE(account.TryCharge(40));
  EXPECT_EQ(account.used_bytes(), 100);
  account.Release(50);
  EXPECT_TRUE(account.TryCharge(50));
}

TEST(MemoryAccountTest, ChargeGoesPastTheBudgetAndThenNothingMoreFits) {
  MemoryAccount account(100);
  account.Charge(150);  // restored groups are kept whatever the budget
  EXPECT_EQ(account.used_bytes(), 150);
  EXPECT_FALSE(account.TryCharge(1));
  account.Release(100);
  EXPECT_TRUE(account.TryCharge(1));
}

TEST(MemoryAccountTest, NoBudgetCountsEverything) {
  MemoryAccount account(0);
  EXPECT_TRUE(account.TryCharge(int64_t{1} << 50));
  EXPECT_EQ(account.used_bytes(), int64_t{1} << 50);
}

// More threads than cores racing for the last bytes: exactly the budget is
// handed out, never more.
TEST(MemoryAccountTest, ConcurrentChargesNeverOvershoot) {
  MemoryAccount account(10000);
  std::atomic<int64_t> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5000; ++i) {
        if (account.TryCharge(7)) granted += 7;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(account.used_bytes(), granted.load());
  EXPECT_LE(account.used_bytes(), 10000);
  EXPECT_GT(account.used_bytes(), 10000 - 7);
}

}  // namespace
}  // namespace sluice::replay_buffer
