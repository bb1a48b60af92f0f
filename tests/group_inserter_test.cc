// GroupInserter against the real replay buffer service on loopback, reached
// through the real gRPC client wrapped in a fault-injecting decorator; and
// the gRPC client's Sample stream across server-side failures.
#include "services/clients/group_inserter.h"

#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "replay_buffer/replay_buffer.h"
#include "replay_buffer/replay_buffer_service.h"
#include "replay_buffer/test_util.h"
#include "services/clients/grpc_clients.h"
#include "services/clients/retrier.h"
#include "services/runtime/grpc_status.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::clients {
namespace {

using replay_buffer::testing::MakeGroup;
using ::testing::HasSubstr;

constexpr char kRun[] = "run-inserter";
constexpr absl::Duration kStillBlocked = absl::Milliseconds(150);
constexpr absl::Duration kReturns = absl::Seconds(10);

// ---------------------------------------------------------------------------
// FaultInjectingReplayBufferClient
// ---------------------------------------------------------------------------

// What an InsertGroups call the test chose does.
enum class Fault {
  // Fails without forwarding: the request is lost, nothing is stored.
  kFailBeforeForwarding,
  // Forwards, then fails: the buffer stored the groups, the ack is lost.
  kFailAfterForwarding,
  // Forwards only the groups at even positions; answers RETRYABLE_ERROR for
  // the others, as a buffer whose storage failed for them.
  kRetryableForOddGroups,
  // Forwards everything, then drops the results of the groups at odd
  // positions from the answer (a partly lost ack).
  kDropOddResultsAfterForwarding,
};

std::string FaultName(Fault fault) {
  switch (fault) {
    case Fault::kFailBeforeForwarding:
      return "Before";
    case Fault::kFailAfterForwarding:
      return "After";
    case Fault::kRetryableForOddGroups:
      return "RetryableOdd";
    case Fault::kDropOddResultsAfterForwarding:
      return "DropOddResults";
  }
  return "?";
}

// Decorates a ReplayBufferClient: InsertGroups calls the test chose fail or
// are answered partly (see Fault); every InsertGroups request is recorded.
// Other calls pass through untouched. Thread-safe.
class FaultInjectingReplayBufferClient final : public ReplayBufferClient {
 public:
  explicit FaultInjectingReplayBufferClient(ReplayBufferClient* inner) : inner_(inner) {}

  // InsertGroups call number `call` (0-based) does `fault`; the failing
  // kinds fail with `code` (not OK).
  void SetInsertFault(int call, Fault fault, absl::StatusCode code = absl::StatusCode::kUnknown) {
    absl::MutexLock lock(&mu_);
    planned_[call] = {fault, code};
  }
  // Every `every`-th InsertGroups call fails with `code`, before and after
  // forwarding in turn.
  void FailEveryNthInsert(int every, absl::StatusCode code) {
    absl::MutexLock lock(&mu_);
    every_ = every;
    every_code_ = code;
  }
  // Runs at the start of every InsertGroups call (e.g. to advance a fake
  // clock, as a slow call would).
  void OnInsertCall(std::function<void()> hook) {
    absl::MutexLock lock(&mu_);
    on_insert_call_ = std::move(hook);
  }

  int num_insert_requests() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(insert_requests_.size());
  }
  std::vector<v1::InsertGroupsRequest> insert_requests() const {
    absl::MutexLock lock(&mu_);
    return insert_requests_;
  }
  // Blocks until at least `n` InsertGroups requests arrived; false when
  // `timeout` passes first.
  bool BlockUntilNumInsertRequestsIs(int n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(insert_requests_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(
      const v1::InsertGroupsRequest& request) override {
    std::optional<std::pair<Fault, absl::StatusCode>> fault;
    std::function<void()> hook;
    {
      absl::MutexLock lock(&mu_);
      const int call = static_cast<int>(insert_requests_.size());
      insert_requests_.push_back(request);
      if (auto it = planned_.find(call); it != planned_.end()) {
        fault = it->second;
      } else if (every_ > 0 && (call + 1) % every_ == 0) {
        fault = {((call + 1) / every_) % 2 == 1 ? Fault::kFailBeforeForwarding
                                                : Fault::kFailAfterForwarding,
                 every_code_};
      }
      hook = on_insert_call_;
    }
    if (hook) hook();
    if (!fault.has_value()) return inner_->InsertGroups(request);
    const absl::Status injected(fault->second, absl::StrCat("injected ", FaultName(fault->first)));
    switch (fault->first) {
      case Fault::kFailBeforeForwarding:
        return injected;
      case Fault::kFailAfterForwarding: {
        absl::StatusOr<v1::InsertGroupsResponse> response = inner_->InsertGroups(request);
        if (!response.ok()) return response;
        return injected;
      }
      case Fault::kRetryableForOddGroups: {
        v1::InsertGroupsRequest even;
        for (int i = 0; i < request.groups_size(); i += 2) *even.add_groups() = request.groups(i);
        absl::StatusOr<v1::InsertGroupsResponse> forwarded = inner_->InsertGroups(even);
        if (!forwarded.ok()) return forwarded;
        v1::InsertGroupsResponse response;
        for (int i = 0; i < request.groups_size(); ++i) {
          if (i % 2 == 0) {
            *response.add_results() = forwarded->results(i / 2);
          } else {
            v1::InsertGroupResult* result = response.add_results();
            result->set_idempotency_key(request.groups(i).idempotency_key());
            result->set_status(v1::INSERT_STATUS_RETRYABLE_ERROR);
            result->set_message("injected storage failure");
          }
        }
        return response;
      }
      case Fault::kDropOddResultsAfterForwarding: {
        absl::StatusOr<v1::InsertGroupsResponse> forwarded = inner_->InsertGroups(request);
        if (!forwarded.ok()) return forwarded;
        v1::InsertGroupsResponse response;
        for (int i = 0; i < forwarded->results_size(); i += 2) {
          *response.add_results() = forwarded->results(i);
        }
        return response;
      }
    }
    return injected;
  }

  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest& request) override {
    return inner_->AcquireGenerationSlots(request);
  }
  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest& request) override {
    return inner_->ReleaseGenerationSlots(request);
  }
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest& request) override {
    return inner_->Sample(request);
  }
  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest& request) override {
    return inner_->UpdatePolicyVersion(request);
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest& request) override {
    return inner_->GetStats(request);
  }
  void CancelSample() override { inner_->CancelSample(); }

 private:
  ReplayBufferClient* const inner_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<int, std::pair<Fault, absl::StatusCode>> planned_ ABSL_GUARDED_BY(mu_);
  int every_ ABSL_GUARDED_BY(mu_) = 0;
  absl::StatusCode every_code_ ABSL_GUARDED_BY(mu_) = absl::StatusCode::kOk;
  std::function<void()> on_insert_call_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::InsertGroupsRequest> insert_requests_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------
