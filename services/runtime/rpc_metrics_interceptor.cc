#include "services/runtime/rpc_metrics_interceptor.h"

#include <chrono>
#include <string>

namespace sluice::runtime {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

const char* TypeName(ServerRpcInfo::Type type) {
  switch (type) {
    case ServerRpcInfo::Type::UNARY: return "unary";
    case ServerRpcInfo::Type::CLIENT_STREAMING: return "client_stream";
    case ServerRpcInfo::Type::SERVER_STREAMING: return "server_stream";
    case ServerRpcInfo::Type::BIDI_STREAMING: return "bidi_stream";
  }
  return "unknown";
}

class RpcMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(RpcMetrics* metrics, ServerRpcInfo* info)
      : metrics_(metrics),
        method_(info->method() != nullptr ? info->method() : "/unknown/unknown"),
        type_(TypeName(info->type())),
        start_(std::chrono::steady_clock::now()) {
    metrics_->Started(method_, type_);
  }

  ~RpcMetricsInterceptor() override {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    metrics_->Handled(method_, type_, code_, seconds);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      code_ = static_cast<int>(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  RpcMetrics* metrics_;
  std::string method_;
  const char* type_;
  std::chrono::steady_clock::time_point start_;
  int code_ = static_cast<int>(grpc::StatusCode::CANCELLED);
};

}  // namespace

grpc::experimental::Interceptor* RpcMetricsInterceptorFactory::CreateServerInterceptor(
    ServerRpcInfo* info) {
  return new RpcMetricsInterceptor(metrics_, info);
}

}  // namespace sluice::runtime
