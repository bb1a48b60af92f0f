#include "services/runtime/request_limits.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "services/runtime/auth.h"
#include "services/runtime/grpc_status.h"

namespace sluice::runtime {

absl::Status RequestLimits::Validate() const {
  std::vector<std::string> problems;
  if (max_streams_per_peer < 1) {
    problems.push_back(
        absl::StrCat("max_streams_per_peer must be >= 1; got ", max_streams_per_peer));
  }
  if (max_streams < 1) {
    problems.push_back(absl::StrCat("max_streams must be >= 1; got ", max_streams));
  }
  if (max_id_bytes < 64) {
    problems.push_back(absl::StrCat("max_id_bytes must be >= 64; got ", max_id_bytes));
  }
  if (max_items_per_request < 1) {
    problems.push_back(
        absl::StrCat("max_items_per_request must be >= 1; got ", max_items_per_request));
  }
  if (max_wait_ms < 1000) {
    problems.push_back(absl::StrCat("max_wait_ms must be >= 1000; got ", max_wait_ms));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

struct RefusalCounter::Counters {
  prometheus::Family<prometheus::Counter>* family = nullptr;
};

RefusalCounter::RefusalCounter(prometheus::Registry* registry)
    : counters_(std::make_unique<Counters>()) {
  if (registry == nullptr) return;
  counters_->family = &prometheus::BuildCounter()
                           .Name("sluice_requests_refused_total")
                           .Help("Calls refused by a request limit (request_limits.h), by reason")
                           .Register(*registry);
  // Present from the start, so that a rate() over them is defined.
  for (const char* reason : {"streams_per_peer", "streams_total", "id_too_long", "too_many_items",
                             "value_out_of_range", "request_too_large", "malformed_request"}) {
    counters_->family->Add({{"reason", reason}});
  }
}

RefusalCounter::~RefusalCounter() = default;

void RefusalCounter::Refused(absl::string_view reason) {
  if (counters_->family == nullptr) return;
  counters_->family->Add({{"reason", std::string(reason)}}).Increment();
}

StreamClient StreamClientOf(const grpc::ServerContext& context) {
  StreamClient client;
  client.connection = context.peer();
  client.description = client.connection;
  if (const std::optional<Principal> caller = Caller(&context); caller.has_value()) {
    client.description =
        absl::StrCat(RoleName(caller->role), ":", caller->identity, " on ", client.connection);
    client.service = caller->role == Role::kWorker || caller->role == Role::kTrainer ||
                     caller->role == Role::kController;
  }
  return client;
}

StreamGate::Slot::Slot(Slot&& other) noexcept
    : gate_(std::exchange(other.gate_, nullptr)),
      connection_(std::move(other.connection_)),
      service_(other.service_) {}

StreamGate::Slot& StreamGate::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    if (gate_ != nullptr) gate_->Release(connection_, service_);
    gate_ = std::exchange(other.gate_, nullptr);
    connection_ = std::move(other.connection_);
    service_ = other.service_;
  }
  return *this;
}

StreamGate::Slot::~Slot() {
  if (gate_ != nullptr) gate_->Release(connection_, service_);
}

absl::StatusOr<StreamGate::Slot> StreamGate::Acquire(const StreamClient& client,
                                                     absl::string_view method) {
  absl::MutexLock lock(&mu_);
  int& pool = client.service ? open_services_ : open_others_;
  if (pool >= max_total_) {
    if (refusals_ != nullptr) refusals_->Refused("streams_total");
    return absl::ResourceExhaustedError(absl::StrCat(
        method, ": this service already has ", pool, " streams open ",
        client.service ? "from services" : "from users and anonymous callers",
        ", the limit (--max-streams ", max_total_, "); close idle streams or raise --max-streams"));
  }
  auto [it, inserted] = open_by_connection_.try_emplace(client.connection, 0);
  if (it->second >= max_per_peer_) {
    if (refusals_ != nullptr) refusals_->Refused("streams_per_peer");
    return absl::ResourceExhaustedError(absl::StrCat(
        method, ": the connection of ", client.description, " already has ", it->second,
        " streams open on this service, the limit (--max-streams-per-peer ", max_per_peer_,
        "); close idle streams or raise --max-streams-per-peer"));
  }
  ++it->second;
  ++pool;
  return Slot(this, client.connection, client.service);
}

void StreamGate::Release(const std::string& connection, bool service) {
  absl::MutexLock lock(&mu_);
  --(service ? open_services_ : open_others_);
  auto it = open_by_connection_.find(connection);
  if (it != open_by_connection_.end() && --it->second <= 0) open_by_connection_.erase(it);
}

int StreamGate::open() const {
  absl::MutexLock lock(&mu_);
  return open_services_ + open_others_;
}

int StreamGate::open_from(absl::string_view connection) const {
  absl::MutexLock lock(&mu_);
  auto it = open_by_connection_.find(connection);
  return it == open_by_connection_.end() ? 0 : it->second;
}

absl::Status CheckIdLength(absl::string_view field, absl::string_view value, int64_t max_bytes) {
  if (static_cast<int64_t>(value.size()) <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", value.size(), " bytes, at most ", max_bytes,
      " for an identifier (--max-id-bytes); starts '", value.substr(0, 32), "'"));
}

