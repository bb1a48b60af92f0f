#include "benchmarks/loopback_bench.h"

#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "benchmarks/bench_group.h"
#include "benchmarks/raw_stream.grpc.pb.h"
#include "prometheus/registry.h"
#include "replay_buffer/replay_buffer.h"
#include "replay_buffer/replay_buffer_service.h"
#include "services/clients/clients.h"
#include "services/clients/grpc_clients.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/metrics.h"
#include "services/runtime/rpc_metrics_interceptor.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"

namespace sluice::bench {
namespace {

using replay_buffer::InsertStatus;
using replay_buffer::ReplayBuffer;
using replay_buffer::ReplayBufferServiceImpl;
using replay_buffer::RunConfig;

// As services/runtime's default: 64 KB groups in batches stay far below it.
constexpr int kMaxMessageBytes = 64 << 20;
constexpr absl::Duration kConnectTimeout = absl::Seconds(10);
// A sampler never waits in this benchmark (the run holds held_groups); the
// bound only keeps a broken run from hanging.
constexpr int64_t kSampleTimeoutMs = 10'000;

// A connection of its own, as a separate worker or trainer process has:
// without a local subchannel pool, gRPC would multiplex every channel to the
// same address over one TCP connection.
std::shared_ptr<grpc::Channel> NewConnection(const std::string& target) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

absl::Status Connect(grpc::Channel& channel) {
  if (!channel.WaitForConnected(absl::ToChronoTime(absl::Now() + kConnectTimeout))) {
    return absl::UnavailableError("could not connect to the loopback server");
  }
  return absl::OkStatus();
}

absl::Status StreamError(absl::string_view what, const grpc::Status& status) {
  return absl::InternalError(absl::StrCat(what, ": stream ended with ",
                                          runtime::StatusCodeName(status.error_code()), " ",
                                          status.error_message()));
}

// The raw baseline: bytes in, an Ack out; a request in, cached bytes out.
class RawStreamService final : public raw::RawStream::Service {
 public:
  explicit RawStreamService(std::string item) : item_(std::move(item)) {}

  grpc::Status Push(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<raw::Ack, raw::Chunk>* stream) override {
    raw::Chunk chunk;
    raw::Ack ack;
    while (stream->Read(&chunk)) {
      ack.set_items(chunk.items());
      if (!stream->Write(ack)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status Pull(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<raw::Chunk, raw::PullRequest>* stream) override {
    raw::PullRequest request;
    while (stream->Read(&request)) {
      if (request.items() <= 0 || request.items() > kMaxItems) {
        return grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("items: must be in [1, ", kMaxItems, "], got ", request.items()));
      }
      if (!stream->Write(ChunkOf(request.items()))) break;
    }
    return grpc::Status::OK;
  }

 private:
  static constexpr int kMaxItems = 256;

  // Chunks are immutable once built, so writers share them without a lock.
  const raw::Chunk& ChunkOf(int items) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<raw::Chunk>& chunk = chunks_[items];
    if (chunk == nullptr) {
      chunk = std::make_unique<raw::Chunk>();
      std::string* payload = chunk->mutable_payload();
      payload->reserve(item_.size() * static_cast<size_t>(items));
      for (int i = 0; i < items; ++i) payload->append(item_);
      chunk->set_items(items);
    }
    return *chunk;
  }

  const std::string item_;
  absl::Mutex mu_;
  absl::flat_hash_map<int, std::unique_ptr<raw::Chunk>> chunks_ ABSL_GUARDED_BY(mu_);
};

// One client stream of a measurement, driven by one thread.
class Worker {
 public:
  virtual ~Worker() = default;
  // Connects and opens the stream (before the clock starts).
  virtual absl::Status Open() = 0;
  // One blocking exchange; returns the items it completed.
  virtual absl::StatusOr<int64_t> Step() = 0;
  // Half-closes, drains and collects the stream's status.
  virtual absl::Status Close() = 0;
};

// A rollout worker's inserts: one group per InsertGroups request on a stream
// kept open, at most `window` requests unacknowledged.
class ServiceWriter final : public Worker {
 public:
  ServiceWriter(std::string target, const v1::Group& group, std::string run_id,
                std::string writer_id, int window)
      : target_(std::move(target)), writer_id_(std::move(writer_id)), window_(window) {
    v1::Group* copy = request_.add_groups();
    *copy = group;
    copy->set_run_id(std::move(run_id));
  }