// The real replay buffer, served on loopback
// ---------------------------------------------------------------------------

// One replay buffer (core and gRPC service). Shutdown() is what a process
// going down does: blocked calls return UNAVAILABLE, open streams end.
class Buffer {
 public:
  // `memory_budget_bytes`: the buffer's --memory-budget (0 = none).
  explicit Buffer(int64_t memory_budget_bytes = 0) {
    replay_buffer::RunTableOptions options;
    options.memory = std::make_shared<replay_buffer::MemoryAccount>(memory_budget_bytes);
    absl::StatusOr<std::unique_ptr<replay_buffer::ReplayBuffer>> buffer =
        replay_buffer::ReplayBuffer::Create(options);
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    service_ = std::make_shared<replay_buffer::ReplayBufferServiceImpl>(
        std::shared_ptr<replay_buffer::ReplayBuffer>(std::move(buffer).value()), registry_);
  }
  replay_buffer::ReplayBufferServiceImpl* service() { return service_.get(); }
  void Shutdown() { service_->Shutdown(); }

 private:
  prometheus::Registry registry_;
  std::shared_ptr<replay_buffer::ReplayBufferServiceImpl> service_;
};

// A gRPC server on a free loopback port for `service`, plus an in-process
// stub for the calls ReplayBufferClient does not have (ConfigureRun).
class LoopbackServer {
 public:
  explicit LoopbackServer(grpc::Service* service) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    EXPECT_NE(server_, nullptr);
    target_ = absl::StrCat("127.0.0.1:", port);
    stub_ = v1::ReplayBufferService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  ~LoopbackServer() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }

  const std::string& target() const { return target_; }

  absl::Status Configure(int group_size, int batch_size_groups, int max_staleness,
                         const std::string& run_id = kRun) {
    v1::ConfigureRunRequest request;
    request.set_run_id(run_id);
    request.set_group_size(group_size);
    request.set_batch_size_groups(batch_size_groups);
    request.set_max_staleness(max_staleness);
    v1::ConfigureRunResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return runtime::FromGrpcStatus(stub_->ConfigureRun(&context, request, &response));
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
  std::unique_ptr<v1::ReplayBufferService::Stub> stub_;
};

v1::BufferStats Stats(ReplayBufferClient& client) {
  v1::GetStatsRequest request;
  request.set_run_id(kRun);
  absl::StatusOr<v1::GetStatsResponse> response = client.GetStats(request);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? response->stats() : v1::BufferStats();
}

int64_t Evicted(const v1::BufferStats& stats, v1::EvictionReason reason) {
  for (const v1::EvictionCount& count : stats.evictions()) {
    if (count.reason() == reason) return count.groups();
  }
  return 0;
}

std::vector<v1::Group> Groups(const std::string& prefix, int n, int group_size = 2,
                              int64_t policy_version = 0) {
  std::vector<v1::Group> groups;
  for (int i = 0; i < n; ++i) {
    groups.push_back(MakeGroup(kRun, absl::StrCat(prefix, "-", i), group_size, policy_version,
                               /*tokens=*/4));
  }
  return groups;
}

std::vector<std::string> Keys(const std::vector<v1::Group>& groups) {
  std::vector<std::string> keys;
  for (const v1::Group& group : groups) keys.push_back(group.idempotency_key());
  return keys;
}

std::vector<std::string> Keys(const v1::InsertGroupsRequest& request) {
  return Keys(std::vector<v1::Group>(request.groups().begin(), request.groups().end()));
}

// Takes `n` groups in one batch; returns their idempotency keys.
std::multiset<std::string> SampleKeys(ReplayBufferClient& client, int n) {
  v1::SampleRequest request;
  request.set_run_id(kRun);
  request.set_batch_size_groups(n);
  request.set_timeout_ms(5000);
  absl::StatusOr<v1::SampleResponse> response = client.Sample(request);
  EXPECT_TRUE(response.ok()) << response.status();
  std::multiset<std::string> keys;
  if (!response.ok()) return keys;
  EXPECT_FALSE(response->timed_out());
  for (const v1::SampledGroup& sampled : response->groups()) {
    keys.insert(sampled.group().idempotency_key());
  }
  return keys;
}

// A clock that moves only when told to, and a sleep that moves it.
class FakeTime {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  bool Sleep(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
    sleeps_.push_back(d);
    return true;
  }
  std::vector<absl::Duration> sleeps() const {
    absl::MutexLock lock(&mu_);
    return sleeps_;
  }
  absl::Duration Elapsed() const { return Now() - kStart; }

  static inline const absl::Time kStart = absl::FromUnixSeconds(1'800'000'000);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = kStart;
  std::vector<absl::Duration> sleeps_ ABSL_GUARDED_BY(mu_);
};

// The real service on loopback, the real gRPC client, a fault injector over
// it and fake time: nothing in these tests really sleeps.
class GroupInserterTest : public ::testing::Test {
 protected:
  GroupInserterTest()
      : server_(buffer_.service()),
        grpc_client_(NewGrpcReplayBufferClient(server_.target())),
        faulty_(grpc_client_.get()) {}

  void SetUp() override { ASSERT_TRUE(server_.Configure(/*group_size=*/2, 4, 2).ok()); }

  void TearDown() override { buffer_.Shutdown(); }

  GroupInserterOptions Options() {
    GroupInserterOptions options;
    options.deadline = absl::Seconds(30);
    options.max_attempts = 10;
    options.initial_backoff = absl::Milliseconds(100);
    options.max_backoff = absl::Seconds(1);
    options.jitter = 0.5;
    options.seed = 7;
    options.clock = [this] { return time_.Now(); };
    options.sleep = [this](absl::Duration d) { return time_.Sleep(d); };
    return options;
  }

  std::unique_ptr<GroupInserter> NewInserter(GroupInserterOptions options) {
    absl::StatusOr<std::unique_ptr<GroupInserter>> inserter =
        GroupInserter::Create(faulty_, std::move(options));
    EXPECT_TRUE(inserter.ok()) << inserter.status();
    return inserter.ok() ? std::move(inserter).value() : nullptr;
  }

