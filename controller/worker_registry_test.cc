#include "controller/worker_registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sluice::controller {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;
using ::testing::SizeIs;

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerRegistryTest()
      : registry_({.heartbeat_interval = absl::Seconds(1),
                   .worker_ttl = absl::Seconds(10),
                   .clock = [this] { return now_; }}) {}

  v1::WorkerHeartbeatResponse Beat(const std::string& id, uint64_t incarnation) {
    v1::WorkerHeartbeatRequest request;
    request.set_worker_id(id);
    request.set_incarnation(incarnation);
    request.set_address("127.0.0.1:" + std::to_string(incarnation));
    absl::StatusOr<v1::WorkerHeartbeatResponse> response = registry_.Heartbeat(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::WorkerHeartbeatResponse{};
  }

  static v1::RolloutAssignment Assignment(const std::string& run_id) {
    v1::RolloutAssignment assignment;
    assignment.set_run_id(run_id);
    assignment.mutable_endpoints()->set_controller_address("controller:1");
    return assignment;
  }

  static std::vector<WorkerEvent::Kind> Kinds(const std::vector<WorkerEvent>& events) {
    std::vector<WorkerEvent::Kind> kinds;
    for (const WorkerEvent& event : events) kinds.push_back(event.kind);
    return kinds;
  }

  absl::StatusOr<v1::WorkerHeartbeatResponse> TryBeat(const std::string& id, uint64_t incarnation,
                                                      std::vector<std::string> serving = {}) {
    v1::WorkerHeartbeatRequest request;
    request.set_worker_id(id);
    request.set_incarnation(incarnation);
    request.set_address("127.0.0.1:" + std::to_string(incarnation));
    for (const std::string& run_id : serving) request.add_serving_run_ids(run_id);
    return registry_.Heartbeat(request);
  }

  // A real incarnation: a start time in ns, `ago` before now_.
  uint64_t StartedAgo(absl::Duration ago) const {
    return static_cast<uint64_t>(absl::ToUnixNanos(now_ - ago));
  }

  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  WorkerRegistry registry_;
};

