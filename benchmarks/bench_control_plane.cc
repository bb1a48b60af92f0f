// bench_control_plane: the control plane under many rollout workers
// (docs/scaling.md).
//
//   bench_control_plane --workers N [--seconds S] [--cycle-ms C] [--json FILE]
//
// Starts the real sluice-controller, sluice-replay-buffer and
// sluice-reward-server as child processes on loopback, hosts a stand-in
// trainer in this process (it answers the controller's StartTraining and
// status calls, reports its state, and samples batches from the buffer and
// publishes a version per batch, as a trainer that keeps up would: no model,
// so that the two cores measure the control plane and not a learner),
// submits one run, and then simulates N rollout workers. Each worker
//
//   - heartbeats the controller (WorkerHeartbeat; the first one registers
//     it) every heartbeat_interval_ms the controller answers, and
//   - every --cycle-ms runs one cycle of what a real worker does per
//     generated group: AcquireGenerationSlots (1 slot, no wait) on the
//     buffer, LeasePrompts (1 prompt) on the controller, InsertGroups (one
//     small valid group on a long-lived stream) on the buffer, and
//     ReportRolloutProgress (the prompt completed) on the controller. A
//     refused slot or an empty lease ends the cycle early (counted, not an
//     error; an unused slot is released).
//
// Workers are spread over --lanes client threads, each with its own channel
// (its own TCP connection) and its own InsertGroups stream, and run one RPC
// at a time: a real fleet has one channel per worker; here a lane stands for
// many workers, so that the client side stays a few threads on two cores.
// A lane that falls behind its schedule shows as `client_lag_ms`.
//
// Measured over the window after every worker registered and ran its first
// cycle: per RPC, calls/s, p50 and p99 latency (client-side, request to
// answer; for InsertGroups, write to acknowledgement) and errors. The
// baseline, measured in the same run over the same lanes and connections:
// the gRPC health check (grpc.health.v1.Health/Check) of the controller and
// of the buffer, the floor of any RPC to that process under the same load;
// each RPC's p99 is printed as a ratio of its server's health-check p99.
// The health check with no load (before the workers start) is reported too.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "nlohmann/json.hpp"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"

namespace sluice::bench {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Flags {
  int workers = 1000;
  double seconds = 20;
  int64_t cycle_ms = 5000;
  int64_t heartbeat_interval_ms = 1000;
  int64_t worker_ttl_ms = 10000;
  int lanes = 32;
  int group_size = 2;
  int batch_size_groups = 32;
  int max_staleness = 4;
  int completion_tokens = 4;
  std::string json_path;
  std::string bin_dir;
  std::string work_dir;
  bool keep_dir = false;
};

// The RPCs measured, in the order printed.
enum Rpc {
  kHeartbeat,
  kAcquire,
  kLease,
  kInsert,
  kReport,
  kRelease,
  kControllerHealth,
  kBufferHealth,
  kNumRpcs
};
constexpr const char* kRpcNames[kNumRpcs] = {
    "WorkerHeartbeat",       "AcquireGenerationSlots", "LeasePrompts",
    "InsertGroups",          "ReportRolloutProgress",  "ReleaseGenerationSlots",
    "ControllerHealthCheck", "BufferHealthCheck"};
// Which health check is the floor of each RPC (its server's).
constexpr Rpc kFloorOf[kNumRpcs] = {kControllerHealth, kBufferHealth,      kControllerHealth,
                                    kBufferHealth,     kControllerHealth,  kBufferHealth,
                                    kControllerHealth, kBufferHealth};

struct RpcRecord {
  std::vector<double> latencies_ms;
  int64_t errors = 0;
  std::string first_error;
};

// What one lane measured; merged at the end (no sharing while running).
struct LaneStats {
  RpcRecord rpcs[kNumRpcs];
  int64_t cycles = 0;
  int64_t slots_denied = 0;
  int64_t empty_leases = 0;
  int64_t groups_stored = 0;
  std::vector<double> lag_ms;  // How late each action started.
};

double Percentile(std::vector<double>* values, double q) {
  if (values->empty()) return 0;
  const double rank = std::ceil(q * static_cast<double>(values->size())) - 1;
  const size_t k = std::min(values->size() - 1, static_cast<size_t>(std::max(0.0, rank)));
  const auto kth = values->begin() + static_cast<std::ptrdiff_t>(k);
  std::nth_element(values->begin(), kth, values->end());
  return (*values)[k];
}

// CPU seconds (user + system) the process has used so far; 0 when unknown.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces): state is field 3,
  // utime and stime are fields 14 and 15.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::strtod(field.c_str(), nullptr);
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  // Each lane its own connection (channels with the same arguments would
  // share one subchannel, and so one TCP connection and one server thread).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

// ---------------------------------------------------------------------------
// The stand-in trainer.
// ---------------------------------------------------------------------------

// Answers the controller as a trainer would and consumes the buffer: one
// Sample of B groups per step, each step publishing version step (carried by
// the next Sample and reported to the controller). No model.
class StandInTrainer final : public v1::TrainerService::Service {
 public:
  explicit StandInTrainer(std::string buffer_address) : buffer_address_(std::move(buffer_address)) {}
  ~StandInTrainer() override { Stop(); }

  void SetControllerAddress(const std::string& address) { controller_address_ = address; }

