#include "rollout_worker/controller_link.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::rollout_worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Serves what it is told; a run it "finished" stays in its status.
class RecordingWorker : public LinkedWorker {
 public:
  v1::RolloutWorkerStatus Status() override {
    absl::MutexLock lock(&mu_);
    v1::RolloutWorkerStatus status;
    status.set_worker_id("w");
    if (!serving_.empty()) status.add_runs()->set_run_id(serving_);
    status.set_state(serving_.empty() ? v1::ROLLOUT_WORKER_STATE_IDLE
                     : finished_      ? v1::ROLLOUT_WORKER_STATE_IDLE
                                      : v1::ROLLOUT_WORKER_STATE_RUNNING);
    return status;
  }
  absl::Status StartRun(const v1::RolloutAssignment& assignment) override {
    absl::MutexLock lock(&mu_);
    starts.push_back(assignment.run_id());
    serving_ = assignment.run_id();
    finished_ = false;
    return absl::OkStatus();
  }
  void StopRun(const std::string& run_id) override {
    absl::MutexLock lock(&mu_);
    stops.push_back(run_id);
    if (serving_ == run_id) serving_.clear();
  }
  // The run ended by itself (the controller said run_done).
  void Finish() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }

  std::vector<std::string> starts;
  std::vector<std::string> stops;

 private:
  absl::Mutex mu_;
  std::string serving_;
  bool finished_ = false;
};

class ControllerLinkTest : public ::testing::Test {
 protected:
  ControllerLinkTest()
      : link_({.worker_id = "w", .incarnation = 42, .address = "127.0.0.1:9"},
              [this](const v1::WorkerHeartbeatRequest& request)
                  -> absl::StatusOr<v1::WorkerHeartbeatResponse> {
                absl::MutexLock lock(&mu_);
                requests_.push_back(request);
                if (!reachable_) return absl::UnavailableError("connection refused");
                return answer_;
              },
              &worker_) {}

  void Answer(std::vector<std::string> runs, bool superseded = false) {
    absl::MutexLock lock(&mu_);
    answer_ = v1::WorkerHeartbeatResponse();
    answer_.set_heartbeat_interval_ms(5);
    answer_.set_superseded(superseded);
    for (const std::string& run : runs) answer_.add_assignments()->set_run_id(run);
  }
  void SetReachable(bool reachable) {
    absl::MutexLock lock(&mu_);
    reachable_ = reachable;
  }

  absl::Mutex mu_;
  std::vector<v1::WorkerHeartbeatRequest> requests_;
  v1::WorkerHeartbeatResponse answer_;
  bool reachable_ = true;
  RecordingWorker worker_;
  ControllerLink link_;
};

TEST_F(ControllerLinkTest, HeartbeatsCarryIdentityAndStatus) {
  Answer({});
  ASSERT_TRUE(link_.BeatOnce().ok());
  ASSERT_EQ(requests_.size(), 1u);
  EXPECT_EQ(requests_[0].worker_id(), "w");
  EXPECT_EQ(requests_[0].incarnation(), 42u);
  EXPECT_EQ(requests_[0].address(), "127.0.0.1:9");
  EXPECT_EQ(requests_[0].status().state(), v1::ROLLOUT_WORKER_STATE_IDLE);
  EXPECT_TRUE(link_.connected());
}

TEST_F(ControllerLinkTest, StartsAssignedRunsOnceAndStopsThemWhenNoLongerListed) {
  Answer({"run-a"});
  ASSERT_TRUE(link_.BeatOnce().ok());
  ASSERT_TRUE(link_.BeatOnce().ok());
  EXPECT_THAT(worker_.starts, ElementsAre("run-a"));
  Answer({});
  ASSERT_TRUE(link_.BeatOnce().ok());
  EXPECT_THAT(worker_.stops, ElementsAre("run-a"));
  // Listed again (a controller that restarted and re-adopted it): served again.
  Answer({"run-a"});
  ASSERT_TRUE(link_.BeatOnce().ok());
  EXPECT_THAT(worker_.starts, ElementsAre("run-a", "run-a"));
}