TEST_F(WorkerRegistryTest, RefusesHeartbeatsWithoutIdentity) {
  v1::WorkerHeartbeatRequest request;
  request.set_incarnation(1);
  EXPECT_EQ(registry_.Heartbeat(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.set_worker_id("w");
  request.set_incarnation(0);
  EXPECT_EQ(registry_.Heartbeat(request).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerRegistryTest, WorkersLearnTheOfferedRunFromHeartbeats) {
  v1::WorkerHeartbeatResponse idle = Beat("w0", 5);
  EXPECT_THAT(idle.assignments(), IsEmpty());
  EXPECT_EQ(idle.heartbeat_interval_ms(), 1000);
  EXPECT_EQ(idle.worker_ttl_ms(), 10000);

  registry_.Offer(Assignment("run-a"), /*max_workers=*/0);
  v1::WorkerHeartbeatResponse busy = Beat("w0", 5);
  ASSERT_THAT(busy.assignments(), SizeIs(1));
  EXPECT_EQ(busy.assignments(0).run_id(), "run-a");
  EXPECT_EQ(busy.assignments(0).endpoints().controller_address(), "controller:1");
  // A worker that joins later gets it too.
  EXPECT_THAT(Beat("w1", 7).assignments(), SizeIs(1));
  EXPECT_THAT(registry_.RunWorkers("run-a"),
              ElementsAre(Field(&RunWorker::worker_id, "w0"), Field(&RunWorker::worker_id, "w1")));
  EXPECT_THAT(Kinds(registry_.TakeEvents("run-a")),
              ElementsAre(WorkerEvent::Kind::kJoined, WorkerEvent::Kind::kJoined));
  EXPECT_THAT(registry_.TakeEvents("run-a"), IsEmpty());

  registry_.Withdraw("run-a");
  EXPECT_THAT(Beat("w0", 5).assignments(), IsEmpty());
  EXPECT_THAT(registry_.RunWorkers("run-a"), IsEmpty());
}

TEST_F(WorkerRegistryTest, MaxWorkersLimitsAssignmentsAndALostWorkerMakesRoom) {
  registry_.Offer(Assignment("run-a"), /*max_workers=*/1);
  EXPECT_THAT(Beat("w0", 1).assignments(), SizeIs(1));
  EXPECT_THAT(Beat("w1", 1).assignments(), IsEmpty());
  registry_.TakeEvents("run-a");

  // w0 goes silent; w1 keeps beating and takes its place once w0 is lost.
  now_ += absl::Seconds(6);
  EXPECT_THAT(Beat("w1", 1).assignments(), IsEmpty());
  now_ += absl::Seconds(5);
  EXPECT_THAT(Beat("w1", 1).assignments(), SizeIs(1));
  const std::vector<WorkerEvent> events = registry_.TakeEvents("run-a");
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].kind, WorkerEvent::Kind::kLost);
  EXPECT_EQ(events[0].worker_id, "w0");
  EXPECT_EQ(events[0].silent_for, absl::Seconds(11));
  EXPECT_EQ(events[1].kind, WorkerEvent::Kind::kJoined);
  EXPECT_EQ(events[1].worker_id, "w1");

  // w0 comes back (partition healed): re-admitted, but the run is full.
  EXPECT_THAT(Beat("w0", 1).assignments(), IsEmpty());
  EXPECT_THAT(registry_.LiveWorkers(), SizeIs(2));
}

TEST_F(WorkerRegistryTest, ANewIncarnationReplacesTheOldAndIsReassigned) {
  registry_.Offer(Assignment("run-a"), 0);
  Beat("w0", 100);
  registry_.TakeEvents("run-a");
  // Restarted (kill -9 and back within the TTL): new incarnation, after the
  // dead process missed its heartbeats.
  now_ += registry_.HandoverAfter();
  EXPECT_THAT(Beat("w0", 200).assignments(), SizeIs(1));
  const std::vector<WorkerEvent> events = registry_.TakeEvents("run-a");
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].kind, WorkerEvent::Kind::kRestarted);
  EXPECT_EQ(events[0].incarnation, 100u);
  EXPECT_EQ(events[1].kind, WorkerEvent::Kind::kJoined);
  EXPECT_EQ(events[1].incarnation, 200u);
  ASSERT_THAT(registry_.RunWorkers("run-a"), SizeIs(1));
  EXPECT_EQ(registry_.RunWorkers("run-a")[0].incarnation, 200u);

  // The old process, still alive somewhere, is told it is superseded.
  v1::WorkerHeartbeatResponse old = Beat("w0", 100);
  EXPECT_TRUE(old.superseded());
  EXPECT_THAT(old.assignments(), IsEmpty());
  EXPECT_EQ(registry_.RunWorkers("run-a")[0].incarnation, 200u);

  const v1::ListWorkersResponse list = registry_.List();
  ASSERT_THAT(list.workers(), SizeIs(1));
  EXPECT_EQ(list.workers(0).restarts(), 1);
  EXPECT_EQ(list.workers(0).run_id(), "run-a");
  EXPECT_TRUE(list.workers(0).live());
}