  grpc::Status StartTraining(grpc::ServerContext*, const v1::StartTrainingRequest* request,
                             v1::StartTrainingResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (run_id_.empty()) {
      run_id_ = request->run_id();
      state_ = v1::TRAINER_STATE_WAITING_FOR_DATA;
      thread_ = std::thread([this, run_id = run_id_] { Loop(run_id); });
    }
    FillLocked(response->mutable_status());
    return grpc::Status::OK;
  }
  grpc::Status StopTraining(grpc::ServerContext*, const v1::StopTrainingRequest*,
                            v1::StopTrainingResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    state_ = v1::TRAINER_STATE_IDLE;
    FillLocked(response->mutable_status());
    return grpc::Status::OK;
  }
  grpc::Status GetTrainerStatus(grpc::ServerContext*, const v1::GetTrainerStatusRequest*,
                                v1::GetTrainerStatusResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    FillLocked(response->mutable_status());
    return grpc::Status::OK;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      if (sample_context_ != nullptr) sample_context_->TryCancel();
    }
    if (thread_.joinable()) thread_.join();
  }

  int64_t steps() const { return steps_.load(); }
  std::string error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  void FillLocked(v1::TrainerStatus* status) {
    status->set_run_id(run_id_);
    status->set_state(state_);
    status->set_step(steps_.load());
    status->set_policy_version(steps_.load());
    status->set_incarnation(incarnation_);
    status->set_resumed_from_step(-1);
  }

  bool Report(v1::ControllerService::Stub* controller, const std::string& run_id,
              v1::TrainerState state, int64_t step) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ReportTrainerProgressRequest request;
    request.set_run_id(run_id);
    request.set_state(state);
    request.set_policy_version(step);
    if (step > 0) {
      v1::TrainingStepMetrics& metrics = *request.mutable_step();
      metrics.set_step(step);
      metrics.set_policy_version(step);
      metrics.set_groups(batch_groups_);
    }
    v1::ReportTrainerProgressResponse response;
    const grpc::Status status = controller->ReportTrainerProgress(&context, request, &response);
    if (!status.ok()) SetError(absl::StrCat("ReportTrainerProgress: ", status.error_message()));
    return status.ok() && !response.stop();
  }

  void SetError(const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = error;
  }

  void Loop(const std::string& run_id) {
    auto controller = v1::ControllerService::NewStub(Channel(controller_address_));
    auto buffer = v1::ReplayBufferService::NewStub(Channel(buffer_address_));
    if (!Report(controller.get(), run_id, v1::TRAINER_STATE_WAITING_FOR_DATA, 0)) return;
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      sample_context_ = &context;
    }
    auto stream = buffer->Sample(&context);
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) break;
      }
      v1::SampleRequest request;
      request.set_run_id(run_id);
      request.set_trainer_policy_version(steps_.load());
      request.set_timeout_ms(500);
      v1::SampleResponse response;
      if (!stream->Write(request) || !stream->Read(&response)) break;
      if (response.timed_out()) continue;
      batch_groups_ = response.groups_size();
      const int64_t step = ++steps_;
      {
        std::lock_guard<std::mutex> lock(mu_);
        state_ = v1::TRAINER_STATE_TRAINING;
      }
      if (!Report(controller.get(), run_id, v1::TRAINER_STATE_TRAINING, step)) break;
    }
    stream->WritesDone();
    const grpc::Status finished = stream->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    sample_context_ = nullptr;
    if (!stopping_ && !finished.ok()) error_ = absl::StrCat("Sample: ", finished.error_message());
  }

  const std::string buffer_address_;
  std::string controller_address_;
  const uint64_t incarnation_ = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  std::atomic<int64_t> steps_{0};
  int batch_groups_ = 0;  // Only the loop thread.
  std::mutex mu_;
  std::string run_id_;
  v1::TrainerState state_ = v1::TRAINER_STATE_IDLE;
  bool stopping_ = false;
  grpc::ClientContext* sample_context_ = nullptr;
  std::string error_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// Simulated workers.
// ---------------------------------------------------------------------------

struct SimWorker {
  std::string worker_id;
  uint64_t incarnation = 0;
  int64_t policy_version = 0;
  bool assigned = false;
  int64_t groups_inserted = 0;
};

struct Window {
  Clock::time_point start;
  Clock::time_point end;
  bool Contains(Clock::time_point t) const { return t >= start && t < end; }
};

// One client thread, its connections and its share of the workers.
class Lane {
 public:
  Lane(const Flags& flags, const std::string& run_id, const std::string& controller_address,
       const std::string& buffer_address, std::vector<SimWorker*> workers, Window window,
       Clock::time_point t0, int lane_index)
      : flags_(flags),
        run_id_(run_id),
        controller_channel_(Channel(controller_address)),
        buffer_channel_(Channel(buffer_address)),
        controller_(v1::ControllerService::NewStub(controller_channel_)),
        controller_health_(grpc::health::v1::Health::NewStub(controller_channel_)),
        buffer_(v1::ReplayBufferService::NewStub(buffer_channel_)),
        buffer_health_(grpc::health::v1::Health::NewStub(buffer_channel_)),
        workers_(std::move(workers)),
        window_(window),
        t0_(t0),
        lane_index_(lane_index) {}

  void Start() { thread_ = std::thread([this] { Run(); }); }
  void Join() { thread_.join(); }
  LaneStats& stats() { return stats_; }

 private:
  enum class Action { kHeartbeat, kCycle, kProbe };
  struct Due {
    Clock::time_point at;
    Action action;
    size_t worker;
    bool operator>(const Due& other) const { return at > other.at; }
  };

