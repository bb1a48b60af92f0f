#ifndef SLUICE_REWARD_SERVER_REWARD_SERVER_SERVICE_H_
#define SLUICE_REWARD_SERVER_REWARD_SERVER_SERVICE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/registry.h"
#include "common/wire_limits.h"
#include "reward_server/reward_metrics.h"
#include "reward_server/sandbox/sandbox_pool.h"
#include "reward_server/sandbox_admission.h"
#include "reward_server/scorer.h"
#include "services/runtime/bounded_methods.h"
#include "sluice/v1/reward_server.grpc.pb.h"

namespace sluice::reward_server {

struct RewardServiceOptions {
  // Largest ScoreBatchRequest.items accepted; larger batches are
  // INVALID_ARGUMENT. Clients split to the default (common/wire_limits.h).
  int max_batch_items = kDefaultMaxBatchItems;
  // With a sandbox pool: sandboxed programs admitted beyond its slots
  // (SandboxAdmissionOptions::max_queued) before ScoreBatch refuses a batch
  // with RESOURCE_EXHAUSTED and a retry hint.
  int sandbox_max_queued = 64;

  // INVALID_ARGUMENT unless max_batch_items is in [1, 1000000] and
  // sandbox_max_queued >= 0.
  absl::Status Validate() const;
};

// The gRPC edge of the reward server (sluice.v1.RewardService): validates
// the request, converts protos to core types (proto_convert.h), runs the
// Scorer, records metrics, and maps absl::Status to grpc::Status. The
// scoring logic lives in the core library.
//
// ScoreBatch fails only for a malformed request (INVALID_ARGUMENT: too many
// items, an item without item_id, a bad composition; the message names the
// field), when the scorer has shut down (UNAVAILABLE), or when the code
// sandbox pool's backlog is full (RESOURCE_EXHAUSTED, with a retry hint in
// the trailing metadata grpc-retry-pushback-ms and the message, which the
// clients honour: services/clients/retrier.h); everything else is a
// per-item outcome. It blocks for at most the batch's largest item
// deadline. ListVerifiers also answers the service's incarnation: the time it
// was created (at process start) in Unix nanoseconds, distinct for every
// start, which tells a caller (the controller) that the server restarted.
// Thread-safe.
class RewardServerServiceImpl final : public v1::RewardService::Service,
                                      public runtime::BoundedService {
 public:
  // `registry` receives the sluice_reward_* metrics and must outlive the
  // service. `options` must be valid.
  // `pool` (may be null): the code verifier's sandbox pool, whose slots
  // bound admission and whose state is exported.
  RewardServerServiceImpl(std::shared_ptr<Scorer> scorer, prometheus::Registry& registry,
                          RewardServiceOptions options = {},
                          std::shared_ptr<const sandbox::SandboxPool> pool = nullptr);

  grpc::Status ScoreBatch(grpc::ServerContext* context, const v1::ScoreBatchRequest* request,
                          v1::ScoreBatchResponse* response) override;
  grpc::Status ListVerifiers(grpc::ServerContext* context, const v1::ListVerifiersRequest* request,
                             v1::ListVerifiersResponse* response) override;

  // A ScoreBatch's items are bounded by --max-batch-items before the
  // request is parsed (runtime::BoundEveryMethod).
  std::vector<runtime::FieldElementLimit> FieldElementLimits() const override {
    return {{"sluice.v1.ScoreBatchRequest.items", options_.max_batch_items, "--max-batch-items"}};
  }

  // Sets the scorer's gauges (queued items, busy and abandoned verifier
  // threads) and the sandbox pool's to their state now; run before each
  // scrape of /metrics.
  void UpdateScorerGauges();

 private:
  const std::shared_ptr<Scorer> scorer_;
  const RewardServiceOptions options_;
  const std::shared_ptr<const sandbox::SandboxPool> pool_;
  // Present with a pool.
  std::unique_ptr<SandboxAdmission> admission_;
  const uint64_t incarnation_;
  RewardMetrics metrics_;
};

}  // namespace sluice::reward_server

#endif  // SLUICE_REWARD_SERVER_REWARD_SERVER_SERVICE_H_
