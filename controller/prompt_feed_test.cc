#include "controller/prompt_feed.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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

// A lease closes when its last prompt completes (so that the feed keeps only
// the leases still out, not every lease of the last TTL); one with a prompt
// still out stays renewable.
TEST(PromptFeedTest, ALeaseClosesWhenItsLastPromptCompletes) {
  PromptFeed feed(Pool(10), 1, absl::Seconds(10));
  const PromptLease lease = feed.Lease("w1", 1, 2, kT0);
  ASSERT_EQ(lease.prompts.size(), 2u);
  EXPECT_EQ(feed.Complete({lease.prompts[0].prompt_id()}), 1);
  EXPECT_TRUE(feed.Renew(lease.lease_id, kT0 + absl::Seconds(1)).ok());
  EXPECT_EQ(feed.Complete({lease.prompts[1].prompt_id()}), 1);
  EXPECT_EQ(feed.Renew(lease.lease_id, kT0 + absl::Seconds(2)).status().code(),
            absl::StatusCode::kNotFound);
  // Nothing of it comes back at its expiry, and nothing counts as expired.
  const PromptLease later = feed.Lease("w2", 1, 1, kT0 + absl::Seconds(20));
  ASSERT_EQ(later.prompts.size(), 1u);
  EXPECT_NE(later.prompts[0].prompt_id(), lease.prompts[0].prompt_id());
  EXPECT_NE(later.prompts[0].prompt_id(), lease.prompts[1].prompt_id());
  EXPECT_EQ(feed.stats().leases_expired, 0);
  EXPECT_EQ(feed.stats().reissued, 0);
}