  void Record(Rpc rpc, Clock::time_point start, const grpc::Status& status) {
    if (!window_.Contains(start)) return;
    RpcRecord& record = stats_.rpcs[rpc];
    record.latencies_ms.push_back(MsSince(start));
    if (!status.ok()) {
      ++record.errors;
      if (record.first_error.empty()) {
        record.first_error = absl::StrCat(status.error_code(), ": ", status.error_message());
      }
    }
  }
  void RecordError(Rpc rpc, Clock::time_point start, const std::string& error) {
    if (!window_.Contains(start)) return;
    RpcRecord& record = stats_.rpcs[rpc];
    ++record.errors;
    if (record.first_error.empty()) record.first_error = error;
  }

  static void SetDeadline(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  }

  void Heartbeat(SimWorker& worker, Clock::time_point* next) {
    v1::WorkerHeartbeatRequest request;
    request.set_worker_id(worker.worker_id);
    request.set_incarnation(worker.incarnation);
    request.set_address("127.0.0.1:0");
    v1::RolloutWorkerStatus& status = *request.mutable_status();
    status.set_worker_id(worker.worker_id);
    status.set_incarnation(worker.incarnation);
    status.set_state(worker.assigned ? v1::ROLLOUT_WORKER_STATE_RUNNING
                                     : v1::ROLLOUT_WORKER_STATE_IDLE);
    status.set_current_policy_version(worker.policy_version);
    if (worker.assigned) {
      v1::RolloutRunStatus& run = *status.add_runs();
      run.set_run_id(run_id_);
      run.set_policy_version(worker.policy_version);
      run.set_groups_inserted(worker.groups_inserted);
      run.set_tokens_generated(worker.groups_inserted * flags_.group_size *
                               flags_.completion_tokens);
    }
    v1::WorkerHeartbeatResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    const Clock::time_point start = Clock::now();
    const grpc::Status rpc = controller_->WorkerHeartbeat(&context, request, &response);
    Record(kHeartbeat, start, rpc);
    int64_t interval_ms = flags_.heartbeat_interval_ms;
    if (rpc.ok()) {
      if (response.heartbeat_interval_ms() > 0) interval_ms = response.heartbeat_interval_ms();
      worker.assigned = false;
      for (const v1::RolloutAssignment& assignment : response.assignments()) {
        if (assignment.run_id() == run_id_) worker.assigned = true;
      }
      if (response.superseded()) RecordError(kHeartbeat, start, "superseded");
    }
    *next += std::chrono::milliseconds(interval_ms);
  }

  void Cycle(SimWorker& worker) {
    const Clock::time_point cycle_start = Clock::now();
    if (window_.Contains(cycle_start)) ++stats_.cycles;
    // 1. A generation slot.
    v1::AcquireGenerationSlotsRequest acquire;
    acquire.set_run_id(run_id_);
    acquire.set_worker_id(worker.worker_id);
    acquire.set_worker_incarnation(worker.incarnation);
    acquire.set_num_groups(1);
    v1::AcquireGenerationSlotsResponse slots;
    {
      grpc::ClientContext context;
      SetDeadline(&context);
      const Clock::time_point start = Clock::now();
      const grpc::Status rpc = buffer_->AcquireGenerationSlots(&context, acquire, &slots);
      Record(kAcquire, start, rpc);
      if (!rpc.ok()) return;
    }
    worker.policy_version = slots.policy_version();
    if (slots.granted() == 0) {
      if (window_.Contains(cycle_start)) ++stats_.slots_denied;
      return;
    }
    const std::string slot = slots.lease_ids(0);
    // 2. A prompt.
    v1::LeasePromptsRequest lease;
    lease.set_run_id(run_id_);
    lease.set_worker_id(worker.worker_id);
    lease.set_worker_incarnation(worker.incarnation);
    lease.set_max_prompts(1);
    v1::LeasePromptsResponse leased;
    grpc::Status lease_status;
    {
      grpc::ClientContext context;
      SetDeadline(&context);
      const Clock::time_point start = Clock::now();
      lease_status = controller_->LeasePrompts(&context, lease, &leased);
      Record(kLease, start, lease_status);
    }
    if (!lease_status.ok() || leased.prompts_size() == 0) {
      if (lease_status.ok() && window_.Contains(cycle_start)) ++stats_.empty_leases;
      v1::ReleaseGenerationSlotsRequest release;
      release.set_run_id(run_id_);
      release.set_worker_id(worker.worker_id);
      release.set_worker_incarnation(worker.incarnation);
      release.add_lease_ids(slot);
      release.set_reason("bench: no prompt");
      v1::ReleaseGenerationSlotsResponse released;
      grpc::ClientContext context;
      SetDeadline(&context);
      const Clock::time_point start = Clock::now();
      Record(kRelease, start, buffer_->ReleaseGenerationSlots(&context, release, &released));
      return;
    }
    const v1::Prompt& prompt = leased.prompts(0);
    // 3. The group, on the lane's stream.
    v1::InsertGroupsRequest insert;
    v1::Group& group = *insert.add_groups();
    group.set_group_id(absl::StrCat(prompt.prompt_id(), "/", worker.worker_id));
    group.set_prompt_id(prompt.prompt_id());
    group.set_run_id(run_id_);
    group.set_idempotency_key(absl::StrCat(run_id_, "/", prompt.prompt_id()));
    group.set_slot_lease_id(slot);
    group.set_min_policy_version(worker.policy_version);
    group.set_max_policy_version(worker.policy_version);
    for (int i = 0; i < flags_.group_size; ++i) {
      v1::Trajectory& trajectory = *group.add_trajectories();
      trajectory.set_trajectory_id(absl::StrCat(group.group_id(), "/", i));
      trajectory.set_prompt_id(prompt.prompt_id());
      trajectory.set_group_id(group.group_id());
      trajectory.set_sample_index(i);
      for (int32_t id : prompt.token_ids()) trajectory.add_prompt_token_ids(id);
      if (trajectory.prompt_token_ids_size() == 0) trajectory.add_prompt_token_ids(1);
      for (int t = 0; t < flags_.completion_tokens; ++t) {
        trajectory.add_completion_token_ids(1 + (t + i) % 7);
        trajectory.add_behaviour_logprobs(-0.5f);
        trajectory.add_token_policy_versions(worker.policy_version);
      }
      trajectory.set_finish_reason(v1::FINISH_REASON_LENGTH);
      trajectory.set_reward(i % 2 == 0 ? 1.0 : 0.0);
      trajectory.set_rollout_worker_id(worker.worker_id);
      trajectory.set_worker_incarnation(worker.incarnation);
    }
    {
      const Clock::time_point start = Clock::now();
      const std::string error = InsertOnStream(insert);
      Record(kInsert, start, grpc::Status::OK);
      if (error.empty()) {
        ++worker.groups_inserted;
        if (window_.Contains(start)) ++stats_.groups_stored;
      } else {
        RecordError(kInsert, start, error);
      }
    }
    // 4. The report.
    v1::ReportRolloutProgressRequest report;
    report.set_run_id(run_id_);
    report.set_worker_id(worker.worker_id);
    report.set_worker_incarnation(worker.incarnation);
    report.add_completed_prompt_ids(prompt.prompt_id());
    report.set_tokens_generated(flags_.group_size * flags_.completion_tokens);
    report.set_groups_inserted(1);
    report.set_policy_version(worker.policy_version);
    v1::ReportRolloutProgressResponse reported;
    grpc::ClientContext context;
    SetDeadline(&context);
    const Clock::time_point start = Clock::now();
    Record(kReport, start, controller_->ReportRolloutProgress(&context, report, &reported));
  }