  absl::Status Open() override {
    channel_ = NewConnection(target_);
    if (absl::Status connected = Connect(*channel_); !connected.ok()) return connected;
    stub_ = sluice::v1::ReplayBufferService::NewStub(channel_);
    stream_ = stub_->InsertGroups(&context_);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Step() override {
    while (static_cast<int>(in_flight_.size()) < window_) {
      v1::Group* group = request_.mutable_groups(0);
      RenameGroup(absl::StrCat(writer_id_, "-", next_++), group);
      if (!stream_->Write(request_)) return StreamError("InsertGroups write", stream_->Finish());
      in_flight_.push_back(group->idempotency_key());
    }
    return ReadAcks();
  }

  absl::Status Close() override {
    stream_->WritesDone();
    while (!in_flight_.empty()) {
      absl::StatusOr<int64_t> acked = ReadAcks();
      if (!acked.ok()) return acked.status();
    }
    grpc::Status status = stream_->Finish();
    if (!status.ok()) return StreamError("InsertGroups", status);
    return absl::OkStatus();
  }

 private:
  // Reads one response; a response may acknowledge several requests.
  absl::StatusOr<int64_t> ReadAcks() {
    v1::InsertGroupsResponse response;
    if (!stream_->Read(&response)) return StreamError("InsertGroups read", stream_->Finish());
    for (const v1::InsertGroupResult& result : response.results()) {
      if (result.status() != v1::INSERT_STATUS_STORED) {
        return absl::InternalError(absl::StrCat("insert of ", result.idempotency_key(), " was ",
                                                v1::InsertStatus_Name(result.status()), ": ",
                                                result.message()));
      }
      auto it = std::find(in_flight_.begin(), in_flight_.end(), result.idempotency_key());
      if (it != in_flight_.end()) in_flight_.erase(it);
    }
    return response.results_size();
  }

  const std::string target_;
  const std::string writer_id_;
  const int window_;
  v1::InsertGroupsRequest request_;
  int64_t next_ = 0;
  std::deque<std::string> in_flight_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<sluice::v1::ReplayBufferService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::InsertGroupsRequest, v1::InsertGroupsResponse>>
      stream_;
};

// A trainer's sampling: one batch at a time on a stream kept open.
class ServiceSampler final : public Worker {
 public:
  ServiceSampler(std::string target, std::string run_id, int batch) : target_(std::move(target)) {
    request_.set_run_id(std::move(run_id));
    request_.set_batch_size_groups(batch);
    request_.set_timeout_ms(kSampleTimeoutMs);
  }

  absl::Status Open() override {
    channel_ = NewConnection(target_);
    if (absl::Status connected = Connect(*channel_); !connected.ok()) return connected;
    stub_ = sluice::v1::ReplayBufferService::NewStub(channel_);
    stream_ = stub_->Sample(&context_);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Step() override {
    if (!stream_->Write(request_)) return StreamError("Sample write", stream_->Finish());
    if (!stream_->Read(&response_)) return StreamError("Sample read", stream_->Finish());
    if (response_.timed_out()) return absl::InternalError("Sample timed out: the run ran dry");
    return response_.groups_size();
  }

  absl::Status Close() override {
    stream_->WritesDone();
    grpc::Status status = stream_->Finish();
    if (!status.ok()) return StreamError("Sample", status);
    return absl::OkStatus();
  }

 private:
  const std::string target_;
  v1::SampleRequest request_;
  v1::SampleResponse response_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<sluice::v1::ReplayBufferService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SampleRequest, v1::SampleResponse>> stream_;
};

// The raw counterpart of ServiceWriter: the group's bytes, one Ack each.
class RawPusher final : public Worker {
 public:
  RawPusher(std::string target, const std::string& item, int window)
      : target_(std::move(target)), window_(window) {
    chunk_.set_payload(item);
    chunk_.set_items(1);
  }

