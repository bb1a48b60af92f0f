#ifndef SLUICE_SERVICES_CLIENTS_RETRY_METRICS_H_
#define SLUICE_SERVICES_CLIENTS_RETRY_METRICS_H_

#include <functional>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "services/clients/retrier.h"

namespace sluice::clients {

// The Prometheus side of a process's client retries (retrier.h), per service
// called:
//
//   sluice_client_retries_total{service="reward_server"}     retries made
//   sluice_client_retry_give_ups_total{service="..."}        calls given up
//                                                            (retry deadline)
//
// A rollout worker or trainer makes one and sets RetryOptions::observer to
// Observer() for every client it creates. Thread-safe.
class ClientRetryMetrics {
 public:
  // `registry` must outlive this object.
  explicit ClientRetryMetrics(prometheus::Registry& registry);

  // Counts each event in the families above. Valid while this object lives.
  std::function<void(const RetryEvent&)> Observer();

 private:
  prometheus::Family<prometheus::Counter>& retries_;
  prometheus::Family<prometheus::Counter>& give_ups_;
};

}  // namespace sluice::clients

#endif  // SLUICE_SERVICES_CLIENTS_RETRY_METRICS_H_