  // Writes one group and reads its acknowledgement; "" when stored (or a
  // duplicate), else what went wrong. Reopens a broken stream once.
  std::string InsertOnStream(const v1::InsertGroupsRequest& request) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (insert_stream_ == nullptr) {
        insert_context_ = std::make_unique<grpc::ClientContext>();
        insert_stream_ = buffer_->InsertGroups(insert_context_.get());
      }
      v1::InsertGroupsResponse response;
      if (insert_stream_->Write(request) && insert_stream_->Read(&response)) {
        if (response.results_size() != 1) return "not one result for one group";
        const v1::InsertGroupResult& result = response.results(0);
        if (result.status() == v1::INSERT_STATUS_STORED ||
            result.status() == v1::INSERT_STATUS_DUPLICATE) {
          return "";
        }
        return absl::StrCat(v1::InsertStatus_Name(result.status()), ": ", result.message());
      }
      const grpc::Status status = insert_stream_->Finish();
      insert_stream_.reset();
      if (attempt == 1) return absl::StrCat("stream ended: ", status.error_message());
    }
    return "unreachable";
  }

  void Probe() {
    grpc::health::v1::HealthCheckRequest request;
    for (Rpc rpc : {kControllerHealth, kBufferHealth}) {
      grpc::health::v1::HealthCheckResponse response;
      grpc::ClientContext context;
      SetDeadline(&context);
      const Clock::time_point start = Clock::now();
      const grpc::Status status =
          (rpc == kControllerHealth ? controller_health_ : buffer_health_)
              ->Check(&context, request, &response);
      Record(rpc, start, status);
    }
  }

  void Run() {
    std::priority_queue<Due, std::vector<Due>, std::greater<Due>> queue;
    const int n = flags_.workers;
    for (size_t i = 0; i < workers_.size(); ++i) {
      // Registrations spread over one heartbeat interval, first cycles over
      // one cycle after that, in a global order across lanes.
      const double phase =
          static_cast<double>(static_cast<int>(i) * flags_.lanes + lane_index_) / n;
      queue.push({t0_ + std::chrono::microseconds(static_cast<int64_t>(
                            phase * 1000.0 * static_cast<double>(flags_.heartbeat_interval_ms))),
                  Action::kHeartbeat, i});
      queue.push({t0_ + std::chrono::milliseconds(flags_.heartbeat_interval_ms) +
                      std::chrono::microseconds(static_cast<int64_t>(
                          phase * 1000.0 * static_cast<double>(flags_.cycle_ms))),
                  Action::kCycle, i});
    }
    // 50 health checks a second of each server in all, staggered across
    // lanes: enough for a p99, too few to be a load of their own.
    const auto probe_interval = std::chrono::milliseconds(20 * flags_.lanes);
    queue.push({t0_ + std::chrono::milliseconds(20 * lane_index_), Action::kProbe, 0});
    while (!queue.empty()) {
      Due due = queue.top();
      // A lane behind its schedule stops at the window's end all the same.
      if (due.at >= window_.end || Clock::now() >= window_.end) break;
      queue.pop();
      std::this_thread::sleep_until(due.at);
      const Clock::time_point now = Clock::now();
      if (window_.Contains(now)) {
        stats_.lag_ms.push_back(std::chrono::duration<double, std::milli>(now - due.at).count());
      }
      switch (due.action) {
        case Action::kHeartbeat: {
          Clock::time_point next = due.at;
          Heartbeat(*workers_[due.worker], &next);
          queue.push({next, Action::kHeartbeat, due.worker});
          break;
        }
        case Action::kCycle:
          if (workers_[due.worker]->assigned) Cycle(*workers_[due.worker]);
          queue.push({due.at + std::chrono::milliseconds(flags_.cycle_ms), Action::kCycle,
                      due.worker});
          break;
        case Action::kProbe:
          Probe();
          queue.push({due.at + probe_interval, Action::kProbe, 0});
          break;
      }
    }
    if (insert_stream_ != nullptr) {
      insert_stream_->WritesDone();
      insert_stream_->Finish().IgnoreError();
    }
  }

  const Flags& flags_;
  const std::string run_id_;
  // The health checks share the lane's connections with its workers' RPCs.
  std::shared_ptr<grpc::Channel> controller_channel_;
  std::shared_ptr<grpc::Channel> buffer_channel_;
  std::unique_ptr<v1::ControllerService::Stub> controller_;
  std::unique_ptr<grpc::health::v1::Health::Stub> controller_health_;
  std::unique_ptr<v1::ReplayBufferService::Stub> buffer_;
  std::unique_ptr<grpc::health::v1::Health::Stub> buffer_health_;
  std::unique_ptr<grpc::ClientContext> insert_context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::InsertGroupsRequest, v1::InsertGroupsResponse>>
      insert_stream_;
  std::vector<SimWorker*> workers_;
  const Window window_;
  const Clock::time_point t0_;
  const int lane_index_;
  LaneStats stats_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// The stack.
