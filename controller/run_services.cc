#include "controller/run_services.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/run/run_memory.h"
#include "common/run/run_model.h"
#include "controller/worker_registry.h"

namespace sluice::controller {
namespace {

v1::StartTrainingRequest BuildStartTraining(const std::string& run_id, const v1::RunSpec& spec,
                                            const RunSizes& sizes,
                                            const v1::ServiceEndpoints& endpoints) {
  v1::StartTrainingRequest request;
  request.set_run_id(run_id);
  *request.mutable_spec() = spec;
  *request.mutable_endpoints() = endpoints;
  request.set_max_prompt_tokens(sizes.max_prompt_tokens);
  return request;
}

}  // namespace

std::string CallFailure(absl::string_view service, absl::string_view address,
                        absl::string_view method, const absl::Status& status) {
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::StrCat(service, " (", address, ") is unreachable: ", status.message());
  }
  std::string failure = absl::StrCat(service, " (", address, ") refused ", method, ": ",
                                     absl::StatusCodeToString(status.code()));
  if (!status.message().empty()) absl::StrAppend(&failure, ": ", status.message());
  return failure;
}

RunServices::RunServices(std::string run_id, v1::RunSpec spec, RunSizes sizes,
                         ServiceClients clients, v1::ServiceEndpoints endpoints)
    : run_id_(std::move(run_id)),
      spec_(std::move(spec)),
      sizes_(sizes),
      clients_(std::move(clients)),
      endpoints_(std::move(endpoints)),
      start_training_(BuildStartTraining(run_id_, spec_, sizes_, endpoints_)) {}

const std::string& RunServices::trainer_address() const {
  static const std::string* const kNone = new std::string();
  return clients_.trainer != nullptr ? clients_.trainer->address() : *kNone;
}

const std::string& RunServices::buffer_address() const {
  static const std::string* const kNone = new std::string();
  return clients_.replay_buffer != nullptr ? clients_.replay_buffer->address() : *kNone;
}

std::string RunServices::OtherRunHolder() const {
  std::string busy;
  if (absl::StatusOr<v1::TrainerStatus> trainer = clients_.trainer->GetStatus(); trainer.ok()) {
    const v1::TrainerState state = trainer->state();
    if (!trainer->run_id().empty() && trainer->run_id() != run_id_ &&
        state != v1::TRAINER_STATE_IDLE && state != v1::TRAINER_STATE_FINISHED &&
        state != v1::TRAINER_STATE_FAILED) {
      busy = absl::StrCat("trainer (", clients_.trainer->address(), ") with run ",
                          trainer->run_id(), " (", v1::TrainerState_Name(state), ")");
    }
  }
  if (clients_.workers != nullptr) {
    for (const RunWorker& worker : clients_.workers->LiveWorkers()) {
      for (const v1::RolloutRunStatus& other : worker.status.runs()) {
        if (busy.empty() && other.run_id() != run_id_ && other.groups_in_flight() > 0) {
          busy = absl::StrCat("rollout worker ", worker.worker_id, " (", worker.address,
                              ") with run ", other.run_id());
        }
      }
    }
  }
  return busy;
}

v1::ConfigureRunRequest RunServices::ConfigureRunRequest() const {
  v1::ConfigureRunRequest configure;
  configure.set_run_id(run_id_);
  *configure.mutable_config() = spec_.buffer();
  configure.set_batch_size_groups(spec_.algorithm().batch_size_groups());
  configure.set_max_staleness(spec_.algorithm().max_staleness());
  configure.set_staleness_bound(spec_.algorithm().staleness_bound());
  configure.set_group_size(spec_.algorithm().group_size());
  configure.set_initial_policy_version(0);
  configure.set_seed(spec_.seed());
  // What the buffer checks inserted groups against: ids in the model's
  // vocabulary, rewards in the reward server's [0, 1].
  if (auto model = run::LoadRunModelConfig(spec_.model()); model.ok()) {
    configure.set_vocab_size(model->vocab_size);
  }
  configure.set_min_reward(0.0);
  configure.set_max_reward(1.0);
  // What the controller measured at submit: the services check their own
  // memory budgets with the same sizes.
  configure.set_max_sequence_tokens(sizes_.max_sequence_tokens);
  // The trainer's batches the buffer keeps until a checkpoint covers them.
  configure.set_retained_step_batches(run::RetainedStepBatches(spec_));
  return configure;
}

absl::Status RunServices::ConfigureBuffer() {
  return clients_.replay_buffer->ConfigureRun(ConfigureRunRequest());
}

absl::StatusOr<v1::GetStatsResponse> RunServices::BufferStats() {
  return clients_.replay_buffer->GetStats(run_id_);
}

absl::Status RunServices::StartTraining() {
  trainer_started_ = true;  // Even a failed call may have started it.
  return clients_.trainer->StartTraining(start_training_);
}

absl::Status RunServices::ResumeTraining() {
  return clients_.trainer->StartTraining(start_training_);
}

void RunServices::OfferToWorkers() {
  if (clients_.workers == nullptr || workers_offered_) return;
  v1::RolloutAssignment assignment;
  assignment.set_run_id(run_id_);
  *assignment.mutable_spec() = spec_;
  *assignment.mutable_endpoints() = endpoints_;
  assignment.set_max_prompt_tokens(sizes_.max_prompt_tokens);
  clients_.workers->Offer(assignment, spec_.rollout().num_workers());
  workers_offered_ = true;
}

void RunServices::WithdrawFromWorkers() {
  if (workers_offered_) clients_.workers->Withdraw(run_id_);
}

void RunServices::Release() {
  WithdrawFromWorkers();
  if (!trainer_started_) return;
  v1::StopTrainingRequest stop_training;
  stop_training.set_run_id(run_id_);
  stop_training.set_checkpoint(!spec_.checkpoint().dir().empty());
  if (absl::Status status = clients_.trainer->StopTraining(stop_training); !status.ok()) {
    log::Warning("cannot stop training", {{"run_id", run_id_},
                                          {"address", clients_.trainer->address()},
                                          {"error", status.ToString()}});
  }
}

absl::Status RunServices::ReleaseWorkerSlots(const std::string& worker_id) {
  return clients_.replay_buffer->ReleaseWorkerSlots(run_id_, worker_id);
}

}  // namespace sluice::controller
