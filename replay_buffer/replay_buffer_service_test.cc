#include "replay_buffer/replay_buffer_service.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "replay_buffer/test_util.h"

namespace sluice::replay_buffer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeGroup;

constexpr char kRun[] = "run-s";
constexpr absl::Duration kStillBlocked = absl::Milliseconds(150);
constexpr absl::Duration kReturns = absl::Seconds(10);

void SetDeadline(grpc::ClientContext& context, int seconds = 30) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

// The real service on an in-process channel.
class ReplayBufferServiceTest : public ::testing::Test {
 protected:
  // The buffer's --memory-budget; 0 = none.
  virtual int64_t MemoryBudget() const { return 0; }

  void SetUp() override {
    RunTableOptions options;
    options.memory = std::make_shared<MemoryAccount>(MemoryBudget());
    absl::StatusOr<std::unique_ptr<ReplayBuffer>> buffer = ReplayBuffer::Create(options);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    service_ = std::make_shared<ReplayBufferServiceImpl>(std::move(buffer).value(), registry_);
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::ReplayBufferService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  // The in-process transport hands a message over only when the other side
  // reads, so a client that writes two requests before reading deadlocks on
  // it; HTTP/2 buffers them, as a real trainer's prefetch needs.
  std::unique_ptr<v1::ReplayBufferService::Stub> LoopbackStub() {
    return v1::ReplayBufferService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    service_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }

  grpc::Status Configure(int32_t batch_size, int32_t max_staleness, int32_t group_size = 2,
                         v1::ConfigureRunResponse* response = nullptr,
                         const std::string& run_id = kRun) {
    v1::ConfigureRunRequest request;
    request.set_run_id(run_id);
    request.set_batch_size_groups(batch_size);
    request.set_max_staleness(max_staleness);
    request.set_group_size(group_size);
    v1::ConfigureRunResponse ignored;
    grpc::ClientContext context;
    SetDeadline(context);
    return stub_->ConfigureRun(&context, request, response != nullptr ? response : &ignored);
  }

  // Sends each request on one InsertGroups stream; returns every response.
  std::vector<v1::InsertGroupsResponse> InsertOnOneStream(
      const std::vector<std::vector<v1::Group>>& requests) {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub_->InsertGroups(&context);
    std::vector<v1::InsertGroupsResponse> responses;
    for (const std::vector<v1::Group>& groups : requests) {
      v1::InsertGroupsRequest request;
      for (const v1::Group& group : groups) *request.add_groups() = group;
      EXPECT_TRUE(stream->Write(request));
      v1::InsertGroupsResponse response;
      EXPECT_TRUE(stream->Read(&response));
      responses.push_back(response);
    }
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return responses;
  }

  v1::BufferStats Stats() {
    v1::GetStatsRequest request;
    request.set_run_id(kRun);
    v1::GetStatsResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->GetStats(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.stats();
  }

  static v1::SampleRequest SampleRequestFor(int64_t trainer_version, int64_t timeout_ms,
                                            int32_t batch = 0) {
    v1::SampleRequest request;
    request.set_run_id(kRun);
    request.set_trainer_policy_version(trainer_version);
    request.set_timeout_ms(timeout_ms);
    request.set_batch_size_groups(batch);
    return request;
  }

  std::string MetricsText() { return prometheus::TextSerializer().Serialize(registry_.Collect()); }

  prometheus::Registry registry_;
  int port_ = 0;
  std::shared_ptr<ReplayBufferServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::ReplayBufferService::Stub> stub_;
};

std::vector<std::string> GroupIds(const v1::SampleResponse& response) {
  std::vector<std::string> ids;
  for (const v1::SampledGroup& sampled : response.groups())
    ids.push_back(sampled.group().group_id());
  return ids;
}

TEST_F(ReplayBufferServiceTest, ConfigureRunCreatesOnceAndReportsTheGate) {
  v1::ConfigureRunResponse response;
  ASSERT_TRUE(Configure(4, 2, 2, &response).ok());
  EXPECT_TRUE(response.created());
  EXPECT_EQ(response.stats().run_id(), kRun);
  EXPECT_EQ(response.stats().admission_limit(), 12);
  EXPECT_EQ(response.stats().batch_size_groups(), 4);
  EXPECT_EQ(response.stats().max_staleness(), 2);
  ASSERT_TRUE(Configure(4, 2, 2, &response).ok());
  EXPECT_FALSE(response.created());
}

TEST_F(ReplayBufferServiceTest, ConfigureRunErrorsNameTheField) {
  grpc::Status status = Configure(-3, 1);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("batch_size_groups: must be > 0, got -3"));

  v1::ConfigureRunRequest request;
  request.set_run_id(kRun);
  request.set_batch_size_groups(4);
  request.set_group_size(2);
  request.mutable_config()->set_sampler(static_cast<v1::SamplerKind>(99));
  request.mutable_config()->set_recency_probability(1.5);
  v1::ConfigureRunResponse response;
  grpc::ClientContext context;
  status = stub_->ConfigureRun(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("buffer.sampler: unknown sampler kind 99"));
  EXPECT_THAT(status.error_message(),
              HasSubstr("buffer.recency_probability: must be in [0, 1], got 1.5"));

  ASSERT_TRUE(Configure(4, 1).ok());
  status = Configure(4, 3);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("max_staleness: run run-s is configured with 1"));
}

