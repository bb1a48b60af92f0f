#ifndef SLUICE_SERVICES_RUNTIME_RPC_METRICS_INTERCEPTOR_H_
#define SLUICE_SERVICES_RUNTIME_RPC_METRICS_INTERCEPTOR_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "services/runtime/metrics.h"

namespace sluice::runtime {

// Counts every RPC a server handles (health and reflection included) and
// times it from the call's creation to the status it sent. A call that ends
// without sending a status (the client cancelled it) is counted as CANCELLED.
class RpcMetricsInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  RpcMetrics* metrics_;
};

}  // namespace sluice::runtime

#endif  // SLUICE_SERVICES_RUNTIME_RPC_METRICS_INTERCEPTOR_H_
