#include "services/runtime/request_limits.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace sluice::runtime {
namespace {

using ::testing::HasSubstr;

TEST(StreamGateTest, RefusesThePeerOverItsLimitButNotOthers) {
  StreamGate gate(/*max_per_peer=*/2, /*max_total=*/10);
  absl::StatusOr<StreamGate::Slot> a = gate.Acquire("10.0.0.1", "Sample");
  absl::StatusOr<StreamGate::Slot> b = gate.Acquire("10.0.0.1", "Sample");
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  absl::StatusOr<StreamGate::Slot> c = gate.Acquire("10.0.0.1", "Sample");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("--max-streams-per-peer 2"));
  EXPECT_THAT(c.status().message(), HasSubstr("10.0.0.1 already has 2 streams open"));
  EXPECT_TRUE(gate.Acquire("10.0.0.2", "Sample").ok());
  EXPECT_EQ(gate.open_from("10.0.0.1"), 2);
}

TEST(StreamGateTest, ASlotReleasedOnDestructionFreesItsPlace) {
  StreamGate gate(/*max_per_peer=*/1, /*max_total=*/10);
  {
    absl::StatusOr<StreamGate::Slot> held = gate.Acquire("p", "WatchRun");
    ASSERT_TRUE(held.ok());
    StreamGate::Slot moved = std::move(*held);  // the move keeps one slot, not two
    EXPECT_EQ(gate.open(), 1);
    EXPECT_FALSE(gate.Acquire("p", "WatchRun").ok());
  }
  EXPECT_EQ(gate.open(), 0);
  EXPECT_EQ(gate.open_from("p"), 0);
  EXPECT_TRUE(gate.Acquire("p", "WatchRun").ok());
}

TEST(StreamGateTest, RefusesEveryPeerOverTheTotalAndCountsIt) {
  prometheus::Registry registry;
  RefusalCounter refusals(&registry);
  StreamGate gate(/*max_per_peer=*/5, /*max_total=*/3, &refusals);
  std::vector<StreamGate::Slot> slots;
  for (const char* peer : {"a", "b", "c"}) {
    absl::StatusOr<StreamGate::Slot> slot = gate.Acquire(peer, "WatchVersions");
    ASSERT_TRUE(slot.ok());
    slots.push_back(std::move(*slot));
  }
  absl::StatusOr<StreamGate::Slot> refused = gate.Acquire("d", "WatchVersions");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-streams 3"));
  const std::string text = prometheus::TextSerializer().Serialize(registry.Collect());
  EXPECT_THAT(text, HasSubstr("sluice_requests_refused_total{reason=\"streams_total\"} 1"));
  EXPECT_THAT(text, HasSubstr("sluice_requests_refused_total{reason=\"streams_per_peer\"} 0"));
}

TEST(PeerHostTest, DropsThePort) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.7:53122"), "10.0.0.7");
  EXPECT_EQ(PeerHost("ipv6:[::1]:4000"), "[::1]");
  EXPECT_EQ(PeerHost("unix:/tmp/socket"), "unix:/tmp/socket");
}

TEST(CheckIdLengthTest, NamesTheFieldTheLengthAndTheLimit) {
  EXPECT_TRUE(CheckIdLength("run_id", "run-1", 8).ok());
  EXPECT_TRUE(CheckIdLength("run_id", std::string(8, 'x'), 8).ok());
  absl::Status status = CheckIdLength("run_id", std::string(9, 'x'), 8);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("run_id: 9 bytes, at most 8"));
  EXPECT_THAT(status.message(), HasSubstr("--max-id-bytes"));
}

TEST(CheckItemCountTest, NamesTheFieldTheCountAndTheLimit) {
  EXPECT_TRUE(CheckItemCount("max_prompts", 4096, 4096).ok());
  absl::Status status = CheckItemCount("max_prompts", 1000000000, 4096);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("max_prompts: 1000000000 items, at most 4096"));
  EXPECT_THAT(status.message(), HasSubstr("--max-items-per-request"));
}

TEST(RequestLimitsTest, DefaultsAreValidAndNonsenseIsNamed) {
  EXPECT_TRUE(RequestLimits{}.Validate().ok());
  RequestLimits bad;
  bad.max_streams = 0;
  bad.max_wait_ms = 10;
  absl::Status status = bad.Validate();
  EXPECT_THAT(status.message(), HasSubstr("max_streams must be >= 1; got 0"));
  EXPECT_THAT(status.message(), HasSubstr("max_wait_ms must be >= 1000; got 10"));
}

}  // namespace
}  // namespace sluice::runtime
