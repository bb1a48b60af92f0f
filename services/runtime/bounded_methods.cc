#include "services/runtime/bounded_methods.h"

#include <malloc.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "services/runtime/grpc_status.h"
#include "services/runtime/request_limits.h"
#include "sluice/v1/controller.grpc.pb.h"
#include "sluice/v1/replay_buffer.grpc.pb.h"
#include "sluice/v1/reward_server.grpc.pb.h"
#include "sluice/v1/rollout_worker.grpc.pb.h"
#include "sluice/v1/trainer.grpc.pb.h"

namespace sluice::runtime {
namespace {

// The size class of each method's requests. Valid requests of a kSmall
// method name a run, a worker, a lease or a few counts; kSpec ones carry a
// run spec; kReport ones the trainer's or a worker's figures and lease lists;
// kData ones the run's data, as large as the message limit allows.
enum class SizeClass { kSmall, kSpec, kReport, kData };

const std::map<std::string, SizeClass, std::less<>> &MethodClasses() {
  static const auto *classes = new std::map<std::string, SizeClass, std::less<>>{
      {"/sluice.v1.ControllerService/SubmitRun", SizeClass::kSpec},
      {"/sluice.v1.ControllerService/GetRun", SizeClass::kSmall},
      {"/sluice.v1.ControllerService/WatchRun", SizeClass::kSmall},
      {"/sluice.v1.ControllerService/CancelRun", SizeClass::kSmall},
      {"/sluice.v1.ControllerService/ListRuns", SizeClass::kSmall},
      {"/sluice.v1.ControllerService/LeasePrompts", SizeClass::kSmall},
      {"/sluice.v1.ControllerService/ReportRolloutProgress", SizeClass::kData},
      {"/sluice.v1.ControllerService/ReportTrainerProgress", SizeClass::kReport},
      {"/sluice.v1.ControllerService/WorkerHeartbeat", SizeClass::kReport},
      {"/sluice.v1.ControllerService/ListWorkers", SizeClass::kSmall},
      {"/sluice.v1.ControllerService/ReportServiceFailure", SizeClass::kSmall},
      {"/sluice.v1.ReplayBufferService/ConfigureRun", SizeClass::kSpec},
      {"/sluice.v1.ReplayBufferService/AcquireGenerationSlots", SizeClass::kReport},
      {"/sluice.v1.ReplayBufferService/ReleaseGenerationSlots", SizeClass::kReport},
      {"/sluice.v1.ReplayBufferService/InsertGroups", SizeClass::kData},
      {"/sluice.v1.ReplayBufferService/Sample", SizeClass::kSmall},
      {"/sluice.v1.ReplayBufferService/UpdatePolicyVersion", SizeClass::kReport},
      {"/sluice.v1.ReplayBufferService/UpdatePriorities", SizeClass::kReport},
      {"/sluice.v1.ReplayBufferService/GetStats", SizeClass::kSmall},
      {"/sluice.v1.ReplayBufferService/CommitTrainedSteps", SizeClass::kReport},
      {"/sluice.v1.RewardService/ScoreBatch", SizeClass::kData},
      {"/sluice.v1.RewardService/ListVerifiers", SizeClass::kSmall},
      {"/sluice.v1.RolloutWorkerService/StartRollouts", SizeClass::kSpec},
      {"/sluice.v1.RolloutWorkerService/StopRollouts", SizeClass::kSmall},
      {"/sluice.v1.RolloutWorkerService/GetWorkerStatus", SizeClass::kSmall},
      {"/sluice.v1.TrainerService/StartTraining", SizeClass::kSpec},
      {"/sluice.v1.TrainerService/StopTraining", SizeClass::kSmall},
      {"/sluice.v1.TrainerService/GetLatestVersion", SizeClass::kSmall},
      {"/sluice.v1.TrainerService/WatchVersions", SizeClass::kSmall},
      {"/sluice.v1.TrainerService/StreamWeights", SizeClass::kSmall},
      {"/sluice.v1.TrainerService/GetTrainerStatus", SizeClass::kSmall},
      {"/sluice.v1.TrainerService/GetWeightSource", SizeClass::kSmall},
      {"/sluice.v1.WeightRelay/StreamWeights", SizeClass::kSmall},
  };
  return *classes;
}

int64_t ClassBytes(SizeClass size_class, int64_t max_message_bytes) {
  switch (size_class) {
    case SizeClass::kSmall:
      return std::min(kSmallRequestBytes, max_message_bytes);
    case SizeClass::kSpec:
      return std::min(kSpecRequestBytes, max_message_bytes);
    case SizeClass::kReport:
      return std::min(kReportRequestBytes, max_message_bytes);
    case SizeClass::kData:
      return max_message_bytes;
  }
  return max_message_bytes;
}

std::string MethodName(absl::string_view method) {
  const size_t slash = method.rfind('/');
  return std::string(slash == absl::string_view::npos ? method : method.substr(slash + 1));
}

// Binds every unary and server-streaming method of `service` (a generated
// service type) with the bounds of the method table. Bidi methods are left
// to the service's BoundedService.
class Binder {
 public:
  Binder(grpc::Service &service, std::string full_name, int64_t max_message_bytes,
         std::vector<FieldElementLimit> field_limits)
      : service_(service),
        full_name_(std::move(full_name)),
        max_message_bytes_(max_message_bytes),
        field_limits_(std::move(field_limits)) {}