  absl::Status Open() override {
    channel_ = NewConnection(target_);
    if (absl::Status connected = Connect(*channel_); !connected.ok()) return connected;
    stub_ = raw::RawStream::NewStub(channel_);
    stream_ = stub_->Push(&context_);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Step() override {
    while (in_flight_ < window_) {
      if (!stream_->Write(chunk_)) return StreamError("Push write", stream_->Finish());
      ++in_flight_;
    }
    return ReadAck();
  }

  absl::Status Close() override {
    stream_->WritesDone();
    while (in_flight_ > 0) {
      absl::StatusOr<int64_t> acked = ReadAck();
      if (!acked.ok()) return acked.status();
    }
    grpc::Status status = stream_->Finish();
    if (!status.ok()) return StreamError("Push", status);
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<int64_t> ReadAck() {
    raw::Ack ack;
    if (!stream_->Read(&ack)) return StreamError("Push read", stream_->Finish());
    --in_flight_;
    return ack.items();
  }

  const std::string target_;
  const int window_;
  int in_flight_ = 0;
  raw::Chunk chunk_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<raw::RawStream::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<raw::Chunk, raw::Ack>> stream_;
};

// The raw counterpart of ServiceSampler: `batch` items' bytes per request.
class RawPuller final : public Worker {
 public:
  RawPuller(std::string target, int batch) : target_(std::move(target)) {
    request_.set_items(batch);
  }

  absl::Status Open() override {
    channel_ = NewConnection(target_);
    if (absl::Status connected = Connect(*channel_); !connected.ok()) return connected;
    stub_ = raw::RawStream::NewStub(channel_);
    stream_ = stub_->Pull(&context_);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Step() override {
    if (!stream_->Write(request_)) return StreamError("Pull write", stream_->Finish());
    if (!stream_->Read(&chunk_)) return StreamError("Pull read", stream_->Finish());
    return chunk_.items();
  }

  absl::Status Close() override {
    stream_->WritesDone();
    grpc::Status status = stream_->Finish();
    if (!status.ok()) return StreamError("Pull", status);
    return absl::OkStatus();
  }

 private:
  const std::string target_;
  raw::PullRequest request_;
  raw::Chunk chunk_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<raw::RawStream::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<raw::PullRequest, raw::Chunk>> stream_;
};

// A rollout worker's inserts through the shipped client (sluice_clients):
// one group per InsertGroups call, each call on a new stream.
class ClientLibraryWriter final : public Worker {
 public:
  ClientLibraryWriter(std::string target, const v1::Group& group, std::string run_id,
                      std::string writer_id)
      : target_(std::move(target)), run_id_(std::move(run_id)), writer_id_(std::move(writer_id)) {
    v1::Group* copy = request_.add_groups();
    *copy = group;
    copy->set_run_id(run_id_);
  }

  absl::Status Open() override {
    client_ = clients::NewGrpcReplayBufferClient(target_);
    v1::GetStatsRequest stats;
    stats.set_run_id(run_id_);
    return client_->GetStats(stats).status();  // connects
  }

  absl::StatusOr<int64_t> Step() override {
    RenameGroup(absl::StrCat(writer_id_, "-", next_++), request_.mutable_groups(0));
    absl::StatusOr<v1::InsertGroupsResponse> response = client_->InsertGroups(request_);
    if (!response.ok()) return response.status();
    for (const v1::InsertGroupResult& result : response->results()) {
      if (result.status() != v1::INSERT_STATUS_STORED) {
        return absl::InternalError(absl::StrCat("insert of ", result.idempotency_key(), " was ",
                                                v1::InsertStatus_Name(result.status()), ": ",
                                                result.message()));
      }
    }
    return response->results_size();
  }

  absl::Status Close() override {
    client_.reset();
    return absl::OkStatus();
  }

 private:
  const std::string target_;
  const std::string run_id_;
  const std::string writer_id_;
  v1::InsertGroupsRequest request_;
  int64_t next_ = 0;
  std::unique_ptr<clients::ReplayBufferClient> client_;
};

// A trainer's sampling through the shipped client: its Sample keeps one
// stream open.
class ClientLibrarySampler final : public Worker {
 public:
  ClientLibrarySampler(std::string target, std::string run_id, int batch)
      : target_(std::move(target)) {
    request_.set_run_id(std::move(run_id));
    request_.set_batch_size_groups(batch);
    request_.set_timeout_ms(kSampleTimeoutMs);
  }

  absl::Status Open() override {
    client_ = clients::NewGrpcReplayBufferClient(target_);
    v1::GetStatsRequest stats;
    stats.set_run_id(request_.run_id());
    return client_->GetStats(stats).status();
  }

  absl::StatusOr<int64_t> Step() override {
    absl::StatusOr<v1::SampleResponse> response = client_->Sample(request_);
    if (!response.ok()) return response.status();
    if (response->timed_out()) return absl::InternalError("Sample timed out: the run ran dry");
    return response->groups_size();
  }

  absl::Status Close() override {
    client_.reset();
    return absl::OkStatus();
  }

 private:
  const std::string target_;
  v1::SampleRequest request_;
  std::unique_ptr<clients::ReplayBufferClient> client_;
};

// CPU time this process (clients and server together) has used so far.
absl::Duration ProcessCpuTime() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return absl::DurationFromTimeval(usage.ru_utime) + absl::DurationFromTimeval(usage.ru_stime);
}

// Runs writers and samplers together: every worker opens its stream, then
// all start; items completed between warmup and warmup + duration count.
absl::StatusOr<PathThroughput> RunWorkers(std::vector<std::unique_ptr<Worker>> writers,
                                          std::vector<std::unique_ptr<Worker>> samplers,
                                          const LoopbackOptions& options, int64_t item_bytes) {
  const size_t count = writers.size() + samplers.size();
  std::vector<Worker*> workers;
  for (auto& w : writers) workers.push_back(w.get());
  for (auto& s : samplers) workers.push_back(s.get());
  std::vector<int64_t> items(count, 0);
  std::vector<absl::Status> statuses(count);
  absl::BlockingCounter opened(static_cast<int>(count));
  absl::Notification start;
  std::atomic<bool> counting{false};
  std::atomic<bool> stop{false};

  std::vector<std::thread> threads;
  threads.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      Worker& worker = *workers[i];
      absl::Status status = worker.Open();
      opened.DecrementCount();
      start.WaitForNotification();
      while (status.ok() && !stop.load()) {
        absl::StatusOr<int64_t> done = worker.Step();
        if (!done.ok()) {
          status = done.status();
          break;
        }
        if (counting.load()) items[i] += *done;
      }
      if (status.ok()) status = worker.Close();
      statuses[i] = status;
    });
  }
  opened.Wait();
  start.Notify();
  absl::SleepFor(options.warmup);
  const absl::Time begin = absl::Now();
  const absl::Duration cpu_begin = ProcessCpuTime();
  counting.store(true);
  absl::SleepFor(options.duration);
  counting.store(false);
  const absl::Time end = absl::Now();
  const absl::Duration cpu_end = ProcessCpuTime();
  stop.store(true);
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& status : statuses) {
    if (!status.ok()) return status;
  }