// ---------------------------------------------------------------------------

// A service binary on loopback, started and stopped by the bench.
struct Service {
  std::unique_ptr<Subprocess> process;
  std::string address;
};

absl::StatusOr<Service> StartService(const std::string& binary, std::vector<std::string> args,
                                     const std::string& log_path) {
  SubprocessOptions options;
  options.argv = {binary, "--listen-address=127.0.0.1:0", "--metrics-port=-1",
                  absl::StrCat("--ready-fd=", Subprocess::kReadyFd)};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.log_path = log_path;
  options.ready_pipe = true;
  absl::StatusOr<std::unique_ptr<Subprocess>> started = Subprocess::Start(options);
  if (!started.ok()) return started.status();
  absl::StatusOr<std::string> ready = (*started)->WaitReady(absl::Now() + absl::Seconds(60));
  if (!ready.ok()) {
    return absl::Status(ready.status().code(),
                        absl::StrCat(binary, ": ", ready.status().message(), " (see ", log_path,
                                     ")"));
  }
  Service service;
  service.process = std::move(*started);
  service.address = json::parse(*ready).at("grpc").get<std::string>();
  return service;
}

v1::RunSpec BenchSpec(const Flags& flags) {
  v1::RunSpec spec;
  spec.set_name("bench-control-plane");
  spec.set_seed(7);
  spec.mutable_model()->set_builtin("micro");
  auto* arithmetic = spec.mutable_task()->mutable_arithmetic();
  arithmetic->set_max_operand(99);
  arithmetic->set_num_operands(2);
  arithmetic->add_operators("+");
  arithmetic->set_num_prompts(2000);
  spec.mutable_task()->set_eval_split_size(20);
  auto* algorithm = spec.mutable_algorithm();
  algorithm->set_group_size(flags.group_size);
  algorithm->set_batch_size_groups(flags.batch_size_groups);
  algorithm->set_max_staleness(flags.max_staleness);
  algorithm->set_total_steps(1000000);
  spec.mutable_rollout()->mutable_sampling()->set_max_new_tokens(flags.completion_tokens);
  spec.mutable_rollout()->set_max_concurrent_groups_per_worker(1);
  spec.mutable_eval()->set_every_n_steps(1000000);
  return spec;
}

struct RpcSummary {
  std::string name;
  int64_t calls = 0;
  double per_s = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  int64_t errors = 0;
  std::string first_error;
};