TEST_F(ReplayBufferServiceTest, AcquireInsertAndSampleAGroupsLifecycle) {
  ASSERT_TRUE(Configure(2, 1).ok());

  v1::AcquireGenerationSlotsRequest acquire;
  acquire.set_run_id(kRun);
  acquire.set_worker_id("worker-0");
  acquire.set_worker_incarnation(1);
  acquire.set_num_groups(3);
  v1::AcquireGenerationSlotsResponse slots;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->AcquireGenerationSlots(&context, acquire, &slots).ok());
  }
  EXPECT_EQ(slots.granted(), 3);
  ASSERT_EQ(slots.lease_ids_size(), 3);
  EXPECT_EQ(slots.lease_ttl_ms(), 60000);
  EXPECT_EQ(slots.policy_version(), 0);
  EXPECT_EQ(slots.admission_limit(), 4);
  EXPECT_EQ(slots.running(), 3);
  EXPECT_GT(slots.lease_expires_at().seconds(), 0);

  v1::Group g0 = MakeGroup(kRun, "g0", 2, 0, 10, slots.lease_ids(0));
  v1::Group g1 = MakeGroup(kRun, "g1", 2, 0, 10, slots.lease_ids(1));
  v1::Group wrong_size = MakeGroup(kRun, "g2", 3, 0, 10, slots.lease_ids(2));
  v1::Group other_run = MakeGroup("no-such-run", "g0", 2, 0);
  const std::vector<v1::InsertGroupsResponse> responses =
      InsertOnOneStream({{g0, g1}, {g0}, {other_run, wrong_size}});
  ASSERT_EQ(responses.size(), 3u);
  ASSERT_EQ(responses[0].results_size(), 2);
  EXPECT_EQ(responses[0].results(0).status(), v1::INSERT_STATUS_STORED);
  EXPECT_EQ(responses[0].results(0).idempotency_key(), "run-s/g0");
  EXPECT_EQ(responses[0].results(0).buffer_sequence(), 1);
  EXPECT_EQ(responses[0].results(1).buffer_sequence(), 2);
  ASSERT_EQ(responses[1].results_size(), 1);
  EXPECT_EQ(responses[1].results(0).status(), v1::INSERT_STATUS_DUPLICATE);  // a retry
  EXPECT_EQ(responses[1].results(0).buffer_sequence(), 1);
  ASSERT_EQ(responses[2].results_size(), 2);
  EXPECT_EQ(responses[2].results(0).status(), v1::INSERT_STATUS_UNKNOWN_RUN);
  EXPECT_EQ(responses[2].results(1).status(), v1::INSERT_STATUS_INVALID);
  EXPECT_EQ(responses[2].results(1).message(), "trajectories: expected group_size = 2, got 3");

  v1::BufferStats stats = Stats();
  EXPECT_EQ(stats.size_groups(), 2);
  EXPECT_EQ(stats.inserted_groups(), 2);
  EXPECT_EQ(stats.duplicate_inserts(), 1);
  EXPECT_EQ(stats.rejected_inserts(), 1);
  EXPECT_EQ(stats.accepted(), 2);
  EXPECT_EQ(stats.running(), 0);  // two consumed, one released by the invalid insert

  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub_->Sample(&context);
  ASSERT_TRUE(stream->Write(SampleRequestFor(1, 5000)));
  v1::SampleResponse batch;
  ASSERT_TRUE(stream->Read(&batch));
  EXPECT_FALSE(batch.timed_out());
  EXPECT_THAT(GroupIds(batch), ElementsAre("g0", "g1"));
  EXPECT_EQ(batch.policy_version(), 1);
  for (const v1::SampledGroup& sampled : batch.groups()) {
    EXPECT_EQ(sampled.staleness(), 1);
    EXPECT_EQ(sampled.times_sampled(), 1);
    EXPECT_EQ(sampled.group().min_policy_version(), 0);
    EXPECT_GT(sampled.group().inserted_at().seconds(), 0);
    EXPECT_EQ(sampled.group().trajectories_size(), 2);
  }
  ASSERT_TRUE(stream->Write(SampleRequestFor(1, 50)));
  v1::SampleResponse empty;
  ASSERT_TRUE(stream->Read(&empty));
  EXPECT_TRUE(empty.timed_out());
  EXPECT_EQ(empty.groups_size(), 0);
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();

  stats = Stats();
  EXPECT_EQ(stats.sampled_groups(), 2);
  EXPECT_EQ(stats.sampled_group_staleness().counts(1), 2);
  EXPECT_EQ(stats.sampled_token_staleness().sum(), 40);

  const std::string metrics = MetricsText();
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_groups{run_id=\"run-s\"} 0"));
  EXPECT_THAT(metrics,
              HasSubstr("sluice_buffer_inserts_total{run_id=\"run-s\",status=\"stored\"} 2"));
  EXPECT_THAT(metrics,
              HasSubstr("sluice_buffer_inserts_total{run_id=\"run-s\",status=\"duplicate\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_sampled_groups_total{run_id=\"run-s\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_evictions_total{reason=\"max_times_sampled\","
                                 "run_id=\"run-s\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_policy_version{run_id=\"run-s\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_admission_limit{run_id=\"run-s\"} 6"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_max_staleness{run_id=\"run-s\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_admission_accepted{run_id=\"run-s\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_admission_running{run_id=\"run-s\"} 0"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_sampled_staleness_count{run_id=\"run-s\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_admission_wait_seconds_count 1"));
}

// The trainer's steps over the wire: a step's batch comes back unchanged
// (replayed) on a new stream, as for a trainer that restarted, until
// CommitTrainedSteps lets it go; then asking for it ends the stream with
// FAILED_PRECONDITION naming the step.
// The trainer's quarantine (issue 19) arrives with UpdatePolicyVersion; the
// worker's slots and inserts are then PERMISSION_DENIED naming it.
TEST_F(ReplayBufferServiceTest, AQuarantinedWorkerIsPermissionDenied) {
  ASSERT_TRUE(Configure(2, 1).ok());
  v1::UpdatePolicyVersionRequest update;
  update.set_run_id(kRun);
  update.set_policy_version(1);
  update.add_quarantined_worker_ids("rogue");
  {
    v1::UpdatePolicyVersionResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->UpdatePolicyVersion(&context, update, &response).ok());
  }
  v1::AcquireGenerationSlotsRequest acquire;
  acquire.set_run_id(kRun);
  acquire.set_worker_id("rogue");
  acquire.set_worker_incarnation(1);
  acquire.set_num_groups(1);
  {
    v1::AcquireGenerationSlotsResponse slots;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->AcquireGenerationSlots(&context, acquire, &slots);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(), HasSubstr("rollout worker rogue is quarantined"));
  }
  v1::Group forged = MakeGroup(kRun, "g0", 2, 1);
  for (v1::Trajectory& t : *forged.mutable_trajectories()) t.set_rollout_worker_id("rogue");
  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub_->InsertGroups(&context);
  v1::InsertGroupsRequest request;
  *request.add_groups() = forged;
  ASSERT_TRUE(stream->Write(request));
  v1::InsertGroupsResponse response;
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(response.results(0).status(), v1::INSERT_STATUS_REFUSED_QUARANTINED);
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("quarantined for run run-s"));
  EXPECT_EQ(Stats().size_groups(), 0);
}