  Buffer buffer_;
  LoopbackServer server_;
  std::unique_ptr<ReplayBufferClient> grpc_client_;
  FaultInjectingReplayBufferClient faulty_;
  FakeTime time_;
};

// ---------------------------------------------------------------------------
// Transient faults: every group stored exactly once
// ---------------------------------------------------------------------------

class TransientFaultTest
    : public GroupInserterTest,
      public ::testing::WithParamInterface<std::tuple<absl::StatusCode, Fault>> {
 protected:
  absl::StatusCode code() const { return std::get<0>(GetParam()); }
  Fault fault() const { return std::get<1>(GetParam()); }
  // A failure after forwarding means the buffer has the groups already.
  v1::InsertStatus ExpectedAfterRetry() const {
    return fault() == Fault::kFailAfterForwarding ? v1::INSERT_STATUS_DUPLICATE
                                                  : v1::INSERT_STATUS_STORED;
  }
};

TEST_P(TransientFaultTest, RetriesAndStoresEveryGroupExactlyOnce) {
  faulty_.SetInsertFault(0, fault(), code());
  std::unique_ptr<GroupInserter> inserter = NewInserter(Options());
  const std::vector<v1::Group> groups = Groups("g", 5);

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(groups);

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->status.ok()) << outcome->status;
  EXPECT_EQ(outcome->attempts, 2);
  ASSERT_EQ(outcome->groups.size(), 5u);
  std::set<int64_t> sequences;
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupInsertResult& result = outcome->groups[i];
    EXPECT_EQ(result.idempotency_key, groups[i].idempotency_key());
    EXPECT_EQ(result.status, ExpectedAfterRetry()) << v1::InsertStatus_Name(result.status);
    EXPECT_EQ(result.sends, 2);
    sequences.insert(result.buffer_sequence);
  }
  EXPECT_EQ(sequences.size(), 5u) << "each group has its own buffer sequence";
  EXPECT_EQ(outcome->stored(), 5);
  EXPECT_EQ(outcome->duplicates(), fault() == Fault::kFailAfterForwarding ? 5 : 0);

  // The retry resent the same groups under the same keys.
  const std::vector<v1::InsertGroupsRequest> requests = faulty_.insert_requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(Keys(requests[0]), Keys(groups));
  EXPECT_EQ(Keys(requests[1]), Keys(groups));
  // One backoff, jittered within [initial * (1 - jitter), initial].
  ASSERT_EQ(time_.sleeps().size(), 1u);
  EXPECT_GE(time_.sleeps()[0], absl::Milliseconds(50));
  EXPECT_LE(time_.sleeps()[0], absl::Milliseconds(100));

  // The buffer holds each group once, and counts the resend as a duplicate.
  const v1::BufferStats stats = Stats(*grpc_client_);
  EXPECT_EQ(stats.inserted_groups(), 5);
  EXPECT_EQ(stats.size_groups(), 5);
  EXPECT_EQ(stats.duplicate_inserts(), fault() == Fault::kFailAfterForwarding ? 5 : 0);
  const std::multiset<std::string> sampled = SampleKeys(*grpc_client_, 5);
  const std::vector<std::string> keys = Keys(groups);
  EXPECT_EQ(sampled, std::multiset<std::string>(keys.begin(), keys.end()));
  EXPECT_EQ(Stats(*grpc_client_).size_groups(), 0);
}

TEST_P(TransientFaultTest, ResendsOnlyTheGroupsNotYetConfirmed) {
  // Call 0 stores the even groups and answers RETRYABLE_ERROR for the odd
  // ones; call 1 fails; call 2 goes through.
  faulty_.SetInsertFault(0, Fault::kRetryableForOddGroups);
  faulty_.SetInsertFault(1, fault(), code());
  std::unique_ptr<GroupInserter> inserter = NewInserter(Options());
  const std::vector<v1::Group> groups = Groups("g", 6);

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(groups);

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->status.ok()) << outcome->status;
  EXPECT_EQ(outcome->attempts, 3);
  const std::vector<v1::InsertGroupsRequest> requests = faulty_.insert_requests();
  ASSERT_EQ(requests.size(), 3u);
  const std::vector<std::string> odd = {groups[1].idempotency_key(), groups[3].idempotency_key(),
                                        groups[5].idempotency_key()};
  EXPECT_EQ(Keys(requests[1]), odd);
  EXPECT_EQ(Keys(requests[2]), odd);
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupInsertResult& result = outcome->groups[i];
    if (i % 2 == 0) {
      EXPECT_EQ(result.status, v1::INSERT_STATUS_STORED) << i;
      EXPECT_EQ(result.sends, 1) << i;
    } else {
      EXPECT_EQ(result.status, ExpectedAfterRetry()) << i;
      EXPECT_EQ(result.sends, 3) << i;
    }
  }
  const v1::BufferStats stats = Stats(*grpc_client_);
  EXPECT_EQ(stats.inserted_groups(), 6);
  EXPECT_EQ(stats.size_groups(), 6);
}

INSTANTIATE_TEST_SUITE_P(
    CodesAndFaultPoints, TransientFaultTest,
    ::testing::Combine(
        ::testing::Values(absl::StatusCode::kUnavailable, absl::StatusCode::kCancelled,
                          absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted,
                          absl::StatusCode::kResourceExhausted),
        ::testing::Values(Fault::kFailBeforeForwarding, Fault::kFailAfterForwarding)),
    [](const ::testing::TestParamInfo<std::tuple<absl::StatusCode, Fault>>& info) {
      return absl::StrCat(runtime::StatusCodeName(static_cast<int>(std::get<0>(info.param))), "_",
                          FaultName(std::get<1>(info.param)));
    });

TEST_F(GroupInserterTest, ResendsGroupsWhoseResultsWereMissingAndCountsThemOnce) {
  faulty_.SetInsertFault(0, Fault::kDropOddResultsAfterForwarding);
  std::unique_ptr<GroupInserter> inserter = NewInserter(Options());
  const std::vector<v1::Group> groups = Groups("g", 4);

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(groups);

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->status.ok()) << outcome->status;
  EXPECT_EQ(outcome->attempts, 2);
  EXPECT_EQ(Keys(faulty_.insert_requests()[1]),
            (std::vector<std::string>{groups[1].idempotency_key(), groups[3].idempotency_key()}));
  EXPECT_EQ(outcome->groups[0].status, v1::INSERT_STATUS_STORED);
  EXPECT_EQ(outcome->groups[1].status, v1::INSERT_STATUS_DUPLICATE);
  EXPECT_EQ(outcome->groups[2].status, v1::INSERT_STATUS_STORED);
  EXPECT_EQ(outcome->groups[3].status, v1::INSERT_STATUS_DUPLICATE);
  EXPECT_EQ(Stats(*grpc_client_).inserted_groups(), 4);
}

