#ifndef SLUICE_SERVICES_RUNTIME_BOUNDED_METHODS_H_
#define SLUICE_SERVICES_RUNTIME_BOUNDED_METHODS_H_

// How every Sluice service reads a request: the caller is authorized before
// a byte of its message is read, and the message is bounded before it is
// parsed.
//
// gRPC's sync server reads and parses a unary (or server-streaming) call's
// request before any handler or interceptor can refuse the call, so an
// anonymous caller's 4 MiB of empty items once cost a service ~470 MB
// before it answered UNAUTHENTICATED. ServiceMain therefore replaces the
// handler of every method of every service it serves (BoundEveryMethod):
//
//   1. the call's caller is checked (CheckCaller: the auth interceptor
//      decided at the call's initial metadata); a refused caller is answered
//      at once, its message never read;
//   2. the request is read as bytes (at most --max-message-size-bytes, which
//      gRPC enforces from the message's length prefix), and refused when it
//      is larger than its method takes (MethodBounds: far below the message
//      limit where valid requests are small), holds more items in one
//      repeated field than allowed, or would cost more than its bound once
//      parsed (message_bounds.h);
//   3. only then is it parsed, and the service's own handler runs;
//   4. after a request over 1 MiB, the memory its parse freed is handed back
//      to the system (malloc_trim), so that resident memory returns to where
//      it was.
//
// What one call can cost a service is thus bounded per method, and for a
// caller the auth policy refuses it is nothing (docs/security.md states the
// figures per service). Streams that read many messages (the buffer's
// InsertGroups and Sample) are bound by their service (BoundedService), whose
// handlers read through a ServerReaderWriterInterface that applies the same
// checks to every message.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "grpcpp/impl/call_op_set.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/method_handler.h"
#include "grpcpp/support/sync_stream.h"
#include "services/runtime/auth.h"
#include "services/runtime/message_bounds.h"

namespace sluice::runtime {

// The bounds of one method's request messages, under the process's request
// limits (request_limits.h) and its message-size limit. `method` is the
// method's full path, "/sluice.v1.RewardService/ScoreBatch". Methods whose
// valid requests are small take at most kSmallRequestBytes, those carrying a
// run spec kSpecRequestBytes, reports kReportRequestBytes, and those that
// carry data (groups, items to score, completed prompts) the whole message
// limit; each at most `max_message_bytes`.
inline constexpr int64_t kSmallRequestBytes = 256 << 10;
inline constexpr int64_t kSpecRequestBytes = 4 << 20;
inline constexpr int64_t kReportRequestBytes = 16 << 20;
MessageBounds BoundsForMethod(absl::string_view method, int64_t max_message_bytes);

// Every method of every Sluice service with its bounds (for docs and
// tests), by full path.
std::vector<std::pair<std::string, MessageBounds>> AllMethodBounds(int64_t max_message_bytes);

// An element limit of a service's own for one field (e.g. the reward
// server's --max-batch-items for "sluice.v1.ScoreBatchRequest.items").
struct FieldElementLimit {
  std::string field;  // Full name.
  int64_t max_elements = 0;
  std::string flag;  // What raises it, for the error.
};

// A streaming method a service binds itself (see BoundedStream below).
struct BoundedStreamMethod {
  std::string method;  // Full path.
  // Makes the handler, given the method's bounds.
  std::function<grpc::internal::MethodHandler *(const MessageBounds &)> make_handler;
};

// What a service tells BoundEveryMethod beyond the method table. A service
// with bidi methods must implement it: BoundEveryMethod refuses to serve a
// method it cannot bound.
class BoundedService {
 public:
  virtual ~BoundedService() = default;
  virtual std::vector<BoundedStreamMethod> BoundedStreams() { return {}; }
  virtual std::vector<FieldElementLimit> FieldElementLimits() const { return {}; }
};

// Installs the bounded handler on every method of `service`, a generated
// sluice.v1 service named `full_name` ("sluice.v1.RewardService"). Call
// before the service is registered with a server. INTERNAL naming the
// method when one cannot be bounded (an unknown service, or a bidi method
// its BoundedService does not bind).
absl::Status BoundEveryMethod(grpc::Service &service, absl::string_view full_name,
                              int64_t max_message_bytes);

namespace internal {

// The index of `method` ("/pkg.Service/Method") in its generated service,
// or -1 when the descriptor pool knows no such method.
int MethodIndex(absl::string_view method);
// Puts `handler` (owned by the service from then on) in place of the
// method's generated handler; the method then reads its own request.
void ReplaceHandler(grpc::Service &service, int index, grpc::internal::MethodHandler *handler);

// Checks the caller, reads the call's one request as bytes, bounds and
// parses it into `request`. `request_bytes` is what was read (0 when
// nothing was). Counts each refusal.
grpc::Status ReadBoundedRequest(const grpc::internal::MethodHandler::HandlerParameter &param,
                                absl::string_view method, const MessageBounds &bounds,
                                google::protobuf::Message *request, int64_t *request_bytes);
// Bounds and parses one message of a stream.
grpc::Status ParseBounded(grpc::ByteBuffer &bytes, absl::string_view method,
                          const MessageBounds &bounds, google::protobuf::Message *message);
// After a call that read `request_bytes`: hands freed memory back to the
// system when that was large (over 1 MiB).
void AfterCall(int64_t request_bytes);

// Room in the call's arena for its request (freed with the call).
template <class Request>
Request *NewRequest(const grpc::internal::MethodHandler::HandlerParameter &param) {
  void *room =
      grpc::g_core_codegen_interface->grpc_call_arena_alloc(param.call->call(), sizeof(Request));
  return new (room) Request;
}

// A unary method: reads its request bounded, then runs the generated
// handler (which calls the service's virtual method and sends the answer).
template <class Service, class Request, class Response>
class BoundedUnaryHandler final : public grpc::internal::MethodHandler {
 public:
  using Method = grpc::Status (Service::*)(grpc::ServerContext *, const Request *, Response *);
  BoundedUnaryHandler(Service *service, Method method, std::string path, MessageBounds bounds)
      : path_(std::move(path)),
        bounds_(std::move(bounds)),
        inner_([method](Service *s, grpc::ServerContext *context, const Request *request,
                        Response *response) { return (s->*method)(context, request, response); },
               service) {}