absl::Status CheckItemCount(absl::string_view field, int64_t count, int64_t max_items) {
  if (count <= max_items) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", count, " items, at most ", max_items,
                   " per request (--max-items-per-request); split it into smaller requests"));
}

namespace {

struct ProcessLimits {
  RequestLimits limits;
  std::unique_ptr<RefusalCounter> refusals = std::make_unique<RefusalCounter>(nullptr);
  std::unique_ptr<StreamGate> streams = std::make_unique<StreamGate>(
      limits.max_streams_per_peer, limits.max_streams, refusals.get());
};

ProcessLimits& Process() {
  static ProcessLimits* const process = new ProcessLimits();
  return *process;
}

}  // namespace

void InstallRequestLimits(const RequestLimits& limits, prometheus::Registry* registry) {
  ProcessLimits& process = Process();
  process.limits = limits;
  process.refusals = std::make_unique<RefusalCounter>(registry);
  process.streams = std::make_unique<StreamGate>(limits.max_streams_per_peer, limits.max_streams,
                                                 process.refusals.get());
}

const RequestLimits& ProcessRequestLimits() { return Process().limits; }

void CountRefusal(absl::string_view reason) { Process().refusals->Refused(reason); }

grpc::Status AcquireStreamSlot(grpc::ServerContext* context, absl::string_view method,
                               StreamGate::Slot* slot) {
  // Per connection, and services apart from users and anonymous callers
  // (RequestLimits): neither a local process nor a shared token's holder
  // can use up another client's allowance.
  const StreamClient client = StreamClientOf(*context);
  absl::StatusOr<StreamGate::Slot> acquired = Process().streams->Acquire(client, method);
  if (!acquired.ok()) {
    log::Warning("refused a stream", {{"method", std::string(method)},
                                      {"peer", client.description},
                                      {"error", std::string(acquired.status().message())}});
    return ToGrpcStatus(acquired.status());
  }
  *slot = std::move(*acquired);
  context->AddInitialMetadata(kStreamSlotMetadataKey, "held");
  return grpc::Status::OK;
}

grpc::Status CheckId(absl::string_view field, absl::string_view value) {
  absl::Status status = CheckIdLength(field, value, Process().limits.max_id_bytes);
  if (status.ok()) return grpc::Status::OK;
  Process().refusals->Refused("id_too_long");
  return ToGrpcStatus(status);
}

grpc::Status CheckItems(absl::string_view field, int64_t count) {
  absl::Status status = CheckItemCount(field, count, Process().limits.max_items_per_request);
  if (status.ok()) return grpc::Status::OK;
  Process().refusals->Refused("too_many_items");
  return ToGrpcStatus(status);
}

grpc::Status CheckRange(absl::string_view field, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return grpc::Status::OK;
  Process().refusals->Refused("value_out_of_range");
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat(field, ": must be in [", min, ", ", max, "], got ", value));
}

absl::Duration CapWait(absl::Duration wait, const grpc::ServerContext& context) {
  wait = std::min(wait, absl::Milliseconds(Process().limits.max_wait_ms));
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return wait;
  return std::min(wait, std::max(absl::ZeroDuration(), absl::FromChrono(deadline) - absl::Now()));
}

}  // namespace sluice::runtime