// Two processes started with one --worker-id (a copy-paste in a deployment):
// the second is not taken for a restart of the first. It is refused while the
// first heartbeats, the first is told, nothing is counted as a restart and
// the first keeps the run.
TEST_F(WorkerRegistryTest, ASecondLiveProcessWithTheSameIdIsRefusedNotTakenForARestart) {
  registry_.Offer(Assignment("run-a"), 0);
  Beat("w0", 100);
  registry_.TakeEvents("run-a");
  for (int beat = 0; beat < 5; ++beat) {
    now_ += absl::Seconds(1);
    const absl::StatusOr<v1::WorkerHeartbeatResponse> second = TryBeat("w0", 200);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_THAT(std::string(second.status().message()),
                ::testing::AllOf(::testing::HasSubstr("held by a live process (incarnation 100"),
                                 ::testing::HasSubstr("give each its own --worker-id")));
    const v1::WorkerHeartbeatResponse first = Beat("w0", 100);
    EXPECT_FALSE(first.superseded());
    EXPECT_THAT(first.conflict(), ::testing::HasSubstr("another process (incarnation 200"));
    EXPECT_THAT(first.assignments(), SizeIs(1));
  }
  EXPECT_THAT(registry_.TakeEvents("run-a"), IsEmpty());  // No restart, no join.
  const v1::ListWorkersResponse list = registry_.List();
  ASSERT_THAT(list.workers(), SizeIs(1));
  EXPECT_EQ(list.workers(0).incarnation(), 100u);
  EXPECT_EQ(list.workers(0).restarts(), 0);
  EXPECT_THAT(list.workers(0).conflict(), ::testing::HasSubstr("incarnation 200"));

  // The first one dies: once it has missed its heartbeats the second takes
  // the id over, as a restart would.
  now_ += registry_.HandoverAfter();
  ASSERT_TRUE(TryBeat("w0", 200).ok());
  EXPECT_THAT(Kinds(registry_.TakeEvents("run-a")),
              ElementsAre(WorkerEvent::Kind::kRestarted, WorkerEvent::Kind::kJoined));
  EXPECT_TRUE(Beat("w0", 200).conflict().empty());
}

// A heartbeat with the worker's own credentials and an incarnation far in the
// future used to evict the real worker for as long as the value stayed
// ahead. Incarnations are start times: one ahead of the controller's clock by
// more than the skew allowed is refused, and one within it cannot take a
// live worker's id either.
TEST_F(WorkerRegistryTest, AnIncarnationAheadOfTheControllersClockCannotEvictTheWorker) {
  registry_.Offer(Assignment("run-a"), 0);
  const uint64_t real = StartedAgo(absl::Minutes(5));
  Beat("w0", real);
  registry_.TakeEvents("run-a");

  const uint64_t far = static_cast<uint64_t>(absl::ToUnixNanos(now_ + absl::Hours(24 * 365)));
  const absl::StatusOr<v1::WorkerHeartbeatResponse> forged = TryBeat("w0", far);
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(forged.status().message()),
              ::testing::AllOf(::testing::HasSubstr("ahead of the controller's clock"),
                               ::testing::HasSubstr("--worker-clock-skew-ms")));
  const uint64_t near = static_cast<uint64_t>(absl::ToUnixNanos(now_ + absl::Seconds(30)));
  EXPECT_EQ(TryBeat("w0", near).status().code(), absl::StatusCode::kAlreadyExists);

  const v1::WorkerHeartbeatResponse still = Beat("w0", real);
  EXPECT_FALSE(still.superseded());
  EXPECT_THAT(still.assignments(), SizeIs(1));
  ASSERT_THAT(registry_.RunWorkers("run-a"), SizeIs(1));
  EXPECT_EQ(registry_.RunWorkers("run-a")[0].incarnation, real);
  EXPECT_THAT(registry_.TakeEvents("run-a"), IsEmpty());
}

// If a newer incarnation did take the id (the real one was silent a while)
// and then vanished, the real process is not locked out: once the newer one
// is lost, the older one holds the id again.
TEST_F(WorkerRegistryTest, AnOlderProcessHoldsTheIdAgainOnceTheNewerOneIsLost) {
  registry_.Offer(Assignment("run-a"), 0);
  Beat("w0", 100);
  now_ += registry_.HandoverAfter();
  Beat("w0", 200);
  EXPECT_TRUE(Beat("w0", 100).superseded());  // While 200 is live.
  now_ += absl::Seconds(11);                  // 200 goes silent; lost.
  const v1::WorkerHeartbeatResponse back = Beat("w0", 100);
  EXPECT_FALSE(back.superseded());
  EXPECT_THAT(back.assignments(), SizeIs(1));
  ASSERT_THAT(registry_.RunWorkers("run-a"), SizeIs(1));
  EXPECT_EQ(registry_.RunWorkers("run-a")[0].incarnation, 100u);
  EXPECT_EQ(registry_.List().workers(0).restarts(), 1);  // Only the one takeover.
}