TEST_F(GroupInserterTest, RefusedGroupsAreFinalAndNeverResent) {
  v1::UpdatePolicyVersionRequest version;
  version.set_run_id(kRun);
  version.set_policy_version(10);
  ASSERT_TRUE(grpc_client_->UpdatePolicyVersion(version).ok());
  std::vector<v1::Group> groups = {
      MakeGroup(kRun, "fresh", 2, /*policy_version=*/10),
      MakeGroup(kRun, "stale", 2, /*policy_version=*/0),
      MakeGroup(kRun, "wrong-size", 3, 10),
      MakeGroup("no-such-run", "lost", 2, 10),
  };
  faulty_.SetInsertFault(0, Fault::kFailAfterForwarding, absl::StatusCode::kUnavailable);
  std::unique_ptr<GroupInserter> inserter = NewInserter(Options());

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(groups);

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->status.ok()) << outcome->status;
  EXPECT_EQ(outcome->groups[0].status, v1::INSERT_STATUS_DUPLICATE);
  EXPECT_EQ(outcome->groups[1].status, v1::INSERT_STATUS_REJECTED_STALE);
  EXPECT_THAT(outcome->groups[1].message, HasSubstr("stale"));
  EXPECT_EQ(outcome->groups[2].status, v1::INSERT_STATUS_INVALID);
  EXPECT_EQ(outcome->groups[3].status, v1::INSERT_STATUS_UNKNOWN_RUN);
  EXPECT_EQ(outcome->stored(), 1);
  EXPECT_EQ(outcome->refused(), 3);
  EXPECT_EQ(outcome->unresolved(), 0);

  // Refusals are answers: with no faults left, nothing is sent twice.
  const int before = faulty_.num_insert_requests();
  std::vector<v1::Group> refused = {MakeGroup(kRun, "stale-2", 2, 0)};
  outcome = inserter->Insert(refused);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->attempts, 1);
  EXPECT_EQ(outcome->groups[0].status, v1::INSERT_STATUS_REJECTED_STALE);
  EXPECT_EQ(faulty_.num_insert_requests(), before + 1);
  EXPECT_EQ(time_.sleeps().size(), 1u) << "only the injected failure backed off";
}

// A buffer at its memory budget answers RETRYABLE_ERROR: the inserter keeps
// the group and sends it again, and it is stored once the trainer has
// sampled and made room. (Treated as a refusal, the generated group would be
// lost.)
TEST(GroupInserterBudgetTest, AnInsertOverTheBuffersBudgetIsRetriedUntilTheTrainerMakesRoom) {
  int64_t group_bytes = 0;
  {
    Buffer unbudgeted;
    LoopbackServer server(unbudgeted.service());
    ASSERT_TRUE(server.Configure(2, 2, 1).ok());
    std::unique_ptr<ReplayBufferClient> client = NewGrpcReplayBufferClient(server.target());
    v1::InsertGroupsRequest request;
    *request.add_groups() = Groups("measure", 1)[0];
    ASSERT_TRUE(client->InsertGroups(request).ok());
    group_bytes = Stats(*client).size_bytes();
    unbudgeted.Shutdown();
  }
  ASSERT_GT(group_bytes, 0);
  Buffer buffer(2 * group_bytes + group_bytes / 2);
  LoopbackServer server(buffer.service());
  ASSERT_TRUE(server.Configure(2, 2, 1).ok());
  std::unique_ptr<ReplayBufferClient> client = NewGrpcReplayBufferClient(server.target());
  GroupInserterOptions options;
  options.seed = 3;
  std::vector<std::string> why;
  options.on_retry = [&](const absl::Status& status, int, absl::Duration) {
    why.emplace_back(status.message());
  };
  // The backoff is when the trainer samples: a batch of the two held groups.
  std::multiset<std::string> trained;
  options.sleep = [&](absl::Duration) {
    if (trained.empty()) trained = SampleKeys(*client, 2);
    return true;
  };
  absl::StatusOr<std::unique_ptr<GroupInserter>> inserter =
      GroupInserter::Create(*client, std::move(options));
  ASSERT_TRUE(inserter.ok()) << inserter.status();

  absl::StatusOr<InsertOutcome> first = (*inserter)->Insert(Groups("measure", 2));
  ASSERT_TRUE(first.ok() && first->status.ok()) << first.status();
  EXPECT_EQ(first->stored(), 2);
  absl::StatusOr<InsertOutcome> over = (*inserter)->Insert(Groups("over", 1));
  ASSERT_TRUE(over.ok()) << over.status();
  EXPECT_TRUE(over->status.ok()) << over->status;
  EXPECT_EQ(over->groups[0].status, v1::INSERT_STATUS_STORED);
  EXPECT_EQ(over->attempts, 2);
  ASSERT_EQ(why.size(), 1u);
  EXPECT_THAT(why[0], HasSubstr("over the memory budget"));
  EXPECT_EQ(trained.size(), 2u);
  EXPECT_EQ(Stats(*client).size_groups(), 1);
  buffer.Shutdown();
}

TEST_F(GroupInserterTest, UnconfirmedOnEveryAttemptGroupsStayUnresolved) {
  // A buffer shutting down refuses every InsertGroups stream (UNAVAILABLE).
  buffer_.Shutdown();
  GroupInserterOptions options = Options();
  options.max_attempts = 3;
  std::unique_ptr<GroupInserter> inserter = NewInserter(options);

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(Groups("g", 2));

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kUnavailable) << outcome->status;
  EXPECT_THAT(outcome->status.message(), HasSubstr("gave up after 3"));
  EXPECT_EQ(outcome->attempts, 3);
  EXPECT_EQ(outcome->unresolved(), 2);
  for (const GroupInsertResult& result : outcome->groups) {
    EXPECT_FALSE(result.stored());
    EXPECT_EQ(result.sends, 3);
    EXPECT_EQ(result.status, v1::INSERT_STATUS_UNSPECIFIED);
    EXPECT_THAT(result.message, HasSubstr("no answer"));
  }
  EXPECT_EQ(time_.sleeps().size(), 2u);
  EXPECT_TRUE(inserter->fatal_error().ok()) << "giving up is not fatal";
}

// ---------------------------------------------------------------------------
// Fatal codes: returned at once, never retried, sticky
// ---------------------------------------------------------------------------

class FatalCodeTest : public GroupInserterTest,
                      public ::testing::WithParamInterface<std::tuple<absl::StatusCode, Fault>> {};

TEST_P(FatalCodeTest, IsReturnedAtOnceWithoutRetryAndSticks) {
  const auto [code, fault] = GetParam();
  faulty_.SetInsertFault(0, fault, code);
  std::unique_ptr<GroupInserter> inserter = NewInserter(Options());

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(Groups("g", 3));

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->status.code(), code) << outcome->status;
  EXPECT_THAT(outcome->status.message(), HasSubstr("non-retryable"));
  EXPECT_EQ(outcome->attempts, 1);
  EXPECT_TRUE(time_.sleeps().empty());
  EXPECT_EQ(outcome->unresolved(), 3);
  for (const GroupInsertResult& result : outcome->groups) {
    // The ack was lost either way: the inserter cannot know.
    EXPECT_EQ(result.status, v1::INSERT_STATUS_UNSPECIFIED);
  }
  EXPECT_EQ(Stats(*grpc_client_).inserted_groups(), fault == Fault::kFailAfterForwarding ? 3 : 0);

  // Sticky: the next Insert fails the same way without calling the buffer.
  absl::StatusOr<InsertOutcome> next = inserter->Insert(Groups("h", 1));
  EXPECT_EQ(next.status().code(), code);
  EXPECT_EQ(faulty_.num_insert_requests(), 1);
  EXPECT_EQ(inserter->fatal_error().code(), code);
  // A fresh inserter starts clean.
  absl::StatusOr<InsertOutcome> fresh = NewInserter(Options())->Insert(Groups("h", 1));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->status.ok()) << fresh->status;
}