int Main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"bench_control_plane: many simulated rollout workers against one controller and "
               "one replay buffer on loopback (docs/scaling.md)"};
  app.add_option("--workers", flags.workers, "simulated rollout workers")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--seconds", flags.seconds, "measured window, after the ramp-up")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--cycle-ms", flags.cycle_ms,
                 "each worker's cycle period: acquire a slot, lease a prompt, insert a group, "
                 "report (a real worker does one per generated group)")
      ->check(CLI::Range(int64_t{1}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--heartbeat-interval-ms", flags.heartbeat_interval_ms,
                 "the controller's --worker-heartbeat-interval-ms (the workers heartbeat as "
                 "often as the controller answers)")
      ->check(CLI::Range(int64_t{10}, int64_t{60000}))
      ->capture_default_str();
  app.add_option("--worker-ttl-ms", flags.worker_ttl_ms, "the controller's --worker-ttl-ms")
      ->capture_default_str();
  app.add_option("--lanes", flags.lanes,
                 "client threads, each with its own connections and InsertGroups stream")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--batch-size-groups", flags.batch_size_groups, "the run's B")
      ->capture_default_str();
  app.add_option("--json", flags.json_path, "write the figures here");
  app.add_option("--bin-dir", flags.bin_dir,
                 "where sluice-controller, sluice-replay-buffer and sluice-reward-server are "
                 "(default: this binary's directory)");
  app.add_option("--work-dir", flags.work_dir,
                 "the services' data and logs (default: a fresh directory under $TMPDIR)");
  app.add_flag("--keep-dir", flags.keep_dir, "keep --work-dir (logs) afterwards");
  CLI11_PARSE(app, argc, argv);
  if (flags.worker_ttl_ms <= 2 * flags.heartbeat_interval_ms) {
    flags.worker_ttl_ms = 10 * flags.heartbeat_interval_ms;
  }
  flags.lanes = std::min(flags.lanes, flags.workers);
  if (flags.bin_dir.empty()) {
    flags.bin_dir = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
  }
  const bool made_dir = flags.work_dir.empty();
  if (made_dir) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/bench_control_plane.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      std::fprintf(stderr, "cannot make a work directory under %s\n", pattern.c_str());
      return 1;
    }
    flags.work_dir = pattern;
  }
  std::filesystem::create_directories(flags.work_dir);
  const std::string& dir = flags.work_dir;
  const auto fail = [&](const std::string& message) {
    std::fprintf(stderr, "bench_control_plane: %s (logs in %s)\n", message.c_str(), dir.c_str());
    return 1;
  };

  // The services. The buffer is durable (a data directory, the default
  // fsync policy) as in a deployment.
  absl::StatusOr<Service> buffer = StartService(
      flags.bin_dir + "/sluice-replay-buffer", {"--data-dir=" + dir + "/buffer"},
      dir + "/replay_buffer.log");
  if (!buffer.ok()) return fail(std::string(buffer.status().message()));
  absl::StatusOr<Service> reward =
      StartService(flags.bin_dir + "/sluice-reward-server", {"--workers=1"},
                   dir + "/reward_server.log");
  if (!reward.ok()) return fail(std::string(reward.status().message()));

  StandInTrainer trainer(buffer->address);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int trainer_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &trainer_port);
  builder.RegisterService(&trainer);
  std::unique_ptr<grpc::Server> trainer_server = builder.BuildAndStart();
  if (trainer_server == nullptr || trainer_port == 0) return fail("cannot start the trainer");
  const std::string trainer_address = absl::StrCat("127.0.0.1:", trainer_port);

  absl::StatusOr<Service> controller = StartService(
      flags.bin_dir + "/sluice-controller",
      {"--runs-dir=" + dir + "/runs", "--trainer-address=" + trainer_address,
       "--replay-buffer-address=" + buffer->address,
       "--reward-server-address=" + reward->address,
       absl::StrCat("--worker-heartbeat-interval-ms=", flags.heartbeat_interval_ms),
       absl::StrCat("--worker-ttl-ms=", flags.worker_ttl_ms)},
      dir + "/controller.log");
  if (!controller.ok()) return fail(std::string(controller.status().message()));
  trainer.SetControllerAddress(controller->address);

  // One run, until it is TRAINING (the stand-in trainer says it waits for
  // data).
  auto control = v1::ControllerService::NewStub(Channel(controller->address));
  std::string run_id;
  {
    grpc::ClientContext context;
    v1::SubmitRunRequest request;
    *request.mutable_spec() = BenchSpec(flags);
    v1::SubmitRunResponse response;
    const grpc::Status status = control->SubmitRun(&context, request, &response);
    if (!status.ok()) return fail(absl::StrCat("SubmitRun: ", status.error_message()));
    run_id = response.run().run_id();
  }
  const auto get_run = [&]() {
    grpc::ClientContext context;
    v1::GetRunRequest request;
    request.set_run_id(run_id);
    v1::GetRunResponse response;
    control->GetRun(&context, request, &response).ok();
    return response.run();
  };
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::WatchRunRequest request;
    request.set_run_id(run_id);
    request.set_min_interval_ms(50);
    auto reader = control->WatchRun(&context, request);
    v1::RunUpdate update;
    v1::RunState state = v1::RUN_STATE_UNSPECIFIED;
    while (reader->Read(&update)) {
      state = update.run().state();
      if (state != v1::RUN_STATE_QUEUED && state != v1::RUN_STATE_PENDING) {
        context.TryCancel();
        break;
      }
    }
    reader->Finish().IgnoreError();
    if (state != v1::RUN_STATE_TRAINING) {
      return fail(absl::StrCat("the run is ", v1::RunState_Name(state), " instead of TRAINING: ",
                               get_run().error_message()));
    }
  }

  // The floor with no load: health checks, one at a time.
  std::vector<double> idle[2];
  {
    auto controller_health = grpc::health::v1::Health::NewStub(Channel(controller->address));
    auto buffer_health = grpc::health::v1::Health::NewStub(Channel(buffer->address));
    for (int i = 0; i < 300; ++i) {
      for (int which = 0; which < 2; ++which) {
        grpc::ClientContext context;
        grpc::health::v1::HealthCheckRequest request;
        grpc::health::v1::HealthCheckResponse response;
        const Clock::time_point start = Clock::now();
        const grpc::Status status =
            (which == 0 ? controller_health : buffer_health)->Check(&context, request, &response);
        if (status.ok() && i >= 20) idle[which].push_back(MsSince(start));
      }
    }
  }

  // The workers.
  std::vector<SimWorker> workers(static_cast<size_t>(flags.workers));
  const uint64_t base_incarnation = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  for (int i = 0; i < flags.workers; ++i) {
    workers[i].worker_id = absl::StrFormat("sim-worker-%06d", i);
    workers[i].incarnation = base_incarnation + static_cast<uint64_t>(i);
  }
  const Clock::time_point t0 = Clock::now() + std::chrono::milliseconds(200);
  const auto ramp = std::chrono::milliseconds(flags.heartbeat_interval_ms + flags.cycle_ms);
  const Window window{t0 + ramp, t0 + ramp + std::chrono::microseconds(static_cast<int64_t>(
                                                   flags.seconds * 1e6))};
  std::vector<std::unique_ptr<Lane>> lanes;
  for (int lane = 0; lane < flags.lanes; ++lane) {
    std::vector<SimWorker*> mine;
    for (int i = lane; i < flags.workers; i += flags.lanes) mine.push_back(&workers[i]);
    lanes.push_back(std::make_unique<Lane>(flags, run_id, controller->address, buffer->address,
                                           std::move(mine), window, t0, lane));
  }
  std::printf("bench_control_plane: %d workers over %d lanes, cycle %lld ms, heartbeat %lld ms; "
              "ramp-up %.1f s, then %.1f s measured\n",
              flags.workers, flags.lanes, static_cast<long long>(flags.cycle_ms),
              static_cast<long long>(flags.heartbeat_interval_ms),
              std::chrono::duration<double>(ramp).count(), flags.seconds);
  std::fflush(stdout);
  // CPU used in the window by each process (the bench's own includes the
  // stand-in trainer, a small share).
  const pid_t pids[3] = {controller->process->pid(), buffer->process->pid(), getpid()};
  const char* const process_names[3] = {"controller", "replay_buffer", "bench_client"};
  double cpu_before[3];
  for (auto& lane : lanes) lane->Start();
  std::this_thread::sleep_until(window.start);
  const int64_t steps_before_window = trainer.steps();
  for (int i = 0; i < 3; ++i) cpu_before[i] = CpuSeconds(pids[i]);
  std::this_thread::sleep_until(window.end);
  double cpu_cores[3];
  for (int i = 0; i < 3; ++i) cpu_cores[i] = (CpuSeconds(pids[i]) - cpu_before[i]) / flags.seconds;
  for (auto& lane : lanes) lane->Join();
  const int64_t steps_in_window = trainer.steps() - steps_before_window;
  const v1::Run run = get_run();

  // Merge.
  LaneStats total;
  for (auto& lane : lanes) {
    LaneStats& stats = lane->stats();
    for (int rpc = 0; rpc < kNumRpcs; ++rpc) {
      RpcRecord& into = total.rpcs[rpc];
      RpcRecord& from = stats.rpcs[rpc];
      into.latencies_ms.insert(into.latencies_ms.end(), from.latencies_ms.begin(),
                               from.latencies_ms.end());
      into.errors += from.errors;
      if (into.first_error.empty()) into.first_error = from.first_error;
    }
    total.cycles += stats.cycles;
    total.slots_denied += stats.slots_denied;
    total.empty_leases += stats.empty_leases;
    total.groups_stored += stats.groups_stored;
    total.lag_ms.insert(total.lag_ms.end(), stats.lag_ms.begin(), stats.lag_ms.end());
  }
  RpcSummary summaries[kNumRpcs];
  for (int rpc = 0; rpc < kNumRpcs; ++rpc) {
    RpcRecord& record = total.rpcs[rpc];
    RpcSummary& summary = summaries[rpc];
    summary.name = kRpcNames[rpc];
    summary.calls = static_cast<int64_t>(record.latencies_ms.size());
    summary.per_s = static_cast<double>(summary.calls) / flags.seconds;
    summary.p50_ms = Percentile(&record.latencies_ms, 0.50);
    summary.p99_ms = Percentile(&record.latencies_ms, 0.99);
    summary.errors = record.errors;
    summary.first_error = record.first_error;
  }
  const double lag_p99 = Percentile(&total.lag_ms, 0.99);
  const double lag_max = total.lag_ms.empty()
                             ? 0
                             : *std::max_element(total.lag_ms.begin(), total.lag_ms.end());
  const double idle_p50[2] = {Percentile(&idle[0], 0.5), Percentile(&idle[1], 0.5)};
  const double idle_p99[2] = {Percentile(&idle[0], 0.99), Percentile(&idle[1], 0.99)};

  // Stop everything: the run (so that its services are told), the services.
  {
    grpc::ClientContext context;
    v1::CancelRunRequest request;
    request.set_run_id(run_id);
    request.set_reason("bench over");
    v1::CancelRunResponse response;
    control->CancelRun(&context, request, &response).IgnoreError();
  }
  const ExitStatus controller_exit = controller->process->Stop(absl::Seconds(20));
  trainer.Stop();
  trainer_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  reward->process->Stop(absl::Seconds(10));
  const ExitStatus buffer_exit = buffer->process->Stop(absl::Seconds(20));

  // Report.
  const double expected_heartbeats = static_cast<double>(flags.workers) * 1000.0 /
                                     static_cast<double>(flags.heartbeat_interval_ms);
  const double expected_cycles =
      static_cast<double>(flags.workers) * 1000.0 / static_cast<double>(flags.cycle_ms);
  std::printf("\n%-24s %10s %10s %10s %8s %12s\n", "rpc", "per_s", "p50_ms", "p99_ms", "errors",
              "p99/floor");
  bool goal_met = true;
  int64_t errors = 0;
  json rpcs = json::object();
  for (int rpc = 0; rpc < kNumRpcs; ++rpc) {
    const RpcSummary& s = summaries[rpc];
    const RpcSummary& floor = summaries[kFloorOf[rpc]];
    const double ratio = floor.p99_ms > 0 ? s.p99_ms / floor.p99_ms : 0;
    std::printf("%-24s %10.1f %10.3f %10.3f %8lld %12.2f\n", s.name.c_str(), s.per_s, s.p50_ms,
                s.p99_ms, static_cast<long long>(s.errors), ratio);
    json entry = {{"calls", s.calls},     {"per_s", s.per_s},   {"p50_ms", s.p50_ms},
                  {"p99_ms", s.p99_ms},   {"errors", s.errors}, {"p99_vs_health_check", ratio}};
    if (!s.first_error.empty()) {
      entry["first_error"] = s.first_error;
      std::printf("    first error: %s\n", s.first_error.c_str());
    }
    rpcs[s.name] = entry;
    errors += s.errors;
    const bool worker_rpc = rpc < kControllerHealth && rpc != kRelease;
    if (worker_rpc && (s.p99_ms >= 10.0 || s.calls == 0)) goal_met = false;
  }
  if (errors > 0) goal_met = false;
  const double heartbeat_fraction = summaries[kHeartbeat].per_s / expected_heartbeats;
  const double cycle_fraction =
      static_cast<double>(total.cycles) / flags.seconds / expected_cycles;
  // Latencies of a load that was not delivered say nothing about that load.
  const bool schedule_kept = heartbeat_fraction >= 0.95 && cycle_fraction >= 0.95;
  if (!schedule_kept) goal_met = false;
  std::printf("\nfloor with no load (health check p50/p99 ms): controller %.3f/%.3f, buffer "
              "%.3f/%.3f\n",
              idle_p50[0], idle_p99[0], idle_p50[1], idle_p99[1]);
  std::printf("heartbeats %.0f/s of %.0f/s scheduled (%.1f%%); cycles %.0f/s of %.0f/s (%.1f%%); "
              "client lag p99 %.1f ms, max %.1f ms\n",
              summaries[kHeartbeat].per_s, expected_heartbeats, 100 * heartbeat_fraction,
              static_cast<double>(total.cycles) / flags.seconds, expected_cycles,
              100 * cycle_fraction, lag_p99, lag_max);
  std::printf("groups stored %.0f/s; slots refused at the gate %lld, empty leases %lld; trainer "
              "steps %.1f/s; run %s, %d workers live\n",
              static_cast<double>(total.groups_stored) / flags.seconds,
              static_cast<long long>(total.slots_denied),
              static_cast<long long>(total.empty_leases),
              static_cast<double>(steps_in_window) / flags.seconds,
              v1::RunState_Name(run.state()).c_str(), run.progress().workers_live());
  std::printf("CPU in the window (cores): controller %.2f, replay buffer %.2f, bench client %.2f "
              "(of %u on this machine, shared with whatever else runs)\n",
              cpu_cores[0], cpu_cores[1], cpu_cores[2], std::thread::hardware_concurrency());
  const std::string trainer_error = trainer.error();
  if (!trainer_error.empty()) std::printf("stand-in trainer: %s\n", trainer_error.c_str());
  std::printf("goal (each worker RPC p99 < 10 ms, no errors, >= 95%% of the schedule done): %s%s\n",
              goal_met ? "met" : "NOT met",
              schedule_kept ? "" : " (the client fell behind: the machine ran out of CPU)");

  json report = {
      {"workers", flags.workers},
      {"lanes", flags.lanes},
      {"seconds", flags.seconds},
      {"cycle_ms", flags.cycle_ms},
      {"heartbeat_interval_ms", flags.heartbeat_interval_ms},
      {"worker_ttl_ms", flags.worker_ttl_ms},
      {"rpcs", rpcs},
      {"baseline",
       {{"what", "grpc.health.v1.Health/Check of the same server over the same connections, "
                 "under the same load; p99_vs_health_check = p99 / its p99"},
        {"idle_controller_p50_ms", idle_p50[0]},
        {"idle_controller_p99_ms", idle_p99[0]},
        {"idle_buffer_p50_ms", idle_p50[1]},
        {"idle_buffer_p99_ms", idle_p99[1]}}},
      {"schedule",
       {{"heartbeats_scheduled_per_s", expected_heartbeats},
        {"heartbeats_done_fraction", heartbeat_fraction},
        {"cycles_scheduled_per_s", expected_cycles},
        {"cycles_done_fraction", cycle_fraction},
        {"schedule_kept", schedule_kept},
        {"client_lag_p99_ms", lag_p99},
        {"client_lag_max_ms", lag_max}}},
      {"cycles",
       {{"groups_stored_per_s", static_cast<double>(total.groups_stored) / flags.seconds},
        {"slots_refused", total.slots_denied},
        {"empty_leases", total.empty_leases},
        {"trainer_steps_per_s", static_cast<double>(steps_in_window) / flags.seconds}}},
      {"cpu_cores", {{process_names[0], cpu_cores[0]},
                     {process_names[1], cpu_cores[1]},
                     {process_names[2], cpu_cores[2]},
                     {"machine_cores", std::thread::hardware_concurrency()}}},
      {"run_state", v1::RunState_Name(run.state())},
      {"workers_live", run.progress().workers_live()},
      {"goal_met", goal_met},
      {"services_exit", {{"controller", controller_exit.ToString()},
                         {"replay_buffer", buffer_exit.ToString()}}},
  };
  if (!flags.json_path.empty()) {
    std::ofstream out(flags.json_path);
    out << report.dump(2) << "\n";
    if (!out) return fail("cannot write " + flags.json_path);
  }
  if (made_dir && !flags.keep_dir) std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) { return sluice::bench::Main(argc, argv); }