// A run's spec crosses the wire in the answer that assigns it; the worker
// then says it serves the run and its answers carry the run without it.
TEST_F(WorkerRegistryTest, AServingWorkerGetsItsRunWithoutTheSpec) {
  v1::RolloutAssignment assignment = Assignment("run-a");
  assignment.mutable_spec()->set_name(std::string(100000, 'n'));
  assignment.set_max_prompt_tokens(12);
  registry_.Offer(assignment, 0);
  const absl::StatusOr<v1::WorkerHeartbeatResponse> first = TryBeat("w0", 1);
  ASSERT_TRUE(first.ok());
  ASSERT_THAT(first->assignments(), SizeIs(1));
  EXPECT_EQ(first->assignments(0).spec().name().size(), 100000u);
  const absl::StatusOr<v1::WorkerHeartbeatResponse> later = TryBeat("w0", 1, {"run-a"});
  ASSERT_TRUE(later.ok());
  ASSERT_THAT(later->assignments(), SizeIs(1));
  EXPECT_EQ(later->assignments(0).run_id(), "run-a");
  EXPECT_FALSE(later->assignments(0).has_spec());
  EXPECT_EQ(later->assignments(0).endpoints().controller_address(), "controller:1");
  EXPECT_EQ(later->assignments(0).max_prompt_tokens(), 12);
  EXPECT_LT(later->ByteSizeLong(), 200u);
}

// A restart slower than the TTL (a loaded machine, a slow model load): the
// old incarnation is lost first, and the new one is still a restart of a
// worker that served the run, counted as such.
TEST_F(WorkerRegistryTest, ARestartAfterTheWorkerWasLostIsStillARestart) {
  registry_.Offer(Assignment("run-a"), 0);
  Beat("w0", 100);
  registry_.TakeEvents("run-a");
  now_ += absl::Seconds(11);
  EXPECT_THAT(Beat("w0", 200).assignments(), SizeIs(1));
  EXPECT_THAT(Kinds(registry_.TakeEvents("run-a")),
              ElementsAre(WorkerEvent::Kind::kLost, WorkerEvent::Kind::kRestarted,
                          WorkerEvent::Kind::kJoined));
  // The same process back after a partition is no restart.
  now_ += absl::Seconds(11);
  Beat("w0", 200);
  EXPECT_THAT(Kinds(registry_.TakeEvents("run-a")),
              ElementsAre(WorkerEvent::Kind::kLost, WorkerEvent::Kind::kJoined));
}

TEST_F(WorkerRegistryTest, ALeavingWorkerIsGoneAtOnce) {
  registry_.Offer(Assignment("run-a"), 0);
  Beat("w0", 1);
  registry_.TakeEvents("run-a");
  v1::WorkerHeartbeatRequest request;
  request.set_worker_id("w0");
  request.set_incarnation(1);
  request.set_leaving(true);
  absl::StatusOr<v1::WorkerHeartbeatResponse> response = registry_.Heartbeat(request);
  ASSERT_TRUE(response.ok());
  EXPECT_THAT(response->assignments(), IsEmpty());
  EXPECT_THAT(registry_.RunWorkers("run-a"), IsEmpty());
  EXPECT_THAT(Kinds(registry_.TakeEvents("run-a")), ElementsAre(WorkerEvent::Kind::kLeft));
  EXPECT_THAT(registry_.LiveWorkers(), IsEmpty());
}