INSTANTIATE_TEST_SUITE_P(
    Codes, FatalCodeTest,
    ::testing::Combine(
        ::testing::Values(absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
                          absl::StatusCode::kNotFound, absl::StatusCode::kPermissionDenied,
                          absl::StatusCode::kUnauthenticated, absl::StatusCode::kUnimplemented,
                          absl::StatusCode::kOutOfRange, absl::StatusCode::kDataLoss),
        ::testing::Values(Fault::kFailBeforeForwarding, Fault::kFailAfterForwarding)),
    [](const ::testing::TestParamInfo<std::tuple<absl::StatusCode, Fault>>& info) {
      return absl::StrCat(runtime::StatusCodeName(static_cast<int>(std::get<0>(info.param))), "_",
                          FaultName(std::get<1>(info.param)));
    });

TEST(IsRetryableInsertErrorTest, RetriesTransportAndOverloadCodesOnly) {
  for (absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kCancelled,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kAborted, absl::StatusCode::kInternal, absl::StatusCode::kUnknown}) {
    EXPECT_TRUE(IsRetryableInsertError(code)) << absl::StatusCodeToString(code);
  }
  for (absl::StatusCode code :
       {absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
        absl::StatusCode::kAlreadyExists, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kPermissionDenied, absl::StatusCode::kUnauthenticated,
        absl::StatusCode::kUnimplemented, absl::StatusCode::kOutOfRange,
        absl::StatusCode::kDataLoss}) {
    EXPECT_FALSE(IsRetryableInsertError(code)) << absl::StatusCodeToString(code);
  }
}

// ---------------------------------------------------------------------------
// Deadline, attempts, backoff, abandoning
// ---------------------------------------------------------------------------

TEST_F(GroupInserterTest, DeadlineBoundsBackoffsAndNoAttemptStartsAfterIt) {
  faulty_.FailEveryNthInsert(1, absl::StatusCode::kUnavailable);
  GroupInserterOptions options = Options();
  options.deadline = absl::Seconds(1);
  options.max_attempts = 100;
  options.initial_backoff = absl::Milliseconds(100);
  options.max_backoff = absl::Milliseconds(400);
  options.jitter = 0;
  std::unique_ptr<GroupInserter> inserter = NewInserter(options);

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(Groups("g", 2));

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kDeadlineExceeded) << outcome->status;
  EXPECT_THAT(outcome->status.message(), HasSubstr("deadline of 1s passed"));
  // Every call failed: the buffer was unreachable for the whole deadline,
  // which the caller treats as final.
  EXPECT_TRUE(IsRetriesExhausted(outcome->status));
  EXPECT_THAT(outcome->status.message(), HasSubstr("replay_buffer unreachable"));
  // 100 + 200 + 400 ms, then the last backoff is cut to the 300 ms left.
  EXPECT_EQ(time_.sleeps(),
            (std::vector<absl::Duration>{absl::Milliseconds(100), absl::Milliseconds(200),
                                         absl::Milliseconds(400), absl::Milliseconds(300)}));
  EXPECT_EQ(time_.Elapsed(), absl::Seconds(1));
  EXPECT_EQ(outcome->attempts, 4);
  EXPECT_EQ(faulty_.num_insert_requests(), 4);
  EXPECT_TRUE(inserter->fatal_error().ok()) << "a deadline is not fatal";
}

// Answers every group RETRYABLE_ERROR, as a buffer whose rate limiter or
// memory budget keeps it back.
class AlwaysRetryableBuffer final : public ReplayBufferClient {
 public:
  absl::StatusOr<v1::AcquireGenerationSlotsResponse> AcquireGenerationSlots(
      const v1::AcquireGenerationSlotsRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::ReleaseGenerationSlotsResponse> ReleaseGenerationSlots(
      const v1::ReleaseGenerationSlotsRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::InsertGroupsResponse> InsertGroups(
      const v1::InsertGroupsRequest& request) override {
    v1::InsertGroupsResponse response;
    for (const v1::Group& group : request.groups()) {
      v1::InsertGroupResult* result = response.add_results();
      result->set_idempotency_key(group.idempotency_key());
      result->set_status(v1::INSERT_STATUS_RETRYABLE_ERROR);
      result->set_message("rate limited");
    }
    return response;
  }
  absl::StatusOr<v1::SampleResponse> Sample(const v1::SampleRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::UpdatePolicyVersionResponse> UpdatePolicyVersion(
      const v1::UpdatePolicyVersionRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<v1::GetStatsResponse> GetStats(const v1::GetStatsRequest&) override {
    return absl::UnimplementedError("");
  }
  void CancelSample() override {}
};

// A buffer that answers, but keeps the groups back, is not unreachable: the
// deadline passing is not marked final.
TEST_F(GroupInserterTest, ADeadlinePassedWhileTheBufferAnswersIsNotFinal) {
  AlwaysRetryableBuffer buffer;
  GroupInserterOptions options = Options();
  options.deadline = absl::Seconds(1);
  options.max_attempts = 100;
  absl::StatusOr<std::unique_ptr<GroupInserter>> inserter =
      GroupInserter::Create(buffer, std::move(options));
  ASSERT_TRUE(inserter.ok()) << inserter.status();

  absl::StatusOr<InsertOutcome> outcome = (*inserter)->Insert(Groups("g", 2));

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kDeadlineExceeded) << outcome->status;
  EXPECT_FALSE(IsRetriesExhausted(outcome->status));
  EXPECT_GT(outcome->attempts, 1);
  EXPECT_EQ(outcome->groups[0].status, v1::INSERT_STATUS_RETRYABLE_ERROR);
  EXPECT_EQ(outcome->groups[1].status, v1::INSERT_STATUS_RETRYABLE_ERROR);
}

TEST_F(GroupInserterTest, SlowCallsUseUpTheDeadline) {
  faulty_.FailEveryNthInsert(1, absl::StatusCode::kDeadlineExceeded);
  faulty_.OnInsertCall([this] { time_.Advance(absl::Milliseconds(600)); });
  GroupInserterOptions options = Options();
  options.deadline = absl::Seconds(1);
  options.jitter = 0;
  std::unique_ptr<GroupInserter> inserter = NewInserter(options);

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(Groups("g", 1));

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kDeadlineExceeded) << outcome->status;
  // Call at 0 (ends 0.6 s), backoff 100 ms, call at 0.7 s (ends 1.3 s): done.
  EXPECT_EQ(outcome->attempts, 2);
  EXPECT_EQ(time_.sleeps(), (std::vector<absl::Duration>{absl::Milliseconds(100)}));
}

TEST_F(GroupInserterTest, MaxAttemptsEndsTheInsertWithTheLastError) {
  faulty_.FailEveryNthInsert(1, absl::StatusCode::kAborted);
  GroupInserterOptions options = Options();
  options.max_attempts = 3;
  std::unique_ptr<GroupInserter> inserter = NewInserter(options);

  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(Groups("g", 2));

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kAborted) << outcome->status;
  EXPECT_EQ(outcome->attempts, 3);
  EXPECT_EQ(time_.sleeps().size(), 2u);
  // Calls 0 and 2 failed before forwarding, call 1 after: one group set
  // reached the buffer, but no answer did.
  EXPECT_EQ(outcome->unresolved(), 2);
  EXPECT_EQ(Stats(*grpc_client_).inserted_groups(), 2);
  // The next Insert of the same groups learns they are stored.
  faulty_.FailEveryNthInsert(0, absl::StatusCode::kOk);
  outcome = inserter->Insert(Groups("g", 2));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->duplicates(), 2);
  EXPECT_EQ(Stats(*grpc_client_).inserted_groups(), 2);
}

