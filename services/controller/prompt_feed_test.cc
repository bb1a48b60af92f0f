#include "services/controller/prompt_feed.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::controller {
namespace {

using ::testing::ElementsAreArray;

std::vector<v1::Prompt> Pool(int n) {
  std::vector<v1::Prompt> prompts;
  for (int i = 0; i < n; ++i) {
    v1::Prompt& prompt = prompts.emplace_back();
    prompt.set_prompt_id(absl::StrCat("p", i));
    prompt.set_text(absl::StrCat(i, "+0="));
    prompt.set_reference_answer(absl::StrCat(i));
  }
  return prompts;
}

std::vector<std::string> Ids(const PromptLease& lease) {
  std::vector<std::string> ids;
  for (const v1::Prompt& prompt : lease.prompts) ids.push_back(prompt.prompt_id());
  return ids;
}

const absl::Time kT0 = absl::FromUnixSeconds(1000000);

TEST(PromptFeedTest, LeasesAtMostTheAskedNumberWithTtl) {
  PromptFeed feed(Pool(10), /*seed=*/1, absl::Seconds(30));
  const PromptLease lease = feed.Lease("w", 1, 4, kT0);
  EXPECT_EQ(lease.prompts.size(), 4u);
  EXPECT_FALSE(lease.lease_id.empty());
  EXPECT_EQ(lease.expires_at, kT0 + absl::Seconds(30));
  EXPECT_EQ(feed.stats().outstanding, 4);
}

TEST(PromptFeedTest, OrderIsAShuffleDeterminedBySeed) {
  PromptFeed a(Pool(50), 7);
  PromptFeed b(Pool(50), 7);
  PromptFeed c(Pool(50), 8);
  const std::vector<std::string> first = Ids(a.Lease("w", 1, 50, kT0));
  EXPECT_THAT(Ids(b.Lease("w", 1, 50, kT0)), ElementsAreArray(first));
  EXPECT_NE(Ids(c.Lease("w", 1, 50, kT0)), first);
  // A permutation of the pool, not the task order.
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), 50u);
  std::vector<std::string> task_order;
  for (const auto& p : Pool(50)) task_order.push_back(p.prompt_id());
  EXPECT_NE(first, task_order);
}

TEST(PromptFeedTest, EpochsRepeatThePoolUnderFreshIds) {
  PromptFeed feed(Pool(3), 1);
  const std::vector<std::string> epoch0 = Ids(feed.Lease("w", 1, 3, kT0));
  const std::vector<std::string> epoch1 = Ids(feed.Lease("w", 1, 3, kT0));
  std::set<std::string> base(epoch0.begin(), epoch0.end());
  EXPECT_EQ(base, (std::set<std::string>{"p0", "p1", "p2"}));
  std::set<std::string> second(epoch1.begin(), epoch1.end());
  EXPECT_EQ(second, (std::set<std::string>{"p0-e1", "p1-e1", "p2-e1"}));
  EXPECT_EQ(feed.stats().epoch, 1);
}

TEST(PromptFeedTest, CompletedPromptsAreNeverReissued) {
  PromptFeed feed(Pool(4), 1, absl::Seconds(10));
  const PromptLease lease = feed.Lease("w", 1, 2, kT0);
  EXPECT_EQ(feed.Complete(Ids(lease)), 2);
  EXPECT_EQ(feed.Complete(Ids(lease)), 0);  // Repeated completion is a no-op.
  // The lease expires: nothing of it comes back.
  const PromptLease next = feed.Lease("w", 1, 2, kT0 + absl::Seconds(11));
  for (const std::string& id : Ids(next)) {
    EXPECT_THAT(Ids(lease), ::testing::Not(::testing::Contains(id)));
  }
  EXPECT_EQ(feed.stats().reissued, 0);
}

TEST(PromptFeedTest, AbandonedPromptsAreReissuedFirstUnderTheirIds) {
  PromptFeed feed(Pool(10), 1);
  const PromptLease first = feed.Lease("w1", 1, 3, kT0);
  feed.Abandon({first.prompts[1].prompt_id()});
  const PromptLease second = feed.Lease("w2", 1, 2, kT0);
  ASSERT_EQ(second.prompts.size(), 2u);
  EXPECT_EQ(second.prompts[0].prompt_id(), first.prompts[1].prompt_id());
  EXPECT_EQ(second.prompts[0].text(), first.prompts[1].text());
  EXPECT_EQ(feed.stats().reissued, 1);
}

TEST(PromptFeedTest, ExpiredLeasesAreReissuedAndRenewedOnesAreNot) {
  PromptFeed feed(Pool(10), 1, absl::Seconds(10));
  const PromptLease kept = feed.Lease("w1", 1, 2, kT0);
  const PromptLease lost = feed.Lease("w2", 1, 2, kT0);
  absl::StatusOr<absl::Time> renewed = feed.Renew(kept.lease_id, kT0 + absl::Seconds(8));
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(*renewed, kT0 + absl::Seconds(18));

  const PromptLease after = feed.Lease("w3", 1, 3, kT0 + absl::Seconds(12));
  ASSERT_EQ(after.prompts.size(), 3u);
  EXPECT_EQ(after.prompts[0].prompt_id(), lost.prompts[0].prompt_id());
  EXPECT_EQ(after.prompts[1].prompt_id(), lost.prompts[1].prompt_id());
  EXPECT_NE(after.prompts[2].prompt_id(), kept.prompts[0].prompt_id());
  EXPECT_NE(after.prompts[2].prompt_id(), kept.prompts[1].prompt_id());
  // The expired lease cannot be renewed any more.
  EXPECT_EQ(feed.Renew(lost.lease_id, kT0 + absl::Seconds(12)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(PromptFeedTest, LateCompletionOfAnExpiredLeaseStillCounts) {
  PromptFeed feed(Pool(10), 1, absl::Seconds(10));
  const PromptLease lease = feed.Lease("w1", 1, 1, kT0);
  // Expired (noticed by the next Lease), then completed late before re-issue.
  feed.Lease("w2", 1, 1, kT0 + absl::Seconds(11));
  EXPECT_EQ(feed.stats().waiting_reissue, 0);  // w2 took it.
  EXPECT_EQ(feed.Complete(Ids(lease)), 1);
  EXPECT_EQ(feed.stats().outstanding, 0);
}

TEST(PromptFeedTest, NewIncarnationGivesBackTheOldOnesLeases) {
  PromptFeed feed(Pool(10), 1);
  const PromptLease old_lease = feed.Lease("w", 1, 2, kT0);
  feed.ObserveWorker("w", 1);  // Same incarnation: nothing happens.
  EXPECT_EQ(feed.stats().waiting_reissue, 0);
  feed.ObserveWorker("w", 2);
  EXPECT_EQ(feed.stats().waiting_reissue, 2);
  const PromptLease next = feed.Lease("w", 2, 2, kT0);
  EXPECT_THAT(Ids(next), ElementsAreArray(Ids(old_lease)));
}

TEST(PromptFeedTest, NothingAfterDone) {
  PromptFeed feed(Pool(10), 1);
  feed.MarkDone();
  EXPECT_TRUE(feed.done());
  const PromptLease lease = feed.Lease("w", 1, 4, kT0);
  EXPECT_TRUE(lease.prompts.empty());
  EXPECT_TRUE(lease.lease_id.empty());
}

}  // namespace
}  // namespace sluice::controller
