#include "replay_buffer/replay_buffer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace sluice::replay_buffer {

absl::StatusOr<std::unique_ptr<ReplayBuffer>> ReplayBuffer::Create(RunTableOptions options) {
  RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<ReplayBuffer>(new ReplayBuffer(std::move(options)));
}

absl::StatusOr<ReplayBuffer::ConfigureResult> ReplayBuffer::ConfigureRun(const RunConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  std::shared_ptr<RunTable> table;
  ConfigureResult result;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("replay buffer is shutting down");
    if (auto it = runs_.find(config.run_id); it != runs_.end()) {
      table = it->second;
    } else {
      ASSIGN_OR_RETURN(std::unique_ptr<RunTable> created, RunTable::Create(config, options_));
      table = std::move(created);
      runs_.emplace(config.run_id, table);
      result.created = true;
    }
  }
  if (!result.created) RETURN_IF_ERROR(table->Reconfigure(config));
  result.stats = table->Stats();
  return result;
}

absl::StatusOr<std::shared_ptr<RunTable>> ReplayBuffer::GetRun(absl::string_view run_id) const {
  absl::MutexLock lock(&mu_);
  if (auto it = runs_.find(run_id); it != runs_.end()) return it->second;
  if (run_id.empty()) return absl::InvalidArgumentError("run_id: required");
  return absl::NotFoundError(absl::StrCat("run_id: run \"", run_id,
                                          "\" is not configured on this replay buffer "
                                          "(ConfigureRun creates it)"));
}

std::vector<InsertResult> ReplayBuffer::Insert(std::vector<v1::Group> groups) {
  std::vector<InsertResult> results;
  results.reserve(groups.size());
  for (v1::Group& group : groups) {
    absl::StatusOr<std::shared_ptr<RunTable>> table = GetRun(group.run_id());
    if (!table.ok()) {
      InsertResult& result = results.emplace_back();
      result.idempotency_key = group.idempotency_key();
      result.status = table.status().code() == absl::StatusCode::kNotFound
                          ? InsertStatus::kUnknownRun
                          : InsertStatus::kInvalid;
      result.message = std::string(table.status().message());
      continue;
    }
    results.push_back((*table)->Insert(std::move(group)));
  }
  return results;
}

void ReplayBuffer::Shutdown() {
  std::vector<std::shared_ptr<RunTable>> tables;
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    for (const auto& [run_id, table] : runs_) tables.push_back(table);
  }
  for (const auto& table : tables) table->Shutdown();
}

}  // namespace sluice::replay_buffer