  MessageBounds Bounds(absl::string_view method) const {
    MessageBounds bounds = BoundsForMethod(method, max_message_bytes_);
    for (const FieldElementLimit &limit : field_limits_) {
      bounds.field_max_elements[limit.field] = {limit.max_elements, limit.flag};
    }
    return bounds;
  }

  template <class S, class Request, class Response>
  void Unary(absl::string_view name,
             grpc::Status (S::*method)(grpc::ServerContext *, const Request *, Response *)) {
    const std::string path = Path(name);
    Replace(path, new internal::BoundedUnaryHandler<S, Request, Response>(
                      &dynamic_cast<S &>(service_), method, path, Bounds(path)));
  }

  template <class S, class Request, class Response>
  void ServerStreaming(absl::string_view name,
                       grpc::Status (S::*method)(grpc::ServerContext *, const Request *,
                                                 grpc::ServerWriter<Response> *)) {
    const std::string path = Path(name);
    Replace(path, new internal::BoundedServerStreamingHandler<S, Request, Response>(
                      &dynamic_cast<S &>(service_), method, path, Bounds(path)));
  }

  void Stream(const BoundedStreamMethod &stream) {
    Replace(stream.method, stream.make_handler(Bounds(stream.method)));
  }

  // INTERNAL naming each method of the service's descriptor left unbound.
  absl::Status CheckAllBound() const {
    const google::protobuf::ServiceDescriptor *descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(full_name_);
    if (descriptor == nullptr) {
      return absl::InternalError(
          absl::StrCat("no service ", full_name_, " in the descriptor pool"));
    }
    std::vector<std::string> unbound;
    for (int i = 0; i < descriptor->method_count(); ++i) {
      if (bound_.count(i) == 0) unbound.push_back(descriptor->method(i)->name());
    }
    if (unbound.empty()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(full_name_, " would read unbounded requests in ",
                                            absl::StrJoin(unbound, ", "),
                                            ": bind them (bounded_methods.h)"));
  }

 private:
  std::string Path(absl::string_view name) const {
    return absl::StrCat("/", full_name_, "/", name);
  }

  void Replace(const std::string &path, grpc::internal::MethodHandler *handler) {
    const int index = internal::MethodIndex(path);
    if (index < 0) {
      delete handler;
      return;
    }
    internal::ReplaceHandler(service_, index, handler);
    bound_.insert(index);
  }

