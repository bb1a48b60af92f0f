#ifndef SLUICE_CONTROLLER_SERVICE_CLIENTS_H_
#define SLUICE_CONTROLLER_SERVICE_CLIENTS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/v1/replay_buffer.pb.h"
#include "sluice/v1/reward_server.pb.h"
#include "sluice/v1/rollout_worker.pb.h"
#include "sluice/v1/trainer.pb.h"

namespace sluice::controller {

class WorkerRegistry;

// What the controller needs of the other services, as small interfaces: the
// gRPC implementations live at the service edge (grpc_clients.h), tests use
// fakes. Every call blocks for at most the implementation's deadline and
// reports failures as absl::Status with the callee's code and message.
// Implementations must be thread-safe.

class TrainerClient {
 public:
  virtual ~TrainerClient() = default;
  // "host:port" of the trainer, for messages.
  virtual const std::string& address() const = 0;
  virtual absl::Status StartTraining(const v1::StartTrainingRequest& request) = 0;
  virtual absl::Status StopTraining(const v1::StopTrainingRequest& request) = 0;
  // What the trainer is doing: its run, state, step and memory budget.
  virtual absl::StatusOr<v1::TrainerStatus> GetStatus() = 0;
};

class ReplayBufferClient {
 public:
  virtual ~ReplayBufferClient() = default;
  virtual const std::string& address() const = 0;
  virtual absl::Status ConfigureRun(const v1::ConfigureRunRequest& request) = 0;
  // The run's statistics (GetStatsResponse.stats) and the buffer's
  // incarnation (a new one after every restart).
  virtual absl::StatusOr<v1::GetStatsResponse> GetStats(const std::string& run_id) = 0;
  // Gives back every generation slot the worker holds for the run (a lost
  // worker's slots, so that others may generate in its place at once).
  virtual absl::Status ReleaseWorkerSlots(const std::string& run_id,
                                          const std::string& worker_id) = 0;
  // Every run's statistics and the buffer's memory budget and use
  // (GetStats with an empty run_id).
  virtual absl::StatusOr<v1::GetStatsResponse> GetServerStats() = 0;
};

class RewardServerClient {
 public:
  virtual ~RewardServerClient() = default;
  virtual const std::string& address() const = 0;
  // The names of the verifiers the server offers.
  virtual absl::StatusOr<std::vector<std::string>> ListVerifiers() = 0;
  // The server's incarnation (ListVerifiersResponse.incarnation; a new one
  // after every restart; 0 from a server that does not say).
  virtual absl::StatusOr<uint64_t> Incarnation() = 0;
};

class HealthChecker {
 public:
  virtual ~HealthChecker() = default;
  // OK when the server at `address` answers SERVING; otherwise an error whose
  // message says what was seen ("health is NOT_SERVING", "connection
  // refused", "deadline exceeded").
  virtual absl::Status Check(const std::string& address) = 0;
};

// The services the controller drives. A null client (or empty reward server
// address) means the controller was started without that service's flag; a
// run cannot be submitted until it is given.
struct ServiceClients {
  std::shared_ptr<TrainerClient> trainer;
  std::shared_ptr<ReplayBufferClient> replay_buffer;
  // The rollout workers that registered themselves (WorkerHeartbeat); the
  // controller never calls them.
  std::shared_ptr<WorkerRegistry> workers;
  std::string reward_server_address;
  // Asked for its verifiers at submit; null = names are not checked.
  std::shared_ptr<RewardServerClient> reward_server;
  std::shared_ptr<HealthChecker> health;
};

}  // namespace sluice::controller

#endif  // SLUICE_CONTROLLER_SERVICE_CLIENTS_H_
