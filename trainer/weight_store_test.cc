#include "trainer/weight_store.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace sluice::trainer {
namespace {

std::shared_ptr<const PublishedVersion> Version(const std::string& run, int64_t v) {
  auto p = std::make_shared<PublishedVersion>();
  p->info.set_run_id(run);
  p->info.set_version(v);
  return p;
}

TEST(WeightStoreTest, ServesLatestAndRetainedVersions) {
  WeightStore store(/*retain=*/2);
  store.Reset("r");
  EXPECT_EQ(store.Latest("r").status().code(), absl::StatusCode::kNotFound);
  for (int v = 0; v < 3; ++v) store.Publish(Version("r", v));
  EXPECT_EQ((*store.Latest("r"))->info.version(), 2);
  EXPECT_EQ((*store.Latest(""))->info.version(), 2);
  EXPECT_TRUE(store.Get("r", 1).ok());
  EXPECT_EQ(store.Get("r", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Latest("other").status().code(), absl::StatusCode::kNotFound);
}

TEST(WeightStoreTest, WaitForNewerBlocksUntilPublished) {
  WeightStore store;
  store.Reset("r");
  store.Publish(Version("r", 0));
  absl::Notification done;
  int64_t got = -1;
  std::thread waiter([&] {
    auto v = store.WaitForNewer("r", 0, absl::Now() + absl::Seconds(30));
    if (v.ok()) got = (*v)->info.version();
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  store.Publish(Version("r", 1));
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_EQ(got, 1);
}

TEST(WeightStoreTest, WaitTimesOutAndCloseWakesWaiters) {
  WeightStore store;
  store.Reset("r");
  EXPECT_EQ(store.WaitForNewer("r", 5, absl::Now() + absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::Notification done;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::thread waiter([&] {
    code = store.WaitForNewer("r", 0, absl::InfiniteFuture()).status().code();
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  store.Close();
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  waiter.join();
  EXPECT_EQ(code, absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace sluice::trainer