  grpc::Service &service_;
  const std::string full_name_;
  const int64_t max_message_bytes_;
  const std::vector<FieldElementLimit> field_limits_;
  std::set<int> bound_;
};

void BindGenerated(Binder &bind, v1::ControllerService::Service &) {
  using S = v1::ControllerService::Service;
  bind.Unary("SubmitRun", &S::SubmitRun);
  bind.Unary("GetRun", &S::GetRun);
  bind.ServerStreaming("WatchRun", &S::WatchRun);
  bind.Unary("CancelRun", &S::CancelRun);
  bind.Unary("ListRuns", &S::ListRuns);
  bind.Unary("LeasePrompts", &S::LeasePrompts);
  bind.Unary("ReportRolloutProgress", &S::ReportRolloutProgress);
  bind.Unary("ReportTrainerProgress", &S::ReportTrainerProgress);
  bind.Unary("WorkerHeartbeat", &S::WorkerHeartbeat);
  bind.Unary("ListWorkers", &S::ListWorkers);
  bind.Unary("ReportServiceFailure", &S::ReportServiceFailure);
}

void BindGenerated(Binder &bind, v1::ReplayBufferService::Service &) {
  using S = v1::ReplayBufferService::Service;
  bind.Unary("ConfigureRun", &S::ConfigureRun);
  bind.Unary("AcquireGenerationSlots", &S::AcquireGenerationSlots);
  bind.Unary("ReleaseGenerationSlots", &S::ReleaseGenerationSlots);
  bind.Unary("UpdatePolicyVersion", &S::UpdatePolicyVersion);
  bind.Unary("UpdatePriorities", &S::UpdatePriorities);
  bind.Unary("GetStats", &S::GetStats);
  bind.Unary("CommitTrainedSteps", &S::CommitTrainedSteps);
  // InsertGroups and Sample: bidi, bound by the service (BoundedService).
}

void BindGenerated(Binder &bind, v1::RewardService::Service &) {
  using S = v1::RewardService::Service;
  bind.Unary("ScoreBatch", &S::ScoreBatch);
  bind.Unary("ListVerifiers", &S::ListVerifiers);
}

void BindGenerated(Binder &bind, v1::RolloutWorkerService::Service &) {
  using S = v1::RolloutWorkerService::Service;
  bind.Unary("StartRollouts", &S::StartRollouts);
  bind.Unary("StopRollouts", &S::StopRollouts);
  bind.Unary("GetWorkerStatus", &S::GetWorkerStatus);
}

void BindGenerated(Binder &bind, v1::TrainerService::Service &) {
  using S = v1::TrainerService::Service;
  bind.Unary("StartTraining", &S::StartTraining);
  bind.Unary("StopTraining", &S::StopTraining);
  bind.Unary("GetLatestVersion", &S::GetLatestVersion);
  bind.ServerStreaming("WatchVersions", &S::WatchVersions);
  bind.ServerStreaming("StreamWeights", &S::StreamWeights);
  bind.Unary("GetTrainerStatus", &S::GetTrainerStatus);
  bind.Unary("GetWeightSource", &S::GetWeightSource);
}

void BindGenerated(Binder &bind, v1::WeightRelay::Service &) {
  using S = v1::WeightRelay::Service;
  bind.ServerStreaming("StreamWeights", &S::StreamWeights);
}

// Calls BindGenerated with `service` as the generated type named
// `full_name`; false for a name none of them has.
template <class Generated>
bool BindIf(Binder &bind, grpc::Service &service, absl::string_view full_name) {
  if (full_name != Generated::service_full_name()) return false;
  auto *generated = dynamic_cast<typename Generated::Service *>(&service);
  if (generated == nullptr) return false;
  BindGenerated(bind, *generated);
  return true;
}

}  // namespace

MessageBounds BoundsForMethod(absl::string_view method, int64_t max_message_bytes) {
  const RequestLimits &limits = ProcessRequestLimits();
  MessageBounds bounds;
  auto it = MethodClasses().find(method);
  bounds.max_bytes =
      ClassBytes(it == MethodClasses().end() ? SizeClass::kSmall : it->second, max_message_bytes);
  bounds.max_elements_per_field = limits.max_items_per_request;
  // A valid request takes about its wire size once parsed (token arrays are
  // packed fixed-width: reserved at once); twice that and a megabyte leave
  // room for objects' headers and small items.
  bounds.max_parsed_bytes = 2 * bounds.max_bytes + (1 << 20);
  return bounds;
}

std::vector<std::pair<std::string, MessageBounds>> AllMethodBounds(int64_t max_message_bytes) {
  std::vector<std::pair<std::string, MessageBounds>> all;
  for (const auto &[method, size_class] : MethodClasses()) {
    all.emplace_back(method, BoundsForMethod(method, max_message_bytes));
  }
  return all;
}

absl::Status BoundEveryMethod(grpc::Service &service, absl::string_view full_name,
                              int64_t max_message_bytes) {
  auto *bounded = dynamic_cast<BoundedService *>(&service);
  Binder bind(
      service, std::string(full_name), max_message_bytes,
      bounded != nullptr ? bounded->FieldElementLimits() : std::vector<FieldElementLimit>{});
  const bool known = BindIf<v1::ControllerService>(bind, service, full_name) ||
                     BindIf<v1::ReplayBufferService>(bind, service, full_name) ||
                     BindIf<v1::RewardService>(bind, service, full_name) ||
                     BindIf<v1::RolloutWorkerService>(bind, service, full_name) ||
                     BindIf<v1::TrainerService>(bind, service, full_name) ||
                     BindIf<v1::WeightRelay>(bind, service, full_name);
  if (!known) {
    return absl::InternalError(absl::StrCat("cannot bound the requests of service ", full_name,
                                            ": not a Sluice service (bounded_methods.cc)"));
  }
  if (bounded != nullptr) {
    for (const BoundedStreamMethod &stream : bounded->BoundedStreams()) bind.Stream(stream);
  }
  return bind.CheckAllBound();
}

namespace internal {

int MethodIndex(absl::string_view method) {
  const std::vector<std::string> parts = absl::StrSplit(method, '/', absl::SkipEmpty());
  if (parts.size() != 2) return -1;
  const google::protobuf::ServiceDescriptor *service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(parts[0]);
  if (service == nullptr) return -1;
  const google::protobuf::MethodDescriptor *found = service->FindMethodByName(parts[1]);
  // The generated service adds its methods in the order of the .proto.
  return found == nullptr ? -1 : found->index();
}

namespace {
// grpc::Service keeps MarkMethodStreamed protected for generated subclasses;
// a pointer to it, taken here, lets the runtime replace any service's
// handler before the server starts.
struct ServiceAccess : grpc::Service {
  static void Replace(grpc::Service &service, int index, grpc::internal::MethodHandler *handler) {
    (service.*(&ServiceAccess::MarkMethodStreamed))(index, handler);
  }
};
}  // namespace

void ReplaceHandler(grpc::Service &service, int index, grpc::internal::MethodHandler *handler) {
  // Marked as streamed: the server then reads no message before the handler
  // runs; the bounded handler reads it itself, once the caller is known.
  ServiceAccess::Replace(service, index, handler);
}

grpc::Status ParseBounded(grpc::ByteBuffer &bytes, absl::string_view method,
                          const MessageBounds &bounds, google::protobuf::Message *message) {
  const int64_t size = static_cast<int64_t>(bytes.Length());
  {
    grpc::ProtoBufferReader reader(&bytes);
    const absl::StatusOr<WireCost> cost =
        CheckMessageBounds(*message->GetDescriptor(), reader, size, bounds);
    if (!cost.ok()) {
      const absl::StatusCode code = cost.status().code();
      CountRefusal(code == absl::StatusCode::kResourceExhausted ? "request_too_large"
                   : absl::StrContains(cost.status().message(), kTooManyItemsText)
                       ? "too_many_items"
                       : "malformed_request");
      return ToGrpcStatus(
          absl::Status(code, absl::StrCat(MethodName(method), ": ", cost.status().message())));
    }
  }
  grpc::Status parsed =
      grpc::SerializationTraits<google::protobuf::Message>::Deserialize(&bytes, message);
  if (!parsed.ok()) {
    CountRefusal("malformed_request");
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(MethodName(method), ": the request does not parse as a ",
                                     message->GetDescriptor()->full_name()));
  }
  return grpc::Status::OK;
}

grpc::Status ReadBoundedRequest(const grpc::internal::MethodHandler::HandlerParameter &param,
                                absl::string_view method, const MessageBounds &bounds,
                                google::protobuf::Message *request, int64_t *request_bytes) {
  *request_bytes = 0;
  // A caller the policy refuses is answered before its message is read.
  if (grpc::Status denied = CheckCaller(param.server_context); !denied.ok()) return denied;
  grpc::ByteBuffer bytes;
  grpc::internal::ServerReaderWriterBody<grpc::ByteBuffer, grpc::ByteBuffer> call(
      param.call, static_cast<grpc::ServerContext*>(param.server_context));
  if (!call.Read(&bytes)) {
    // A message over --max-message-size-bytes fails the call in gRPC itself,
    // whose status (RESOURCE_EXHAUSTED, naming the limit) the client gets.
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(MethodName(method), ": the call carried no request message"));
  }
  *request_bytes = static_cast<int64_t>(bytes.Length());
  return ParseBounded(bytes, method, bounds, request);
}

void AfterCall(int64_t request_bytes) {
  // Below this a request's parse leaves too little behind to matter; above
  // it, the trim (a walk of malloc's free lists, about a millisecond) is
  // small beside reading and parsing the request.
  constexpr int64_t kTrimAfterBytes = 1 << 20;
  if (request_bytes < kTrimAfterBytes) return;
  // glibc keeps freed chunks in its arenas; a large parse's objects, freed,
  // would stay resident. malloc_trim returns the free pages of every arena.
  malloc_trim(0);
}

}  // namespace internal
}  // namespace sluice::runtime