TEST_F(GroupInserterTest, BackoffGrowsToItsMaximumWithSeededJitter) {
  const auto sleeps_for = [this](uint64_t seed, double jitter) {
    FakeTime time;
    FaultInjectingReplayBufferClient always_failing(grpc_client_.get());
    always_failing.FailEveryNthInsert(1, absl::StatusCode::kUnavailable);
    GroupInserterOptions options = Options();
    options.max_attempts = 7;
    options.initial_backoff = absl::Milliseconds(100);
    options.max_backoff = absl::Milliseconds(800);
    options.jitter = jitter;
    options.seed = seed;
    options.clock = [&time] { return time.Now(); };
    options.sleep = [&time](absl::Duration d) { return time.Sleep(d); };
    auto inserter = GroupInserter::Create(always_failing, options);
    EXPECT_TRUE(inserter.ok());
    EXPECT_TRUE((*inserter)->Insert(Groups("g", 1)).ok());
    return time.sleeps();
  };
  const std::vector<absl::Duration> plain = {absl::Milliseconds(100), absl::Milliseconds(200),
                                             absl::Milliseconds(400), absl::Milliseconds(800),
                                             absl::Milliseconds(800), absl::Milliseconds(800)};
  EXPECT_EQ(sleeps_for(1, 0.0), plain);

  const std::vector<absl::Duration> jittered = sleeps_for(1, 0.5);
  ASSERT_EQ(jittered.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_GE(jittered[i], plain[i] / 2) << i;
    EXPECT_LE(jittered[i], plain[i]) << i;
  }
  EXPECT_EQ(sleeps_for(1, 0.5), jittered) << "same seed, same backoffs";
  EXPECT_NE(sleeps_for(2, 0.5), jittered) << "another seed, other backoffs";
}

TEST_F(GroupInserterTest, SleepReturningFalseAbandonsTheInsert) {
  faulty_.FailEveryNthInsert(1, absl::StatusCode::kUnavailable);
  absl::Notification stop;
  GroupInserterOptions options = Options();
  options.clock = nullptr;  // real time: this test waits for real
  options.deadline = absl::Hours(1);
  options.initial_backoff = absl::Hours(1);
  options.max_backoff = absl::Hours(1);
  // As the rollout worker does: the backoff ends early when it stops.
  options.sleep = [&stop](absl::Duration d) { return !stop.WaitForNotificationWithTimeout(d); };
  std::unique_ptr<GroupInserter> inserter = NewInserter(options);

  absl::Notification returned;
  absl::StatusOr<InsertOutcome> outcome;
  std::thread inserting([&] {
    outcome = inserter->Insert(Groups("g", 2));
    returned.Notify();
  });
  ASSERT_TRUE(faulty_.BlockUntilNumInsertRequestsIs(1, kReturns));
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked)) << "still backing off";
  stop.Notify();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  inserting.join();

  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->status.code(), absl::StatusCode::kCancelled) << outcome->status;
  EXPECT_THAT(outcome->status.message(), HasSubstr("abandoned"));
  EXPECT_EQ(outcome->attempts, 1);
  EXPECT_EQ(faulty_.num_insert_requests(), 1);
}

TEST_F(GroupInserterTest, OnRetryIsToldWhyAndHowLong) {
  faulty_.SetInsertFault(0, Fault::kFailBeforeForwarding, absl::StatusCode::kUnavailable);
  GroupInserterOptions options = Options();
  options.jitter = 0;
  std::vector<std::tuple<absl::StatusCode, int, absl::Duration>> retries;
  options.on_retry = [&](const absl::Status& why, int attempts, absl::Duration backoff) {
    retries.emplace_back(why.code(), attempts, backoff);
  };
  std::unique_ptr<GroupInserter> inserter = NewInserter(options);
  ASSERT_TRUE(inserter->Insert(Groups("g", 1)).ok());
  EXPECT_EQ(retries, (std::vector<std::tuple<absl::StatusCode, int, absl::Duration>>{
                         {absl::StatusCode::kUnavailable, 1, absl::Milliseconds(100)}}));
}

// ---------------------------------------------------------------------------
// Input and options
// ---------------------------------------------------------------------------

TEST_F(GroupInserterTest, RefusesGroupsWithoutOrWithSharedKeysBeforeSendingAnything) {
  std::unique_ptr<GroupInserter> inserter = NewInserter(Options());
  std::vector<v1::Group> keyless = Groups("g", 2);
  keyless[1].clear_idempotency_key();
  absl::StatusOr<InsertOutcome> outcome = inserter->Insert(keyless);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outcome.status().message(), HasSubstr("group 1 (group_id \"g-1\")"));

  std::vector<v1::Group> shared = Groups("g", 3);
  shared[2].set_idempotency_key(shared[0].idempotency_key());
  outcome = inserter->Insert(shared);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outcome.status().message(), HasSubstr("groups 0 and 2 share"));

  EXPECT_EQ(faulty_.num_insert_requests(), 0);
  EXPECT_TRUE(inserter->fatal_error().ok()) << "bad input is not sticky";

  outcome = inserter->Insert({});
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->status.ok());
  EXPECT_EQ(outcome->attempts, 0);
  EXPECT_EQ(faulty_.num_insert_requests(), 0);
}