TEST_F(ReplayBufferServiceTest, StepBatchesAreReplayedUntilCommitted) {
  ASSERT_TRUE(Configure(2, 4).ok());
  InsertOnOneStream({{MakeGroup(kRun, "g0", 2, 0), MakeGroup(kRun, "g1", 2, 0),
                      MakeGroup(kRun, "g2", 2, 0), MakeGroup(kRun, "g3", 2, 0)}});
  const auto sample_steps = [&](const std::vector<int64_t>& steps, grpc::Status* end) {
    std::vector<v1::SampleResponse> responses;
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub_->Sample(&context);
    for (const int64_t step : steps) {
      v1::SampleRequest request = SampleRequestFor(0, 1000);
      request.set_step(step);
      if (!stream->Write(request)) break;
      v1::SampleResponse response;
      if (!stream->Read(&response)) break;
      responses.push_back(response);
    }
    stream->WritesDone();
    *end = stream->Finish();
    return responses;
  };
  grpc::Status end;
  std::vector<v1::SampleResponse> first = sample_steps({1, 2}, &end);
  ASSERT_TRUE(end.ok()) << end.error_message();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_THAT(GroupIds(first[0]), ElementsAre("g0", "g1"));
  EXPECT_FALSE(first[0].replayed());

  std::vector<v1::SampleResponse> again = sample_steps({1, 2}, &end);
  ASSERT_TRUE(end.ok()) << end.error_message();
  ASSERT_EQ(again.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(again[i].replayed());
    EXPECT_EQ(GroupIds(again[i]), GroupIds(first[i]));
    EXPECT_EQ(again[i].buffer_version(), first[i].buffer_version());
  }
  v1::BufferStats stats = Stats();
  EXPECT_EQ(stats.sampled_groups(), 4);  // counted once
  EXPECT_EQ(stats.sampled_group_staleness().counts(0), 4);
  EXPECT_EQ(stats.retained_groups(), 4);
  EXPECT_GT(stats.retained_bytes(), 0);
  EXPECT_EQ(stats.last_recorded_step(), 2);
  EXPECT_EQ(stats.replayed_batches(), 2);

  v1::CommitTrainedStepsRequest commit;
  commit.set_run_id(kRun);
  commit.set_step(1);
  v1::CommitTrainedStepsResponse committed;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->CommitTrainedSteps(&context, commit, &committed).ok());
  }
  EXPECT_EQ(committed.committed_step(), 1);
  EXPECT_EQ(committed.released_groups(), 2);
  stats = Stats();
  EXPECT_EQ(stats.committed_step(), 1);
  EXPECT_EQ(stats.retained_groups(), 2);

  std::vector<v1::SampleResponse> gone = sample_steps({1}, &end);
  EXPECT_TRUE(gone.empty());
  EXPECT_EQ(end.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(end.error_message(), HasSubstr("step 1 of run run-s was committed"));
  gone = sample_steps({4}, &end);
  EXPECT_EQ(end.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(end.error_message(), HasSubstr("is ahead of the next step to sample, 3"));

  commit.set_run_id("no-such-run");
  grpc::ClientContext context;
  SetDeadline(context);
  EXPECT_EQ(stub_->CommitTrainedSteps(&context, commit, &committed).error_code(),
            grpc::StatusCode::NOT_FOUND);
  const std::string metrics = MetricsText();
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_retained_groups{run_id=\"run-s\"} 2"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_committed_step{run_id=\"run-s\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_replayed_batches_total{run_id=\"run-s\"} 2"));
  // Replays are not observed again in the delivered-staleness histogram.
  EXPECT_THAT(metrics, HasSubstr("sluice_buffer_sampled_staleness_count{run_id=\"run-s\"} 4"));
}

TEST_F(ReplayBufferServiceTest, GetStatsCarriesTheServicesIncarnation) {
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->GetStats(&context, v1::GetStatsRequest(), &response).ok());
  EXPECT_EQ(response.incarnation(), service_->incarnation());
  EXPECT_GT(response.incarnation(), uint64_t{1'600'000'000} * 1'000'000'000);  // ns, after 2020
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> buffer = ReplayBuffer::Create();
  ASSERT_TRUE(buffer.ok());
  prometheus::Registry registry;
  ReplayBufferServiceImpl later(std::move(buffer).value(), registry);
  EXPECT_GT(later.incarnation(), service_->incarnation());
}

TEST_F(ReplayBufferServiceTest, SampleAnswersPrefetchedRequestsInOrder) {
  ASSERT_TRUE(Configure(2, 4).ok());
  InsertOnOneStream({{MakeGroup(kRun, "g0", 2, 0), MakeGroup(kRun, "g1", 2, 0),
                      MakeGroup(kRun, "g2", 2, 0), MakeGroup(kRun, "g3", 2, 0)}});
  grpc::ClientContext context;
  SetDeadline(context);
  auto loopback = LoopbackStub();
  auto stream = loopback->Sample(&context);
  ASSERT_TRUE(stream->Write(SampleRequestFor(0, 5000)));
  ASSERT_TRUE(stream->Write(SampleRequestFor(0, 5000)));
  v1::SampleResponse first;
  v1::SampleResponse second;
  ASSERT_TRUE(stream->Read(&first));
  ASSERT_TRUE(stream->Read(&second));
  EXPECT_THAT(GroupIds(first), ElementsAre("g0", "g1"));
  EXPECT_THAT(GroupIds(second), ElementsAre("g2", "g3"));
  EXPECT_LT(first.buffer_version(), second.buffer_version());
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ReplayBufferServiceTest, SampleWaitsForEnoughInserts) {
  ASSERT_TRUE(Configure(1, 4).ok());
  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub_->Sample(&context);
  ASSERT_TRUE(stream->Write(SampleRequestFor(0, 0)));  // 0 = the default wait (10 s)
  absl::Notification answered;
  v1::SampleResponse response;
  std::thread reader([&] {
    EXPECT_TRUE(stream->Read(&response));
    answered.Notify();
  });
  EXPECT_FALSE(answered.WaitForNotificationWithTimeout(kStillBlocked));
  InsertOnOneStream({{MakeGroup(kRun, "late", 2, 0)}});
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(kReturns));
  reader.join();
  EXPECT_FALSE(response.timed_out());
  EXPECT_THAT(GroupIds(response), ElementsAre("late"));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ReplayBufferServiceTest, UpdatePolicyVersionEvictsStaleGroupsAndWidensTheGate) {
  ASSERT_TRUE(Configure(2, 0).ok());  // limit (0 + 0 + 1) * 2 = 2
  InsertOnOneStream({{MakeGroup(kRun, "g0", 2, 0), MakeGroup(kRun, "g1", 2, 0)}});
  EXPECT_EQ(Stats().accepted(), 2);

  v1::UpdatePolicyVersionRequest update;
  update.set_run_id(kRun);
  update.set_policy_version(1);
  v1::UpdatePolicyVersionResponse response;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->UpdatePolicyVersion(&context, update, &response).ok());
  }
  EXPECT_EQ(response.policy_version(), 1);
  EXPECT_EQ(response.evicted_stale_groups(), 2);
  EXPECT_EQ(response.admission_limit(), 4);
  update.set_policy_version(0);  // never back
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->UpdatePolicyVersion(&context, update, &response).ok());
  }
  EXPECT_EQ(response.policy_version(), 1);
  EXPECT_EQ(response.evicted_stale_groups(), 0);

  const v1::BufferStats stats = Stats();
  EXPECT_EQ(stats.size_groups(), 0);
  EXPECT_EQ(stats.accepted(), 0);  // the evicted groups gave their capacity back
  int64_t stale = -1;
  for (const v1::EvictionCount& count : stats.evictions()) {
    if (count.reason() == v1::EVICTION_REASON_STALE) stale = count.groups();
  }
  EXPECT_EQ(stale, 2);
  EXPECT_THAT(MetricsText(),
              HasSubstr("sluice_buffer_evictions_total{reason=\"stale\",run_id=\"run-s\"} 2"));
}