// Only a lease that gives prompts back expired unreported; one whose prompts
// were all completed just closes at its expiry.
TEST(PromptFeedTest, OnlyLeasesWithUnfinishedPromptsCountAsExpired) {
  PromptFeed feed(Pool(10), 1, absl::Seconds(10));
  const PromptLease done = feed.Lease("w1", 1, 2, kT0);
  feed.Lease("w2", 1, 2, kT0);
  EXPECT_EQ(feed.Complete(Ids(done)), 2);
  feed.Lease("w3", 1, 1, kT0 + absl::Seconds(11));
  EXPECT_EQ(feed.stats().leases_expired, 1);
  // A lost worker's lease with prompts out counts too.
  feed.Lease("w4", 1, 1, kT0 + absl::Seconds(11));
  EXPECT_EQ(feed.GiveBackWorker("w4"), 1);
  EXPECT_EQ(feed.stats().leases_expired, 2);
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

// --- The journal: a feed that survives its controller. ---

class PromptFeedJournalTest : public ::testing::Test {
 protected:
  PromptFeedJournalTest() {
    dir_ = ::testing::TempDir() + "/feed-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/prompt_feed.jsonl";
  }

  // A feed on the journal; restored from it when it holds events. The
  // previous feed object is simply dropped, as a controller killed -9 would
  // drop it: nothing is flushed or closed first.
  std::unique_ptr<PromptFeed> OpenFeed(int pool = 10, int64_t compact_after = 10000) {
    PromptFeedJournalOptions journal;
    journal.path = path_;
    journal.sync_interval = absl::InfiniteDuration();
    journal.compact_after_events = compact_after;
    journal.min_compaction_interval = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<PromptFeed>> feed =
        PromptFeed::Open(Pool(pool), /*seed=*/5, absl::Seconds(10), journal);
    EXPECT_TRUE(feed.ok()) << feed.status();
    return feed.ok() ? std::move(*feed) : nullptr;
  }

  std::string ReadJournal() const {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  std::string dir_;
  std::string path_;
};

TEST_F(PromptFeedJournalTest, ANewJournalStartsAtTheBeginning) {
  std::unique_ptr<PromptFeed> feed = OpenFeed();
  EXPECT_FALSE(feed->restore().restored);
  PromptFeed memory(Pool(10), 5, absl::Seconds(10));
  // Journaled or not, the order is the seed's.
  EXPECT_THAT(Ids(feed->Lease("w", 1, 10, kT0)),
              ElementsAreArray(Ids(memory.Lease("w", 1, 10, kT0))));
}

TEST_F(PromptFeedJournalTest, RestoreResumesFreshHandOutAndReissuesOnlyWhatWasNotCompleted) {
  std::vector<std::string> first_pass;
  {
    std::unique_ptr<PromptFeed> feed = OpenFeed();
    const PromptLease a = feed->Lease("w1", 1, 3, kT0);
    const PromptLease b = feed->Lease("w2", 1, 3, kT0);
    first_pass = Ids(a);
    for (const std::string& id : Ids(b)) first_pass.push_back(id);
    // a completed; of b only the middle one.
    EXPECT_EQ(feed->Complete(Ids(a)), 3);
    EXPECT_EQ(feed->Complete({b.prompts[1].prompt_id()}), 1);
  }  // Killed.
  std::unique_ptr<PromptFeed> feed = OpenFeed();
  EXPECT_TRUE(feed->restore().restored);
  EXPECT_EQ(feed->restore().reissue_queued, 2);
  PromptFeedStats stats = feed->stats();
  EXPECT_EQ(stats.issued, 6);
  EXPECT_EQ(stats.completed, 4);
  EXPECT_EQ(stats.waiting_reissue, 2);
  EXPECT_EQ(stats.outstanding, 0);

  // The two outstanding prompts first, under their ids, in hand-out order;
  // then fresh hand-out goes on where it stopped.
  const PromptLease next = feed->Lease("w3", 1, 6, kT0);
  std::vector<std::string> expected = {first_pass[3], first_pass[5]};
  PromptFeed reference(Pool(10), 5, absl::Seconds(10));
  reference.Lease("x", 1, 6, kT0);
  for (const std::string& id : Ids(reference.Lease("x", 1, 4, kT0))) expected.push_back(id);
  EXPECT_THAT(Ids(next), ElementsAreArray(expected));
  stats = feed->stats();
  EXPECT_EQ(stats.reissued, 2);
  EXPECT_EQ(stats.issued, 12);
  // Over the whole first pass: every prompt once, none completed twice.
  std::set<std::string> handed(first_pass.begin(), first_pass.end());
  for (const std::string& id : Ids(next)) handed.insert(id);
  EXPECT_EQ(handed.size(), 10u);
}

TEST_F(PromptFeedJournalTest, LateCompletionFromBeforeTheRestartCountsOnceAndStopsTheReissue) {
  std::string late;
  {
    std::unique_ptr<PromptFeed> feed = OpenFeed();
    late = feed->Lease("w1", 1, 1, kT0).prompts[0].prompt_id();
  }
  std::unique_ptr<PromptFeed> feed = OpenFeed();
  EXPECT_EQ(feed->stats().waiting_reissue, 1);
  // The first worker, unaware of the restart, completes it.
  EXPECT_EQ(feed->Complete({late}), 1);
  EXPECT_EQ(feed->stats().waiting_reissue, 0);
  // Not handed out again; a second report of it counts nothing.
  EXPECT_THAT(Ids(feed->Lease("w2", 1, 9, kT0)), ::testing::Not(::testing::Contains(late)));
  EXPECT_EQ(feed->Complete({late}), 0);
  const PromptFeedStats stats = feed->stats();
  EXPECT_EQ(stats.completed, 1);
  EXPECT_EQ(stats.completions_ignored, 1);
  EXPECT_EQ(stats.reissued, 0);
}

TEST_F(PromptFeedJournalTest, ACompletedPromptIsNeverHandedOutAgainAcrossRestarts) {
  std::set<std::string> completed;
  for (int restart = 0; restart < 4; ++restart) {
    std::unique_ptr<PromptFeed> feed = OpenFeed(/*pool=*/6);
    const PromptLease lease = feed->Lease("w", 1, 4, kT0);
    for (const std::string& id : Ids(lease)) {
      EXPECT_FALSE(completed.count(id)) << id << " handed out again after its completion";
    }
    // Complete the first two of every lease; the rest stay out.
    feed->Complete({lease.prompts[0].prompt_id(), lease.prompts[1].prompt_id()});
    completed.insert(lease.prompts[0].prompt_id());
    completed.insert(lease.prompts[1].prompt_id());
    EXPECT_EQ(feed->stats().completed, static_cast<int64_t>(completed.size()));
  }
  // 8 completions over 4 lives of a pool of 6: the second epoch has begun,
  // under fresh ids.
  EXPECT_EQ(completed.size(), 8u);
  EXPECT_EQ(OpenFeed(6)->stats().epoch, 1);
}

TEST_F(PromptFeedJournalTest, ATornLastLineIsIgnoredAndTheNextAppendStartsOnANewLine) {
  std::vector<std::string> leased;
  {
    std::unique_ptr<PromptFeed> feed = OpenFeed();
    leased = Ids(feed->Lease("w", 1, 2, kT0));
  }
  // kill -9 in the middle of appending a completion.
  { std::ofstream(path_, std::ios::app) << R"({"t":"done","ids":[")" << leased[0]; }
  std::unique_ptr<PromptFeed> feed = OpenFeed();
  EXPECT_GT(feed->restore().torn_tail_bytes, 0);
  // The cut completion never happened: both prompts are re-issued.
  EXPECT_EQ(feed->stats().waiting_reissue, 2);
  EXPECT_EQ(feed->stats().completed, 0);
  EXPECT_EQ(feed->Complete({leased[0]}), 1);
  // Every line of the journal is whole again, and a third life sees it all.
  const std::string text = ReadJournal();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
  }
  feed.reset();
  feed = OpenFeed();
  EXPECT_EQ(feed->stats().completed, 1);
  EXPECT_EQ(feed->stats().waiting_reissue, 1);
}

TEST_F(PromptFeedJournalTest, CompactionKeepsTheFeedAndBoundsTheJournal) {
  std::vector<std::string> out;
  {
    std::unique_ptr<PromptFeed> feed = OpenFeed(/*pool=*/50, /*compact_after=*/5);
    for (int i = 0; i < 20; ++i) {
      const PromptLease lease = feed->Lease("w", 1, 2, kT0);
      feed->Complete({lease.prompts[0].prompt_id()});
      out.push_back(lease.prompts[1].prompt_id());
    }
  }
  // 40 events, rewritten every 5: a handful of lines.
  const std::string journal = ReadJournal();
  EXPECT_LE(std::count(journal.begin(), journal.end(), '\n'), 5);
  std::unique_ptr<PromptFeed> feed = OpenFeed(50, 5);
  EXPECT_EQ(feed->stats().completed, 20);
  EXPECT_EQ(feed->stats().issued, 40);
  EXPECT_THAT(Ids(feed->Lease("w", 1, 20, kT0)), ElementsAreArray(out));
}

// The fdatasync is handed to the caller (outside the feed's lock) at most
// once per sync_interval, and only when something was written since.
TEST_F(PromptFeedJournalTest, ASyncIsDueOncePerIntervalAndOnlyAfterAWrite) {
  PromptFeedJournalOptions options;
  options.path = path_;
  options.sync_interval = absl::Hours(1);
  absl::StatusOr<std::unique_ptr<PromptFeedJournal>> journal = PromptFeedJournal::Open(options);
  ASSERT_TRUE(journal.ok()) << journal.status();
  EXPECT_EQ((*journal)->BeginSync(), -1);  // Nothing written yet.
  ASSERT_TRUE((*journal)->Append({{"t", "expired"}, {"count", 1}}).ok());
  const int fd = (*journal)->BeginSync();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::fdatasync(fd), 0);
  ::close(fd);
  EXPECT_EQ((*journal)->syncs(), 1);
  ASSERT_TRUE((*journal)->Append({{"t", "expired"}, {"count", 1}}).ok());
  EXPECT_EQ((*journal)->BeginSync(), -1);  // The last one is not an hour old.
  EXPECT_EQ((*journal)->syncs(), 1);
}