// Expiry looks at an index of heartbeats: it must still lose exactly the
// workers silent for the TTL, whatever their ids' order, and only once.
TEST_F(WorkerRegistryTest, OnlyWorkersSilentForTheTtlAreLost) {
  registry_.Offer(Assignment("run-a"), 0);
  Beat("z-early", 1);
  now_ += absl::Seconds(4);
  Beat("a-late", 1);
  Beat("m-late", 1);
  registry_.TakeEvents("run-a");
  now_ += absl::Seconds(6);  // z-early silent 10 s, the others 6 s.
  Beat("m-late", 1);
  EXPECT_THAT(registry_.TakeEvents("run-a"),
              ElementsAre(AllOf(Field(&WorkerEvent::kind, WorkerEvent::Kind::kLost),
                                Field(&WorkerEvent::worker_id, "z-early"))));
  EXPECT_EQ(registry_.SummarizeRunWorkers("run-a").live, 2);
  now_ += absl::Seconds(4);  // a-late silent 10 s; m-late 4 s.
  EXPECT_THAT(registry_.RunWorkers("run-a"), ElementsAre(Field(&RunWorker::worker_id, "m-late")));
  EXPECT_THAT(registry_.TakeEvents("run-a"),
              ElementsAre(Field(&WorkerEvent::worker_id, "a-late")));
  now_ += absl::Seconds(30);
  EXPECT_EQ(registry_.SummarizeRunWorkers("run-a").live, 0);
  EXPECT_THAT(registry_.TakeEvents("run-a"),
              ElementsAre(Field(&WorkerEvent::worker_id, "m-late")));
  EXPECT_THAT(registry_.TakeEvents("run-a"), IsEmpty());
}

TEST_F(WorkerRegistryTest, SummaryCountsTheRunsWorkersAndNamesTheFailedOnes) {
  registry_.Offer(Assignment("run-a"), 0);
  Beat("w0", 1);
  Beat("w1", 1);
  v1::WorkerHeartbeatRequest failed;
  failed.set_worker_id("w2");
  failed.set_incarnation(1);
  failed.mutable_status()->set_state(v1::ROLLOUT_WORKER_STATE_FAILED);
  failed.mutable_status()->set_last_error("out of memory");
  ASSERT_TRUE(registry_.Heartbeat(failed).ok());
  WorkerRegistry::RunWorkerSummary summary = registry_.SummarizeRunWorkers("run-a");
  EXPECT_EQ(summary.live, 3);
  ASSERT_THAT(summary.failed, SizeIs(1));
  EXPECT_EQ(summary.failed[0].worker_id, "w2");
  EXPECT_EQ(summary.failed[0].status.last_error(), "out of memory");
  EXPECT_EQ(registry_.SummarizeRunWorkers("run-b").live, 0);

  // It recovered (its next heartbeat says so): no longer listed.
  failed.mutable_status()->set_state(v1::ROLLOUT_WORKER_STATE_RUNNING);
  ASSERT_TRUE(registry_.Heartbeat(failed).ok());
  EXPECT_THAT(registry_.SummarizeRunWorkers("run-a").failed, IsEmpty());
  // A lost worker is counted no more.
  now_ += absl::Seconds(11);
  Beat("w0", 1);
  EXPECT_EQ(registry_.SummarizeRunWorkers("run-a").live, 1);
}

TEST_F(WorkerRegistryTest, ListShowsLiveWorkersFirst) {
  Beat("b", 1);
  now_ += absl::Seconds(20);
  Beat("c", 1);
  Beat("a", 1);
  const v1::ListWorkersResponse list = registry_.List();
  ASSERT_THAT(list.workers(), SizeIs(3));
  EXPECT_EQ(list.workers(0).worker_id(), "a");
  EXPECT_EQ(list.workers(1).worker_id(), "c");
  EXPECT_EQ(list.workers(2).worker_id(), "b");
  EXPECT_FALSE(list.workers(2).live());
}

TEST_F(WorkerRegistryTest, GivenUpWorkersAreRememberedUntilTheyReturn) {
  registry_.GiveUp("w3", "killed by signal 9; gave up after 5 restarts");
  EXPECT_EQ(registry_.GivenUp().at("w3"), "killed by signal 9; gave up after 5 restarts");
  Beat("w3", 9);
  EXPECT_THAT(registry_.GivenUp(), IsEmpty());
}

}  // namespace
}  // namespace sluice::controller