  void RunHandler(const HandlerParameter &param) override {
    Request *request = NewRequest<Request>(param);
    int64_t bytes = 0;
    const grpc::Status status = ReadBoundedRequest(param, path_, bounds_, request, &bytes);
    if (!status.ok()) {
      request->~Request();
      request = nullptr;
    }
    inner_.RunHandler(HandlerParameter(param.call, param.server_context, request, status,
                                       param.internal_data, param.call_requester));
    AfterCall(bytes);
  }

 private:
  const std::string path_;
  const MessageBounds bounds_;
  grpc::internal::RpcMethodHandler<Service, Request, Response> inner_;
};

// A server-streaming method: the same for its one request.
template <class Service, class Request, class Response>
class BoundedServerStreamingHandler final : public grpc::internal::MethodHandler {
 public:
  using Method = grpc::Status (Service::*)(grpc::ServerContext *, const Request *,
                                           grpc::ServerWriter<Response> *);
  BoundedServerStreamingHandler(Service *service, Method method, std::string path,
                                MessageBounds bounds)
      : path_(std::move(path)),
        bounds_(std::move(bounds)),
        inner_(
            [method](Service *s, grpc::ServerContext *context, const Request *request,
                     grpc::ServerWriter<Response> *writer) {
              return (s->*method)(context, request, writer);
            },
            service) {}

  void RunHandler(const HandlerParameter &param) override {
    Request *request = NewRequest<Request>(param);
    int64_t bytes = 0;
    const grpc::Status status = ReadBoundedRequest(param, path_, bounds_, request, &bytes);
    if (!status.ok()) {
      request->~Request();
      request = nullptr;
    }
    inner_.RunHandler(HandlerParameter(param.call, param.server_context, request, status,
                                       param.internal_data, param.call_requester));
    AfterCall(bytes);
  }

 private:
  const std::string path_;
  const MessageBounds bounds_;
  grpc::internal::ServerStreamingHandler<Service, Request, Response> inner_;
};

}  // namespace internal

// The stream a bounded bidi handler reads: each message is read as bytes,
// bounded and parsed as a unary request is. Read returns false at the end of
// the stream or once a message was refused; BoundedStream then answers the
// call with the refusal, whatever the handler returns.
template <class W, class R>
class BoundedReaderWriter final : public grpc::ServerReaderWriterInterface<W, R> {
 public:
  BoundedReaderWriter(grpc::ServerReaderWriter<W, grpc::ByteBuffer> *raw, absl::string_view method,
                      const MessageBounds &bounds)
      : raw_(raw), method_(method), bounds_(bounds) {}

  void SendInitialMetadata() override { raw_->SendInitialMetadata(); }
  bool NextMessageSize(uint32_t *size) override { return raw_->NextMessageSize(size); }
  bool Read(R *message) override {
    if (!refused_.ok()) return false;
    grpc::ByteBuffer bytes;
    if (!raw_->Read(&bytes)) return false;
    const size_t size = bytes.Length();
    refused_ = internal::ParseBounded(bytes, method_, bounds_, message);
    largest_ = std::max<int64_t>(largest_, static_cast<int64_t>(size));
    return refused_.ok();
  }
  using grpc::internal::WriterInterface<W>::Write;
  bool Write(const W &message, grpc::WriteOptions options) override {
    return raw_->Write(message, options);
  }

  const grpc::Status &refused() const { return refused_; }
  int64_t largest_message_bytes() const { return largest_; }

 private:
  grpc::ServerReaderWriter<W, grpc::ByteBuffer> *const raw_;
  const absl::string_view method_;
  const MessageBounds &bounds_;
  grpc::Status refused_;
  int64_t largest_ = 0;
};

// A bidi method of `service` whose messages are bounded: `handler` is the
// service's method taking the stream as a ServerReaderWriterInterface (keep
// an override of the generated virtual that forwards to it, for servers
// built without ServiceMain). For BoundedService::BoundedStreams.
template <class Service, class W, class R>
BoundedStreamMethod BoundedStream(
    Service *service, std::string method,
    grpc::Status (Service::*handler)(grpc::ServerContext *,
                                     grpc::ServerReaderWriterInterface<W, R> *)) {
  return BoundedStreamMethod{
      method, [service, method, handler](const MessageBounds &bounds) {
        return new grpc::internal::BidiStreamingHandler<Service, grpc::ByteBuffer, W>(
            [method, handler, bounds](Service *s, grpc::ServerContext *context,
                                      grpc::ServerReaderWriter<W, grpc::ByteBuffer> *raw) {
              if (grpc::Status denied = CheckCaller(context); !denied.ok()) {
                return denied;
              }
              BoundedReaderWriter<W, R> stream(raw, method, bounds);
              const grpc::Status status = (s->*handler)(context, &stream);
              internal::AfterCall(stream.largest_message_bytes());
              return stream.refused().ok() ? status : stream.refused();
            },
            service);
      }};
}

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_BOUNDED_METHODS_H_