TEST_F(PromptFeedJournalTest, ExpiredLeasesAreCountedAcrossRestarts) {
  {
    std::unique_ptr<PromptFeed> feed = OpenFeed();
    feed->ObserveWorker("w2", 1);
    feed->Lease("w1", 1, 2, kT0);
    feed->Lease("w2", 1, 1, kT0 + absl::Seconds(11));  // w1's lease expired.
    EXPECT_EQ(feed->stats().leases_expired, 1);
    feed->ObserveWorker("w2", 2);  // w2 restarted: its lease is given back.
    EXPECT_EQ(feed->stats().leases_expired, 2);
  }
  EXPECT_EQ(OpenFeed()->stats().leases_expired, 2);
}

TEST_F(PromptFeedJournalTest, LeaseIdsAreNotReusedAfterARestart) {
  std::string before;
  {
    std::unique_ptr<PromptFeed> feed = OpenFeed();
    before = feed->Lease("w", 1, 1, kT0).lease_id;
  }
  EXPECT_NE(OpenFeed()->Lease("w", 1, 1, kT0).lease_id, before);
}

// In a child process (the file size limit binds it all): the journal cannot
// grow (a full disk) when a lease's prompts complete, so that event is not
// written; the feed says so, and once there is room the repair's checkpoint
// records the completions. Exits 0 when every step went as expected.
[[noreturn]] void CompleteWhileTheJournalCannotGrow(const std::string& path) {
  ::signal(SIGXFSZ, SIG_IGN);
  PromptFeedJournalOptions journal;
  journal.path = path;
  journal.sync_interval = absl::InfiniteDuration();
  absl::StatusOr<std::unique_ptr<PromptFeed>> feed =
      PromptFeed::Open(Pool(10), /*seed=*/5, absl::Seconds(10), journal);
  if (!feed.ok()) ::_exit(101);
  const PromptLease lease = (*feed)->Lease("w", 1, 3, kT0);
  const rlimit limit = {std::filesystem::file_size(path), RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(102);
  if ((*feed)->Complete(Ids(lease)) != 3) ::_exit(103);
  const absl::Status error = (*feed)->journal_error();
  if (error.ok() || !absl::StrContains(error.message(), path)) ::_exit(104);
  // Still no room: the repair fails and says why.
  if ((*feed)->RepairJournal().ok()) ::_exit(105);
  const rlimit lifted = {RLIM_INFINITY, RLIM_INFINITY};
  if (::setrlimit(RLIMIT_FSIZE, &lifted) != 0) ::_exit(106);
  if (!(*feed)->RepairJournal().ok()) ::_exit(107);
  if (!(*feed)->journal_error().ok()) ::_exit(108);
  ::_exit(0);
}

TEST_F(PromptFeedJournalTest, CompletionsNotJournaledOnAFullDiskAreRecordedByTheRepair) {
  EXPECT_EXIT(CompleteWhileTheJournalCannotGrow(path_), ::testing::ExitedWithCode(0), "");
  std::unique_ptr<PromptFeed> feed = OpenFeed();
  const PromptFeedStats stats = feed->stats();
  EXPECT_EQ(stats.completed, 3);
  EXPECT_EQ(stats.waiting_reissue, 0) << "completed prompts would be handed out again";
}

TEST_F(PromptFeedJournalTest, ACorruptJournalIsRefusedNamingTheLine) {
  { std::ofstream(path_) << R"({"t":"lease","n":1,"fresh":[[0,0,2]]})" << "\n"
                         << R"({"t":"lease","n":2,"fresh":[[0,5,6]]})" << "\n"; }
  PromptFeedJournalOptions journal;
  journal.path = path_;
  absl::StatusOr<std::unique_ptr<PromptFeed>> feed =
      PromptFeed::Open(Pool(10), 5, absl::Seconds(10), journal);
  EXPECT_EQ(feed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(feed.status().message()), ::testing::HasSubstr("line 2"));
  EXPECT_THAT(std::string(feed.status().message()),
              ::testing::HasSubstr("does not continue the feed at epoch 0 position 2"));
  { std::ofstream(path_) << "not json\n"; }
  feed = PromptFeed::Open(Pool(10), 5, absl::Seconds(10), journal);
  EXPECT_EQ(feed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(feed.status().message()), ::testing::HasSubstr("line 1"));
}

}  // namespace
}  // namespace sluice::controller