TEST_F(ReplayBufferServiceTest, ErrorsNameTheField) {
  ASSERT_TRUE(Configure(2, 1).ok());
  {
    v1::AcquireGenerationSlotsRequest request;
    request.set_run_id("nope");
    request.set_worker_id("w");
    v1::AcquireGenerationSlotsResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->AcquireGenerationSlots(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(status.error_message(), HasSubstr("run_id: run \"nope\" is not configured"));
  }
  {
    v1::AcquireGenerationSlotsRequest request;
    request.set_run_id(kRun);
    request.set_worker_id("w");
    request.set_num_groups(-1);
    v1::AcquireGenerationSlotsResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->AcquireGenerationSlots(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), "num_groups: must be >= 0, got -1");
  }
  {
    v1::GetStatsRequest request;
    v1::GetStatsResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->GetStats(&context, request, &response);
    // No run id: every run.
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.runs_size(), 1);
    EXPECT_EQ(response.runs(0).run_id(), kRun);
    EXPECT_FALSE(response.has_stats());
  }
  {
    v1::UpdatePrioritiesRequest request;
    request.set_run_id(kRun);
    (*request.mutable_priorities())["g0"] = 2.0;
    v1::UpdatePrioritiesResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->UpdatePriorities(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    // g0 is not held: reported, not an error.
    EXPECT_EQ(response.updated(), 0);
    EXPECT_THAT(response.not_found_group_ids(), ElementsAre("g0"));
  }
  {
    v1::UpdatePolicyVersionRequest request;
    request.set_run_id(kRun);
    request.set_policy_version(-1);
    v1::UpdatePolicyVersionResponse response;
    grpc::ClientContext context;
    const grpc::Status status = stub_->UpdatePolicyVersion(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), "policy_version: must be >= 0, got -1");
  }
  const auto sample_error = [&](const v1::SampleRequest& request) {
    grpc::ClientContext context;
    SetDeadline(context);
    auto stream = stub_->Sample(&context);
    EXPECT_TRUE(stream->Write(request));
    v1::SampleResponse response;
    EXPECT_FALSE(stream->Read(&response));
    return stream->Finish();
  };
  grpc::Status status = sample_error(SampleRequestFor(0, 100, -3));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(), "batch_size_groups: must be >= 0 (0 = the run's 2), got -3");
  status = sample_error(SampleRequestFor(0, -1));
  EXPECT_EQ(status.error_message(), "timeout_ms: must be >= 0, got -1");
  v1::SampleRequest unknown = SampleRequestFor(0, 100);
  unknown.set_run_id("nope");
  EXPECT_EQ(sample_error(unknown).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A poisoned group sent over gRPC is refused with the field named, counted
// on /metrics, and never stored; the valid group beside it is.
TEST_F(ReplayBufferServiceTest, PoisonedGroupsAreRefusedNamingTheFieldAndCounted) {
  v1::ConfigureRunRequest configure;
  configure.set_run_id(kRun);
  configure.set_batch_size_groups(2);
  configure.set_max_staleness(1);
  configure.set_group_size(2);
  configure.set_vocab_size(1000);
  configure.set_min_reward(0.0);
  configure.set_max_reward(1.0);
  {
    v1::ConfigureRunResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->ConfigureRun(&context, configure, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  v1::Group nan_logprob = MakeGroup(kRun, "nan", 2, 0);
  nan_logprob.mutable_trajectories(1)->set_behaviour_logprobs(4, std::nanf(""));
  v1::Group huge_reward = MakeGroup(kRun, "huge", 2, 0);
  huge_reward.mutable_trajectories(0)->set_reward(1e300);
  v1::Group out_of_vocabulary = MakeGroup(kRun, "oov", 2, 0);
  out_of_vocabulary.mutable_trajectories(0)->set_completion_token_ids(2, 1000000000);
  v1::Group from_the_future = MakeGroup(kRun, "future", 2, 1'000'000'000'000);
  const std::vector<v1::InsertGroupsResponse> responses = InsertOnOneStream(
      {{nan_logprob, huge_reward, out_of_vocabulary, from_the_future,
        MakeGroup(kRun, "ok", 2, 0)}});
  ASSERT_EQ(responses.size(), 1u);
  const auto& results = responses[0].results();
  ASSERT_EQ(results.size(), 5);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(results[i].status(), v1::INSERT_STATUS_INVALID) << i;
  EXPECT_EQ(results[0].message(),
            "trajectories[1].behaviour_logprobs[4]: must be finite and <= 0, got nan");
  EXPECT_EQ(results[1].message(),
            "trajectories[0].reward: must be in the run's reward range [0, 1], got 1e+300");
  EXPECT_EQ(results[2].message(),
            "trajectories[0].completion_token_ids[2]: must be in [0, 1000) (the model's "
            "vocabulary), got 1000000000");
  EXPECT_THAT(results[3].message(),
              HasSubstr("trajectories[0].token_policy_versions[0]: must not be ahead of policy "
                        "version 1 (the newest the trainer can have published)"));
  EXPECT_EQ(results[4].status(), v1::INSERT_STATUS_STORED);
  const v1::BufferStats stats = Stats();
  EXPECT_EQ(stats.size_groups(), 1);
  EXPECT_EQ(stats.rejected_inserts(), 4);
  EXPECT_THAT(MetricsText(),
              HasSubstr("sluice_buffer_inserts_total{run_id=\"run-s\",status=\"invalid\"} 4"));

  // Bad limits are refused at ConfigureRun, naming the field.
  configure.set_vocab_size(-1);
  configure.set_min_reward(2.0);
  v1::ConfigureRunResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::Status status = stub_->ConfigureRun(&context, configure, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("vocab_size: must be >= 0 (0 = ids unchecked), got -1"));
  EXPECT_THAT(status.error_message(), HasSubstr("min_reward: must be <= max_reward, got 2 > 1"));
}

TEST_F(ReplayBufferServiceTest, ShutdownEndsWaitingAndIdleStreamsPromptly) {
  ASSERT_TRUE(Configure(2, 1).ok());
  grpc::ClientContext waiting_context;
  SetDeadline(waiting_context, 60);
  auto waiting = stub_->Sample(&waiting_context);
  ASSERT_TRUE(waiting->Write(SampleRequestFor(0, 60000)));
  grpc::ClientContext idle_context;
  SetDeadline(idle_context, 60);
  auto idle = stub_->Sample(&idle_context);

  absl::Notification ended;
  grpc::Status waiting_status;
  grpc::Status idle_status;
  std::thread finisher([&] {
    v1::SampleResponse response;
    EXPECT_FALSE(waiting->Read(&response));
    waiting_status = waiting->Finish();
    EXPECT_FALSE(idle->Read(&response));
    idle_status = idle->Finish();
    ended.Notify();
  });
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(kStillBlocked));
  service_->Shutdown();
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(kReturns));
  finisher.join();
  for (const grpc::Status& status : {waiting_status, idle_status}) {
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                status.error_code() == grpc::StatusCode::CANCELLED)
        << status.error_code() << " " << status.error_message();
  }
}