TEST_F(GroupInserterTest, CreateNamesEveryBadOption) {
  GroupInserterOptions options;
  options.deadline = absl::ZeroDuration();
  options.max_attempts = 0;
  options.initial_backoff = absl::Seconds(2);
  options.max_backoff = absl::Seconds(1);
  options.backoff_multiplier = 0.5;
  options.jitter = 1.5;
  absl::StatusOr<std::unique_ptr<GroupInserter>> inserter = GroupInserter::Create(faulty_, options);
  ASSERT_EQ(inserter.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* field : {"deadline: must be > 0", "max_attempts: must be >= 1, got 0",
                            "max_backoff: must be >= initial_backoff",
                            "backoff_multiplier: must be >= 1", "jitter: must be in [0, 1]"}) {
    EXPECT_THAT(inserter.status().message(), HasSubstr(field));
  }
  EXPECT_TRUE(GroupInserterOptions().Validate().ok());
}

// ---------------------------------------------------------------------------
// Stress: more threads than cores, periodic faults of both kinds
// ---------------------------------------------------------------------------

TEST_F(GroupInserterTest, StressEveryGroupStoredAndSampledExactlyOnce) {
  constexpr int kWriters = 16;
  constexpr int kInsertsPerWriter = 25;
  constexpr int kGroupsPerInsert = 4;
  constexpr int kFailEvery = 3;
  constexpr int kSamplers = 3;
  constexpr int kTotal = kWriters * kInsertsPerWriter * kGroupsPerInsert;
  const absl::StatusCode kCodes[] = {absl::StatusCode::kUnavailable, absl::StatusCode::kCancelled,
                                     absl::StatusCode::kDeadlineExceeded,
                                     absl::StatusCode::kAborted,
                                     absl::StatusCode::kResourceExhausted};
  // Samplers: one client each (a client samples on one thread), each taking
  // batches of a different size; the one that takes the last group cancels
  // the others' waits.
  std::vector<std::unique_ptr<ReplayBufferClient>> sampler_clients;
  for (int s = 0; s < kSamplers; ++s) {
    sampler_clients.push_back(NewGrpcReplayBufferClient(server_.target()));
  }
  absl::Mutex mu;
  absl::flat_hash_map<std::string, int> times_sampled;  // guarded by mu
  int sampled = 0;                                      // guarded by mu
  std::vector<std::string> sampler_errors;              // guarded by mu
  absl::Notification all_sampled;
  std::vector<std::thread> samplers;
  for (int s = 0; s < kSamplers; ++s) {
    samplers.emplace_back([&, s] {
      v1::SampleRequest request;
      request.set_run_id(kRun);
      request.set_batch_size_groups(s + 1);
      request.set_timeout_ms(5000);
      while (!all_sampled.HasBeenNotified()) {
        absl::StatusOr<v1::SampleResponse> batch = sampler_clients[s]->Sample(request);
        if (!batch.ok()) {
          if (!all_sampled.HasBeenNotified()) {
            absl::MutexLock lock(&mu);
            sampler_errors.push_back(std::string(batch.status().message()));
          }
          return;
        }
        absl::MutexLock lock(&mu);
        for (const v1::SampledGroup& group : batch->groups()) {
          ++times_sampled[group.group().idempotency_key()];
          ++sampled;
        }
        if (sampled >= kTotal && !all_sampled.HasBeenNotified()) {
          all_sampled.Notify();
          for (auto& client : sampler_clients) client->CancelSample();
        }
      }
    });
  }

  // Writers: their own gRPC client each, behind a fault injector that fails
  // every third call, before and after forwarding in turn.
  std::vector<InsertOutcome> outcomes[kWriters];
  absl::Status writer_errors[kWriters];
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      std::unique_ptr<ReplayBufferClient> client = NewGrpcReplayBufferClient(server_.target());
      FaultInjectingReplayBufferClient faulty(client.get());
      faulty.FailEveryNthInsert(kFailEvery, kCodes[w % 5]);
      GroupInserterOptions options;
      options.seed = w;
      options.sleep = [](absl::Duration) { return true; };  // retry at once
      auto inserter = GroupInserter::Create(faulty, options);
      if (!inserter.ok()) {
        writer_errors[w] = inserter.status();
        return;
      }
      for (int i = 0; i < kInsertsPerWriter; ++i) {
        absl::StatusOr<InsertOutcome> outcome =
            (*inserter)->Insert(Groups(absl::StrCat("w", w, "-i", i), kGroupsPerInsert));
        if (!outcome.ok()) {
          writer_errors[w] = outcome.status();
          return;
        }
        if (!outcome->status.ok()) writer_errors[w] = outcome->status;
        outcomes[w].push_back(*std::move(outcome));
      }
    });
  }
  for (std::thread& writer : writers) writer.join();
  const bool drained = all_sampled.WaitForNotificationWithTimeout(absl::Seconds(20));
  if (!drained) {
    for (auto& client : sampler_clients) client->CancelSample();
  }
  for (std::thread& sampler : samplers) sampler.join();

  int64_t stored = 0;
  int64_t duplicates = 0;
  int64_t retried_inserts = 0;
  for (int w = 0; w < kWriters; ++w) {
    EXPECT_TRUE(writer_errors[w].ok()) << "writer " << w << ": " << writer_errors[w];
    for (const InsertOutcome& outcome : outcomes[w]) {
      stored += outcome.stored();
      duplicates += outcome.duplicates();
      retried_inserts += outcome.attempts > 1;
    }
  }
  ASSERT_TRUE(drained) << "sampled only " << sampled << " of " << kTotal;
  EXPECT_EQ(stored, kTotal);
  EXPECT_GT(duplicates, 0) << "acks lost after forwarding come back as duplicates";
  EXPECT_GT(retried_inserts, 0);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(sampler_errors.empty()) << sampler_errors.front();
    EXPECT_EQ(sampled, kTotal);
    EXPECT_EQ(times_sampled.size(), static_cast<size_t>(kTotal));
    for (const auto& [key, times] : times_sampled) EXPECT_EQ(times, 1) << key;
  }
  const v1::BufferStats stats = Stats(*grpc_client_);
  EXPECT_EQ(stats.inserted_groups(), kTotal);
  EXPECT_EQ(stats.sampled_groups(), kTotal);
  EXPECT_EQ(stats.size_groups(), 0);
  EXPECT_EQ(Evicted(stats, v1::EVICTION_REASON_MAX_TIMES_SAMPLED), kTotal);
  // The buffer saw every duplicate a writer saw, and those whose answer was
  // itself lost.
  EXPECT_GE(stats.duplicate_inserts(), duplicates);
}