// Each heartbeat names the runs this process serves, so that the controller
// sends their specs once (in the answer that assigned them), not on every
// heartbeat; a run stopped is no longer named, and gets its spec again.
TEST_F(ControllerLinkTest, HeartbeatsNameTheRunsServedSoTheirSpecsAreNotSentAgain) {
  Answer({"run-a"});
  ASSERT_TRUE(link_.BeatOnce().ok());
  ASSERT_TRUE(link_.BeatOnce().ok());
  Answer({});
  ASSERT_TRUE(link_.BeatOnce().ok());
  ASSERT_TRUE(link_.BeatOnce().ok());
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(requests_.size(), 4u);
  EXPECT_THAT(requests_[0].serving_run_ids(), IsEmpty());
  EXPECT_THAT(requests_[1].serving_run_ids(), ElementsAre("run-a"));
  EXPECT_THAT(requests_[2].serving_run_ids(), ElementsAre("run-a"));
  EXPECT_THAT(requests_[3].serving_run_ids(), IsEmpty());  // Stopped by the third answer.
}

// The controller refuses a second process with this worker id: not a
// connection problem, nothing is started, and the refusal is returned.
TEST_F(ControllerLinkTest, ARefusedDuplicateWorkerIdServesNothing) {
  {
    absl::MutexLock lock(&mu_);
    reachable_ = true;
  }
  ControllerLink duplicate(
      {.worker_id = "w", .incarnation = 43, .address = "127.0.0.1:10"},
      [](const v1::WorkerHeartbeatRequest&) -> absl::StatusOr<v1::WorkerHeartbeatResponse> {
        return absl::AlreadyExistsError("worker_id: \"w\" is held by a live process");
      },
      &worker_);
  EXPECT_EQ(duplicate.BeatOnce().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(duplicate.connected());
  EXPECT_THAT(worker_.starts, IsEmpty());
}

TEST_F(ControllerLinkTest, AnUnreachableControllerLeavesTheRunGoing) {
  Answer({"run-a"});
  ASSERT_TRUE(link_.BeatOnce().ok());
  SetReachable(false);
  EXPECT_EQ(link_.BeatOnce().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(link_.BeatOnce().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(link_.connected());
  EXPECT_THAT(worker_.stops, IsEmpty());
  SetReachable(true);
  ASSERT_TRUE(link_.BeatOnce().ok());
  EXPECT_TRUE(link_.connected());
  EXPECT_THAT(worker_.starts, ElementsAre("run-a"));
  EXPECT_THAT(worker_.stops, IsEmpty());
}

TEST_F(ControllerLinkTest, ARunThatEndedOnItsOwnIsNotStartedAgain) {
  Answer({"run-a"});
  ASSERT_TRUE(link_.BeatOnce().ok());
  worker_.Finish();
  ASSERT_TRUE(link_.BeatOnce().ok());
  ASSERT_TRUE(link_.BeatOnce().ok());
  EXPECT_THAT(worker_.starts, ElementsAre("run-a"));
}

TEST_F(ControllerLinkTest, ASupersededWorkerStopsServing) {
  Answer({"run-a"});
  ASSERT_TRUE(link_.BeatOnce().ok());
  Answer({"run-a"}, /*superseded=*/true);
  ASSERT_TRUE(link_.BeatOnce().ok());
  EXPECT_THAT(worker_.stops, ElementsAre("run-a"));
  ASSERT_TRUE(link_.BeatOnce().ok());
  EXPECT_THAT(worker_.starts, ElementsAre("run-a"));
}

TEST_F(ControllerLinkTest, LeaveSaysSoInALastHeartbeat) {
  Answer({});
  ASSERT_TRUE(link_.BeatOnce().ok());
  link_.Leave();
  ASSERT_EQ(requests_.size(), 2u);
  EXPECT_FALSE(requests_[0].leaving());
  EXPECT_TRUE(requests_[1].leaving());
  EXPECT_EQ(requests_[1].worker_id(), "w");
}

TEST_F(ControllerLinkTest, TheThreadHeartbeatsAtTheIntervalTheControllerSays) {
  Answer({});
  link_.Start();
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(mu_.AwaitWithTimeout(
        absl::Condition(+[](std::vector<v1::WorkerHeartbeatRequest>* r) { return r->size() >= 5; },
                        &requests_),
        absl::Seconds(10)));
  }
  link_.Stop();
  EXPECT_GE(link_.heartbeats(), 5);
}

}  // namespace
}  // namespace sluice::rollout_worker