  PathThroughput result;
  result.seconds = absl::ToDoubleSeconds(end - begin);
  for (size_t i = 0; i < count; ++i) {
    (i < writers.size() ? result.inserted_items : result.sampled_items) += items[i];
  }
  result.insert_items_per_s = static_cast<double>(result.inserted_items) / result.seconds;
  result.sample_items_per_s = static_cast<double>(result.sampled_items) / result.seconds;
  result.items_per_s = result.insert_items_per_s + result.sample_items_per_s;
  result.mb_per_s = result.items_per_s * static_cast<double>(item_bytes) / 1e6;
  result.cpu_seconds = absl::ToDoubleSeconds(cpu_end - cpu_begin);
  const int64_t moved = result.inserted_items + result.sampled_items;
  result.cpu_us_per_item = moved > 0 ? result.cpu_seconds * 1e6 / static_cast<double>(moved) : 0;
  return result;
}

}  // namespace

struct LoopbackBench::State {
  LoopbackOptions options;
  v1::Group group;
  std::string item;
  prometheus::Registry registry;
  std::unique_ptr<runtime::RpcMetrics> rpc_metrics;
  std::shared_ptr<ReplayBuffer> buffer;
  std::unique_ptr<ReplayBufferServiceImpl> service;
  std::unique_ptr<RawStreamService> raw;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  int runs = 0;
};

LoopbackBench::LoopbackBench(std::unique_ptr<State> state) : state_(std::move(state)) {}

LoopbackBench::~LoopbackBench() {
  if (state_->service != nullptr) state_->service->Shutdown();
  if (state_->server != nullptr) {
    state_->server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    state_->server->Wait();
  }
}

absl::StatusOr<std::unique_ptr<LoopbackBench>> LoopbackBench::Start(
    const v1::Group& group, const LoopbackOptions& options) {
  if (options.sample_batch_groups <= 0 || options.sample_batch_groups > options.held_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample batch: must be in [1, held groups = ", options.held_groups, "], got ",
                     options.sample_batch_groups));
  }
  if (options.insert_window <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("insert window: must be > 0, got ", options.insert_window));
  }
  auto state = std::make_unique<State>();
  state->options = options;
  state->group = group;
  state->item = group.SerializeAsString();
  absl::StatusOr<std::unique_ptr<ReplayBuffer>> buffer = ReplayBuffer::Create();
  if (!buffer.ok()) return buffer.status();
  state->buffer = std::move(buffer).value();
  state->service = std::make_unique<ReplayBufferServiceImpl>(state->buffer, state->registry);
  state->raw = std::make_unique<RawStreamService>(state->item);
  state->rpc_metrics = std::make_unique<runtime::RpcMetrics>(state->registry);

  // As services/runtime/service_main.cc builds the real server.
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &state->port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(
      std::make_unique<runtime::RpcMetricsInterceptorFactory>(state->rpc_metrics.get()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(state->service.get());
  builder.RegisterService(state->raw.get());
  state->server = builder.BuildAndStart();
  if (state->server == nullptr || state->port == 0) {
    return absl::UnavailableError("cannot listen on 127.0.0.1 (an ephemeral port)");
  }
  return std::unique_ptr<LoopbackBench>(new LoopbackBench(std::move(state)));
}

int64_t LoopbackBench::item_bytes() const { return static_cast<int64_t>(state_->item.size()); }

std::string LoopbackBench::target() const { return absl::StrCat("127.0.0.1:", state_->port); }

absl::StatusOr<PathThroughput> LoopbackBench::MeasureService(int concurrency, bool client_library) {
  const LoopbackOptions& options = state_->options;
  RunConfig config;
  config.run_id = absl::StrCat("bench-c", concurrency, "-", ++state_->runs);
  config.batch_size_groups = options.sample_batch_groups;
  // Versions never advance, so neither the admission gate (inserts carry no
  // slot lease) nor the staleness filter acts.
  config.max_staleness = 1'000'000;
  config.group_size = state_->group.trajectories_size();
  // Samplers never drain the run and writers never grow it: each insert
  // evicts the oldest group.
  config.buffer.set_max_times_sampled(1 << 30);
  config.buffer.set_capacity_groups(options.held_groups);
  if (absl::StatusOr<ReplayBuffer::ConfigureResult> configured =
          state_->buffer->ConfigureRun(config);
      !configured.ok()) {
    return configured.status();
  }
  std::vector<v1::Group> prefill;
  for (int i = 0; i < options.held_groups; ++i) {
    v1::Group group = state_->group;
    group.set_run_id(config.run_id);
    RenameGroup(absl::StrCat("held-", i), &group);
    prefill.push_back(std::move(group));
  }
  for (const replay_buffer::InsertResult& result : state_->buffer->Insert(std::move(prefill))) {
    if (result.status != InsertStatus::kStored) {
      return absl::InternalError(absl::StrCat("prefill insert not stored: ", result.message));
    }
  }

  std::vector<std::unique_ptr<Worker>> writers;
  std::vector<std::unique_ptr<Worker>> samplers;
  for (int i = 0; i < concurrency; ++i) {
    if (client_library) {
      writers.push_back(std::make_unique<ClientLibraryWriter>(target(), state_->group,
                                                              config.run_id, absl::StrCat("w", i)));
      samplers.push_back(std::make_unique<ClientLibrarySampler>(target(), config.run_id,
                                                                options.sample_batch_groups));
    } else {
      writers.push_back(std::make_unique<ServiceWriter>(
          target(), state_->group, config.run_id, absl::StrCat("w", i), options.insert_window));
      samplers.push_back(
          std::make_unique<ServiceSampler>(target(), config.run_id, options.sample_batch_groups));
    }
  }
  return RunWorkers(std::move(writers), std::move(samplers), options, item_bytes());
}

absl::StatusOr<PathThroughput> LoopbackBench::MeasureRaw(int concurrency) {
  const LoopbackOptions& options = state_->options;
  std::vector<std::unique_ptr<Worker>> writers;
  std::vector<std::unique_ptr<Worker>> samplers;
  for (int i = 0; i < concurrency; ++i) {
    writers.push_back(std::make_unique<RawPusher>(target(), state_->item, options.insert_window));
    samplers.push_back(std::make_unique<RawPuller>(target(), options.sample_batch_groups));
  }
  return RunWorkers(std::move(writers), std::move(samplers), options, item_bytes());
}

absl::StatusOr<LoopbackMeasurement> LoopbackBench::Measure(int concurrency) {
  if (concurrency <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("concurrency: must be > 0, got ", concurrency));
  }
  LoopbackMeasurement measurement;
  measurement.concurrency = concurrency;
  absl::StatusOr<PathThroughput> raw = MeasureRaw(concurrency);
  if (!raw.ok()) return raw.status();
  measurement.raw_grpc = *raw;
  absl::StatusOr<PathThroughput> service = MeasureService(concurrency, /*client_library=*/false);
  if (!service.ok()) return service.status();
  measurement.service = *service;
  measurement.service_vs_raw_grpc =
      raw->items_per_s > 0 ? service->items_per_s / raw->items_per_s : 0;
  if (state_->options.client_library) {
    absl::StatusOr<PathThroughput> client = MeasureService(concurrency, /*client_library=*/true);
    if (!client.ok()) return client.status();
    measurement.service_client_library = *client;
    measurement.service_client_library_vs_raw_grpc =
        raw->items_per_s > 0 ? client->items_per_s / raw->items_per_s : 0;
  }
  return measurement;
}

}  // namespace sluice::bench