// A buffer with a 64 KiB budget, as sluice-replay-buffer --memory-budget=64KiB.
class ReplayBufferServiceBudgetTest : public ReplayBufferServiceTest {
 protected:
  int64_t MemoryBudget() const override { return 64 << 10; }

  v1::GetStatsResponse AllStats() {
    v1::GetStatsRequest request;
    v1::GetStatsResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    const grpc::Status status = stub_->GetStats(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }
};

TEST_F(ReplayBufferServiceBudgetTest, GetStatsReportsTheBudgetAndWhatTheTablesHold) {
  EXPECT_EQ(AllStats().memory_budget_bytes(), 64 << 10);
  EXPECT_EQ(AllStats().memory_used_bytes(), 0);
  ASSERT_TRUE(Configure(4, 1).ok());
  InsertOnOneStream({{MakeGroup(kRun, "g0", 2, 0), MakeGroup(kRun, "g1", 2, 0)}});
  const v1::GetStatsResponse all = AllStats();
  ASSERT_EQ(all.runs_size(), 1);
  EXPECT_GT(all.memory_used_bytes(), 0);
  EXPECT_EQ(all.memory_used_bytes(), all.runs(0).size_bytes());
}

// What the controller checks at submit, the buffer checks itself: another
// client configuring a run too big for what is left is refused.
TEST_F(ReplayBufferServiceBudgetTest, ConfigureRunOverTheBudgetIsResourceExhausted) {
  v1::ConfigureRunRequest request;
  request.set_run_id(kRun);
  request.set_batch_size_groups(64);
  request.set_max_staleness(1);
  request.set_group_size(8);
  request.set_max_sequence_tokens(1024);
  v1::ConfigureRunResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  const grpc::Status status = stub_->ConfigureRun(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("replay buffer: the run needs about"));
  EXPECT_THAT(status.error_message(), HasSubstr("64.0 KiB"));
  EXPECT_THAT(status.error_message(), HasSubstr("algorithm.batch_size_groups"));
}

// Groups that would take the buffer past its budget are RETRYABLE_ERROR,
// not INVALID: a worker keeps them and retries once the trainer sampled.
TEST_F(ReplayBufferServiceBudgetTest, InsertsPastTheBudgetAreRetryable) {
  ASSERT_TRUE(Configure(4, 1).ok());
  std::vector<v1::Group> groups;
  for (int i = 0; i < 8; ++i) {
    groups.push_back(MakeGroup(kRun, "g" + std::to_string(i), 2, 0, /*tokens=*/1000));
  }
  const std::vector<v1::InsertGroupsResponse> responses = InsertOnOneStream({groups});
  ASSERT_EQ(responses.size(), 1u);
  ASSERT_EQ(responses[0].results_size(), 8);
  int stored = 0;
  for (const v1::InsertGroupResult& result : responses[0].results()) {
    if (result.status() == v1::INSERT_STATUS_STORED) {
      ++stored;
      continue;
    }
    EXPECT_EQ(result.status(), v1::INSERT_STATUS_RETRYABLE_ERROR);
    EXPECT_THAT(result.message(), HasSubstr("over the memory budget"));
  }
  EXPECT_GT(stored, 0);
  EXPECT_LT(stored, 8);
  EXPECT_LE(AllStats().memory_used_bytes(), 64 << 10);
}

}  // namespace
}  // namespace sluice::replay_buffer
