#include "services/weights/relay_tree.h"

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace sluice::weights {
namespace {

std::string Addr(int i) { return absl::StrCat("10.0.0.", i, ":50052"); }
std::string Id(int i) { return absl::StrCat("w", i); }

TEST(RelayTreeTest, TrainerServesRootFanoutOthersFromRelays) {
  RelayTree tree({.root_fanout = 1, .fanout = 2});
  std::map<std::string, int> children;  // by source
  int direct = 0;
  for (int i = 0; i < 8; ++i) {
    RelayAssignment a = tree.Assign(5, Id(i), Addr(i), {});
    if (a.source_address.empty()) {
      ++direct;
    } else {
      ++children[a.source_address];
    }
  }
  EXPECT_EQ(direct, 1);
  for (const auto& [source, n] : children) EXPECT_LE(n, 2) << source;
  const RelayTreeStats stats = tree.stats();
  EXPECT_EQ(stats.direct, 1);
  EXPECT_EQ(stats.relayed, 7);
  EXPECT_EQ(stats.root_overflows, 0);
}

TEST(RelayTreeTest, ShallowestRelayFirstSoDepthGrowsLogarithmically) {
  RelayTree tree({.root_fanout = 1, .fanout = 2});
  int max_depth = 0;
  for (int i = 0; i < 15; ++i) max_depth = std::max(max_depth, tree.Assign(1, Id(i), Addr(i), {}).depth);
  // 1 + 2 + 4 + 8 = 15 nodes fill depths 1..4.
  EXPECT_EQ(max_depth, 4);
}

TEST(RelayTreeTest, LeavesThatDoNotRelayGetNoChildren) {
  RelayTree tree({.root_fanout = 1, .fanout = 1});
  EXPECT_EQ(tree.Assign(1, "leaf", "", {}).source_address, "");
  // The only node does not relay: the trainer serves the next one too.
  RelayAssignment a = tree.Assign(1, Id(1), Addr(1), {});
  EXPECT_EQ(a.source_address, "");
  EXPECT_EQ(tree.stats().root_overflows, 1);
  EXPECT_EQ(tree.Assign(1, Id(2), Addr(2), {}).source_address, Addr(1));
}

TEST(RelayTreeTest, FailedSourceIsNeverHandedOutAgainForThatVersion) {
  RelayTree tree({.root_fanout = 1, .fanout = 2});
  ASSERT_EQ(tree.Assign(3, Id(0), Addr(0), {}).source_address, "");
  ASSERT_EQ(tree.Assign(3, Id(1), Addr(1), {}).source_address, Addr(0));
  ASSERT_EQ(tree.Assign(3, Id(2), Addr(2), {}).source_address, Addr(0));
  // w0 dies: its children ask again, naming it.
  RelayAssignment again = tree.Assign(3, Id(1), Addr(1), {Addr(0)});
  EXPECT_NE(again.source_address, Addr(0));
  for (int i = 3; i < 10; ++i) EXPECT_NE(tree.Assign(3, Id(i), Addr(i), {}).source_address, Addr(0));
  EXPECT_EQ(tree.stats().failed_sources, 1);
  // Another version: w0 is alive there.
  EXPECT_EQ(tree.Assign(4, Id(0), Addr(0), {}).source_address, "");
  EXPECT_EQ(tree.Assign(4, Id(1), Addr(1), {}).source_address, Addr(0));
}

TEST(RelayTreeTest, ReplacedWorkerIsNeverPutUnderItsOwnSubtree) {
  RelayTree tree({.root_fanout = 1, .fanout = 1});
  ASSERT_EQ(tree.Assign(1, Id(0), Addr(0), {}).source_address, "");
  ASSERT_EQ(tree.Assign(1, Id(1), Addr(1), {}).source_address, Addr(0));
  ASSERT_EQ(tree.Assign(1, Id(2), Addr(2), {}).source_address, Addr(1));
  // w1 lost w0: the only relays with room are w2, below w1 itself. It must
  // go to the trainer, not wait on its own child.
  RelayAssignment a = tree.Assign(1, Id(1), Addr(1), {Addr(0)});
  EXPECT_EQ(a.source_address, "");
  EXPECT_EQ(a.depth, 1);
}

TEST(RelayTreeTest, NeverPlacedUnderANodeAtItsOwnAddress) {
  RelayTree tree({.root_fanout = 1, .fanout = 2});
  ASSERT_EQ(tree.Assign(1, Id(0), "127.0.0.1:50052", {}).source_address, "");
  // Another host's worker advertising the same loopback address.
  EXPECT_EQ(tree.Assign(1, Id(1), "127.0.0.1:50052", {}).source_address, "");
  EXPECT_EQ(tree.Assign(1, Id(2), Addr(2), {}).source_address, "127.0.0.1:50052");
}

TEST(RelayTreeTest, EveryoneFailedFallsBackToTheTrainer) {
  RelayTree tree({.root_fanout = 1, .fanout = 2});
  std::vector<std::string> failed;
  for (int i = 0; i < 4; ++i) {
    tree.Assign(9, Id(i), Addr(i), {});
    failed.push_back(Addr(i));
  }
  EXPECT_EQ(tree.Assign(9, Id(7), Addr(7), failed).source_address, "");
}

TEST(RelayTreeTest, KeepsOnlyRecentVersionsAndResets) {
  RelayTree tree({.root_fanout = 1, .fanout = 2, .keep_versions = 2});
  for (int v = 0; v < 5; ++v) tree.Assign(v, Id(0), Addr(0), {});
  // Version 0's tree was forgotten: w1 is placed afresh (at the trainer's).
  EXPECT_EQ(tree.Assign(0, Id(1), Addr(1), {}).source_address, "");
  tree.Reset();
  EXPECT_EQ(tree.Assign(4, Id(1), Addr(1), {}).source_address, "");
}

}  // namespace
}  // namespace sluice::weights
