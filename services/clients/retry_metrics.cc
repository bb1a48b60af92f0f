#include "services/clients/retry_metrics.h"

#include <string>

namespace sluice::clients {

ClientRetryMetrics::ClientRetryMetrics(prometheus::Registry& registry)
    : retries_(prometheus::BuildCounter()
                   .Name("sluice_client_retries_total")
                   .Help("Calls to another service retried after a transient failure (the "
                         "service down or restarting), by the service called")
                   .Register(registry)),
      give_ups_(prometheus::BuildCounter()
                    .Name("sluice_client_retry_give_ups_total")
                    .Help("Calls to another service given up after their retry deadline, by "
                          "the service called")
                    .Register(registry)) {}

std::function<void(const RetryEvent&)> ClientRetryMetrics::Observer() {
  return [this](const RetryEvent& event) {
    auto& family = event.kind == RetryEvent::Kind::kRetry ? retries_ : give_ups_;
    family.Add({{"service", std::string(event.service)}}).Increment();
  };
}

}  // namespace sluice::clients