// ---------------------------------------------------------------------------
// The gRPC client's Sample stream across server-side failures
// ---------------------------------------------------------------------------

// Serves Sample from a replaceable backend (a buffer restarting behind the
// same address), and fails the next Sample stream on command.
class SampleFrontend final : public v1::ReplayBufferService::Service {
 public:
  void SetBackend(replay_buffer::ReplayBufferServiceImpl* backend) {
    absl::MutexLock lock(&mu_);
    backend_ = backend;
  }
  // The next Sample stream reads its first request and ends with `status`.
  void FailNextSampleStream(grpc::Status status) {
    absl::MutexLock lock(&mu_);
    fail_next_ = std::move(status);
  }
  int sample_streams() const {
    absl::MutexLock lock(&mu_);
    return sample_streams_;
  }

  grpc::Status Sample(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SampleResponse, v1::SampleRequest>* stream) override {
    replay_buffer::ReplayBufferServiceImpl* backend;
    std::optional<grpc::Status> fail;
    {
      absl::MutexLock lock(&mu_);
      ++sample_streams_;
      backend = backend_;
      std::swap(fail, fail_next_);
    }
    if (fail.has_value()) {
      v1::SampleRequest request;
      stream->Read(&request);
      return *fail;
    }
    return backend->Sample(context, stream);
  }
  grpc::Status InsertGroups(grpc::ServerContext* context,
                            grpc::ServerReaderWriter<v1::InsertGroupsResponse,
                                                     v1::InsertGroupsRequest>* stream) override {
    return Backend()->InsertGroups(context, stream);
  }
  grpc::Status ConfigureRun(grpc::ServerContext* context, const v1::ConfigureRunRequest* request,
                            v1::ConfigureRunResponse* response) override {
    return Backend()->ConfigureRun(context, request, response);
  }

 private:
  replay_buffer::ReplayBufferServiceImpl* Backend() {
    absl::MutexLock lock(&mu_);
    return backend_;
  }

  mutable absl::Mutex mu_;
  replay_buffer::ReplayBufferServiceImpl* backend_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<grpc::Status> fail_next_ ABSL_GUARDED_BY(mu_);
  int sample_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

class SampleStreamTest : public ::testing::Test {
 protected:
  SampleStreamTest() : server_(&frontend_) {
    frontend_.SetBackend(first_.service());
    client_ = NewGrpcReplayBufferClient(server_.target());
  }
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Fill()); }
  void TearDown() override {
    first_.Shutdown();
    second_.Shutdown();
  }

  // Configures the run on the current backend and inserts `n` groups.
  void Fill(int n = 4) {
    ASSERT_TRUE(server_.Configure(/*group_size=*/2, /*batch_size_groups=*/2, 2).ok());
    v1::InsertGroupsRequest request;
    for (const v1::Group& group : Groups(absl::StrCat("fill", fills_++), n)) {
      *request.add_groups() = group;
    }
    absl::StatusOr<v1::InsertGroupsResponse> response = client_->InsertGroups(request);
    ASSERT_TRUE(response.ok()) << response.status();
  }

  static v1::SampleRequest Request(int64_t timeout_ms = 5000) {
    v1::SampleRequest request;
    request.set_run_id(kRun);
    request.set_batch_size_groups(2);
    request.set_timeout_ms(timeout_ms);
    return request;
  }

  Buffer first_;
  Buffer second_;
  SampleFrontend frontend_;
  LoopbackServer server_;
  std::unique_ptr<ReplayBufferClient> client_;
  int fills_ = 0;
};

class SampleStreamFailureTest : public SampleStreamTest,
                                public ::testing::WithParamInterface<grpc::StatusCode> {};

TEST_P(SampleStreamFailureTest, NextSampleReopensTheStreamAndSucceeds) {
  frontend_.FailNextSampleStream(grpc::Status(GetParam(), "injected"));

  absl::StatusOr<v1::SampleResponse> failed = client_->Sample(Request());
  EXPECT_EQ(failed.status().code(), static_cast<absl::StatusCode>(GetParam())) << failed.status();

  absl::StatusOr<v1::SampleResponse> batch = client_->Sample(Request());
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->groups_size(), 2);
  EXPECT_EQ(frontend_.sample_streams(), 2);
  // And the reopened stream stays open for the next batch.
  batch = client_->Sample(Request());
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->groups_size(), 2);
  EXPECT_EQ(frontend_.sample_streams(), 2);
}

INSTANTIATE_TEST_SUITE_P(Codes, SampleStreamFailureTest,
                         ::testing::Values(grpc::StatusCode::UNAVAILABLE,
                                           grpc::StatusCode::CANCELLED, grpc::StatusCode::INTERNAL,
                                           grpc::StatusCode::FAILED_PRECONDITION),
                         [](const ::testing::TestParamInfo<grpc::StatusCode>& info) {
                           return std::string(runtime::StatusCodeName(info.param));
                         });

TEST_F(SampleStreamTest, ReopensAfterTheBufferRestartsBehindTheSameAddress) {
  absl::StatusOr<v1::SampleResponse> batch = client_->Sample(Request());
  ASSERT_TRUE(batch.ok()) << batch.status();

  // The buffer goes down (its open streams are cancelled) and a new one
  // takes its place.
  first_.Shutdown();
  frontend_.SetBackend(second_.service());
  ASSERT_NO_FATAL_FAILURE(Fill());

  // The old stream is dead: the next call says so...
  absl::StatusOr<v1::SampleResponse> broken = client_->Sample(Request());
  EXPECT_FALSE(broken.ok());
  // ...and the one after reaches the new buffer.
  batch = client_->Sample(Request());
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->groups_size(), 2);
  EXPECT_THAT(batch->groups(0).group().group_id(), HasSubstr("fill1"));
  EXPECT_EQ(frontend_.sample_streams(), 2);
}

TEST_F(SampleStreamTest, BlockedSampleEndsWhenTheBufferGoesDownAndTheNextOneSucceeds) {
  ASSERT_TRUE(client_->Sample(Request()).ok());
  ASSERT_TRUE(client_->Sample(Request()).ok());  // the buffer is empty now

  absl::Notification returned;
  absl::StatusOr<v1::SampleResponse> blocked;
  std::thread sampling([&] {
    blocked = client_->Sample(Request(/*timeout_ms=*/60'000));
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(kStillBlocked)) << "no groups to sample";
  first_.Shutdown();
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(kReturns));
  sampling.join();
  EXPECT_FALSE(blocked.ok());

  frontend_.SetBackend(second_.service());
  ASSERT_NO_FATAL_FAILURE(Fill());
  absl::StatusOr<v1::SampleResponse> batch = client_->Sample(Request());
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->groups_size(), 2);
}

}  // namespace
}  // namespace sluice::clients
